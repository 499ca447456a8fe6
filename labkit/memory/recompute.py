"""Activation checkpointing policies, measured against their models: memory kept, peak, FLOPs executed.

For each policy of ``TrainConfig.checkpoint`` (:func:`labkit.model.config.checkpoint_policy`: "none",
"attention", "every:k", "full") the trainer's own model is built (:func:`labkit.train.build_model`, the policy
applied by :func:`labkit.train.parallel.parallelize`) and one micro-batch is run:

- **saved activation bytes** — every tensor autograd keeps for backward, exact and deduplicated
  (:func:`labkit.memory.tensors.measure_activation_bytes`), beside the itemised model
  (:func:`labkit.memory.estimate.activation_bytes` with the policy's ``recompute`` and the run's attention);
- **peak above the step's start** — the allocator's highest total through one forward and backward minus
  what it held when they began (the parameters; :class:`labkit.memory.timeline.StepMemoryRecorder`): the
  saved activations at their worst, plus the block being recomputed, the logits' gradient and the gradients as
  they appear (no optimizer step: its transient is not the activations' business);
- **FLOPs executed** — ``torch.utils.flop_counter`` over forward and backward (:func:`labkit.flops.count_flops`):
  the recomputed forwards run inside backward, so they are counted; the *model* FLOPs are the same count
  without recomputation. Executed ÷ model is HFU ÷ MFU at any speed (PaLM App. B), beside the formula's ratio
  (:func:`labkit.flops.hardware_flops_per_token` ÷ :func:`labkit.flops.model_flops_per_token`).

Taught in chapter 21 (activation checkpointing).
"""
from __future__ import annotations

import pandas as pd

from labkit import checks

__all__ = ["measure_policy", "policy_table", "policy_costs"]


def measure_policy(cfg, *, micro_batch: int | None = None, peak: bool = True) -> dict:
    """One policy's measured and predicted figures (see the module docstring), on ``cfg.device`` in this
    process; ``cfg.checkpoint`` names the policy. Taught in chapter 21."""
    import torch

    from labkit import flops
    from labkit.hardware.measure import resolve_device
    from labkit.memory.estimate import activation_bytes
    from labkit.memory.tensors import measure_activation_bytes
    from labkit.memory.timeline import StepMemoryRecorder
    from labkit.train.loop import build_model

    if cfg.parallel != "single":
        raise ValueError(f"cfg.parallel={cfg.parallel!r}: measure_policy runs one process (parallel='single')")
    mb = cfg.micro_batch if micro_batch is None else checks.count("micro_batch", micro_batch)
    device = resolve_device(cfg.device)
    mcfg = cfg.model_config
    model = build_model(cfg, device)
    gen = torch.Generator().manual_seed(cfg.seed)
    idx = torch.randint(0, mcfg.vocab_size, (mb, mcfg.seq_len), generator=gen).to(device)
    tgt = torch.randint(0, mcfg.vocab_size, (mb, mcfg.seq_len), generator=gen).to(device)
    saved = measure_activation_bytes(model, idx, tgt)
    dtype_bytes = 4                              # fp32 activations (the runs of chapter 21)
    predicted = activation_bytes(mcfg, mb, recompute=cfg.recompute, attention=cfg.attention,
                                 dtype_bytes=dtype_bytes, include_head=True,
                                 mask_bytes=1 if device.type == "cuda" else dtype_bytes)
    model.zero_grad(set_to_none=True)
    counted = flops.count_flops(model, (idx, tgt))
    out = {"policy": cfg.checkpoint_policy, "recompute": cfg.recompute, "attention": cfg.attention,
           "micro_batch": mb, "seq_len": mcfg.seq_len, "saved_bytes": saved, "predicted_bytes": predicted,
           "executed_flops": counted.total, "forward_flops": counted.forward, "backward_flops": counted.backward,
           "formula_hfu_over_mfu": flops.hardware_flops_per_token(mcfg.shape(), recompute=cfg.recompute)
           / flops.model_flops_per_token(mcfg.shape())}
    if peak:                                     # a warm-up pass, then one recorded forward + backward
        for record in (False, True):
            model.zero_grad(set_to_none=True)
            rec = StepMemoryRecorder(model, None, device=device.type)
            with rec if record else _null():
                with rec.phase("forward") if record else _null():
                    loss = model(idx, tgt)[1]
                with rec.phase("backward") if record else _null():
                    loss.backward()
                with rec.phase("optimizer") if record else _null():
                    pass                         # no optimizer: this is the activations' peak, not Adam's
            del loss
        start = int(rec.result.phases.set_index("phase").loc["forward", "start_bytes"])
        out["peak_above_start"] = rec.result.peak_bytes - start
        out["peak_phase"] = rec.result.peak_phase
    return out


def _null():
    import contextlib

    return contextlib.nullcontext()


def policy_table(base, policies=(False, "attention", "every:2", True), *, micro_batch: int | None = None,
                 peak: bool = True) -> pd.DataFrame:
    """:func:`measure_policy` for each policy on ``base`` (a ``TrainConfig``), one row each, with the model's
    error and the executed FLOPs relative to the first policy's (no recomputation: the model FLOPs).
    Taught in chapter 21."""
    rows = [measure_policy(base.replace(checkpoint=p), micro_batch=micro_batch, peak=peak) for p in policies]
    df = pd.DataFrame(rows)
    if df.empty:
        raise ValueError("policy_table needs at least one policy")
    df["error"] = df["saved_bytes"] / df["predicted_bytes"] - 1.0
    df["executed_over_model"] = df["executed_flops"] / df["executed_flops"].iloc[0]
    return df


def policy_costs(shape, micro_batch: int, *, policies=None, attention: str = "sdpa", dtype_bytes: int = 2,
                 budget_bytes: float | None = None, tp: int = 1, sequence_parallel: bool = False) -> pd.DataFrame:
    """What each policy keeps and what it re-executes, from the models alone — the calculator of chapter 21.

    ``shape``: a :class:`labkit.model.gpt.GPTConfig` (or anything with n_layers, d_model, n_heads, seq_len and a
    ``shape()``/ModelShape for the FLOPs). ``policies`` defaults to none, attention, every k for k = 8, 4, 2
    (those ≤ the layers) and full. Columns: policy, activation bytes (whole model, one micro-batch,
    :func:`labkit.memory.estimate.activation_bytes` with ``attention``), extra FLOPs as a share of the model
    FLOPs (:func:`labkit.flops.hardware_flops_per_token`), and with ``budget_bytes`` whether the activations
    fit it; sorted from the cheapest in FLOPs. Taught in chapter 21.
    """
    from labkit import flops
    from labkit.memory.estimate import activation_bytes
    from labkit.model.config import checkpoint_policy, recompute_mode

    mshape = shape.shape() if hasattr(shape, "shape") and callable(shape.shape) else shape
    L = checks.count("shape.n_layers", shape.n_layers)
    sequence_parallel = checks.flag("sequence_parallel", sequence_parallel)
    if policies is None:
        policies = ["none", "attention"] + [f"every:{k}" for k in (8, 4, 2) if k <= L] + ["full"]
    model = flops.model_flops_per_token(mshape)
    rows = []
    for p in policies:
        pol = checkpoint_policy(p, L)
        rec = recompute_mode(pol)
        acts = activation_bytes(shape, micro_batch, recompute=rec, attention=attention, dtype_bytes=dtype_bytes,
                                include_head=True, tp=tp, sequence_parallel=sequence_parallel)
        rows.append({"policy": pol, "activation_bytes": acts,
                     "extra_flops": flops.hardware_flops_per_token(mshape, recompute=rec) / model - 1.0})
    df = pd.DataFrame(rows).drop_duplicates("policy")
    if budget_bytes is not None:
        df["fits"] = df["activation_bytes"] <= checks.positive("budget_bytes", budget_bytes)
    return df.sort_values(["extra_flops", "activation_bytes"]).reset_index(drop=True)

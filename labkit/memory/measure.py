"""Predicted vs measured model-state bytes per rank, on real ranks running the reference trainer.

Each strategy is a :class:`labkit.train.TrainConfig` (DDP, FSDP2 with or without resharding) trained
for a step by the one training loop; a probe at the end of the last step — parameters, gradients and
Adam state all live — measures the rank's exact bytes (:func:`labkit.memory.tensors.measure_model_state`)
and predicts them (:func:`labkit.memory.estimate.model_state_bytes`, exact per-rank FSDP2 sharding).

Taught in chapter 13 (memory anatomy) and chapter 20 (FSDP / ZeRO).
"""
from __future__ import annotations

import pandas as pd

from labkit.memory.estimate import canonical_strategy, model_state_bytes
from labkit.memory.tensors import measure_activation_bytes, measure_model_state  # noqa: F401 - old labkit.memory_measure names

# memory strategy -> the TrainConfig fields that run it
RUNS = {"ddp": {"parallel": "ddp"}, "fsdp_no_shard": {"parallel": "ddp"},
        "fsdp_full": {"parallel": "fsdp", "reshard_after_forward": True},
        "fsdp_grad_op": {"parallel": "fsdp", "reshard_after_forward": False}}


def probe_model_state(model, optimizer, cfg) -> dict:
    """This rank's measured and predicted model-state bytes (a :func:`labkit.train.train` probe)."""
    import torch
    import torch.distributed as dist

    from labkit.model.gpt import GPT

    rank, world = dist.get_rank(), dist.get_world_size()
    strategy = cfg.memory_strategy
    with torch.device("meta"):      # the unsharded shapes, no memory: exact per-rank shards predicted
        shapes = GPT(cfg.model_config)
    predicted = model_state_bytes(shapes, strategy=strategy, n_ranks=world, precision="fp32", rank=rank)
    measured = measure_model_state(model, optimizer, strategy=strategy, n_ranks=world, precision="fp32")
    return {"rank": rank, "measured": measured.as_dict(), "predicted": predicted.as_dict(),
            "n_params_local": measured.n_params}


def predict_vs_measure(strategy="ddp", nprocs: int = 2, *, model: str = "tiny", timeout_s: float = 120,
                       micro_batch: int = 2) -> pd.DataFrame:
    """Predicted vs measured per-rank model-state bytes for every rank (fp32 AdamW, after one step).

    ``strategy``: one name or a list (all run in the same launch): ddp, fsdp_no_shard, fsdp_full,
    fsdp_grad_op. Columns: strategy, nprocs, rank, category, predicted, measured, error
    (measured/predicted − 1). Taught in chapter 13 and chapter 20.
    """
    from labkit.train import TrainConfig, run_many

    strategies = [canonical_strategy(s) for s in ((strategy,) if isinstance(strategy, str) else strategy)]
    bad = [s for s in strategies if s not in RUNS]
    if bad:
        raise ValueError(f"strategy={bad[0]!r}: predict_vs_measure runs one of {sorted(RUNS)}")
    cfgs = [TrainConfig(model=model, micro_batch=micro_batch, steps=1, warmup_steps=0, peak_flops=1e12,
                        label=f"memory:{s}", **RUNS[s]) for s in strategies]
    per_cfg = run_many(cfgs, nprocs, timeout_s=timeout_s, all_ranks=True, probe=probe_model_state)
    rows = []
    for strat, ranks in zip(strategies, per_cfg, strict=True):
        for rec in ranks:
            v = rec.extra["probe"]
            for cat in ("params", "grads", "optimizer", "model_states"):
                p, m = v["predicted"][cat], v["measured"][cat]
                rows.append({"strategy": strat, "nprocs": nprocs, "rank": v["rank"], "category": cat,
                             "predicted": p, "measured": m, "error": (m / p - 1.0) if p else float("nan")})
    return pd.DataFrame(rows)

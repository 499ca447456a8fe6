"""What each FSDP2 knob does to one training step, measured on real ranks and set beside the prediction.

For every :class:`labkit.train.TrainConfig` given (``parallel="fsdp"``), each rank builds the trainer's
model (:func:`labkit.train.build_model`: the one model, wrapped by ``parallelize``), trains one warm-up
step and then ``measured_steps`` steps with the trainer's own ``forward_backward`` and AdamW, and records:

- **collectives per step** — a counting hook on ``torch.distributed.all_gather_single`` and
  ``reduce_scatter_single``, the two calls FSDP2 issues for every unit
  (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``): how many, how many bytes (S: the full
  gathered output / the full reduced input) and over how many ranks — deterministic, unlike time on two
  shared cores (PLATFORM_NOTES: overlap and prefetch gains are invisible there);
- **how far forward all-gathers run ahead** — at each block's start, the all-gathers already issued
  in this forward beyond the root and blocks 0..i (0 without explicit forward prefetch, up to the
  ``prefetch`` depth with it: the order of calls, not their timing);
- **parameter bytes registered** on the rank: the most while a block runs (sampled in a forward pre-hook
  of every block, after FSDP's own pre-hook has gathered it) and between forward and backward (a forward
  hook on the root, after FSDP's own post-forward resharding) — exact tensor bytes
  (:func:`labkit.memory.tensors.measure_model_state`);
- **model states** after the last optimizer step (parameters, gradients, Adam state of this rank);
- the **predictions** of :mod:`labkit.memory.sharding` for the same config and rank.

Time, tokens/s and loss come from the trainer itself (:func:`labkit.train.run_many`); this harness is
for what time cannot show on a laptop. Taught in chapter 20 (FSDP and ZeRO) and lab 6.
"""
from __future__ import annotations

import pandas as pd

__all__ = ["CollectiveCounter", "measure_knobs", "probe_knobs", "knob_table"]

_OPS = {"all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter"}


class CollectiveCounter:
    """Counts FSDP2's collectives while active: ``calls`` = list of (op, bytes S, group ranks).

    Patches ``torch.distributed.all_gather_single`` / ``reduce_scatter_single`` (module attributes,
    which FSDP2 calls) and restores them on exit. DDP's all-reduces run in C++ and are not seen: count
    those from a trace (chapter 19). Taught in chapter 20."""

    def __init__(self):
        self.calls: list[tuple[str, int, int]] = []
        self._saved = {}

    def __enter__(self):
        import torch.distributed as dist

        for name, op in _OPS.items():
            real = getattr(dist, name)
            self._saved[name] = real

            def counted(*a, _real=real, _op=op, **kw):
                import inspect

                bound = inspect.signature(_real).bind(*a, **kw)
                bound.apply_defaults()
                args = list(bound.arguments.values())       # (output, input, …, group, …)
                big = args[0] if _op == "all_gather" else args[1]   # S = the full (gathered / reduced) tensor
                group = bound.arguments.get("group")
                n = dist.get_world_size(group) if group is not None else dist.get_world_size()
                self.calls.append((_op, big.numel() * big.element_size(), n))
                return _real(*a, **kw)

            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        for name, real in self._saved.items():
            setattr(dist, name, real)
        return False

    def per_step(self, steps: int) -> dict:
        """{op: calls per step}, {op: S bytes per step}, {op: bytes one rank sends per step by the ring
        model, bus_factor(op, group)·S}, {op: sorted group sizes seen}. On gloo a reduce-scatter runs as an
        all-reduce of its input (PLATFORM_NOTES); "sent" is what a ring (NCCL) sends."""
        from labkit.comm.models import bus_factor

        calls, nbytes, sent, groups = {}, {}, {}, {}
        for op, b, n in self.calls:
            calls[op] = calls.get(op, 0) + 1 / steps
            nbytes[op] = nbytes.get(op, 0) + b / steps
            sent[op] = sent.get(op, 0) + bus_factor(op, n) * b / steps
            groups.setdefault(op, set()).add(n)
        return {"calls": calls, "bytes": nbytes, "sent": sent, "groups": {k: sorted(v) for k, v in groups.items()}}


def _gathers(counter) -> int:
    return sum(1 for op, _, _ in counter.calls if op == "all_gather")


def _registered_bytes(model) -> int:
    from labkit.memory.tensors import measure_model_state

    return int(measure_model_state(model).params)


def probe_knobs(cfg, measured_steps: int = 2) -> dict:
    """One rank's measurement of ``cfg`` (see the module docstring); runs inside an initialised group.
    Taught in chapter 20 (FSDP knobs) and lab 6."""
    import torch
    import torch.distributed as dist

    from labkit.memory.sharding import collectives_per_step, params_held
    from labkit.memory.tensors import measure_model_state
    from labkit.model.gpt import GPT
    from labkit.train.loop import forward_backward

    model, opt, it, device = fsdp_probe_start(cfg, "knob")
    rank, world = dist.get_rank(), dist.get_world_size()
    inner = getattr(model, "_orig_mod", model)
    peak, after, lead = [0], [], []
    counter = CollectiveCounter()
    start = [0]

    def pre_block(i):
        def hook(m, a):
            peak[0] = max(peak[0], _registered_bytes(inner))
            if cfg.fsdp_wrap == "block":    # all-gathers issued so far in this forward beyond root + blocks 0..i
                lead.append(_gathers(counter) - start[0] - (i + 2))
        return hook

    def pre_root(m, a):
        start[0] = _gathers(counter)

    hooks = [b.register_forward_pre_hook(pre_block(i)) for i, b in enumerate(inner.blocks)]
    hooks.append(inner.register_forward_pre_hook(pre_root, prepend=True))
    hooks.append(inner.register_forward_hook(lambda m, a, o: after.append(_registered_bytes(inner))))
    try:
        with counter:
            for i in range(measured_steps):
                losses = forward_backward(model, it, cfg, device)
                opt.step()
                if i < measured_steps - 1:
                    opt.zero_grad(set_to_none=True)
    finally:
        for h in hooks:
            h.remove()
    states = measure_model_state(model, opt).as_dict()
    with torch.device("meta"):
        shapes = GPT(cfg.model_config)
    pred_held = params_held(shapes, shapes.blocks, world, reshard_after_forward=cfg.reshard_after_forward,
                            wrap=cfg.fsdp_wrap, rank=rank, param_dtype_bytes=2 if cfg.mp_policy == "bf16" else 4)
    pred_calls = collectives_per_step(cfg.model_config.n_layers, wrap=cfg.fsdp_wrap,
                                      reshard_after_forward=cfg.reshard_after_forward, accum=cfg.accum)
    return {"rank": rank, "world": world, "label": cfg.label, "config": cfg.to_dict(),
            "measured": {**counter.per_step(measured_steps), "after_forward": max(after),
                         "forward_lead": max(lead) if lead else 0,
                         "peak_forward": peak[0], "model_states": states, "loss": float(losses)},
            "predicted": {"after_forward": pred_held["after_forward"], "peak_forward": pred_held["peak_forward"],
                          "all_gather": pred_calls["all_gather"], "reduce_scatter": pred_calls["reduce_scatter"]}}


def _rank_knobs(cfgs, measured_steps):
    return [probe_knobs(c, measured_steps) for c in cfgs]


def measure_knobs(cfgs, nprocs: int = 2, *, measured_steps: int = 2, timeout_s: float = 300,
                  all_ranks: bool = False):
    """Measure each FSDP2 config on ``nprocs`` fresh ranks (one launch for all): a DataFrame with one row
    per config (rank 0), or with ``all_ranks`` the raw per-rank dicts. Columns: label, all-gathers and
    reduce-scatters per step (measured, predicted), all-gather MB per step, the backward group size,
    parameter MB after forward and at the forward peak (measured, predicted), model-state MB after the
    step. Taught in chapter 20 (FSDP knobs) and lab 6."""
    from labkit.checks import count
    from labkit.launcher.parent import launch

    cfgs = list(cfgs)
    if not cfgs:
        raise ValueError("measure_knobs needs at least one TrainConfig with parallel='fsdp'")
    bad = [c for c in cfgs if getattr(c, "parallel", None) != "fsdp"]
    if bad:
        raise ValueError(f"measure_knobs measures FSDP2 configs; {getattr(bad[0], 'label', bad[0])!r} has "
                         f"parallel={getattr(bad[0], 'parallel', None)!r}")
    count("measured_steps", measured_steps)
    res = launch(_rank_knobs, count("nprocs", nprocs, at_least=2), args=(cfgs, measured_steps),
                 timeout_s=timeout_s, stream=False)
    per_rank = res.values
    if all_ranks:
        return [[r[i] for r in per_rank] for i in range(len(cfgs))]
    return knob_table(per_rank[0])


def knob_table(rows) -> pd.DataFrame:
    """The table of :func:`measure_knobs` from probe dicts (one per config), e.g. as a lab recorded them.
    Taught in chapter 20 and lab 6."""
    mb = 1e6
    out = []
    for v in rows:
        m, p = v["measured"], v["predicted"]
        out.append({"label": v["label"],
                    "all_gather/step": m["calls"].get("all_gather", 0.0), "predicted AG": p["all_gather"],
                    "reduce_scatter/step": m["calls"].get("reduce_scatter", 0.0), "predicted RS": p["reduce_scatter"],
                    "AG MB/step": m["bytes"].get("all_gather", 0.0) / mb,
                    "sent MB/step": sum(m["sent"].values()) / mb,
                    "fwd prefetch lead": m.get("forward_lead", 0),
                    "AG groups": "/".join(str(g) for g in m["groups"].get("all_gather", [])),
                    "params after fwd MB": m["after_forward"] / mb, "predicted after MB": p["after_forward"] / mb,
                    "params peak fwd MB": m["peak_forward"] / mb, "predicted peak MB": p["peak_forward"] / mb,
                    "model states MB": m["model_states"]["model_states"] / mb, "loss": m["loss"]})
    return pd.DataFrame(out)


def fsdp_probe_start(cfg, what: str):
    """What every FSDP2 probe of one rank starts with: the trainer's model on this rank's device, AdamW, an
    endless distributed loader, and one warm-up step (lazy init, the first all-gathers). Returns (model,
    optimizer, batches, device). Runs inside an initialised group. Taught in chapters 20 and 21."""
    import torch
    import torch.distributed as dist

    from labkit import data
    from labkit.hardware.measure import resolve_device
    from labkit.train.loop import build_model, forward_backward

    if cfg.parallel != "fsdp":
        raise ValueError(f"cfg.parallel={cfg.parallel!r}: the {what} probe measures FSDP2 (parallel='fsdp')")
    device = resolve_device(cfg.device)
    if device.type == "cuda" and device.index is None:      # one GPU per rank
        device = torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    model = build_model(cfg, device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    ds = data.TokenDataset(data.load_tokens(), cfg.model_config.seq_len)

    def batches():
        while True:
            yield from data.make_loader(ds, cfg.micro_batch, seed=cfg.seed, distributed=True)

    it = batches()
    forward_backward(model, it, cfg, device)        # warm-up
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt, it, device

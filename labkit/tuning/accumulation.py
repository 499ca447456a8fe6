"""What an accumulated step costs, measured: collectives per step through the one training loop, and
case A (one large micro-batch) against case B (several accumulated small ones) timed interleaved.

:func:`accumulation_collectives` trains variants of a config (``no_sync``, FSDP2 resharding) in the same
ranks with the profiler on and counts each one's collectives per rank per step from the traces
(:func:`collectives_per_step`); :func:`ab_micro_batch` times two (micro_batch, accum) splits of the same
sequences through the loop's ``forward_backward`` with :func:`labkit.measure.ab.ab_compare`. Re-exported by
:mod:`labkit.tuning.sweep`.

Taught in chapter 15 (micro-batch and accumulation).
"""
from __future__ import annotations

import pandas as pd

from labkit import checks


def collectives_per_step(trace_dir) -> dict[str, float]:
    """Collective calls per rank per profiled step, by type, from a run's per-rank traces
    (:func:`labkit.trace.analyze`'s ``comm_by_type``). On gloo FSDP's reduce-scatter runs as an
    all-reduce (PLATFORM_NOTES), so it is counted as one. Taught in chapter 15."""
    from labkit import trace

    an = trace.analyze(trace_dir)
    per = len(an.ranks) * len(an.steps)
    t = an.comm_by_type
    return {str(ty): float(c) / per for ty, c in zip(t["type"], t["count"], strict=True)}


def accumulation_collectives(base, variants: dict, *, nprocs: int = 2, out_dir, timeout_s: float = 600):
    """Train each variant of ``base`` (name → TrainConfig changes, e.g. ``{"no_sync": False}``) in the same
    ``nprocs`` ranks through the one loop (:func:`labkit.train.run_many`), profile its last step, count its
    collectives per rank per step. Returns (table, records). Taught in chapter 15."""
    from pathlib import Path

    from labkit.train import run_many

    if not isinstance(variants, dict) or not variants:
        raise ValueError("variants must be a non-empty dict of name -> TrainConfig changes")
    out = Path(out_dir)
    cfgs = [base.replace(**changes, label=name, profile_dir=str(out / name), profile_steps=1)
            for name, changes in variants.items()]
    recs = run_many(cfgs, nprocs, timeout_s=timeout_s)
    rows = []
    for (name, changes), cfg, rec in zip(variants.items(), cfgs, recs, strict=True):
        c = collectives_per_step(cfg.profile_dir)
        rows.append({"variant": name, "parallel": cfg.parallel, "accum": cfg.accum,
                     "changes": ", ".join(f"{k}={v}" for k, v in changes.items() if k != "parallel") or "defaults",
                     "all_gather": c.get("all_gather", 0.0), "all_reduce": c.get("all_reduce", 0.0),
                     "collectives": sum(c.values()), "step_ms": rec.step_time.median * 1e3})
    return pd.DataFrame(rows), recs


def ab_micro_batch(cfg, a=(16, 1), b=(4, 4), *, rounds: int = 20, threads: int | None = 1, seed: int = 0):
    """A/B of two (micro_batch, accum) splits of the same sequences per step, e.g. the source's case A
    (16 × 1) against case B (4 × 4): each call is one step's forward and backward through the loop's own
    :func:`labkit.train.forward_backward` on one model and the same sequences, timed in CPU seconds
    (``clock="cpu"``: robust to a shared machine; the optimizer step, equal for both, is left out),
    interleaved A B A' (:func:`labkit.measure.ab.ab_compare`); on a GPU in wall seconds between synchronisations.
    ``threads``: torch threads while it runs (CPU). Taught in chapter 15."""

    from labkit.hardware.measure import resolve_device
    from labkit.train.accum import global_batch
    from labkit.train.loop import build_model, forward_backward

    (ma, ka), (mb, kb) = _same_batch(a, b)
    x, y = global_batch(cfg, ma * ka, seed=seed)
    device = resolve_device(cfg.device)
    x, y = x.to(device), y.to(device)
    model = build_model(cfg.replace(parallel="single", micro_batch=ma, accum=ka), device)

    def arm(m, k):
        run = cfg.replace(parallel="single", micro_batch=m, accum=k)
        chunks = list(zip(x.split(m), y.split(m), strict=True))

        def once():     # returns None: ab_compare times it
            forward_backward(model, iter(chunks), run, device)
            model.zero_grad(set_to_none=True)
        return once

    return _ab_splits(arm, a, b, device, rounds=rounds, threads=threads, seed=seed, what="")


def step_gemm_shapes(model, tokens: int) -> list[tuple[int, int, int]]:
    """The (m, n, k) of every GEMM that one forward and backward of ``model``'s linear layers runs on
    ``tokens`` rows: per ``nn.Linear(k→n)`` the forward (tokens×k)·(k×n), the input gradient
    (tokens×n)·(n×k) and the weight gradient (n×tokens)·(tokens×k) — 3 GEMMs of 2·tokens·k·n FLOPs
    each, the 6N rule's matmuls (Kaplan et al. 2020, §2.1). Attention's score and value products are
    not linear layers and are left out. Taught in chapter 15."""
    import torch

    tokens = checks.count("tokens", tokens)
    shapes = []
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            n, k = mod.weight.shape
            shapes += [(tokens, n, k), (tokens, k, n), (n, k, tokens)]
    if not shapes:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layers: no GEMMs to time")
    return shapes


def ab_gemms(cfg, a=(16, 1), b=(4, 4), *, rounds: int = 20, threads: int | None = 1, seed: int = 0):
    """A/B of the GEMMs alone of :func:`ab_micro_batch`'s two splits: per call, every linear layer's
    forward and backward GEMMs (:func:`step_gemm_shapes`) at micro-batch × seq_len rows, once per
    micro-batch — no norms, no elementwise ops, no autograd. Same clock, threads and interleaving as
    :func:`ab_micro_batch`, so the two A/Bs' gaps can be compared: the share of case B's extra step
    time that its smaller GEMMs explain. Taught in chapter 15."""
    import torch

    from labkit.hardware.measure import resolve_device
    from labkit.train.loop import build_model

    (ma, ka), (mb, kb) = _same_batch(a, b)
    device = resolve_device(cfg.device)
    model = build_model(cfg.replace(parallel="single", micro_batch=ma, accum=ka), device)
    seq = model.config.seq_len if cfg.seq_len is None else cfg.seq_len
    g = torch.Generator().manual_seed(seed)

    def arm(m, k):
        pairs = [(torch.randn(mm, kk, generator=g).to(device), torch.randn(kk, nn, generator=g).to(device))
                 for mm, nn, kk in step_gemm_shapes(model, m * seq)]

        def once():
            for _ in range(k):
                for x, w in pairs:
                    torch.mm(x, w)
        return once

    return _ab_splits(arm, a, b, device, rounds=rounds, threads=threads, seed=seed, what="'s GEMMs")


def _same_batch(a, b):
    (ma, ka), (mb, kb) = a, b
    if ma * ka != mb * kb:
        raise ValueError(f"a={a} and b={b} must hold the same sequences per step (micro_batch × accum)")
    return a, b


def _ab_splits(arm, a, b, device, *, rounds, threads, seed, what):
    """Time ``arm(micro_batch, accum)`` of splits a and b interleaved (:func:`labkit.measure.ab.ab_compare`): CPU seconds
    on ``threads`` torch threads, or wall seconds between synchronisations on a GPU."""
    import torch

    from labkit.measure.ab import ab_compare

    (ma, ka), (mb, kb) = a, b
    old, gpu = torch.get_num_threads(), device.type == "cuda"
    torch.set_num_threads(threads or old)
    try:
        return ab_compare(arm(ma, ka), arm(mb, kb), rounds=rounds, warmup=2, clock="wall" if gpu else "cpu",
                          device=device if gpu else None, seed=seed, unit="s",
                          labels=(f"A{what}: {ma} × accum {ka}", f"B{what}: {mb} × accum {kb}"))
    finally:
        torch.set_num_threads(old)

"""DDP's gradient buckets on live ranks, counted three ways: by torch, by the trace, by the rule.

:func:`measure_buckets` trains each DDP :class:`~labkit.train.TrainConfig` in the same ranks
(:func:`labkit.train.run_many`), profiled, with :func:`bucket_probe` at the end of the last step. Per run:

- **torch's own count**: ``ddp._get_ddp_logging_data()`` — ``num_buckets_reduced`` (buckets all-reduced in
  the last synchronised backward), ``rebuilt_bucket_sizes``, ``rebuilt_per_bucket_param_indices`` and
  ``prev_iteration_grad_ready_order_indices`` (the order gradients became ready);
- **the trace's count**: ``gloo:all_reduce`` / NCCL all-reduce events per rank per profiled step
  (:func:`labkit.trace.analyze`, ``comm_by_type``), which also counts the syncs of an accumulation;
- **the rule**: :func:`labkit.comm.buckets.ddp_buckets` from the parameter sizes — in reverse registration
  order (DDP's assumption) and in the logged ready order;
- what ``gradient_as_bucket_view`` changes: how many storages the ``.grad`` tensors live in (one per bucket
  when they are views into the buckets, one per parameter otherwise) and the gradient bytes held outside
  the buckets (the second copy it saves).

Taught in chapter 19 (DDP and gradient buckets).
"""
from __future__ import annotations

from pathlib import Path

from labkit import checks

__all__ = ["bucket_probe", "allreduces_per_step", "measure_buckets"]


def _ints(s) -> list[int]:
    return [int(x) for x in str(s).replace(",", " ").split()] if str(s).strip() else []


def bucket_probe(model, opt, cfg) -> dict:
    """In a rank, at the end of the last step (gradients still live): DDP's logged buckets and where the
    gradients are stored (see the module docstring). For :func:`labkit.train.run` / ``run_many``'s
    ``probe``. Taught in chapter 19."""
    inner = getattr(model, "_orig_mod", model)
    if not hasattr(inner, "_get_ddp_logging_data"):
        raise ValueError(f"bucket_probe needs a DistributedDataParallel model (parallel='ddp'), got "
                         f"{type(inner).__name__} for parallel={cfg.parallel!r}")
    d = inner._get_ddp_logging_data()
    per_bucket = [_ints(b) for b in str(d.get("rebuilt_per_bucket_param_indices", "")).split(",") if b.strip()]
    params = [p for p in dict.fromkeys(inner.module.parameters()) if p.requires_grad]
    grads = [p.grad for p in params if p.grad is not None]
    storages = {g.untyped_storage().data_ptr() for g in grads}
    bucket_bytes = _ints(d.get("rebuilt_bucket_sizes", ""))
    own = sum(g.numel() * g.element_size() for g in grads) if len(storages) > len(bucket_bytes) else 0
    return {"num_buckets_reduced": int(d["num_buckets_reduced"]), "bucket_bytes": bucket_bytes,
            "bucket_indices": per_bucket, "ready_order": _ints(d.get("prev_iteration_grad_ready_order_indices", "")),
            "bucket_cap_bytes": int(d["bucket_cap_bytes"]), "has_rebuilt_buckets": int(d["has_rebuilt_buckets"]),
            "gradient_as_bucket_view": int(d["gradient_as_bucket_view"]), "grad_storages": len(storages),
            "n_params": len(params), "grad_bytes_outside_buckets": own,
            "param_shapes": [list(p.shape) for p in params], "param_bytes": [p.numel() * p.element_size()
                                                                              for p in params]}


def allreduces_per_step(trace_dir) -> float:
    """All-reduce events per rank per profiled step in a run's traces (``gloo:all_reduce`` on CPU, NCCL
    all-reduce kernels on GPU; :func:`labkit.trace.analyze`). Taught in chapter 19 (and lab 5)."""
    from labkit import trace

    an = trace.analyze(Path(trace_dir), workers=1)     # small traces: no process pool
    t = an.comm_by_type
    calls = t[t["type"].str.replace("_", "").str.lower().str.contains("allreduce")]["count"].sum()
    return float(calls) / (len(an.ranks) * len(an.steps))


def measure_buckets(cfgs, nprocs: int = 2, *, profile_root=None, timeout_s: float = 600):
    """Train each DDP config in the same ``nprocs`` ranks (profiled under ``profile_root``/<label> when
    given) and count its buckets three ways (module docstring). Returns (table, records): a pandas DataFrame
    indexed by label and the run records. Labels must differ. Taught in chapter 19."""
    import pandas as pd

    from labkit.comm.buckets import ddp_buckets
    from labkit.train import run_many

    cfgs = list(cfgs)
    if not cfgs:
        raise ValueError("measure_buckets needs at least one TrainConfig")
    for c in cfgs:
        if getattr(c, "parallel", None) != "ddp":
            raise ValueError(f"measure_buckets counts DDP's buckets: every config needs parallel='ddp', got "
                             f"{getattr(c, 'parallel', c)!r} (label {getattr(c, 'label', '?')!r})")
    labels = [c.label for c in cfgs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must differ (one trace folder each), got {labels}")
    nprocs = checks.count("nprocs", nprocs, at_least=2)
    if profile_root is not None:
        cfgs = [c.replace(profile_dir=str(Path(profile_root) / c.label)) for c in cfgs]
    recs = run_many(cfgs, nprocs, timeout_s=timeout_s, probe=bucket_probe)
    rows = []
    for c, r in zip(cfgs, recs, strict=True):
        p = r.extra["probe"]
        shapes = [tuple(s) for s in p["param_shapes"]]
        by_rule = ddp_buckets(shapes, bucket_cap_mb=c.bucket_cap_mb)
        by_ready = ddp_buckets(shapes, bucket_cap_mb=c.bucket_cap_mb, order=p["ready_order"])
        syncs = 1 if c.no_sync else c.accum
        row = {"label": c.label, "cap MiB": "None (default)" if c.bucket_cap_mb is None else c.bucket_cap_mb,
               "predicted": by_rule.n_buckets, "predicted (ready order)": by_ready.n_buckets,
               "num_buckets_reduced": p["num_buckets_reduced"], "rebuilt buckets": len(p["bucket_bytes"]),
               "bytes match": list(by_ready.nbytes) == p["bucket_bytes"],
               "syncs/step": syncs, "predicted all-reduces/step": by_rule.n_buckets * syncs,
               "first bucket KiB": p["bucket_bytes"][0] / 1024 if p["bucket_bytes"] else 0.0,
               "grad storages": p["grad_storages"], "grad MB outside buckets": p["grad_bytes_outside_buckets"] / 1e6,
               "loss": r.loss, "step ms": r.step_time.median * 1e3, "step p10 ms": r.step_time.p10 * 1e3,
               "step p90 ms": r.step_time.p90 * 1e3}
        if c.profile_dir:
            row["trace all-reduces/step"] = allreduces_per_step(c.profile_dir)
        rows.append(row)
    return pd.DataFrame(rows).set_index("label"), recs

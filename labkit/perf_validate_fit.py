"""α–β of each gloo collective a data-parallel wrapper issues, fitted on this machine (issue #15).

DDP issues all-reduces; FSDP2 (torch ≥ 2.4 ``fully_shard``) issues, per unit, ``all_gather_single``
(= ``all_gather_into_tensor``) of the flat parameter shards and ``reduce_scatter_single``
(= ``reduce_scatter_tensor``) of the flat gradients (torch/distributed/fsdp/_fully_shard/
_fsdp_collectives.py). gloo implements these differently from its all-reduce, so one α–β fitted to
an all-reduce sweep misprices them: each collective type gets its own fit, from its own sweep at the
sizes the wrappers issue, never from a training run.

Layer 3 (ARCHITECTURE.md): it launches ranks (:func:`labkit.comm.benchmark`); the ring model and the fit
are :mod:`labkit.comm.models`'. Used by :mod:`labkit.perf_validate`. Taught in chapter 11 (α–β fits),
chapter 19 (DDP) and chapter 20 (FSDP's collectives).
"""
from __future__ import annotations

from labkit import checks

__all__ = ["LINK_OPS", "fit_gloo_link", "fit_gloo_links"]

#: The collectives fitted: all_reduce (DDP's buckets), all_gather and reduce_scatter (FSDP2's units).
LINK_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def _fit_table(table, ops, n: int, stat: str) -> dict:
    """{op: AlphaBeta} from a :func:`labkit.comm.benchmark` table: one ring fit per op of its ``stat``."""
    from labkit import comm

    col = "time_us" if stat == "median" else "p10_us"
    out = {}
    for op in ops:
        t = table[table["op"] == op]
        if t.empty:
            raise ValueError(f"the benchmark table has no rows for op={op!r} (it has {sorted(set(table['op']))})")
        out[op] = comm.fit_alpha_beta(t["size"], t[col] * 1e-6, op, n)
    return out


def fit_gloo_links(nranks: int, ops=LINK_OPS, *, sizes=None, iters: int = 5, stat: str = "p10",
                   timeout_s: float = 300) -> dict:
    """{op: :class:`labkit.comm.AlphaBeta`} — one ring α–β per collective in ``ops`` (of :data:`LINK_OPS`),
    each fitted to its own gloo sweep on ``nranks`` ranks, all ops timed in one launch.

    ``sizes`` in bytes, nccl-tests S (the total buffer: an all-gather's output, a reduce-scatter's input;
    default 64 KiB … 16 MiB ×4, which holds the tiny and small GPTs' DDP buckets and FSDP2 units); ``stat``:
    "p10" (the collective undisturbed; default) or "median". The reduce-scatter fit is of gloo's own
    ``reduce_scatter_tensor``, whatever it runs underneath. Taught in chapter 20 and chapter 11.
    """
    from labkit import comm

    n = checks.count("nranks", nranks, at_least=2)
    checks.one_of("stat", stat, ("median", "p10"))
    ops = [checks.one_of("ops", o, LINK_OPS) for o in ((ops,) if isinstance(ops, str) else ops)]
    if not ops:
        raise ValueError(f"ops must name at least one of {LINK_OPS}")
    sizes = comm.default_sizes(64 * 1024, 16 * 2**20, 4) if sizes is None else list(sizes)
    t = comm.benchmark(ops, sizes, n, iters=iters, warmup=2, backend="gloo", timeout_s=timeout_s).table
    return _fit_table(t, ops, n, stat)


def fit_gloo_link(nranks: int, *, sizes=None, iters: int = 5, stat: str = "p10", timeout_s: float = 300):
    """α and β (:class:`labkit.comm.AlphaBeta`) of an all-reduce sweep on ``nranks`` gloo ranks
    (:func:`fit_gloo_links` with the all-reduce alone). Taught in chapter 19 (DDP) and chapter 11 (α–β fits).
    """
    return fit_gloo_links(nranks, ("all_reduce",), sizes=sizes, iters=iters, stat=stat,
                          timeout_s=timeout_s)["all_reduce"]

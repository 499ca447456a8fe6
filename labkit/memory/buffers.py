"""Communication buffers per rank, predicted: DDP's gradient buckets and FSDP's unit buffers — the bytes
that model-state estimators (:mod:`labkit.memory.estimate`) leave out.

DDP copies gradients into flat buckets, filled in reverse registration order and closed at
``bucket_cap_mb`` (torch ``_compute_bucket_assignment_by_size``); FSDP holds the all-gathered parameters of
the largest unit (twice with prefetch) and one unit's unsharded gradients for the reduce-scatter (Zhao et al.
2023, §3.2–3.3).

Taught in chapter 13 (memory anatomy), chapter 19 (DDP buckets) and chapter 20 (FSDP / ZeRO).
"""
from __future__ import annotations

import math
import numbers

from labkit import checks
from labkit.memory.estimate import PRECISIONS, _numels, canonical_strategy

__all__ = ["ddp_bucket_sizes", "comm_buffer_bytes"]


def ddp_bucket_sizes(params, *, bucket_cap_mb: float = 25.0, dtype_bytes: int = 4) -> list[int]:
    """Byte sizes of DDP's gradient buckets in steady state (after DDP rebuilds them on the first step).

    ``params``: an ``nn.Module`` or a list of parameter shapes / element counts in registration order.
    DDP fills buckets in (approximately) reverse registration order — the order gradients become ready in
    backward — and closes a bucket once it holds ≥ ``bucket_cap_mb`` MiB, so a parameter larger than the
    cap gets a bucket of its own and buckets slightly exceed the cap (torch
    ``_compute_bucket_assignment_by_size``; https://pytorch.org/docs/stable/notes/ddp.html). One all-reduce
    per bucket per step. Taught in chapter 19 (DDP buckets) and chapter 13.
    """
    bucket_cap_mb = checks.positive("bucket_cap_mb", bucket_cap_mb)
    dtype_bytes = checks.count("dtype_bytes", dtype_bytes)
    items = _numels(params, "params")
    cap = bucket_cap_mb * 2**20
    sizes, cur = [], 0
    for it in reversed(items):
        cur += (math.prod(it) if isinstance(it, tuple) else it) * dtype_bytes
        if cur >= cap:
            sizes.append(int(cur))
            cur = 0
    if cur:
        sizes.append(int(cur))
    return sizes


def comm_buffer_bytes(n_params, *, strategy: str = "ddp", n_ranks: int = 1, precision: str = "fp32",
                      bucket_cap_mb: float = 25.0, unit_params: int | None = None, prefetch: bool = True,
                      gradient_as_bucket_view: bool = False) -> dict:
    """Communication buffers per rank (bytes) — what model-state estimators leave out.

    DDP: gradients are copied into flat buckets (:func:`ddp_bucket_sizes`; pass a module or shapes for
    the exact split) — a second copy of all gradients unless ``gradient_as_bucket_view=True``. FSDP: the all-gathered (unsharded) parameters of the largest
    wrapped unit, ×2 when the next unit is prefetched, plus the unsharded gradients of one unit for
    reduce-scatter (PyTorch FSDP, Zhao et al. 2023, §3.2–3.3). Taught in chapter 13 and chapter 20.
    """
    strat = canonical_strategy(strategy)
    checks.one_of("precision", precision, PRECISIONS)
    checks.count("n_ranks", n_ranks)
    bucket_cap_mb = checks.positive("bucket_cap_mb", bucket_cap_mb)
    prefetch = checks.flag("prefetch", prefetch)
    gradient_as_bucket_view = checks.flag("gradient_as_bucket_view", gradient_as_bucket_view)
    if unit_params is not None:
        unit_params = checks.count("unit_params", unit_params)
    items = _numels(n_params)
    psi = sum(math.prod(i) if isinstance(i, tuple) else i for i in items)
    pb, gb, _ = PRECISIONS[precision]
    compute_b = 2 if precision in ("bf16_mixed", "bf16_autocast") else 4
    if strat in ("ddp", "fsdp_no_shard", "zero1"):
        grad_total = psi * gb
        one_count = isinstance(n_params, numbers.Integral)
        buckets = ddp_bucket_sizes(items, bucket_cap_mb=bucket_cap_mb, dtype_bytes=gb)
        if one_count:                   # no parameter shapes: assume parameters small against the cap
            cap = bucket_cap_mb * 2**20
            if grad_total / cap > 1e7:
                raise ValueError(f"n_params={n_params!r} with bucket_cap_mb={bucket_cap_mb!r} gives "
                                 f"{grad_total / cap:.3g} DDP buckets: the inputs are beyond any meaningful range")
            buckets = [int(cap)] * int(grad_total // cap) + ([int(grad_total % cap)] if grad_total % cap else [])
        return {"kind": "ddp_buckets", "bytes": 0 if gradient_as_bucket_view else grad_total,
                "n_buckets": len(buckets), "bucket_bytes": buckets, "bucket_cap_bytes": bucket_cap_mb * 2**20}
    if unit_params is None:
        raise ValueError("unit_params (parameters of the largest FSDP unit, e.g. one transformer block) "
                         f"is needed for strategy={strat!r}")
    ag = unit_params * compute_b * (2 if prefetch else 1)
    rs = unit_params * compute_b
    return {"kind": "fsdp_unit_buffers", "bytes": ag + rs, "all_gather": ag, "reduce_scatter": rs}

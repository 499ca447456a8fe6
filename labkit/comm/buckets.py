"""DDP's gradient buckets from the parameter sizes, and what the bucket size does to a step (α–β).

**The rule** (torch 2.13, read from its source):

- ``torch/nn/parallel/distributed.py``, ``_BucketCapacityConfig.create``: ``bucket_cap_mb=None`` (the
  default) means a 25 MiB cap *and* a first bucket of ``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB; a cap
  the user passes — even ``25`` — is used for every bucket, the first included (:func:`ddp_caps`).
- On the first iteration DDP (without ``find_unused_parameters``) reduces all gradients as one bucket
  (``compute_bucket_size_limits`` returns ``[sys.maxsize]``: the parameter order need not be the order
  gradients arrive in). During that backward the reducer records the order gradients became ready, and
  before the second forward ``Reducer::rebuild_buckets`` re-buckets them in that order with the limits
  ``[first_bucket_bytes_cap, bucket_bytes_cap]``.
- ``compute_bucket_assignment_by_size`` (``torch/csrc/distributed/c10d/reducer.cpp``): walk the tensors in
  order; add each to the open bucket of its (dtype, device); once the bucket holds **≥** its limit, close it
  and move that key to the next limit (the last limit repeats). Open buckets are closed at the end. So a
  bucket overshoots its cap by up to one parameter, and a parameter larger than the cap is a bucket alone.
- One all-reduce per bucket per synchronised backward, launched when the bucket's last gradient is ready
  (Li et al. 2020, *PyTorch Distributed*, VLDB, §3.2.3, https://arxiv.org/abs/2006.15704).

:func:`ddp_buckets` applies the rule to a module or to sizes in *reverse registration order* (DDP's own
assumption: forward uses parameters in the order they are defined) or to an observed gradient-ready order
(``ddp._get_ddp_logging_data()["prev_iteration_grad_ready_order_indices"]``).

**What the size costs** (:func:`bucket_schedule`, :func:`cap_sweep`): gradients are produced through
backward (assumed at a uniform rate per byte); bucket i's all-reduce starts when its last gradient exists
and the previous all-reduce is done (one communication stream) and takes the ring time α·2(N−1) +
2(N−1)/N·S·β (:func:`labkit.comm.models.ring_time`). What runs past the end of backward is *exposed*.
Many tiny buckets pay α per bucket; one huge bucket cannot start before backward ends.

Pure (layer 1). Taught in chapter 19 (DDP and gradient buckets).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from labkit import checks
from labkit.comm.models import ring_time

__all__ = ["DEFAULT_CAP_MB", "FIRST_BUCKET_BYTES", "BucketPlan", "ddp_caps", "assign_buckets", "ddp_buckets",
           "bucket_schedule", "cap_sweep"]

MIB = 2**20
DEFAULT_CAP_MB = 25.0              # torch/nn/parallel/distributed.py: _DEFAULT_BUCKET_CAP_MB
FIRST_BUCKET_BYTES = 1 * MIB       # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (reducer.hpp kDefaultFirstBucketBytes)


def _seq(name: str, value) -> list:
    """``value`` as a list if it is a list or tuple; else an error naming ``name``."""
    if not isinstance(value, (list, tuple)):
        raise checks.ArgumentTypeError(f"{name} must be a list or tuple, got {type(value).__name__} {value!r:.60}")
    return list(value)


def ddp_caps(bucket_cap_mb: float | None = None) -> tuple[int, int]:
    """(first bucket's limit, every other bucket's limit) in bytes, as torch 2.13's DDP sets them:
    ``None`` → (1 MiB, 25 MiB); a number c → (c MiB, c MiB) — passing ``25`` explicitly drops the small
    first bucket. Taught in chapter 19."""
    if bucket_cap_mb is None:
        return FIRST_BUCKET_BYTES, int(DEFAULT_CAP_MB * MIB)
    mb = checks.positive("bucket_cap_mb", bucket_cap_mb)
    if mb * MIB > 2**62:
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} is beyond any memory; give a cap ≤ {2**42:g} MiB")
    cap = int(mb * MIB)
    if cap < 1:
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} is below one byte; give a cap ≥ {1 / MIB:.3g} MiB")
    return cap, cap


def assign_buckets(nbytes, limits, keys=None) -> list[list[int]]:
    """Buckets (lists of positions into ``nbytes``, in order) by torch's ``compute_bucket_assignment_by_size``:
    walk ``nbytes`` in order, add each to the open bucket of its key (``keys[i]``, e.g. (dtype, device); one
    key if None), close a bucket once it holds ≥ its limit and move that key on to the next of ``limits``
    (the last repeats); close the open buckets at the end. Taught in chapter 19."""
    sizes = [checks.count(f"nbytes[{i}]", b, at_least=0) for i, b in enumerate(_seq("nbytes", nbytes))]
    lims = [checks.count(f"limits[{i}]", x) for i, x in enumerate(_seq("limits", limits))]
    if not lims:
        raise ValueError("limits must hold at least one bucket size limit in bytes, got none")
    keys = [None] * len(sizes) if keys is None else _seq("keys", keys)
    if len(keys) != len(sizes):
        raise ValueError(f"keys has {len(keys)} entries for {len(sizes)} tensors: give one key per tensor or None")
    out, open_, filled, which = [], {}, {}, {}
    for i, (b, k) in enumerate(zip(sizes, keys, strict=True)):
        open_.setdefault(k, []).append(i)
        filled[k] = filled.get(k, 0) + b
        j = which.setdefault(k, 0)
        if filled[k] >= lims[j]:
            out.append(open_.pop(k))
            filled[k] = 0
            which[k] = min(j + 1, len(lims) - 1)
    out.extend(v for v in open_.values() if v)
    return out


@dataclass(frozen=True)
class BucketPlan:
    """DDP's buckets in reduction order: ``indices`` (parameter indices per bucket, registration numbering),
    ``nbytes`` (bytes per bucket), the limits (``first_cap_bytes``, ``cap_bytes``) and the ``order`` the
    parameters were bucketed in. Taught in chapter 19."""

    indices: tuple
    nbytes: tuple
    first_cap_bytes: int
    cap_bytes: int
    order: tuple

    @property
    def n_buckets(self) -> int:
        return len(self.nbytes)

    @property
    def total_bytes(self) -> int:
        return sum(self.nbytes)

    def table(self):
        """One row per bucket: its index, parameters, bytes, MiB and limit (a pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame([{"bucket": i, "parameters": len(ix), "bytes": b, "MiB": b / MIB,
                              "limit MiB": (self.first_cap_bytes if i == 0 else self.cap_bytes) / MIB}
                             for i, (ix, b) in enumerate(zip(self.indices, self.nbytes, strict=True))])


def _sizes(params, dtype_bytes: int) -> tuple[list[int], list]:
    """(bytes, key) per parameter in registration order: from a module (each distinct parameter that needs a
    gradient, as DDP registers them: tied weights once) or from element counts / shapes."""
    if hasattr(params, "parameters"):
        ps = [p for p in dict.fromkeys(params.parameters()) if p.requires_grad]
        return [p.numel() * p.element_size() for p in ps], [(str(p.dtype), str(p.device)) for p in ps]
    if not isinstance(params, (list, tuple)):
        raise checks.ArgumentTypeError(f"params must be an nn.Module or a list of element counts / shapes, got "
                                       f"{type(params).__name__} {params!r:.60}")
    items = list(params)
    if not items:
        raise ValueError("params is empty: DDP needs at least one parameter")
    out = []
    for i, it in enumerate(items):
        n = math.prod(checks.count(f"params[{i}] dimension", d, at_least=0) for d in it) \
            if isinstance(it, (tuple, list)) else checks.count(f"params[{i}]", it, at_least=0)
        out.append(n * dtype_bytes)
    return out, [None] * len(out)


def ddp_buckets(params, *, bucket_cap_mb: float | None = None, order=None, dtype_bytes: int = 4) -> BucketPlan:
    """DDP's steady-state buckets (after the rebuild of the first iteration) for ``params`` — an ``nn.Module``
    or element counts / shapes in registration order (``dtype_bytes`` each). ``order``: None → reverse
    registration order (DDP's assumption); else the parameter indices in gradient-ready order (as DDP logs
    them in ``prev_iteration_grad_ready_order_indices``). See the module docstring for torch's rule.
    Taught in chapter 19."""
    dtype_bytes = checks.count("dtype_bytes", dtype_bytes)
    nbytes, keys = _sizes(params, dtype_bytes)
    n = len(nbytes)
    if order is None:
        order = list(range(n - 1, -1, -1))
    else:
        order = [checks.count("order index", i, at_least=0) for i in _seq("order", order)]
        if sorted(order) != list(range(n)):
            raise ValueError(f"order must be a permutation of the {n} parameter indices 0..{n - 1}, got "
                             f"{order!r:.80}")
    first, cap = ddp_caps(bucket_cap_mb)
    groups = assign_buckets([nbytes[i] for i in order], [first, cap], [keys[i] for i in order])
    idx = tuple(tuple(order[j] for j in g) for g in groups)
    return BucketPlan(indices=idx, nbytes=tuple(sum(nbytes[i] for i in g) for g in idx), first_cap_bytes=first,
                      cap_bytes=cap, order=tuple(order))


def bucket_schedule(bucket_bytes, *, backward_s: float, nranks: int, alpha_s: float,
                    beta_s_per_byte: float) -> dict:
    """When each bucket's all-reduce runs against one backward of ``backward_s`` seconds (buckets in
    reduction order, gradients produced at a uniform rate per byte, one communication stream, ring
    all-reduce α–β): ``ready_s``, ``start_s``, ``end_s`` per bucket, ``comm_s`` (their sum), ``exposed_s``
    (past the end of backward) and ``hidden`` (share of comm_s under backward). Taught in chapter 19."""
    sizes = [checks.nonneg(f"bucket_bytes[{i}]", b) for i, b in enumerate(_seq("bucket_bytes", bucket_bytes))]
    if not sizes:
        raise ValueError("bucket_bytes is empty: give the bytes of at least one bucket")
    T = checks.nonneg("backward_s", backward_s)
    n = checks.count("nranks", nranks)
    a, b = checks.nonneg("alpha_s", alpha_s), checks.nonneg("beta_s_per_byte", beta_s_per_byte)
    total = sum(sizes)
    ready, start, end, done, t = [], [], [], 0.0, 0.0
    for s in sizes:
        done += s
        r = T * done / total if total else T
        st = max(r, t)
        t = st + ring_time("all_reduce", s, n, alpha=a, beta=b)
        ready.append(r)
        start.append(st)
        end.append(t)
    comm = sum(e - s for s, e in zip(start, end, strict=True))
    exposed = max(0.0, t - T)
    checks.finite_result("bucket schedule", t, backward_s=backward_s, nranks=nranks)
    return {"ready_s": ready, "start_s": start, "end_s": end, "comm_s": comm, "exposed_s": exposed,
            "hidden": max(0.0, (comm - exposed) / comm) if comm else 1.0, "n_buckets": len(sizes)}


def cap_sweep(params, caps_mb, *, backward_s: float, nranks: int, alpha_s: float, beta_s_per_byte: float,
              dtype_bytes: int = 4):
    """:func:`ddp_buckets` and :func:`bucket_schedule` for each cap in ``caps_mb`` (None = torch's default):
    a pandas DataFrame with the buckets, the all-reduce time, the exposed time and the step (backward +
    exposed). ``params``: a module, element counts / shapes, or one int (a total element count split into
    equal cap-sized buckets — a model of many small parameters). Taught in chapter 19."""
    import pandas as pd

    caps = _seq("caps_mb", caps_mb)
    if not caps:
        raise ValueError("caps_mb is empty: give at least one bucket_cap_mb (None = torch's default)")
    for i, c in enumerate(caps):
        if c is not None:
            checks.positive(f"caps_mb[{i}]", c)
    dtype_bytes = checks.count("dtype_bytes", dtype_bytes)
    whole = isinstance(params, numbers.Integral) and not isinstance(params, (bool, np.bool_))
    rows = []
    for c in caps:
        if whole:
            total = checks.count("params", params) * dtype_bytes
            first, cap = ddp_caps(c)
            if total / cap > 1e6:
                raise ValueError(f"params={params} at bucket_cap_mb={c!r} gives {total / cap:.3g} buckets: give a "
                                 "cap ≥ 1e-6 of the gradient bytes")
            sizes = [min(first, total)]
            rest = total - sizes[0]
            sizes += [cap] * int(rest // cap) + ([rest % cap] if rest % cap else [])
        else:
            sizes = list(ddp_buckets(params, bucket_cap_mb=c, dtype_bytes=dtype_bytes).nbytes)
        s = bucket_schedule(sizes, backward_s=backward_s, nranks=nranks, alpha_s=alpha_s,
                            beta_s_per_byte=beta_s_per_byte)
        rows.append({"cap MiB": "default (1 + 25)" if c is None else c, "buckets": len(sizes),
                     "all-reduce ms": s["comm_s"] * 1e3, "exposed ms": s["exposed_s"] * 1e3,
                     "hidden": s["hidden"], "step ms": (backward_s + s["exposed_s"]) * 1e3})
    return pd.DataFrame(rows)

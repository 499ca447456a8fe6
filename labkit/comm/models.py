"""Bandwidth conventions and α–β cost models of collectives (``labkit.comm.models``, layer 1: pure).

Taught in chapter 11 (communication diagnostics) and chapter 23 (multi-node scaling). Arguments are
checked with :mod:`labkit.checks` (an error names the parameter, the value and what is valid).

**algbw and busbw** follow nccl-tests (NVIDIA/nccl-tests ``doc/PERFORMANCE.md``,
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): ``algbw = S / t`` and
``busbw = algbw × factor`` where the factor re-scales the algorithm bandwidth to the bytes each rank's
link must carry, so busbw can be compared with the hardware's link bandwidth whatever the rank count:

===============  ===================  ==========================================================
op               factor               S (bytes)
===============  ===================  ==========================================================
all_reduce       2(n−1)/n             the buffer each rank holds
all_gather       (n−1)/n              the *total* (gathered) output = sendcount·n·sizeof
reduce_scatter   (n−1)/n              the *total* input = recvcount·n·sizeof
broadcast        1                    the buffer
reduce           1                    the buffer
all_to_all       (n−1)/n              the buffer each rank sends (all destinations together)
send_recv        1                    the buffer
gather           (n−1)/n              the *total* output at the root = sendcount·n·sizeof
scatter          (n−1)/n              the *total* input at the root = recvcount·n·sizeof
hypercube        1                    count·sizeof·(n−1) (each rank receives every other's chunk)
===============  ===================  ==========================================================

The last three (and ``alltoallv_perf``, read as all_to_all) come from the ``*GetBw`` functions of
nccl-tests' ``src/gather.cu``, ``scatter.cu``, ``hypercube.cu``, ``alltoallv.cu`` (commit a0b82b2, 2026);
PERFORMANCE.md lists only the first six. :data:`NCCL_TESTS` maps each nccl-tests binary
(``all_reduce_perf`` …, the name its header prints after "Collective test starting:") to these ops.

**NVLS (NVLink SHARP) and in-network all-reduce.** From NCCL 2.17 an all-reduce inside an NVSwitch
node can run as NVLS: the switch adds the GPUs' buffers itself (multimem loads that reduce, stores
that broadcast), so each GPU's link carries about S·(1 + 1/n) each way instead of the ring's
2(n−1)/n·S (:func:`link_factor` with ``algorithm="nvls"``; the 1/n is the GPU's own shard, which also
crosses the switch). nccl-tests does not know the algorithm and keeps ``busbw = algbw·2(n−1)/n`` "for
consistency" (maintainer, https://github.com/NVIDIA/nccl-tests/issues/366): under NVLS busbw reads as
"the link bandwidth a ring would need", and can exceed the link — 8×H100 reach ≈480 GB/s over 450 GB/s
NVLink (https://github.com/NVIDIA/nccl/issues/2140, /issues/1374). The link-bound ceiling of the busbw
column is then ``link_bw × 2(n−1)/(n+1)`` (1.56× at n = 8). SHARP on InfiniBand switches (NCCL's
CollNet) is the same idea between nodes.

**α–β models.** A message of m bytes over one link costs α + mβ (α latency, β = 1/bandwidth).
The ring algorithms (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009; Thakur, Rabenseifner & Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 2005) cut the buffer into n chunks: reduce-scatter and all-gather
take n−1 steps of S/n bytes each, all-reduce = reduce-scatter + all-gather = 2(n−1) steps::

    t_ring(all_reduce) = 2(n−1)·α + 2·(n−1)/n · S·β

so the bandwidth term of every ring op is ``bus_factor(op, n) · S · β`` — which is exactly why busbw
of a bandwidth-bound ring approaches the link bandwidth 1/β. Broadcast and reduce are pipelined
chains (n−1 hops of latency, S·β of bandwidth, NCCL's ring broadcast/reduce).

Trees: NCCL's double binary tree (Sanders, Speck & Träff, "Two-tree algorithms for full bandwidth
broadcast, reduction and scan", Parallel Computing 2009) pipelines a reduce up and a broadcast down
a tree of depth ⌈log2 n⌉: ``t ≈ 2⌈log2 n⌉·α + 2·S·β`` (NCCL maintainers: tree busBw = 2·algBw,
https://github.com/NVIDIA/nccl-tests/issues/274). Latency grows with log n instead of n, which is why
NCCL picks trees for small messages at scale. Unpipelined binomial trees pay the full S at every
level: ``2⌈log2 n⌉·(α + S·β)``.

Two-level hierarchy (chapter 23): with g ranks per node and m nodes, all-reduce = intra-node
reduce-scatter (S over g) + inter-node all-reduce of S/g over m nodes + intra-node all-gather.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from labkit import checks
from labkit.checks import ArgumentTypeError, count, finite_result, flag, nonneg, one_of, positive

__all__ = ["OPS", "ALL_OPS", "NCCL_TESTS", "DTYPE_BYTES", "canonical_op", "bus_factor", "link_factor", "bytes_of",
           "algbw", "busbw", "ring_steps", "ring_time", "tree_time", "hierarchical_time", "AlphaBeta",
           "fit_alpha_beta"]

#: The ops labkit's live benchmark runs (each has a torch.distributed call).
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send_recv")
#: Every op with a bus factor: OPS plus the nccl-tests-only gather, scatter and hypercube.
ALL_OPS = OPS + ("gather", "scatter", "hypercube")
#: nccl-tests binaries (src/*.cu, one per test) → op. alltoallv_perf's busbw uses all_to_all's factor on
#: the largest per-rank volume (src/alltoallv.cu).
NCCL_TESTS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
              "reduce_scatter_perf": "reduce_scatter", "broadcast_perf": "broadcast", "reduce_perf": "reduce",
              "alltoall_perf": "all_to_all", "alltoallv_perf": "all_to_all", "sendrecv_perf": "send_recv",
              "gather_perf": "gather", "scatter_perf": "scatter", "hypercube_perf": "hypercube"}
#: Bytes per element of each type name nccl-tests prints in its ``type`` column (src/common.cu
#: ``test_typenames``; "char"/"int" from NCCL 1 builds), plus the usual spellings of the same types.
DTYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "f8e4m3": 1, "f8e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
               "half": 2, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
               "int32": 4, "uint32": 4, "int": 4, "float": 4, "float32": 4, "fp32": 4,
               "int64": 8, "uint64": 8, "double": 8, "float64": 8, "fp64": 8}
_ALIASES = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
    "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast", "bcast": "broadcast", "reduce": "reduce",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "sendrecv": "send_recv", "send_recv": "send_recv", "send/recv": "send_recv", "p2p": "send_recv",
    "alltoallv": "all_to_all", "gather": "gather", "scatter": "scatter", "hypercube": "hypercube",
}


def canonical_op(op: str) -> str:
    """Normalise an op name (``"allreduce"``, ``"all_reduce_perf"``, ``"AllGather"`` …) to one of :data:`ALL_OPS`.

    Taught in chapter 11 (communication diagnostics).
    """
    if not isinstance(op, str):
        raise ArgumentTypeError(f"op must be a str, got {type(op).__name__} {op!r}")
    key = op.strip().lower().replace("-", "_")
    if key.endswith("_perf"):
        key = key[: -len("_perf")]
    key2 = key.replace("_", "")
    if key in _ALIASES:
        return _ALIASES[key]
    if key2 in _ALIASES:
        return _ALIASES[key2]
    raise ValueError(f"op={op!r} is not a known collective; valid: {', '.join(ALL_OPS)} "
                     f"or an nccl-tests binary ({', '.join(NCCL_TESTS)})")


def bus_factor(op: str, nranks: int) -> float:
    """nccl-tests' busbw/algbw factor for ``op`` on ``nranks`` ranks (see the module table).

    Taught in chapter 11 (communication diagnostics).
    """
    op = canonical_op(op)
    n = count("nranks", nranks)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, send_recv, hypercube


def link_factor(op: str, nranks: int, *, algorithm: str = "ring") -> float:
    """Bytes each rank's link carries per direction, over nccl-tests' S, for ``algorithm``.

    ``"ring"`` (and every point-to-point algorithm): :func:`bus_factor` — busbw is then the link's
    bandwidth. ``"nvls"`` (NVLink SHARP, all_reduce only): (n+1)/n, the switch reduces (module
    docstring); ``bus_factor / link_factor`` is how far nccl-tests' busbw can exceed the link.
    Taught in chapter 11 (communication diagnostics) and chapter 23.
    """
    op = canonical_op(op)
    n = count("nranks", nranks)
    if one_of("algorithm", algorithm, ("ring", "nvls")) == "ring":
        return bus_factor(op, n)
    if op != "all_reduce":
        raise ValueError(f"algorithm='nvls' with op={op!r} is not modelled: NVLS here is all_reduce only")
    return (n + 1) / n


def bytes_of(count: int, dtype: str) -> int:
    """Bytes of ``count`` elements of ``dtype``, a type name as nccl-tests prints it (``float``,
    ``half``, ``bfloat16``, ``int8``, ``f8e4m3`` …, see :data:`DTYPE_BYTES`); nccl-tests' ``size``
    column is ``bytes_of(count, type)`` for all_reduce/broadcast/reduce/sendrecv rows.

    Taught in chapter 11 (communication diagnostics).
    """
    n = checks.count("count", count, at_least=0)     # the parameter shadows checks.count here
    if not isinstance(dtype, str):
        raise ArgumentTypeError(f"dtype must be a str such as 'float' or 'bfloat16', got {type(dtype).__name__} "
                                f"{dtype!r}")
    key = dtype.strip().lower().removeprefix("torch.").removeprefix("nccl")
    if key not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not valid: choose one of {sorted(DTYPE_BYTES)}")
    return n * DTYPE_BYTES[key]


def algbw(op: str, size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth S/t in bytes/s (nccl-tests: ``algbw = S/t``; S as in the module table).

    Taught in chapter 11 (communication diagnostics).
    """
    canonical_op(op)
    bw = nonneg("size_bytes", size_bytes) / positive("time_s", time_s)
    return finite_result("algbw", bw, size_bytes=size_bytes, time_s=time_s)


def busbw(op: str, size_bytes: float, time_s: float, nranks: int) -> float:
    """Bus bandwidth in bytes/s: ``algbw × bus_factor(op, nranks)`` (nccl-tests PERFORMANCE.md).

    Taught in chapter 11 (communication diagnostics) and chapter 23.
    """
    return algbw(op, size_bytes, time_s) * bus_factor(op, nranks)


def ring_steps(op: str, nranks: int) -> int:
    """Number of sequential latency-bound steps of the ring / chain algorithm for ``op``.

    all_reduce 2(n−1) (reduce-scatter then all-gather, Patarasuk & Yuan 2009); all_gather,
    reduce_scatter, all_to_all (pairwise exchange) n−1; broadcast/reduce n−1 hops of a pipelined
    chain; gather/scatter n−1 transfers at the root; hypercube ⌈log2 n⌉ exchanges; send_recv 1.
    Taught in chapter 11.
    """
    op = canonical_op(op)
    n = count("nranks", nranks)
    if n == 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1)
    if op == "send_recv":
        return 1
    if op == "hypercube":
        return math.ceil(math.log2(n))
    return n - 1


def ring_time(op: str, size_bytes: float, nranks: int, *, alpha: float, beta: float) -> float:
    """Ring-model time in seconds: ``ring_steps·α + bus_factor·S·β`` (Thakur et al. 2005).

    ``alpha`` = per-step latency (s), ``beta`` = seconds per byte of one link (1/bandwidth).
    Taught in chapter 11 and chapter 23.
    """
    op = canonical_op(op)
    S = nonneg("size_bytes", size_bytes)
    a = nonneg("alpha", alpha)
    b = nonneg("beta", beta)
    n = count("nranks", nranks)
    return finite_result("ring time", _ring(op, S, n, a, b), size_bytes=size_bytes, nranks=nranks,
                         alpha=alpha, beta=beta)


def _ring(op: str, S: float, n: int, a: float, b: float) -> float:
    """The ring formula on checked arguments (``op`` canonical)."""
    if n == 1:
        return 0.0
    return ring_steps(op, n) * a + bus_factor(op, n) * S * b


def tree_time(op: str, size_bytes: float, nranks: int, *, alpha: float, beta: float,
              pipelined: bool = True) -> float:
    """Tree-model time in seconds for all_reduce / broadcast / reduce.

    Pipelined (NCCL double binary tree, Sanders et al. 2009): all_reduce ``2⌈log2 n⌉α + 2Sβ``,
    broadcast/reduce ``⌈log2 n⌉α + Sβ``. Unpipelined binomial tree: ``⌈log2 n⌉(α + Sβ)`` per
    direction. Taught in chapter 11 and chapter 23.
    """
    op = canonical_op(op)
    if op not in ("all_reduce", "broadcast", "reduce"):
        raise ValueError(f"op={op!r}: tree_time models all_reduce, broadcast and reduce only")
    S = nonneg("size_bytes", size_bytes)
    a = nonneg("alpha", alpha)
    b = nonneg("beta", beta)
    n = count("nranks", nranks)
    pipelined = flag("pipelined", pipelined)
    if n == 1:
        return 0.0
    depth = math.ceil(math.log2(n))
    passes = 2 if op == "all_reduce" else 1
    t = passes * (depth * a + S * b) if pipelined else passes * depth * (a + S * b)
    return finite_result("tree time", t, size_bytes=size_bytes, nranks=nranks, alpha=alpha, beta=beta)


def hierarchical_time(op: str, size_bytes: float, nranks: int, *, alpha: float, beta: float,
                      ranks_per_node: int, alpha_inter: float, beta_inter: float) -> float:
    """Two-level (intra-node / inter-node) ring model, seconds.

    ``alpha``/``beta`` describe the intra-node link (NVLink, PCIe), ``alpha_inter``/``beta_inter`` the
    network per rank's share of the NIC. all_reduce = intra reduce-scatter (S over g ranks) + inter
    all-reduce of S/g over m = n/g nodes + intra all-gather; all_gather / reduce_scatter = the matching
    half of that. Other ops fall back to a flat ring on the slower link. Taught in chapter 23.
    """
    op = canonical_op(op)
    S = nonneg("size_bytes", size_bytes)
    n = count("nranks", nranks)
    # every argument checked under its own name, whichever path below uses it
    a, b = nonneg("alpha", alpha), nonneg("beta", beta)
    ai, bi = nonneg("alpha_inter", alpha_inter), nonneg("beta_inter", beta_inter)
    g = count("ranks_per_node", ranks_per_node)
    if n % g:
        raise ValueError(f"nranks={n} is not a multiple of ranks_per_node={g}: use a whole number of nodes")
    m = n // g
    if m == 1:
        t = _ring(op, S, n, a, b)
    elif g == 1:
        t = _ring(op, S, n, ai, bi)
    elif op == "all_reduce":
        t = (_ring("reduce_scatter", S, g, a, b) + _ring("all_reduce", S / g, m, ai, bi)
             + _ring("all_gather", S, g, a, b))
    elif op in ("all_gather", "reduce_scatter"):
        # inter-node part moves S/g·(m-1)/m per rank; intra part the full S·(g-1)/g
        t = _ring(op, S, g, a, b) + _ring(op, S / g, m, ai, bi)
    else:
        t = _ring(op, S, n, max(a, ai), max(b, bi))
    return finite_result("two-level time", t, size_bytes=size_bytes, nranks=nranks, alpha=alpha, beta=beta,
                         alpha_inter=alpha_inter, beta_inter=beta_inter)


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted ring model: per-step latency ``alpha_s`` and seconds per byte ``beta_s_per_byte``.

    ``bandwidth`` = 1/β is the link (bus) bandwidth in bytes/s. ``rel_errors`` are the fit residuals
    (predicted/measured − 1) at the fitted sizes. Taught in chapter 11.
    """

    alpha_s: float
    beta_s_per_byte: float
    op: str
    nranks: int
    sizes: tuple = ()
    rel_errors: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "alpha_s", nonneg("alpha_s", self.alpha_s))
        object.__setattr__(self, "beta_s_per_byte", nonneg("beta_s_per_byte", self.beta_s_per_byte))
        object.__setattr__(self, "op", canonical_op(self.op))
        object.__setattr__(self, "nranks", count("nranks", self.nranks))
        object.__setattr__(self, "sizes", tuple(_array("sizes", self.sizes).ravel().tolist()))
        object.__setattr__(self, "rel_errors",
                           tuple(_array("rel_errors", self.rel_errors, signed=True).ravel().tolist()))

    @property
    def bandwidth(self) -> float:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")

    def predict(self, size_bytes) -> float | np.ndarray:
        """Predicted time (s) of ``op`` at ``size_bytes`` (scalar or array) on ``nranks`` ranks."""
        s = _array("size_bytes", size_bytes)
        with np.errstate(over="ignore"):
            t = (ring_steps(self.op, self.nranks) * self.alpha_s
                 + bus_factor(self.op, self.nranks) * s * self.beta_s_per_byte)
        if not np.isfinite(t).all():     # sizes beyond any real message (1e308 bytes)
            raise ValueError(f"AlphaBeta.predict: size_bytes up to {float(np.max(s)):.3g} gives a time beyond a "
                             "float; use message sizes of a real run")
        return float(t) if t.ndim == 0 else t

    def summary(self) -> str:
        worst = max((abs(e) for e in self.rel_errors), default=float("nan"))
        return (f"{self.op} on {self.nranks} ranks: alpha = {self.alpha_s * 1e6:.1f} us/step, "
                f"beta = 1/({self.bandwidth / 1e9:.3f} GB/s); worst fit error {worst:.1%}")


def fit_alpha_beta(sizes_bytes, times_s, op: str = "all_reduce", nranks: int = 2, *,
                   huber: float = 0.15, iters: int = 20) -> AlphaBeta:
    """Fit α and β of the ring model ``t = steps·α + factor·S·β`` to measured times.

    Least squares on *relative* error (each point weighted by 1/t), so the microsecond small-size
    regime counts as much as the millisecond large sizes; iteratively re-weighted with a Huber loss
    (threshold ``huber`` relative error) so a few noisy points do not pull the line. α and β are
    constrained to be ≥ 0 (a negative latency is a fitting artefact: it is refitted through the
    origin / as a constant). Taught in chapter 11 (communication diagnostics).
    """
    op = canonical_op(op)
    n = count("nranks", nranks, at_least=2)      # one rank has nothing to fit
    huber = positive("huber", huber)
    iters = count("iters", iters, at_most=10_000)
    s = _array("sizes_bytes", sizes_bytes).ravel()
    t = _array("times_s", times_s, positive=True).ravel()
    if s.shape != t.shape:
        raise ValueError(f"sizes_bytes ({s.size}) and times_s ({t.size}) must have the same length")
    if s.size < 2 or np.unique(s).size < 2:
        raise ValueError(f"sizes_bytes needs at least 2 distinct sizes to fit alpha and beta, got {s.tolist()[:8]}")
    steps, factor = ring_steps(op, n), bus_factor(op, n)
    X = np.column_stack([np.full_like(s, steps), factor * s])
    with np.errstate(over="ignore"):
        finite = np.all(np.isfinite(X / t[:, None]))
    if not finite:
        raise ValueError(f"sizes_bytes (up to {s.max():.3g}) over times_s (down to {t.min():.3g}) are beyond any "
                         "meaningful range: the fit would overflow")
    with np.errstate(over="ignore", invalid="ignore"):   # extreme inputs: checked just below
        coef = _irls(X, t, steps, huber, iters)
        pred = X @ coef
    if not (np.all(np.isfinite(coef)) and np.all(np.isfinite(pred))):
        raise ValueError(f"sizes_bytes (up to {s.max():.3g}) and times_s (from {t.min():.3g}) give no finite fit: "
                         "the inputs are beyond any meaningful range")
    return AlphaBeta(alpha_s=float(coef[0]), beta_s_per_byte=float(coef[1]), op=op, nranks=n,
                     sizes=tuple(float(x) for x in s), rel_errors=tuple(float(x) for x in pred / t - 1.0))


def _irls(X: np.ndarray, t: np.ndarray, steps: int, huber: float, iters: int) -> np.ndarray:
    """Iteratively re-weighted least squares on relative error with a Huber loss; α, β >= 0."""
    w = np.ones_like(t)
    coef = np.zeros(2)
    for _ in range(iters):
        sw = w / t  # relative error weighting
        coef, *_ = np.linalg.lstsq(X * sw[:, None], t * sw, rcond=None)
        if coef[0] < 0:  # latency below resolution: fit bandwidth only
            coef = np.array([0.0, float(np.sum(X[:, 1] * t * sw**2) / np.sum((X[:, 1] * sw) ** 2))])
        if coef[1] < 0:  # flat: pure latency
            coef = np.array([float(np.sum(steps * t * sw**2) / np.sum((steps * sw) ** 2)), 0.0])
        r = np.abs(X @ coef / t - 1.0)
        w_new = np.where(r <= huber, 1.0, huber / np.maximum(r, 1e-12))
        if np.allclose(w_new, w):
            break
        w = w_new
    return coef


def _array(name: str, values, *, positive: bool = False, signed: bool = False) -> np.ndarray:
    """``values`` (a number, list, array or Series of real numbers) as a float array, each finite and
    >= 0 (> 0 with ``positive``, any sign with ``signed``); an error names ``name`` and the first bad
    element."""
    try:
        arr = np.asarray(values)
    except ValueError as e:                  # ragged nested lists
        raise ArgumentTypeError(f"{name} must be a flat list or array of numbers, got {values!r:.60}") from e
    if not (isinstance(values, np.ndarray) and arr.dtype.kind in "iuf"):
        # a list may mix bools into floats (NumPy would make True 1.0): look at each element
        items = np.asarray(values, dtype=object)
        for i, v in enumerate(items.ravel() if items.ndim else [items.item()]):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
                raise ArgumentTypeError(f"{name}[{i}] must be a number, got {type(v).__name__} {v!r:.40}")
    a = arr.astype(float)
    bad = ~np.isfinite(a)
    if not signed:
        bad |= (a <= 0) if positive else (a < 0)
    if bad.any():
        i = int(np.flatnonzero(bad.ravel())[0])
        need = "" if signed else " and > 0" if positive else " and >= 0"
        raise ValueError(f"{name} must be finite{need}: "
                         f"{name}[{i}]={float(a.ravel()[i])!r} is not")
    return a

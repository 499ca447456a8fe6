"""A live benchmark of collectives on the current ranks, printed like nccl-tests (``labkit.comm.bench``).

Taught in chapter 11 (communication diagnostics) and chapter 23.

Method (what makes the numbers honest): every (op, size) is warmed up, then timed ``iters`` times,
sizes interleaved within each iteration (background load then hits every size alike); each timed
iteration starts after a ``barrier`` and ends after a device synchronisation (CUDA is
asynchronous; on CPU the gloo call returns when done). A collective is as slow as its slowest rank,
so the per-iteration time is the MAX over ranks (an all-reduce of the timings), and the table reports
the median with p10/p90. Sizes follow nccl-tests' S convention (:mod:`labkit.comm.models`):
all_gather and reduce_scatter count the *total* buffer.

On CPU (gloo): there is no native reduce-scatter — ``reduce_scatter_tensor`` runs as an all_reduce of
the full input (see PLATFORM_NOTES), so its time is all-reduce time and its busbw (factor (n−1)/n)
reads about half of the all_reduce busbw. The table says so.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from labkit import checks
from labkit.comm.models import OPS, algbw, bus_factor, canonical_op

GLOO_REDUCE_SCATTER_NOTE = ("gloo has no native reduce-scatter: reduce_scatter_tensor runs as an all_reduce "
                            "of the full input, so its time is all-reduce time and its busbw is understated")
_DTYPES = {"float": "float32", "float32": "float32", "half": "float16", "bfloat16": "bfloat16",
           "bf16": "bfloat16", "double": "float64"}
_NCCL_TYPE = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double"}


def default_sizes(min_bytes: int = 1024, max_bytes: int = 4 * 2**20, factor: int = 4) -> list[int]:
    """Geometric sizes like nccl-tests ``-b min -e max -f factor``. Taught in chapter 11."""
    min_bytes = checks.count("min_bytes", min_bytes)
    max_bytes = checks.count("max_bytes", max_bytes, at_least=min_bytes)
    factor = checks.count("factor", factor, at_least=2)
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(int(s))
        s *= factor
    return out


def _fits_in_memory(size: int, nprocs: int, backend: str) -> None:
    """Refuse before launching a size whose buffers cannot be allocated: each rank holds an input and an
    output of ``size`` bytes (all on this host unless NCCL puts them on GPUs), so ``size × 2 × nprocs`` must
    fit in the host's physical memory (``--max-bytes 1e30`` killed every rank with no message)."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):      # no sysconf: the ranks will say
        return
    need = size * (1 if backend == "nccl" else 2 * nprocs)
    if need > ram:
        raise ValueError(f"sizes: the largest, {size:,} bytes, needs {need / 2**30:,.1f} GiB of buffers on "
                         f"{nprocs} rank(s); this machine has {ram / 2**30:,.1f} GiB: use a smaller max size")


def _sync(device) -> None:
    """Device synchronisation: the only CUDA-specific step of the timing loop."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _make_call(op: str, nbytes: int, elsize: int, world: int, rank: int, device, dtype):
    """Allocate buffers for ``op`` at nccl-tests size S and return a zero-argument call."""
    import torch
    import torch.distributed as dist

    count = max(nbytes // elsize, world)
    count -= count % world  # per-rank chunks must divide evenly
    if op == "all_reduce":
        x = torch.ones(count, dtype=dtype, device=device)
        return lambda: dist.all_reduce(x), count
    if op == "all_gather":
        inp = torch.ones(count // world, dtype=dtype, device=device)
        out = torch.empty(count, dtype=dtype, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        return lambda: gather(out, inp), count
    if op == "reduce_scatter":
        inp = torch.ones(count, dtype=dtype, device=device)
        out = torch.empty(count // world, dtype=dtype, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, inp), count
    if op == "broadcast":
        x = torch.ones(count, dtype=dtype, device=device)
        return lambda: dist.broadcast(x, src=0), count
    if op == "reduce":
        x = torch.ones(count, dtype=dtype, device=device)
        return lambda: dist.reduce(x, dst=0), count
    if op == "all_to_all":
        inp = torch.ones(count, dtype=dtype, device=device)
        out = torch.empty(count, dtype=dtype, device=device)
        return lambda: dist.all_to_all_single(out, inp), count
    # send_recv: a ring of sends like nccl-tests' sendrecv_perf (rank r sends to r+1, receives from r-1)
    sbuf = torch.ones(count, dtype=dtype, device=device)
    rbuf = torch.empty(count, dtype=dtype, device=device)

    def sendrecv():
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, sbuf, (rank + 1) % world),
                                       dist.P2POp(dist.irecv, rbuf, (rank - 1) % world)])
        for r in reqs:
            r.wait()
    return sendrecv, count


def bench_rank(ops=("all_reduce",), sizes=None, iters: int = 10, warmup: int = 3, dtype: str = "float32",
               *, clock=time.perf_counter, sync=None) -> list[dict]:
    """Per-rank body of :func:`benchmark` (torch.distributed must be initialised).

    Returns, on every rank, one dict per (op, size) with the per-iteration times (max over ranks).
    ``clock`` and ``sync`` are injectable so the timing loop is testable without a GPU.
    Taught in chapter 11 (communication diagnostics).
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("bench_rank needs torch.distributed initialised; run it through labkit.comm.benchmark")
    world, rank = dist.get_world_size(), dist.get_rank()
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    tdtype = getattr(torch, _DTYPES.get(dtype, dtype))
    elsize = torch.empty((), dtype=tdtype).element_size()
    sync = sync or (lambda: _sync(device))
    sizes = list(sizes or default_sizes())
    out = []
    for op in ops:
        op = canonical_op(op)
        if op == "send_recv" and world < 2:
            continue
        calls = [_make_call(op, int(size), elsize, world, rank, device, tdtype) for size in sizes]
        for call, _ in calls:
            for _ in range(warmup):
                call()
        sync()
        # interleave sizes within each iteration, so background load hits every size alike
        times = [[] for _ in calls]
        for _ in range(iters):
            for k, (call, _) in enumerate(calls):
                dist.barrier()
                sync()
                t0 = clock()
                call()
                sync()
                times[k].append(clock() - t0)
        t = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        for (_, count), row in zip(calls, t.cpu().tolist(), strict=True):
            out.append({"op": op, "size": count * elsize, "count": count,
                        "type": _NCCL_TYPE.get(str(tdtype)[6:], dtype),
                        "redop": "sum" if op in ("all_reduce", "reduce_scatter", "reduce") else "none",
                        "root": 0 if op in ("broadcast", "reduce") else -1,
                        "times_s": row, "nranks": world, "backend": backend})
    dist.barrier()
    return out


@dataclass
class BenchResult:
    """Benchmark result: ``table`` has nccl-tests columns (size B, count, type, redop, root, time us,
    algbw GB/s, busbw GB/s) plus p10/p90 of the time; ``raw`` keeps per-iteration times.

    Taught in chapter 11 (communication diagnostics).
    """

    table: pd.DataFrame
    nranks: int
    backend: str
    raw: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def for_op(self, op: str) -> pd.DataFrame:
        return self.table[self.table["op"] == canonical_op(op)].reset_index(drop=True)

    def format(self) -> str:
        lines = [f"# labkit.comm.benchmark  nranks {self.nranks}  backend {self.backend}  "
                 f"(time = median over iterations of the max over ranks)"]
        lines += [f"# note: {n}" for n in self.notes]
        for op, df in self.table.groupby("op", sort=False):
            lines.append(f"#\n# {op}")
            lines.append(f"#{'size':>12} {'count':>12} {'type':>8} {'redop':>6} {'root':>5} {'time':>10} "
                         f"{'algbw':>8} {'busbw':>8} {'p10':>10} {'p90':>10}")
            lines.append(f"#{'(B)':>12} {'(elements)':>12} {'':>8} {'':>6} {'':>5} {'(us)':>10} "
                         f"{'(GB/s)':>8} {'(GB/s)':>8} {'(us)':>10} {'(us)':>10}")
            for r in df.itertuples():
                lines.append(f" {r.size:>12} {r.count:>12} {r.type:>8} {r.redop:>6} {r.root:>5} {r.time_us:>10.1f} "
                             f"{r.algbw:>8.3f} {r.busbw:>8.3f} {r.p10_us:>10.1f} {r.p90_us:>10.1f}")
            big = df[df["size"] >= df["size"].max() / 4]
            lines.append(f"# Avg bus bandwidth (largest sizes) : {big['busbw'].mean():.3f} GB/s")
        return "\n".join(lines)

    def print(self) -> None:
        print(self.format())


def results_to_table(raw: list[dict]) -> pd.DataFrame:
    """Turn :func:`bench_rank` records into the nccl-tests-style table (GB/s = 1e9 B/s). Taught in chapter 11."""
    rows = []
    for r in raw:
        t = np.asarray(r["times_s"], dtype=float)
        med = float(np.median(t))
        rows.append({"op": r["op"], "size": int(r["size"]), "count": int(r["count"]), "type": r["type"],
                     "redop": r["redop"], "root": r["root"], "time_us": med * 1e6,
                     "algbw": algbw(r["op"], r["size"], med) / 1e9,
                     "busbw": algbw(r["op"], r["size"], med) * bus_factor(r["op"], r["nranks"]) / 1e9,
                     "p10_us": float(np.percentile(t, 10)) * 1e6, "p90_us": float(np.percentile(t, 90)) * 1e6,
                     "iters": int(t.size)})
    return pd.DataFrame(rows, columns=["op", "size", "count", "type", "redop", "root", "time_us", "algbw",
                                       "busbw", "p10_us", "p90_us", "iters"])


def benchmark(ops=("all_reduce",), sizes=None, nprocs: int = 2, *, iters: int = 10, warmup: int = 3,
              dtype: str = "float32", backend: str = "auto", timeout_s: float = 300,
              print_table: bool = False) -> BenchResult:
    """Benchmark collectives on ``nprocs`` fresh ranks (gloo on CPU, NCCL on GPUs) via ``labkit.launch``.

    ``ops`` from :data:`labkit.comm.models.OPS`; ``sizes`` in bytes (nccl-tests S). Returns a
    :class:`BenchResult`; ``print_table=True`` prints it like nccl-tests.
    Taught in chapter 11 (communication diagnostics) and chapter 23.
    """
    ops = tuple(canonical_op(o) for o in ((ops,) if isinstance(ops, str) else ops))
    if not ops:
        raise ValueError(f"ops must name at least one of {OPS}")
    for o in ops:
        if o not in OPS:
            raise ValueError(f"ops: {o!r} has no torch.distributed benchmark here; use one of {OPS}")
    nprocs = checks.count("nprocs", nprocs)
    iters = checks.count("iters", iters)
    warmup = checks.count("warmup", warmup, at_least=0)
    sizes = list(sizes) if sizes is not None else default_sizes()
    if not sizes or any((not isinstance(s, (int, np.integer))) or s <= 0 for s in sizes):
        raise ValueError(f"sizes={sizes!r} must be positive integers (bytes)")
    _fits_in_memory(max(int(s) for s in sizes), nprocs, backend)
    from labkit.launcher.parent import launch

    res = launch(bench_rank, nprocs, backend=backend, timeout_s=timeout_s,
                 args=(ops, sizes, iters, warmup, dtype), stream=False)
    raw = res.value if hasattr(res, "value") else res[0]
    be = raw[0]["backend"] if raw else backend
    notes = []
    if be == "gloo" and "reduce_scatter" in ops:
        notes.append(GLOO_REDUCE_SCATTER_NOTE)
    out = BenchResult(table=results_to_table(raw), nranks=nprocs, backend=be, raw=raw, notes=notes)
    if print_table:
        out.print()
    return out


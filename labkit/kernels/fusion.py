"""Fusion, torch.compile and CUDA graphs: why many small ops are slow, and what each remedy removes.

Every op an eager PyTorch program runs pays a fixed **per-op cost** — Python, the dispatcher, and on a GPU
the kernel launch — before it touches a byte, and then moves its bytes through memory. For an elementwise
op on ``n`` fp32 elements (read 4n bytes, write 4n)::

    t_op(n) ≈ c_op + 8·n / BW          (c_op: per-op cost; BW: memory bandwidth)

so below ``n* = c_op · BW / 8`` (:func:`launch_crossover`) the op is **launch-bound**: its time does not
depend on ``n``, and k such ops cost k·c_op whatever they compute. Above it the op is **bandwidth-bound**:
k ops read and write the tensor k times. Fusing the k ops into one kernel removes both: one per-op cost,
one read and one write (Williams et al. 2009, *Roofline*, CACM 52(4); the fusion argument of PyTorch 2's
TorchInductor, Ansel et al. 2024, ASPLOS, https://doi.org/10.1145/3620665.3640366).

The chain (:func:`elementwise_chain`; as one op :func:`fused_chain`, compiled :func:`compiled_chain`), its
timing (:func:`sweep_sizes` over sizes, :func:`ab_fusion` interleaved), the compiler's cost
(:func:`compile_cost`), ops counted in traces (:func:`profile_calls`, :func:`op_counts` on
:func:`labkit.trace.analyze`), AdamW's implementations (:func:`ab_optimizer`) and SYNTHETIC CUDA-graph
traces (:func:`graph_traces`, :func:`graph_step_us`: no GPU here to record them).

Taught in chapter 17 (``chapters/part3_tuning/ch17_fusion_compile.ipynb``).
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from labkit import checks

__all__ = ["elementwise_chain", "fused_constants", "fused_chain", "chain_inputs", "compiled_chain",
           "launch_crossover", "sweep_sizes", "ab_fusion", "CompileCost", "compile_cost", "profile_calls",
           "op_counts", "OpCounts", "ab_optimizer", "graph_step_us", "graph_traces"]


# ----------------------------------------------------------------------------------- the chain of ops
def elementwise_chain(x, scale, shift, n_ops: int = 50):
    """``n_ops`` elementwise ops on ``x``, alternately ``x·scale`` and ``x + shift`` (``scale``/``shift``:
    0-dim tensors on x's device): each op is one dispatch (CPU) or one kernel launch (GPU). Chapter 17."""
    for i in range(n_ops):
        x = x * scale if i % 2 == 0 else x + shift
    return x


def fused_constants(scale, shift, n_ops: int = 50):
    """(a, b) with ``elementwise_chain(x, scale, shift, n_ops) == a·x + b`` (the chain is affine): after the
    pairs, a = sᵖ and b = t·(sᵖ⁻¹ + … + 1); an odd last op multiplies both by s. Chapter 17."""
    n_ops = checks.count("n_ops", n_ops)
    a, b = scale * 0 + 1, shift * 0
    for i in range(n_ops):
        a, b = (a * scale, b * scale) if i % 2 == 0 else (a, b + shift)
    return a, b


def fused_chain(x, a, b):
    """The whole chain as one op: ``addcmul(b, x, a)`` = a·x + b (:func:`fused_constants`). Chapter 17."""
    import torch

    return torch.addcmul(b, x, a)


def chain_inputs(numel: int, device="cpu", seed: int = 0, scale: float = 1.0001, shift: float = 0.001):
    """(x, scale, shift): ``numel`` fp32 normal values and the chain's two constants as 0-dim tensors on
    ``device`` (so no op converts a Python number). Chapter 17."""
    import torch

    numel = checks.count("numel", numel)
    g = torch.Generator().manual_seed(checks.count("seed", seed, at_least=0))
    x = torch.randn(numel, generator=g).to(device)
    return x, torch.tensor(scale, device=device), torch.tensor(shift, device=device)


def compiled_chain(n_ops: int = 50):
    """``torch.compile`` of :func:`elementwise_chain` with ``n_ops`` fixed: a callable (x, scale, shift).
    Nothing compiles until its first call (:func:`compile_cost` times that). Chapter 17."""
    import torch

    n_ops = checks.count("n_ops", n_ops)

    def chain(x, scale, shift):
        return elementwise_chain(x, scale, shift, n_ops)
    return torch.compile(chain)


def launch_crossover(per_op_s: float, bandwidth: float, bytes_per_element: float = 8.0) -> float:
    """Elements at which an elementwise op's data time equals its per-op cost: ``per_op_s · bandwidth /
    bytes_per_element`` (8 for fp32 read + write). Below it the op is launch-bound. Chapter 17."""
    per_op_s = checks.positive("per_op_s", per_op_s)
    bandwidth = checks.positive("bandwidth", bandwidth)
    return per_op_s * bandwidth / checks.positive("bytes_per_element", bytes_per_element)


# ----------------------------------------------------------------------------------- timing
@contextlib.contextmanager
def _threads(n):
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n or old)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _seconds(fn, device, repeats: int, inner: int) -> float:
    """Median seconds per call: CUDA events on a GPU, this process's CPU seconds on a CPU (robust to
    other processes sharing the cores, like :func:`labkit.tuning.sweep.ab_micro_batch`)."""
    import statistics

    import torch

    if torch.device(device).type == "cuda":
        from labkit.hardware.measure import time_fn

        return statistics.median(time_fn(fn, device, warmup=2, repeats=repeats, inner=inner))
    for _ in range(2):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(inner):
            fn()
        out.append((time.process_time() - t0) / inner)
    return statistics.median(out)


def sweep_sizes(sizes, n_ops: int = 50, device="cpu", compiled=None, repeats: int = 5, threads: int | None = 1,
                budget_s: float = 0.02, seed: int = 0):
    """Per call and per op, the eager chain against the one-op :func:`fused_chain` (and ``compiled``, a
    :func:`compiled_chain`, if given) at each tensor size in ``sizes`` (elements): a DataFrame with the
    bytes each eager op moves, its achieved bandwidth, and the fused speed-ups. ``threads``: torch CPU
    threads while timing (1: no OpenMP barriers, which stall on a shared machine). Chapter 17."""
    import pandas as pd

    sizes = [checks.count(f"sizes[{i}]", s) for i, s in enumerate(sizes)]
    if not sizes:
        raise ValueError("sizes must name at least one tensor size (elements)")
    n_ops = checks.count("n_ops", n_ops)
    repeats = checks.count("repeats", repeats)
    with _threads(threads):
        rows = [_size_row(n, n_ops, device, compiled, repeats, budget_s, seed) for n in sizes]
    return pd.DataFrame(rows)


def _size_row(n, n_ops, device, compiled, repeats, budget_s, seed) -> dict:
    x, s, t = chain_inputs(n, device, seed)
    a, b = fused_constants(s, t, n_ops)
    per = _seconds(lambda: elementwise_chain(x, s, t, n_ops), device, 1, 1)      # sizes the timing loop
    inner = max(1, min(200, int(budget_s / max(per, 1e-7))))
    eager = _seconds(lambda: elementwise_chain(x, s, t, n_ops), device, repeats, inner)
    fused = _seconds(lambda: fused_chain(x, a, b), device, repeats, inner)
    row = {"numel": n, "MB per op": 8 * n / 1e6, "eager µs/call": eager * 1e6, "eager µs/op": eager / n_ops * 1e6,
           "eager GB/s per op": 8 * n * n_ops / eager / 1e9, "fused µs/call": fused * 1e6,
           "fused speed-up": eager / fused}
    if compiled is not None:
        comp = _seconds(lambda: compiled(x, s, t), device, repeats, inner)
        row.update({"compiled µs/call": comp * 1e6, "compiled speed-up": eager / comp})
    return row


def ab_fusion(numel: int = 256, n_ops: int = 50, *, candidate=None, rounds: int = 30, device="cpu",
              threads: int | None = 1, seed: int = 0):
    """:func:`labkit.measure.ab.ab_compare` of the eager chain (A) against ``candidate`` (B; default the one-op
    :func:`fused_chain`; pass a :func:`compiled_chain` to A/B the compiler) on ``numel`` elements,
    interleaved, in CPU seconds on one thread (on a GPU: wall time between synchronisations). Chapter 17."""
    import torch

    from labkit.measure.ab import ab_compare

    n_ops = checks.count("n_ops", n_ops)
    x, s, t = chain_inputs(numel, device, seed)
    a, b = fused_constants(s, t, n_ops)
    if candidate is None:
        run_b, label = (lambda: fused_chain(x, a, b)), "one fused op"
    else:
        run_b, label = (lambda: candidate(x, s, t)), "compiled"
    inner = 20 if numel <= 65536 else 2       # calls per timed sample: ≥ 1 ms of work on a CPU

    def times(fn):
        def once():
            for _ in range(inner):
                fn()
        return once
    gpu = torch.device(device).type == "cuda"
    with _threads(threads):
        return ab_compare(times(lambda: elementwise_chain(x, s, t, n_ops)), times(run_b), rounds=rounds,
                          warmup=2, clock="wall" if gpu else "cpu", device=device if gpu else None, seed=seed,
                          labels=(f"eager: {n_ops} ops", label))


# ----------------------------------------------------------------------------------- compile cost
@dataclass(frozen=True)
class CompileCost:
    """What :func:`compile_cost` measured (seconds). ``first_s``: the first call (Dynamo traces, Inductor
    generates and compiles C++/Triton, into a fresh cache), wall clock, and ``first_cpu_s`` its CPU time
    including compiler subprocesses; ``cached_call_s``: a later call (median); ``eager_call_s``: the same
    work uncompiled (median); ``recompile_s``: a first call again after ``torch._dynamo.reset()`` with the
    on-disk cache warm; ``inductor_warm``: whether this process had imported Inductor before (then the
    first call skips its one-off import). Chapter 17."""

    first_s: float
    first_cpu_s: float
    cached_call_s: float
    eager_call_s: float
    recompile_s: float
    inductor_warm: bool
    cache_dir: str

    @property
    def breakeven_calls(self) -> float:
        """Calls after which compiling has paid for itself: first_s / (eager − cached); inf if no gain."""
        gain = self.eager_call_s - self.cached_call_s
        return self.first_s / gain if gain > 0 else float("inf")

    def report(self) -> str:
        """A few lines to print. Chapter 17."""
        return "\n".join([
            f"first call (compile, fresh cache{'' if self.inductor_warm else ', Inductor imported'}): "
            f"{self.first_s:.1f} s wall, {self.first_cpu_s:.1f} s CPU (with compiler processes)",
            f"cached call: {self.cached_call_s * 1e6:.1f} µs   eager call: {self.eager_call_s * 1e6:.1f} µs",
            f"recompile after torch._dynamo.reset() (on-disk cache warm): {self.recompile_s:.2f} s",
            f"compiling pays for itself after {self.breakeven_calls:,.0f} calls"])


def _cpu_all() -> dict:      # CPU seconds of this process and every descendant (compile workers, the C++ compiler)
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            out[p.pid] = t.user + t.system + t.children_user + t.children_system
    return out


def compile_cost(compiled, eager, args, *, cache_dir=None, repeats: int = 5, inner: int = 50) -> CompileCost:
    """Time the first call of ``compiled`` (a fresh ``torch.compile`` callable) with Inductor's cache in a
    new empty ``cache_dir`` (default: a new temporary folder, removed when the process exits:
    :func:`labkit.paths.scratch_dir`) — an honest cold compile — then its cached
    calls against ``eager`` on the same ``args``, then a recompile after ``torch._dynamo.reset()`` that
    finds the compiled code on disk. Inductor's cache folder is restored afterwards. Chapter 17."""
    from statistics import median

    import torch

    from labkit.hardware.measure import time_fn
    from labkit.paths import scratch_dir

    args = tuple(args)
    dev = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    warm = "torch._inductor.compile_fx" in sys.modules
    if cache_dir is None:       # removed at exit; a killed kernel's by the next sweep (labkit.paths.scratch_dir)
        folder = scratch_dir("labkit-inductor-")
    else:
        folder = Path(cache_dir)
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.iterdir()):
            raise ValueError(f"cache_dir={str(folder)!r} is not empty: a cold compile needs an empty folder")
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    try:
        torch._dynamo.reset()
        c0, t0 = _cpu_all(), time.perf_counter()
        compiled(*args)
        first, c1 = time.perf_counter() - t0, _cpu_all()
        first_cpu = sum(v - c0.get(pid, 0.0) for pid, v in c1.items())
        cached, eager_s = (median(time_fn(f, dev, warmup=1, repeats=repeats, inner=inner))      # CUDA: events
                           for f in (lambda: compiled(*args), lambda: eager(*args)))
        torch._dynamo.reset()
        t0 = time.perf_counter()
        compiled(*args)
        again = time.perf_counter() - t0
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    return CompileCost(first, first_cpu, cached, eager_s, again, warm, str(folder))


# ----------------------------------------------------------------------------------- traces
def profile_calls(fn, args, out_path, *, calls: int = 3, device="cpu") -> Path:
    """A torch.profiler Chrome trace of ``calls`` calls of ``fn(*args)``, one ``ProfilerStep`` per call
    (after one unrecorded warm-up call), written to ``out_path``. Chapter 17."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    calls = checks.count("calls", calls)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")        # no "USDT:" lines in the notebook
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    gpu = torch.device(device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=acts, schedule=schedule(wait=0, warmup=1, active=calls, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
        for _ in range(calls + 1):
            fn(*args)
            if gpu:
                torch.cuda.synchronize()
            prof.step()
    return out


@dataclass(frozen=True)
class OpCounts:
    """Ops in a trace per call (per ``ProfilerStep``): ``kind`` "kernel" (GPU) or "cpu_op"; ``table``: name,
    count, per_call; ``aten_per_call``: aten ops (CPU dispatches); ``kernels_per_call``: device kernels;
    ``compiled_per_call``: calls into a compiled graph. Chapter 17."""

    kind: str
    calls: int
    table: object
    aten_per_call: float
    kernels_per_call: float
    compiled_per_call: float


def op_counts(path) -> OpCounts:
    """Count the ops of a :func:`profile_calls` trace with :func:`labkit.trace.analyze` (its top-ops
    tables, all names): aten ops and device kernels per call, and the compiled-graph calls Inductor's
    wrapper records (``## Call CompiledFxGraph … ##``). Chapter 17."""
    from labkit.trace.analysis import analyze

    an = analyze(path)
    calls = len(an.steps)
    cpu = an.top_ops(n=100_000, kind="cpu_op")
    kern = an.top_ops(n=100_000, kind="kernel")
    table = (kern if an.kind == "gpu" else cpu)[["name", "count"]].copy()
    table["per_call"] = table["count"] / calls
    aten = float(cpu.loc[cpu["name"].str.startswith("aten::"), "count"].sum()) / calls
    compiled = float(cpu.loc[cpu["name"].str.contains("CompiledFxGraph"), "count"].sum()) / calls
    return OpCounts(an.kind, calls, table.reset_index(drop=True), aten, float(kern["count"].sum()) / calls, compiled)


# ----------------------------------------------------------------------------------- optimizers
def ab_optimizer(cfg, impl_a: str = "for-loop", impl_b: str = "fused", *, rounds: int = 20,
                 threads: int | None = 1):
    """A/B one AdamW ``step()`` in two implementations (``TrainConfig.optimizer_impl``, built by the
    trainer's :func:`labkit.train.optim.build_optimizer`) on the trainer's own model of ``cfg`` with
    gradients from one real micro-batch through the loop's ``forward_backward``: each arm steps its own copy
    of the model. CPU seconds on one thread (on a GPU: wall time between synchronisations). Chapter 17."""
    import copy

    from labkit.hardware.measure import resolve_device
    from labkit.measure.ab import ab_compare
    from labkit.train.accum import global_batch
    from labkit.train.config import OPTIMIZER_IMPLS
    from labkit.train.loop import build_model, forward_backward
    from labkit.train.optim import build_optimizer

    for name, impl in (("impl_a", impl_a), ("impl_b", impl_b)):
        checks.one_of(name, impl, OPTIMIZER_IMPLS)
    device = resolve_device(cfg.device)
    run = cfg.replace(parallel="single", accum=1)
    model = build_model(run.replace(compile=False), device)
    x, y = global_batch(run, run.micro_batch, seed=run.seed)
    forward_backward(model, iter([(x, y)]), run, device)
    models = {impl: copy.deepcopy(model) for impl in (impl_a, impl_b)}    # deepcopy drops .grad: copy them
    for m in models.values():
        for p, q in zip(m.parameters(), model.parameters(), strict=True):
            p.grad = q.grad.clone()
    opts = {impl: build_optimizer(m, run.replace(optimizer_impl=impl)) for impl, m in models.items()}
    gpu = device.type == "cuda"
    with _threads(threads):
        return ab_compare(opts[impl_a].step, opts[impl_b].step, rounds=rounds, warmup=3,
                          clock="wall" if gpu else "cpu", device=device if gpu else None, seed=None,
                          labels=(f"AdamW {impl_a}", f"AdamW {impl_b}"))


# ----------------------------------------------------------------------------------- CUDA graphs (SYNTHETIC)
def graph_step_us(n_kernels: int, kernel_us: float, launch_us: float, *, graphed: bool,
                  graph_launch_us: float = 10.0, gap_us: float = 1.0) -> float:
    """One step of ``n_kernels`` kernels of ``kernel_us`` each, µs. Eager: the host spends ``launch_us`` per
    kernel (Python, dispatcher, launch) and kernel i starts when its launch is done and kernel i−1 has
    finished (+ ``gap_us``); graphed: one ``graph_launch_us`` replay, then the kernels back to back
    (+ ``gap_us``). Launch-bound (launch_us > kernel_us + gap_us): eager ≈ n·launch_us. Chapter 17."""
    n = checks.count("n_kernels", n_kernels, at_most=10**6)     # a step of a million kernels: the loop's cap
    k, lu = checks.positive("kernel_us", kernel_us), checks.nonneg("launch_us", launch_us)
    g, gap = checks.nonneg("graph_launch_us", graph_launch_us), checks.nonneg("gap_us", gap_us)
    if checks.flag("graphed", graphed):
        return g + n * k + (n - 1) * gap
    end = 0.0
    for i in range(n):
        end = max((i + 1) * lu, end + (gap if i else 0.0)) + k
    return end


def _graph_doc(n, k, lu, graphed, g, gap, steps):
    pid, tid, stream = 1000, 1000, 7
    ev = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "thread (pt_main_thread)"}},
          {"ph": "M", "name": "thread_name", "pid": 0, "tid": stream, "args": {"name": f"stream {stream}"}}]
    corr, t = 1, 1.7e12
    for s in range(steps):
        start, prev = t, None
        host = [("cudaGraphLaunch", start, g)] if graphed else [("cudaLaunchKernel", start + i * lu, lu)
                                                                 for i in range(n)]
        for name, ts, dur in host:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": pid, "tid": tid, "ts": ts,
                       "dur": dur, "args": {"correlation": corr, "External id": corr}})
            if graphed:
                break
            corr += 1
        for i in range(n):
            ready = start + (g if graphed else (i + 1) * lu)
            ks = ready if prev is None else max(ready, prev + gap)
            c = corr if graphed else corr - n + i
            ev.append({"ph": "X", "cat": "kernel", "name": f"void elementwise_kernel_{i % 4}<float>", "pid": 0,
                       "tid": stream, "ts": ks, "dur": k,
                       "args": {"device": 0, "stream": stream, "correlation": c, "External id": c}})
            prev = ks + k
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": pid, "tid": tid,
                   "ts": host[-1][1] + host[-1][2], "dur": prev - host[-1][1] - host[-1][2], "args": {}})
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": pid, "tid": tid,
                   "ts": start, "dur": prev - start, "args": {}})
        t = prev
    ev.sort(key=lambda e: (e.get("ts", 0.0), e.get("ph") != "M"))
    spec = {"n_kernels": n, "kernel_us": k, "launch_us": lu, "graphed": graphed, "graph_launch_us": g,
            "gap_us": gap, "steps": steps}
    return {"schemaVersion": 1, "traceEvents": ev, "displayTimeUnit": "ms",
            "labkit_synthetic": {"SYNTHETIC": True, "generator": "labkit.kernels.fusion.graph_traces", "spec": spec,
                                 "note": "SYNTHETIC trace made by labkit; not recorded on a GPU"},
            "deviceProperties": [{"id": 0, "name": "SYNTHETIC GPU"}]}


def graph_traces(out_dir, n_kernels: int = 60, kernel_us: float = 3.0, launch_us: float = 8.0, *,
                 graph_launch_us: float = 10.0, gap_us: float = 1.0, steps: int = 3) -> dict[str, Path]:
    """Write two SYNTHETIC GPU traces of the same step — ``eager`` (a ``cudaLaunchKernel`` per kernel) and
    ``graphed`` (one ``cudaGraphLaunch``) — as ``out_dir/{eager,graphed}/rank0.SYNTHETIC.json.gz``; each
    step's time is :func:`graph_step_us`. Labelled SYNTHETIC in the file: a model, not a recording.
    Chapter 17."""
    checks.count("steps", steps)
    graph_step_us(n_kernels, kernel_us, launch_us, graphed=True, graph_launch_us=graph_launch_us, gap_us=gap_us)
    paths = {}
    for mode in ("eager", "graphed"):
        d = Path(out_dir) / mode
        d.mkdir(parents=True, exist_ok=True)
        p = d / "rank0.SYNTHETIC.json.gz"
        with gzip.open(p, "wt") as f:
            json.dump(_graph_doc(n_kernels, kernel_us, launch_us, mode == "graphed", graph_launch_us, gap_us,
                                 steps), f)
        paths[mode] = p
    return paths

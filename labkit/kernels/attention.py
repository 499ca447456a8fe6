"""Attention implementations, which SDPA backend runs here and why, and their time, memory and FLOPs.

The GPT (:mod:`labkit.model.gpt`) attends through :func:`attend`, so the chapter measures the very code the
trainer runs. Implementations (``TrainConfig.attention`` / ``GPTConfig.attention``):

- ``"naive"`` — Vaswani et al. 2017, eq. 1: ``softmax(QKᵀ/√d)·V`` written out; the a×s×s score matrix
  (per sequence) is materialised, and autograd keeps the softmax output for backward;
- ``"sdpa"`` — ``F.scaled_dot_product_attention``, the backend chosen by PyTorch's dispatcher (on a CPU
  the fused flash kernel ``_scaled_dot_product_flash_attention_for_cpu``);
- ``"flash"``, ``"efficient"``, ``"cudnn"``, ``"math"`` — SDPA with that one backend forced through
  ``torch.nn.attention.sdpa_kernel`` (FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION, MATH).
  MATH is PyTorch's reference composition of matmuls and softmax: it materialises the scores like
  ``"naive"``. On a CPU only FLASH_ATTENTION and MATH exist; EFFICIENT and CUDNN are CUDA kernels, and
  forcing them fails with "No viable backend" (:func:`backends` records each backend's own reason).

FlashAttention (Dao et al. 2022, *FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness*, §3.1, Algorithm 1, Theorem 1) does the same O(s²·d) FLOPs as standard attention; it is
faster because it is IO-aware: it tiles Q, K, V through on-chip SRAM and never writes the s×s matrix to
HBM (Θ(s²d²/M) HBM accesses instead of Θ(sd + s²)), keeping only the output and the softmax
log-sum-exp (a·s fp32 values per sequence) for backward, where it recomputes the scores.

Taught in chapter 16 (attention kernels) and lab 4.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass

from labkit import checks
from labkit.model.config import ATTENTIONS

__all__ = ["ATTENTIONS", "BACKENDS", "attend", "backend_context", "backends", "backend_ran", "attention_flops",
           "AttentionMeasurement", "measure", "sweep"]

# forced implementation -> torch.nn.attention.SDPBackend member
BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
            "math": "MATH"}
# the aten kernel each fused backend dispatches to -> implementation name
_KERNELS = {"_scaled_dot_product_flash_attention_for_cpu": "flash", "_scaled_dot_product_flash_attention": "flash",
            "_scaled_dot_product_efficient_attention": "efficient",
            "_scaled_dot_product_cudnn_attention": "cudnn"}
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def backend_context(attention: str):
    """The context manager under which ``attention`` runs: ``sdpa_kernel(<backend>)`` for a forced
    backend, a no-op for "sdpa" and "naive". Taught in chapter 16."""
    checks.one_of("attention", attention, ATTENTIONS)
    if attention not in BACKENDS:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, BACKENDS[attention]))


def _naive(q, k, v, causal: bool, dropout_p: float, training: bool):
    import torch
    import torch.nn.functional as F

    T, S = q.size(-2), k.size(-2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))    # a×s×s scores, materialised
    if causal:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
    att = att.softmax(dim=-1)
    return F.dropout(att, dropout_p, training) @ v


def attend(q, k, v, attention: str = "sdpa", *, causal: bool = True, dropout_p: float = 0.0, training: bool = True):
    """Attention of ``q, k, v`` (batch, heads, seq, head_dim) with one implementation of ``ATTENTIONS``.

    A forced backend that cannot run these inputs here raises a ``RuntimeError`` naming the backend and
    torch's reason. Taught in chapter 16 (attention kernels).
    """
    checks.one_of("attention", attention, ATTENTIONS)
    if attention == "naive":
        return _naive(q, k, v, causal, dropout_p, training)
    import torch.nn.functional as F

    p = dropout_p if training else 0.0
    if attention == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=p)
    try:
        with backend_context(attention):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=p)
    except RuntimeError as e:
        raise RuntimeError(f"attention={attention!r} (SDPBackend.{BACKENDS[attention]}) cannot run on "
                           f"{q.device.type} with {q.dtype}: {str(e).splitlines()[0]} - on a CPU only 'flash' "
                           f"and 'math' exist; use attention='sdpa' to let PyTorch choose") from None


def _inputs(batch: int, heads: int, seq_len: int, head_dim: int, device: str, dtype: str, grad: bool, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, _DTYPES[dtype])
    return [torch.randn(batch, heads, seq_len, head_dim, generator=g).to(device=device, dtype=dt).requires_grad_(grad)
            for _ in range(3)]


def backends(device: str = "cpu", dtype: str = "fp32") -> list[dict]:
    """Which SDPA backend runs on ``device`` for ``dtype``: one row per forced implementation with
    ``runs`` and, when it does not, torch's own reason (its first warning, else the error).

    Taught in chapter 16 (which backend ran and why).
    """
    import warnings

    import torch
    import torch.nn.functional as F

    checks.one_of("dtype", dtype, _DTYPES)
    q, k, v = _inputs(1, 2, 16, 8, device, dtype, grad=False)
    rows = []
    for name in BACKENDS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with backend_context(name):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                rows.append({"attention": name, "backend": BACKENDS[name], "runs": True, "why": ""})
                continue
            except RuntimeError as e:
                err = str(e).splitlines()[0]
        reasons = [str(w.message).splitlines()[0] for w in caught if "because" in str(w.message)]
        why = reasons[0] if reasons else f"torch: {err}"
        if torch.device(device).type == "cpu":   # aten/src/ATen/native/transformers/sdp_utils_cpp.cpp
            why = ("a CUDA kernel: PyTorch's CPU dispatcher (sdp_utils_cpp.cpp) has only FLASH_ATTENTION and "
                   f"MATH; {why}")
        rows.append({"attention": name, "backend": BACKENDS[name], "runs": False, "why": why})
    return rows


def backend_ran(attention: str = "sdpa", *, device: str = "cpu", dtype: str = "fp32", seq_len: int = 64,
                heads: int = 2, head_dim: int = 16, dropout_p: float = 0.0) -> str:
    """The implementation that actually executed for ``attention``, read from the aten kernels dispatched
    in one forward (a ``TorchDispatchMode`` sees the fused kernel's name; MATH and naive dispatch only
    matmuls and a softmax). Returns "flash", "efficient", "cudnn" or "math" ("naive" for naive). With
    ``dropout_p`` > 0 a CPU's "sdpa" runs MATH: its flash kernel has no dropout.

    Taught in chapter 16 (which backend ran).
    """
    checks.one_of("attention", attention, ATTENTIONS)
    if attention == "naive":
        return "naive"
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class _Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    q, k, v = _inputs(1, heads, seq_len, head_dim, device, dtype, grad=False)
    with _Ops():
        attend(q, k, v, attention, dropout_p=checks.fraction("dropout_p", dropout_p, open_high=True))
    fused = [_KERNELS[o] for o in seen if o in _KERNELS]
    if fused:
        return fused[0]
    if {"_softmax", "softmax", "_safe_softmax"} & set(seen):
        return "math"
    raise RuntimeError(f"attention={attention!r}: no attention kernel among the dispatched ops {sorted(set(seen))}")


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, *, causal: bool = False,
                    backward: bool = False, recompute_scores: bool = False) -> float:
    """FLOPs of the attention core (QKᵀ and the ·V product; the softmax's few per element not counted).

    Forward: 2 matmuls of 2·b·a·s²·d each = ``4·b·a·s²·d`` for full attention (Vaswani et al. 2017;
    Dao et al. 2022 §3.1: standard attention and FlashAttention both do O(s²d)). ``causal`` counts only the
    s(s+1)/2 query-key pairs a causal mask keeps (the work a kernel that skips masked tiles can do; naive
    and MATH compute all s² and mask). ``backward`` adds the backward's 4 matmuls (2× forward), plus one
    more QKᵀ when ``recompute_scores`` (FlashAttention recomputes the scores instead of storing them:
    backward = 2.5× forward, the factor Dao 2023, FlashAttention-2, §4.1 uses to count its FLOP/s).
    Taught in chapter 16 (attention FLOPs).
    """
    b, a, s, d = (checks.count(n, x) for n, x in (("batch", batch), ("heads", heads), ("seq_len", seq_len),
                                                  ("head_dim", head_dim)))
    pairs = s * (s + 1) / 2 if checks.flag("causal", causal) else float(s * s)
    fwd = 4.0 * b * a * d * pairs
    if not checks.flag("backward", backward):
        return fwd
    return fwd + 2 * fwd + (0.5 * fwd if checks.flag("recompute_scores", recompute_scores) else 0.0)


@dataclass(frozen=True)
class AttentionMeasurement:
    """One implementation at one shape: median forward+backward seconds (and its p10–p90 spread over
    ``repeats``) by ``clock`` on ``threads`` torch threads, peak bytes allocated above the inputs during
    forward+backward, bytes autograd saved for backward (the inputs excluded), what the memory model
    predicts for those, and the backend that ran. Taught in chapter 16 and lab 4."""

    attention: str
    ran: str
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    dtype: str
    causal: bool
    time_s: float
    time_spread: float
    times: tuple
    peak_bytes: int
    saved_bytes: int
    predicted_saved_bytes: int
    clock: str = "cpu"
    threads: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


def _saved_bytes(fn, exclude) -> tuple[int, object]:
    """Bytes of the distinct storages autograd saves during ``fn()`` (those of ``exclude`` left out)."""
    import torch

    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip and st.data_ptr() != 0:
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return int(sum(seen.values())), out


def _peak_bytes(fn, device: str) -> int:
    """Peak bytes allocated above the level at the start of ``fn()``: CUDA's allocator statistics on a GPU;
    on a CPU the running total of ``torch.profiler``'s memory events ("Total Allocated" of each
    ``[memory]`` event, less its value before the first event)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")   # no "USDT: profiler_start" lines (train/loop.py)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    rows = sorted((float(e["ts"]), int(e["args"]["Total Allocated"]), int(e["args"].get("Bytes", 0))) for e in events
                  if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0)
    if not rows:
        return 0
    # the count can start above zero: a block allocated under an earlier profiler and freed after it stays
    # in c10's "Total Allocated" (labkit.memory.timeline): measure from the count before the first event
    start = rows[0][1] - rows[0][2]
    return max(0, max(t for _, t, _ in rows) - start)


def _cpu_seconds(fn, *, warmup: int, repeats: int, threads: int) -> list[float]:
    """CPU seconds per call of ``fn`` on ``threads`` torch threads (restored afterwards).

    Why one thread by default: torch runs each CPU op as an OpenMP parallel region over all its threads
    and waits at the region's end for the slowest. With as many threads as cores on a machine that also
    runs other work, one of the two threads is often descheduled, and every op of the call waits for it
    while the other spins: on this course's loaded 2-core machine (2026-12-06) one softmax of 4×256×256 took ≈ 0.16 ms
    on one thread and a median ≈ 14 ms on two (and ×17 the CPU seconds, spent spinning), so a naive
    attention call of a few dozen ops sat near 250 ms whatever its length. On one thread the process's CPU
    seconds are the call's own work, whoever else shares the cores."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.process_time()
            fn()
            times.append(time.process_time() - t0)
    finally:
        torch.set_num_threads(old)
    return times


def measure(attention: str, seq_len: int, *, batch: int = 1, heads: int = 4, head_dim: int = 32,
            device: str = "cpu", dtype: str = "fp32", causal: bool = True, repeats: int = 5,
            warmup: int = 1, threads: int = 1) -> AttentionMeasurement:
    """Forward+backward of one attention implementation at one sequence length, measured: time (median,
    p10–p90 spread), peak memory, saved bytes, the backend ran.

    On a GPU the time is :func:`labkit.hardware.time_fn`'s (CUDA events). On a CPU it is this process's CPU
    seconds on ``threads`` torch threads (default 1, :func:`_cpu_seconds` says why: with a thread per core
    on a shared machine every op waits for a descheduled thread, and the time measures the scheduler).
    Taught in chapter 16 (attention kernels) and lab 4.
    """
    import torch

    from labkit.hardware.measure import time_fn
    from labkit.memory.estimate import attention_saved_bytes

    checks.one_of("attention", attention, ATTENTIONS)
    checks.one_of("dtype", dtype, _DTYPES)
    s = checks.count("seq_len", seq_len)
    repeats = checks.count("repeats", repeats, at_least=3)
    warmup = checks.count("warmup", warmup, at_least=0)
    threads = checks.count("threads", threads)
    causal = checks.flag("causal", causal)
    q, k, v = _inputs(batch, heads, s, head_dim, device, dtype, grad=True)

    def step():
        out = attend(q, k, v, attention, causal=causal)
        out.sum().backward()
        q.grad = k.grad = v.grad = None

    ran = backend_ran(attention, device=device, dtype=dtype)
    if torch.device(device).type == "cuda":
        times, clock = time_fn(step, device, warmup=warmup, repeats=repeats), "cuda events"
    else:
        times, clock = _cpu_seconds(step, warmup=warmup, repeats=repeats, threads=threads), "cpu"
    saved, out = _saved_bytes(lambda: attend(q, k, v, attention, causal=causal), (q, k, v))
    del out
    peak = _peak_bytes(step, device)
    bytes_of = {"fp32": 4, "bf16": 2, "fp16": 2}[dtype]
    predicted = attention_saved_bytes(ran, batch=batch, heads=heads, seq_len=s, head_dim=head_dim,
                                      dtype_bytes=bytes_of, causal=causal, output=True)
    if ran == "math":   # MATH multiplies Q and K by √scale into new tensors its matmul keeps (aten attention.cpp)
        predicted += 2 * bytes_of * batch * heads * s * head_dim
    qs = statistics.quantiles(times, n=10, method="inclusive")
    med = statistics.median(times)
    return AttentionMeasurement(attention=attention, ran=ran, batch=batch, heads=heads, seq_len=s, head_dim=head_dim,
                                dtype=dtype, causal=causal, time_s=med, time_spread=(qs[-1] - qs[0]) / med,
                                times=tuple(times), peak_bytes=peak, saved_bytes=saved,
                                predicted_saved_bytes=predicted, clock=clock,
                                threads=threads if clock == "cpu" else torch.get_num_threads())


def sweep(attentions=("naive", "flash"), seq_lens=(256, 512, 1024), **kw):
    """:func:`measure` for every implementation × sequence length, interleaved (each length runs every
    implementation before the next length, so machine drift hits all alike); a ``pandas.DataFrame``
    with one row per measurement and ``flops`` (:func:`attention_flops`, forward+backward). Implementations
    that cannot run here are refused up front (:func:`backends`). Taught in chapter 16 and lab 4.
    """
    import pandas as pd

    atts = [checks.one_of("attention", a, ATTENTIONS) for a in attentions]
    if not atts:
        raise ValueError("attentions is empty: name at least one of " + ", ".join(ATTENTIONS))
    lens = [checks.count("seq_len", s) for s in seq_lens]
    runs = {r["attention"]: r for r in backends(kw.get("device", "cpu"), kw.get("dtype", "fp32"))}
    bad = [a for a in atts if a in runs and not runs[a]["runs"]]
    if bad:
        raise ValueError(f"attention={bad[0]!r} cannot run here: {runs[bad[0]]['why']}")
    rows = []
    for s in lens:
        for a in atts:
            m = measure(a, s, **kw)
            d = m.to_dict()
            d["flops"] = attention_flops(m.batch, m.heads, s, m.head_dim, causal=False, backward=True,
                                         recompute_scores=m.ran in ("flash", "efficient", "cudnn"))
            rows.append(d)
    return pd.DataFrame(rows)

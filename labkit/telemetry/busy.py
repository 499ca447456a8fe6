"""Busy is not FLOPs: ``labkit.telemetry.busy``.

:func:`tensor_flops_estimate` turns DCGM's tensor-pipe activity into achieved FLOP/s;
:func:`busy_vs_flops` measures the CPU version of "GPU-Util 100% is not MFU" (a processor kept 100%
busy by small matmuls does little arithmetic). Taught in chapter 12
(``chapters/part2_diagnosis/ch12_telemetry_topology.ipynb``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def tensor_flops_estimate(tensor_active: float, dense_peak_flops: float) -> float:
    """Achieved tensor-core FLOP/s ≈ PIPE_TENSOR_ACTIVE × dense peak (DCGM profiling metrics: the tensor
    pipe issuing every cycle it can is the dense peak). It counts every FLOP executed, recomputation
    included, so compare it with HFU rather than MFU (chapter 4). Taught in chapter 12."""
    if not 0 <= tensor_active <= 1:
        raise ValueError(f"tensor_flops_estimate: tensor_active is a ratio in [0, 1], got {tensor_active!r}")
    if dense_peak_flops <= 0:
        raise ValueError(f"tensor_flops_estimate: dense_peak_flops must be > 0, got {dense_peak_flops!r}")
    return tensor_active * dense_peak_flops


def busy_vs_flops(sizes=(32, 1024), *, seconds: float = 0.5, dtype: str = "fp32") -> pd.DataFrame:
    """The CPU version of "GPU-Util 100% is not MFU", measured: for each square matmul size, run
    matmuls back to back for ``seconds`` and report the *busy share* (process CPU time / wall time on one
    thread, what ``top`` calls utilisation) beside the achieved FLOP/s (2·n³ per matmul) and
    its ratio to the best size's rate. On an idle core every size reads ~100% busy (on a shared machine the
    same lower share for each); only the big matmuls do much arithmetic. One warm-up matmul per size; matmuls are timed in ~10 ms batches and the rate is
    the median over batches (robust to other processes taking the CPU); the clock is
    ``time.perf_counter`` (CPU work is synchronous). Taught in chapter 12."""
    import torch

    if seconds <= 0:
        raise ValueError(f"busy_vs_flops: seconds must be > 0, got {seconds!r}")
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(dtype)
    if dt is None:
        raise ValueError(f"busy_vs_flops: dtype {dtype!r} not supported; use 'fp32' or 'bf16'")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # one thread: no OpenMP barriers, which stall badly on a shared machine
    try:
        return _busy_vs_flops(torch, sizes, seconds, dt)
    finally:
        torch.set_num_threads(threads)


def _busy_vs_flops(torch, sizes, seconds, dt) -> pd.DataFrame:
    import time

    rows = []
    for n in sizes:
        if int(n) < 1:
            raise ValueError(f"busy_vs_flops: sizes must be positive ints, got {n!r}")
        a = torch.randn(int(n), int(n), dtype=dt)
        b = torch.randn(int(n), int(n), dtype=dt)
        a @ b                                                     # warm-up
        t = time.perf_counter()
        for _ in range(3):
            a @ b
        per_batch = max(1, int(0.01 / max((time.perf_counter() - t) / 3, 1e-7)))   # ~10 ms batches
        rates, calls = [], 0
        w0, c0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - w0 < seconds or len(rates) < 3:
            t = time.perf_counter()
            for _ in range(per_batch):
                a @ b
            rates.append(2.0 * n ** 3 * per_batch / (time.perf_counter() - t))
            calls += per_batch
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        rows.append({"n": int(n), "matmuls": calls, "wall_s": wall, "busy_share": min(1.0, cpu / wall),
                     "flops_per_s": float(np.median(rates))})
    df = pd.DataFrame(rows)
    df["share_of_best"] = df["flops_per_s"] / df["flops_per_s"].max()
    return df

"""Asynchronous device execution, modelled on a CPU: a worker thread that plays a CUDA stream.

On a GPU, a kernel launch returns at once and the work runs later on a *stream*; the host only waits
when it synchronizes (``tensor.item()``, ``print(tensor)``, ``.cpu()``, ``cudaStreamSynchronize``).
:class:`ToyStream` reproduces that on a CPU so chapter 7 can *measure* why host clocks lie about
asynchronous work and what a per-step sync costs (:func:`async_timing_demo`). The real thing is
measured with CUDA events (:mod:`labkit.measure.meter`) and seen on a timeline in chapter 10 (:mod:`labkit.nsys`).

Formerly in ``labkit.nsys_live`` (``labkit.nsys.ToyStream`` and ``labkit.nsys.async_timing_demo``
keep working, with a DeprecationWarning, until labkit 0.3).

Taught in chapter 7 (timing) and chapter 10 (the ``.item()`` gap).
"""
from __future__ import annotations

import numpy as np

from labkit import checks

__all__ = ["ToyStream", "async_timing_demo"]


class ToyStream:
    """A worker thread that plays a CUDA stream, so asynchronous execution can be *measured* on a CPU.

    ``launch(fn, *args)`` queues work and returns at once (like a kernel launch); the worker runs the
    queue in order; ``synchronize()`` blocks until the queue is empty (like ``cudaStreamSynchronize``,
    which ``tensor.item()``, ``print(tensor)`` and ``.cpu()`` call on a GPU). Torch kernels release the
    GIL, so the worker's matmuls really run beside the main thread. It is a model of a GPU stream, not
    a GPU: use it to see *why* host clocks lie and per-step syncs cost, then measure the real thing with
    CUDA events (``labkit.measure.meter``). Taught in chapter 7 (timing) and chapter 10 (the ``.item()`` gap).
    """

    def __init__(self):
        import queue
        import threading

        self._q: queue.Queue = queue.Queue()
        self._t = threading.Thread(target=self._run, daemon=True, name="toy-stream")
        self._t.start()

    def _run(self):
        import sys

        torch = sys.modules.get("torch")     # only torch work needs it; do not import torch for plain callables
        if torch is not None:
            torch.set_num_threads(1)         # OpenMP's thread count is per thread: set it in the worker too
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                fn, args = item
                fn(*args)
            finally:
                self._q.task_done()

    def launch(self, fn, *args) -> None:
        self._q.put((fn, args))

    def synchronize(self) -> None:
        self._q.join()

    def close(self) -> None:
        self._q.put(None)
        self._t.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def async_timing_demo(*, n: int = 256, kernels: int = 6, host_ms: float = 5.0, steps: int = 5,
                      repeats: int = 3) -> dict:
    """Measure, with :class:`ToyStream`, what chapter 7 teaches about asynchronous timing.

    Returns medians over ``repeats`` (seconds): ``launch_only`` (host clock around ``kernels`` matmul
    launches, no sync — what a naive timer reports), ``with_sync`` (same, then ``synchronize()`` — the
    real work), and per training step of ``kernels`` matmuls plus ``host_ms`` of host work (a sleep,
    like waiting on a data loader): ``step_sync_each`` (a sync every step, as ``loss.item()`` does) and
    ``step_no_sync`` (one sync at the end). Without per-step syncs the host work of step n+1 overlaps
    the device work of step n, so step time ≈ max(host, device) instead of host + device. Uses one
    torch thread for the worker. Taught in chapter 7.
    """
    import time

    import torch

    for name, value in (("n", n), ("kernels", kernels), ("steps", steps), ("repeats", repeats)):
        checks.count(name, value)
    checks.nonneg("host_ms", host_ms)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    out = {"launch_only": [], "with_sync": [], "step_sync_each": [], "step_no_sync": [], "device_per_step": []}
    try:
        with ToyStream() as s:
            s.launch(torch.mm, a, b)          # warm-up: thread start, allocator
            s.synchronize()
            for _ in range(repeats):
                t = time.perf_counter()
                for _ in range(kernels):
                    s.launch(torch.mm, a, b)
                out["launch_only"].append(time.perf_counter() - t)
                s.synchronize()
                t = time.perf_counter()
                for _ in range(kernels):
                    s.launch(torch.mm, a, b)
                s.synchronize()
                out["with_sync"].append(time.perf_counter() - t)
                out["device_per_step"].append(out["with_sync"][-1])
                for key, sync_each in (("step_sync_each", True), ("step_no_sync", False)):
                    t = time.perf_counter()
                    for _ in range(steps):
                        time.sleep(host_ms / 1e3)            # host work: the next batch
                        for _ in range(kernels):
                            s.launch(torch.mm, a, b)
                        if sync_each:
                            s.synchronize()                  # loss.item()
                    s.synchronize()
                    out[key].append((time.perf_counter() - t) / steps)
    finally:
        torch.set_num_threads(threads)
    res = {k: float(np.median(v)) for k, v in out.items()}
    res["host_per_step"] = host_ms / 1e3
    return res

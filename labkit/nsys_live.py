"""Live Nsight Systems recording (GPU machines) and asynchrony modelled on a CPU.

:func:`record` profiles :func:`demo_training` with ``nsys`` when a CUDA GPU and nsys are present.
:class:`ToyStream` is a worker thread that plays a CUDA stream so chapter 7 can *measure* on a CPU why
host clocks lie about asynchronous work and what a per-step sync costs (:func:`async_timing_demo`).
Re-exported by :mod:`labkit.nsys`.

Taught in chapter 7 (timing) and chapter 10 (Nsight Systems and NVTX).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["demo_training", "record", "ToyStream", "async_timing_demo"]

# --------------------------------------------------------------------------- live recording (GPU + nsys)
def demo_training(steps: int = 8, *, width: int = 2048, host_sync: bool = True) -> int:
    """A small training loop annotated with NVTX ranges (data / forward / backward / optimizer /
    loss.item()) for :func:`record` to profile; on a machine without CUDA it runs on CPU without NVTX.
    Returns the number of steps run. Taught in chapter 10."""
    import torch

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    nvtx = torch.cuda.nvtx if cuda else None
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(6)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def rng(name):
        import contextlib

        return nvtx.range(name) if nvtx else contextlib.nullcontext()

    for step in range(steps):
        with rng(f"step {step}"):
            with rng("data"):
                x = torch.randn(64, width).to(dev)           # pageable host tensor: a synchronous copy
            with rng("forward"):
                loss = model(x).square().mean()
            with rng("backward"):
                loss.backward()
            with rng("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            if host_sync:
                with rng("loss.item()"):
                    loss.item()
    return steps


def record(out_prefix: str | Path, *, steps: int = 8, timeout_s: float = 300, nsys_exe: str = "nsys") -> Path:
    """Profile :func:`demo_training` with Nsight Systems and export SQLite; returns the .sqlite path.
    Needs ``nsys`` on PATH and a CUDA GPU (RuntimeError otherwise). Runs::

        nsys profile -t cuda,nvtx,osrt -o <out_prefix> --force-overwrite true python -c "..."
        nsys export --type sqlite --force-overwrite true -o <out_prefix>.sqlite <out_prefix>.nsys-rep

    Taught in chapter 10."""
    import shutil
    import subprocess
    import sys

    exe = shutil.which(nsys_exe)
    if exe is None:
        raise RuntimeError(f"record: {nsys_exe!r} is not on PATH; read a recorded report instead")
    out_prefix = Path(out_prefix)
    code = f"import labkit.nsys as n; n.demo_training({int(steps)})"
    subprocess.run([exe, "profile", "-t", "cuda,nvtx,osrt", "-o", str(out_prefix), "--force-overwrite", "true",
                    sys.executable, "-c", code], check=True, timeout=timeout_s, capture_output=True)
    db = out_prefix.with_suffix(".sqlite")
    subprocess.run([exe, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(db),
                    str(out_prefix.with_suffix(".nsys-rep"))], check=True, timeout=timeout_s, capture_output=True)
    return db


# --------------------------------------------------------------------------- asynchrony, modelled on a CPU
class ToyStream:
    """A worker thread that plays a CUDA stream, so asynchronous execution can be *measured* on a CPU.

    ``launch(fn, *args)`` queues work and returns at once (like a kernel launch); the worker runs the
    queue in order; ``synchronize()`` blocks until the queue is empty (like ``cudaStreamSynchronize``,
    which ``tensor.item()``, ``print(tensor)`` and ``.cpu()`` call on a GPU). Torch kernels release the
    GIL, so the worker's matmuls really run beside the main thread. It is a model of a GPU stream, not
    a GPU: use it to see *why* host clocks lie and per-step syncs cost, then measure the real thing with
    CUDA events (``labkit.meter``). Taught in chapter 7 (timing) and chapter 10 (the ``.item()`` gap).
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

    if min(n, kernels, steps, repeats) < 1 or host_ms < 0:
        raise ValueError(f"async_timing_demo: n, kernels, steps, repeats must be >= 1 and host_ms >= 0; got "
                         f"n={n}, kernels={kernels}, steps={steps}, repeats={repeats}, host_ms={host_ms}")
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

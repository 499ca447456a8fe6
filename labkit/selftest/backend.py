"""The device layer of the self-check: the only code in :mod:`labkit.selftest` that touches CUDA.

:class:`CudaBackend` is what ``labkit selftest --gpu`` runs on: its methods are one or two lines each —
``torch.cuda`` queries, the CUDA event class, a bf16 matmul workload — plus the labkit entry points the
checks call (:func:`labkit.train.run`, :func:`labkit.launch`, :func:`labkit.hardware.measure_matmul_peak`),
so that a test can hand the runner any object with the same methods and drive every check without a GPU.

:class:`RehearsalBackend` is the same surface on this CPU: gloo ranks, fp32, a "CUDA event" that reads
the host clock (CPU work is synchronous, so the host clock *is* the device clock there). It runs the
checks' real code paths — the training launches included — on a laptop; its verdicts are not GPU
verdicts, and its report says so.

Taught in chapter 7 (timing: CUDA events), chapter 11 (communication: NCCL), chapter 13 (memory:
``max_memory_allocated``), chapter 19/20 (DDP/FSDP on GPUs) and chapter 4 (MFU).
"""
from __future__ import annotations

import time

__all__ = ["CudaBackend", "RehearsalBackend", "HostClockEvent", "PLANS"]

# What each check runs, per plan. "full" fits an 8-minute run on one H200; "quick" about half of it;
# "cpu" is the rehearsal on a laptop (tiny sizes, fp32, no judged bands).
PLANS = {
    "full": {"meter_n": 8192, "meter_matmuls": 8, "meter_steps": 20,
             "comm_sizes": [2**20, 256 * 2**20], "comm_iters": 10,
             "train_model": "medium", "train_micro": 8, "train_steps": 8,
             "memory_model": "medium", "memory_micro": 8, "memory_band": (0.6, 1.6),
             "peak_seconds": 20.0, "peak_sizes": None, "peak_band": (0.5, 1.05),
             "mfu_model": "1b", "mfu_micro": 8, "mfu_steps": 10, "mfu_floor": 0.2,
             "fsdp_mp_policy": "bf16"},
    "quick": {"meter_n": 4096, "meter_matmuls": 8, "meter_steps": 10,
              "comm_sizes": [2**20, 64 * 2**20], "comm_iters": 5,
              "train_model": "small", "train_micro": 8, "train_steps": 5,
              "memory_model": "medium", "memory_micro": 4, "memory_band": (0.6, 1.6),
              "peak_seconds": 8.0, "peak_sizes": [(4096,) * 3, (8192,) * 3], "peak_band": (0.5, 1.05),
              "mfu_model": "medium", "mfu_micro": 8, "mfu_steps": 6, "mfu_floor": 0.1,
              "fsdp_mp_policy": "bf16"},
    "cpu": {"meter_n": 256, "meter_matmuls": 4, "meter_steps": 5,
            "comm_sizes": [4096, 2**20], "comm_iters": 3,
            "train_model": "tiny", "train_micro": 2, "train_steps": 3,
            "memory_model": "tiny", "memory_micro": 2, "memory_band": None,
            "peak_seconds": 0.5, "peak_sizes": [(256,) * 3, (512,) * 3], "peak_band": None,
            "mfu_model": "tiny", "mfu_micro": 2, "mfu_steps": 4, "mfu_floor": None,
            "fsdp_mp_policy": None},
}


def _matmul_workload(n: int, repeats: int, *, device: str, dtype: str):
    """A callable that runs ``repeats`` n×n matmuls on ``device`` in ``dtype``, and its FLOPs per call (2n³ each)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
    b = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))

    def work():
        for _ in range(repeats):
            torch.matmul(a, b)
    return work, 2.0 * n ** 3 * repeats


class CudaBackend:
    """The GPUs of this machine, as the self-check sees them (every method is a thin wrapper).

    Taught in chapter 7 (CUDA events), chapter 11 (NCCL) and chapter 13 (``max_memory_allocated``).
    """

    kind = "cuda"
    dist_backend = "nccl"        # what labkit.launch must choose for these ranks
    dtype = "bf16"               # what the GPU checks compute in
    train_device = "auto"        # TrainConfig.device: each rank takes cuda:LOCAL_RANK
    peak_device = "cuda:0"       # where the matmul peak is measured
    asynchronous = True          # kernels run after the host call returns (chapter 7)
    memory_kind = "cuda.max_memory_allocated"
    recorded_by = "labkit selftest --gpu"

    def plan(self, quick: bool) -> dict:
        return dict(PLANS["quick" if quick else "full"])

    def unavailable(self) -> str | None:
        """None when a CUDA GPU is usable, else why not (one sentence for the user)."""
        import torch

        if torch.cuda.is_available():
            return None
        if not torch.version.cuda:
            return (f"no CUDA GPU found: torch {torch.__version__} is a CPU-only build "
                    "(install a CUDA build of torch on a GPU machine)")
        return (f"no CUDA GPU found: torch {torch.__version__} is built for CUDA {torch.version.cuda} but "
                "torch.cuda.is_available() is False (check nvidia-smi and CUDA_VISIBLE_DEVICES)")

    def device_count(self) -> int:
        import torch

        return int(torch.cuda.device_count())

    def device_name(self, index: int = 0) -> str:
        import torch

        return torch.cuda.get_device_name(index)

    def versions(self) -> dict:
        """torch, CUDA, NCCL (labkit.record.environment_versions) and cuDNN."""
        import torch

        from labkit.record import environment_versions

        v = environment_versions()
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if cudnn:
            v["cudnn"] = str(cudnn)
        return v

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def event_cls(self):
        import torch

        return torch.cuda.Event

    def matmul_workload(self, n: int, repeats: int):
        """A callable that queues ``repeats`` bf16 n×n matmuls on cuda:0, and its FLOPs per call."""
        return _matmul_workload(n, repeats, device="cuda", dtype="bfloat16")

    def release(self) -> None:
        """Give cached device memory back before the next check launches ranks."""
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()

    # the labkit entry points the checks call: real code, swappable in tests
    def train_run(self, cfg, nprocs: int, *, timeout_s: float):
        from labkit.train.launch import run

        return run(cfg, nprocs, timeout_s=timeout_s)

    def launch(self, target, nprocs: int, *, args: tuple, timeout_s: float):
        from labkit.launcher.parent import launch

        return launch(target, nprocs, backend=self.dist_backend, args=args, timeout_s=timeout_s, stream=False)

    def measure_peak(self, dtype: str, *, max_seconds: float, sizes=None):
        from labkit.hardware.measure import measure_matmul_peak

        return measure_matmul_peak(self.peak_device, dtype, sizes=sizes, max_seconds=max_seconds)


class HostClockEvent:
    """A stand-in for ``torch.cuda.Event`` that reads the host clock (exact for synchronous CPU work).

    Taught in chapter 7 (timing): on a GPU this would time the launch, not the kernel.
    """

    def __init__(self, enable_timing: bool = True):
        self.t = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1e3


class RehearsalBackend(CudaBackend):
    """The self-check's surface on this CPU: ``nprocs`` gloo ranks, fp32, host-clock events.

    It runs every check's real path (launches, training, the memory model, the peak sweep) so the
    machinery is tested without a GPU; no band is judged (the plan "cpu" has none).
    Taught in chapter 5 (gloo ranks stand in for GPUs).
    """

    kind = "cpu"
    dist_backend = "gloo"
    dtype = "fp32"
    train_device = "cpu"
    peak_device = "cpu"
    asynchronous = False
    memory_kind = "ru_maxrss (process peak RSS)"
    recorded_by = "labkit.selftest.run_checks(RehearsalBackend()) — a CPU rehearsal, not a GPU record"

    def __init__(self, nprocs: int = 2):
        from labkit import checks

        self.nprocs = checks.count("nprocs", nprocs, at_most=8)

    def plan(self, quick: bool) -> dict:
        return dict(PLANS["cpu"])

    def unavailable(self) -> str | None:
        return None

    def device_count(self) -> int:
        return self.nprocs

    def device_name(self, index: int = 0) -> str:
        import platform

        return f"CPU rehearsal ({platform.machine() or 'cpu'}, {self.nprocs} gloo ranks)"

    def versions(self) -> dict:
        from labkit.record import environment_versions

        return environment_versions()

    def synchronize(self) -> None:
        return None

    def event_cls(self):
        return HostClockEvent

    def matmul_workload(self, n: int, repeats: int):
        return _matmul_workload(n, repeats, device="cpu", dtype="float32")

    def release(self) -> None:
        import gc

        gc.collect()

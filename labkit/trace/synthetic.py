"""SYNTHETIC GPU-style profiler traces with known answers (seeded), for CPU-only learners and tests.

No GPU is available on the course machine, so chapters 9 and 14 read GPU-shaped Kineto traces made
here. Every file this module writes is labelled SYNTHETIC (top-level ``"labkit_synthetic"`` block
naming the generator, its parameters and seed). The traces follow the layout of real torch.profiler
GPU traces (see the real ones in HTA's test data): ``ProfilerStep#N`` on the host thread,
``cudaLaunchKernel`` runtime events linked to kernels by ``correlation``, compute kernels on one
stream, NCCL kernels on another (with ``Collective name``/``In msg nelems``/``dtype`` args as
PyTorch ≥ 2.1 records them), memory copies, optional ``DataLoader`` spans, ``distributedInfo``.

Each step of rank *r* is laid out on the device as (times in µs, ``d_r`` = the straggler's extra
compute, ``D`` = the straggler delay, 0 without one):

    compute [0, C + d_r)  |  NCCL kernel [C + d_r − H, C + D − H + M)  |  memcpy Y  |  idle (hw + other)

so the NCCL kernel overlaps the last ``H`` µs of compute (hidden), every rank's collective ends when
the last rank has arrived, the next step's first kernel is launched ``hw`` µs into the idle gap
(host wait) and starts ``other`` µs after that. :func:`expected` returns the exact breakdown in
labkit's definitions (:mod:`labkit.trace.breakdown`).

Generators: :func:`synthesize_trace` (one rank's document; also named ``gpu_trace``) and
:func:`synthesize_traces` (every rank's file; also named ``write_traces``). Formerly ``labkit.synthetic``.

Taught in chapter 9 (profiler traces) and chapter 14 (diagnosis).
"""
from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from labkit import checks
from labkit.units import GIB

NCCL_NAMES = {
    "current": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "v2_17": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
    "legacy": "ncclAllReduceRingLLKernel_sum_f32(CollectiveArgs)",
    "rccl": "rcclAllReduceRingLLKernel_sum_f32(ncclDevComm*, unsigned long, ncclWork*)",
}
_COMPUTE_NAMES = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
)


#: The largest synthetic trace: 250k events per rank is ≈ 8,000 steps of 12 kernels (≈ 2 s and 180 MB to
#: build on a 2-core machine); 1M in all keeps a whole set under ≈ 10 s and well under 1.5 GB.
MAX_EVENTS_PER_RANK = 250_000
MAX_EVENTS_TOTAL = 1_000_000


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of a synthetic trace (µs per step unless named otherwise).

    Taught in chapter 9.
    """

    world_size: int = 2
    steps: int = 4
    compute_us: float = 6000.0
    comm_us: float = 2000.0
    hidden_us: float = 500.0
    memcpy_us: float = 300.0
    host_wait_us: float = 800.0
    other_idle_us: float = 400.0
    straggler_rank: int | None = None
    straggler_us: float = 0.0
    data_wait: bool = False           # the host is in the DataLoader during the host-wait gap
    kernels_per_step: int = 12
    comm_nelems: int = 25_000_000     # fp32 elements all-reduced per step
    nccl_names: str = "current"
    comm_args: bool = True
    seed: int = 0

    def __post_init__(self):
        for name in ("world_size", "steps", "kernels_per_step"):
            checks.count(name, getattr(self, name))
        for name in ("data_wait", "comm_args"):
            checks.flag(name, getattr(self, name))
        for name in ("compute_us", "comm_us", "hidden_us", "memcpy_us", "host_wait_us", "other_idle_us",
                     "straggler_us"):
            checks.nonneg(name, getattr(self, name))
        if self.hidden_us > min(self.compute_us, self.comm_us):
            raise ValueError(f"hidden_us={self.hidden_us} must not exceed compute_us={self.compute_us} "
                             f"or comm_us={self.comm_us}")
        if self.nccl_names not in NCCL_NAMES:
            raise ValueError(f"nccl_names={self.nccl_names!r} is not valid; choose one of {sorted(NCCL_NAMES)}")
        per_rank = self.steps * (2 * self.kernels_per_step + 6) + 3     # launches + kernels, comm, memcpy, step
        if per_rank > MAX_EVENTS_PER_RANK or per_rank * self.world_size > MAX_EVENTS_TOTAL:
            raise ValueError(f"steps={self.steps}, kernels_per_step={self.kernels_per_step}, world_size="
                             f"{self.world_size} make {per_rank:,} events per rank ({per_rank * self.world_size:,} in "
                             f"all): a synthetic trace holds at most {MAX_EVENTS_PER_RANK:,} per rank and "
                             f"{MAX_EVENTS_TOTAL:,} in all (a profiler records a few steps, not millions)")
        if self.straggler_rank is not None and not 0 <= self.straggler_rank < self.world_size:
            raise ValueError(f"straggler_rank={self.straggler_rank} must be in [0, {self.world_size})")


def expected(spec: SyntheticSpec, rank: int) -> dict:
    """The exact per-step breakdown (seconds) labkit must find for ``rank``: ``steps`` (the non-last
    steps, which end with the idle gap) and ``last`` (the last step ends at its last kernel).

    Taught in chapter 9.
    """
    D = spec.straggler_us if spec.straggler_rank is not None else 0.0
    d = D if rank == spec.straggler_rank else 0.0
    C, M, H, Y = spec.compute_us, spec.comm_us, spec.hidden_us, spec.memcpy_us
    hw, oth = spec.host_wait_us, spec.other_idle_us
    body = {"compute": C + d, "comm_exposed": M + D - d - H, "comm_hidden": H, "memcpy": Y}
    mid = {**body, "idle_host_wait": hw, "idle_other": oth, "total": C + D - H + M + Y + hw + oth,
           "data_wait": hw + oth if spec.data_wait else 0.0}
    last = {**body, "idle_host_wait": 0.0, "idle_other": 0.0, "total": C + D - H + M + Y, "data_wait": 0.0}
    s = lambda x: {k: v * 1e-6 for k, v in x.items()}
    return {"steps": s(mid), "last": s(last), "comm_bytes": spec.comm_nelems * 4,
            "comm_dur_s": (M + D - d) * 1e-6}


def synthesize_trace(spec: SyntheticSpec, rank: int) -> dict:
    """One rank's SYNTHETIC trace document (a dict in torch.profiler's Chrome-trace layout).

    Also named :func:`gpu_trace`. Taught in chapter 9.
    """
    if not 0 <= rank < spec.world_size:
        raise ValueError(f"rank={rank} must be in [0, {spec.world_size})")
    rng = np.random.default_rng([spec.seed, rank])
    D = spec.straggler_us if spec.straggler_rank is not None else 0.0
    d = D if rank == spec.straggler_rank else 0.0
    C, M, H, Y = spec.compute_us, spec.comm_us, spec.hidden_us, spec.memcpy_us
    hw, oth = spec.host_wait_us, spec.other_idle_us
    L = C + D - H + M + Y + hw + oth
    pid, tid, cstream, nstream = 1000 + rank, 1000 + rank, 7, 20
    t0 = 1.7e12 + 12345.0
    ev: list[dict] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "thread (pt_main_thread)"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": cstream, "args": {"name": f"stream {cstream}"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": nstream, "args": {"name": f"stream {nstream}"}},
    ]
    corr = [1]

    def kernel(cat, name, ts, dur, stream, launch, args=None):
        c = corr[0]
        corr[0] += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel" if cat == "kernel" else
                   "cudaMemcpyAsync", "pid": pid, "tid": tid, "ts": launch, "dur": 4.0,
                   "args": {"correlation": c, "External id": c}})
        a = {"device": rank, "stream": stream, "correlation": c, "External id": c}
        a.update(args or {})
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": stream, "ts": ts, "dur": dur,
                   "args": a})

    first_launch = []
    for s in range(spec.steps):
        base = t0 + s * L
        prev_gap_start = base - hw - oth
        launch0 = prev_gap_start + hw if s else base - 50.0
        first_launch.append(launch0)
        # compute kernels: C + d split into pieces (seeded), back to back
        parts = rng.dirichlet(np.ones(spec.kernels_per_step)) * (C + d)
        t = base
        for j, dur in enumerate(parts):     # the host runs ahead: launches 3 µs apart from launch0
            kernel("kernel", _COMPUTE_NAMES[j % len(_COMPUTE_NAMES)], t, float(dur), cstream,
                   min(launch0 + 3.0 * j, t))
            t += dur
        lt = launch0 + 3.0 * len(parts)
        comm_start = base + C + d - H
        comm_end = base + C + D - H + M
        cargs = ({"Collective name": "allreduce", "In msg nelems": spec.comm_nelems,
                  "Out msg nelems": spec.comm_nelems, "Group size": spec.world_size, "dtype": "Float"}
                 if spec.comm_args else {})
        kernel("kernel", NCCL_NAMES[spec.nccl_names], comm_start, comm_end - comm_start, nstream,
               min(lt, comm_start - 1.0), cargs)
        if Y:
            kernel("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", comm_end, Y, cstream, comm_end - 2.0,
                   {"bytes": 4096})
        if spec.data_wait and s + 1 < spec.steps and hw:
            gap = comm_end + Y
            ev.append({"ph": "X", "cat": "user_annotation",
                       "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                       "pid": pid, "tid": tid, "ts": gap - 5.0, "dur": hw + 5.0, "args": {}})
    for s in range(spec.steps):
        h0 = first_launch[s] - 1.0
        h1 = first_launch[s + 1] - 1.0 if s + 1 < spec.steps else t0 + (s + 1) * L
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 10}", "pid": pid,
                   "tid": tid, "ts": h0, "dur": h1 - h0, "args": {}})
    ev.sort(key=lambda e: (e.get("ts", 0.0), e.get("ph") != "M"))
    return {
        "schemaVersion": 1,
        "labkit_synthetic": {"SYNTHETIC": True, "generator": "labkit.trace.synthetic.synthesize_trace",
                             "spec": asdict(spec), "rank": rank,
                             "note": "SYNTHETIC trace made by labkit; not recorded on a GPU"},
        "deviceProperties": [{"id": rank, "name": "SYNTHETIC GPU", "totalGlobalMem": 80 * GIB}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": spec.world_size},
        "traceEvents": ev,
        "displayTimeUnit": "ms",
    }


def synthesize_traces(spec: SyntheticSpec, out_dir) -> list[Path]:
    """Write ``rank{r}.SYNTHETIC.pt.trace.json.gz`` for every rank; returns the paths.

    Also named :func:`write_traces`. Taught in chapter 9.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(spec.world_size):
        p = out / f"rank{r}.SYNTHETIC.pt.trace.json.gz"
        with gzip.open(p, "wt", compresslevel=6) as f:
            json.dump(synthesize_trace(spec, r), f)
        paths.append(p)
    return paths


# the names chapters 9 and 14 (and datasets/traces/README.md) use: the same functions
gpu_trace = synthesize_trace
write_traces = synthesize_traces

"""SYNTHETIC telemetry and topology files, and the ``datasets/telemetry/`` build: ``labkit.telemetry.synthetic``.

No GPU was available where the course was built: :func:`synthesize_telemetry` writes nvidia-smi and
dcgmi samples from a kernel-activity model (only the counters' *definitions* are real) and
:func:`synthesize_topology` the ``nvidia-smi topo -m`` matrix of a typical machine, made by the one
topology generator, :func:`labkit.comm.topology.synthetic_topology`. Every file's first line says
SYNTHETIC. Taught in chapter 12 (``chapters/part2_diagnosis/ch12_telemetry_topology.ipynb``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from labkit.checks import one_of
from labkit.comm.topology import synthetic_topology

#: workload models: per step a list of kernels (ms, share of SMs busy, tensor-pipe share while busy,
#: DRAM share while busy, NVLink bytes/s while busy) and host time with no kernel (idle_ms)
SCENARIOS = {
    "healthy": dict(kernels=[(4.0, 1.0, 0.62, 0.35, 0.0), (1.2, 1.0, 0.05, 0.80, 0.0),
                             (2.0, 0.9, 0.0, 0.15, 140e9)], idle_ms=0.2,
                    about="large bf16 GEMMs keep every SM and the tensor pipes busy; NCCL on NVLink"),
    "launch_bound": dict(kernels=[(0.012, 0.06, 0.30, 0.05, 0.0)] * 60 + [(0.02, 0.1, 0.0, 0.1, 0.0)] * 20,
                         idle_ms=0.01,
                         about="tiny kernels back to back: a kernel is always running (GPU-Util ~100%) "
                               "but it occupies a few SMs"),
    "data_starved": dict(kernels=[(4.0, 1.0, 0.62, 0.35, 0.0), (1.2, 1.0, 0.05, 0.80, 0.0)], idle_ms=6.0,
                         about="healthy kernels, then the GPU waits for the next batch"),
    "comm_bound": dict(kernels=[(2.0, 1.0, 0.62, 0.35, 0.0), (6.0, 0.2, 0.0, 0.25, 60e9)], idle_ms=0.2,
                       about="all-reduce dominates: a few SMs run NCCL, tensor pipes idle"),
}


def synthesize_telemetry(scenario: str = "healthy", *, seed: int = 0, seconds: float = 10.0,
                         interval_s: float = 0.5, n_gpus: int = 1, peak_power_w: float = 700.0,
                         name: str = "NVIDIA H100 80GB HBM3") -> dict[str, str]:
    """SYNTHETIC nvidia-smi and dcgmi samples of a workload model from :data:`SCENARIOS`.

    A step's kernels are laid on a 10 µs grid (durations jittered by a seeded generator); each sample
    window then gets the *definitions* of the counters: GPU-Util = % of the window with any kernel
    running (NVML), SMACT = time-mean of the share of SMs busy, SMOCC ≈ 0.5 × SMACT (half the warp
    slots), TENSO = time-mean of SM share × tensor share, DRAMA likewise, NVLink bytes/s likewise. Power
    is a linear model (90 W idle + activity share of ``peak_power_w``); only the counters' definitions are
    real. Returns ``{"query_gpu": csv text, "dcgmi_dmon": text}`` whose first line says SYNTHETIC.
    Taught in chapter 12.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"synthesize_telemetry: scenario {scenario!r} unknown; choose from {sorted(SCENARIOS)}")
    if seconds <= 0 or interval_s <= 0 or interval_s > seconds or n_gpus < 1:
        raise ValueError(f"synthesize_telemetry: need 0 < interval_s <= seconds and n_gpus >= 1, got "
                         f"seconds={seconds}, interval_s={interval_s}, n_gpus={n_gpus}")
    rng = np.random.default_rng(seed)
    sc = SCENARIOS[scenario]
    dt = 1e-5
    n = int(round(seconds / dt))
    label = (f"# SYNTHETIC: labkit.telemetry.synthesize_telemetry({scenario!r}, seed={seed}, seconds={seconds}, "
             f"interval_s={interval_s}) -- a workload model, not a recording")
    q_lines = [label, "timestamp, index, name, utilization.gpu [%], utilization.memory [%], memory.used [MiB], "
                      "power.draw [W], temperature.gpu, clocks.sm [MHz]"]
    d_lines = [label, "#Entity   SMACT  SMOCC  TENSO  DRAMA  NVLTX         NVLRX", "ID"]
    t0 = pd.Timestamp("2026-11-29 10:00:00")
    per = int(round(interval_s / dt))
    acts = []
    for _g in range(n_gpus):
        sm, tc, dr, nv = (np.zeros(n) for _ in range(4))
        i = 0
        while i < n:
            for ms, sm_s, tc_s, dr_s, nv_s in sc["kernels"]:
                k = max(1, int(round(ms * 1e-3 / dt * rng.lognormal(0, 0.05))))
                sl = slice(i, min(n, i + k))
                sm[sl], tc[sl], dr[sl], nv[sl] = sm_s, sm_s * tc_s, dr_s, nv_s
                i += k
            i += int(round(sc["idle_ms"] * 1e-3 / dt * rng.lognormal(0, 0.1)))
        acts.append((sm, tc, dr, nv))
    for s in range(n // per):
        ts = (t0 + pd.Timedelta(seconds=(s + 1) * interval_s)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        for g, (sm, tc, dr, nv) in enumerate(acts):
            w = slice(s * per, (s + 1) * per)
            util = 100 * np.mean(sm[w] > 0)
            smact, tenso, drama, nvl = sm[w].mean(), tc[w].mean(), dr[w].mean(), nv[w].mean()
            power = min(peak_power_w, 90 + (peak_power_w - 90) * (0.35 * smact + 0.65 * tenso) + rng.normal(0, 4))
            q_lines.append(f"{ts}, {g}, {name}, {util:.0f} %, {100 * drama:.0f} %, 61234 MiB, {power:.2f} W, "
                           f"{int(55 + 20 * smact)}, 1980 MHz")
            d_lines.append(f"GPU {g}     {smact:.3f}  {0.5 * smact:.3f}  {tenso:.3f}  {drama:.3f}  "
                           f"{nvl:<12.0f}  {nvl:.0f}")
    return {"query_gpu": "\n".join(q_lines) + "\n", "dcgmi_dmon": "\n".join(d_lines) + "\n"}


#: the machines :func:`synthesize_topology` knows: arguments of :func:`labkit.comm.topology.synthetic_topology`
SYSTEMS = {
    "dgx-h100": {},                    # its defaults: 8 GPUs all NV18, 8 NICs (PXB to their GPU), 2 x 56 cores
    "pcie-4gpu": {"n_gpus": 4, "nvlinks": 0, "n_nics": 1, "cores_per_socket": 16, "pcie_link": "PIX"},
}


def synthesize_topology(system: str = "dgx-h100") -> str:
    """A SYNTHETIC ``nvidia-smi topo -m`` matrix of a typical machine, in nvidia-smi's layout (tab
    separated, ``CPU Affinity`` and ``NUMA Affinity`` columns, the legend), made by
    :func:`labkit.comm.topology.synthetic_topology` with the arguments in :data:`SYSTEMS`. ``"dgx-h100"``:
    8 GPUs all pairs NV18 (18 NVLinks through NVSwitch), one NIC per GPU behind its PCIe switch (PXB),
    two sockets of 56 cores with SMT (GPUs 0-3 on node 0); ``"pcie-4gpu"``: a 4-GPU workstation without
    NVLink (pairs on one switch PIX, across sockets SYS), one NIC. Built from the systems' published
    layouts, not recorded. Taught in chapter 12."""
    one_of("system", system, SYSTEMS)
    return synthetic_topology(**SYSTEMS[system])


def build_dataset(out_dir: str | Path, *, seconds: float = 5.0, interval_s: float = 0.5) -> list[Path]:
    """(Re)generate ``datasets/telemetry/``: per scenario of :data:`SCENARIOS` a ``<scenario>_query_gpu.csv``
    and ``<scenario>_dcgmi_dmon.txt`` (seed 0), and ``topo_<system>.txt`` for both synthetic systems;
    every file starts with a SYNTHETIC line. Taught in chapter 12."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for sc in SCENARIOS:
        d = synthesize_telemetry(sc, seed=0, seconds=seconds, interval_s=interval_s)
        for key, ext in (("query_gpu", "csv"), ("dcgmi_dmon", "txt")):
            p = out_dir / f"{sc}_{key}.{ext}"
            p.write_text(d[key])
            written.append(p)
    for system in ("dgx-h100", "pcie-4gpu"):
        p = out_dir / f"topo_{system.replace('-', '_')}.txt"
        p.write_text(synthesize_topology(system))
        written.append(p)
    return written

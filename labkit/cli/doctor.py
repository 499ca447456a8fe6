"""``labkit doctor``: what this machine is, and what peak it really reaches.

Reports Python/torch/CUDA/NCCL versions, CPU threads and GPUs, which torch.distributed backends are
available, each GPU's catalogue entry (or why none matches) beside a time-boxed live matmul and memory
bandwidth measurement, and the GPU topology from ``nvidia-smi topo -m`` when nvidia-smi exists.

Taught in chapter 6 (roofline) and chapter 4 (MFU and HFU).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "doctor", help="versions, devices, backends, catalogue vs measured peak, topology",
        description="Check the environment and measure this machine's achievable matmul peak and "
                    "memory bandwidth (time-boxed) next to the datasheet catalogue.")
    p.add_argument("--quick", action="store_true", help="smallest, fastest measurements (about a second)")
    p.add_argument("--no-measure", action="store_true", help="skip the live measurements")
    p.add_argument("--dtype", default=None, help="dtype to measure (default fp32 on CPU, bf16 on GPU)")
    p.add_argument("--max-seconds", type=float, default=None, help="time box per matmul sweep")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def collect(args) -> dict:
    """Everything the command reports, as a dict."""
    import torch
    import torch.distributed as dist

    from labkit import hardware
    from labkit.record import environment_versions

    info: dict = {"versions": environment_versions(),
                  "cpu": {"logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
                  "backends": {"gloo": bool(dist.is_available() and dist.is_gloo_available()),
                               "nccl": bool(dist.is_available() and dist.is_nccl_available()),
                               "mpi": bool(dist.is_available() and dist.is_mpi_available())},
                  "gpus": [], "measured": [], "topology": None}
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        name = torch.cuda.get_device_name(i)
        props = torch.cuda.get_device_properties(i)
        entry = {"index": i, "name": name, "memory_bytes": int(props.total_memory)}
        try:
            spec = hardware.lookup(name)
            entry.update(catalogue=spec.name, peak_flops=spec.peak_flops, memory_bw=spec.memory_bw,
                         source=spec.source)
        except ValueError as e:
            entry["catalogue_error"] = str(e)
        info["gpus"].append(entry)
    if not args.no_measure:
        devices = ["cuda:0"] if info["gpus"] else ["cpu"]
        for dev in devices:
            dtype = args.dtype or ("bf16" if dev.startswith("cuda") else "fp32")
            if args.quick:
                sizes = [(512, 512, 512), (1024, 1024, 1024)] if dev == "cpu" else [(4096,) * 3, (8192,) * 3]
                box = args.max_seconds or 0.5
                nbytes = 16 * 2**20 if dev == "cpu" else 2**28
            else:
                sizes, box, nbytes = None, args.max_seconds or 3.0, None
            m = hardware.measure_matmul_peak(dev, dtype, sizes=sizes, max_seconds=box)
            bw = hardware.measure_memory_bandwidth(dev, nbytes=nbytes)
            row = {"device": dev, "dtype": m.dtype, "matmul_flops": m.flops, "shape": list(m.shape),
                   "sweep": [[list(s), f] for s, f in m.table], "memory_bw": bw, "seconds": m.seconds}
            if dev.startswith("cuda") and "catalogue" in info["gpus"][0]:
                spec = hardware.lookup(info["gpus"][0]["name"])
                if m.dtype in spec.peak_flops:
                    row["fraction_of_catalogue_peak"] = m.flops / spec.peak(m.dtype)
                row["fraction_of_catalogue_bw"] = bw / spec.memory_bw
            info["measured"].append(row)
        info["capability"] = hardware.capability(devices[0], quick_seconds=0.5 if args.quick else 1.5)
        cal, fresh = hardware.calibration.find(devices[0], "fp32")
        info["calibration"] = (None if cal is None else {"describe": cal.describe(), "flops": cal.flops,
                                                            "fresh": fresh})
    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
            info["topology"] = r.stdout if r.returncode == 0 else f"nvidia-smi topo -m failed: {r.stderr.strip()}"
        except (OSError, subprocess.TimeoutExpired) as e:
            info["topology"] = f"nvidia-smi topo -m failed: {e}"
    return info


def run(args) -> int:
    info = collect(args)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    v = info["versions"]
    print("versions   " + ", ".join(f"{k} {val}" for k, val in v.items()))
    print(f"cpu        {info['cpu']['logical_cpus']} logical CPUs, torch uses {info['cpu']['torch_threads']} threads")
    print("backends   " + ", ".join(f"{k}: {'yes' if ok else 'no'}" for k, ok in info["backends"].items()))
    if not info["gpus"]:
        print("gpus       none (CPU only: MFU divides by a calibrated or live-measured matmul peak)")
    for g in info["gpus"]:
        if "catalogue" in g:
            pk = g["peak_flops"]
            print(f"gpu {g['index']}      {g['name']} -> {g['catalogue']}: "
                  + ", ".join(f"{k} {val / 1e12:,.1f} TF" for k, val in pk.items())
                  + f", {g['memory_bw'] / 1e9:,.0f} GB/s  [{g['source'].split(',')[0]}]")
        else:
            print(f"gpu {g['index']}      {g['name']}: NOT in the catalogue ({g['catalogue_error'][:120]}...)")
    for m in info["measured"]:
        s = "x".join(map(str, m["shape"]))
        f = m["matmul_flops"]
        rate = f"{f / 1e12:,.2f} TFLOP/s" if f >= 1e12 else f"{f / 1e9:,.1f} GFLOP/s"
        line = (f"measured   {m['device']} {m['dtype']} matmul {rate} "
                f"(best shape {s}, {m['seconds']:.1f} s sweep), copy bandwidth {m['memory_bw'] / 1e9:,.1f} GB/s")
        if "fraction_of_catalogue_peak" in m:
            line += f" = {m['fraction_of_catalogue_peak']:.0%} of catalogue peak"
        print(line)
    cap = info.get("capability") or {}
    base = cap.get("fp32", {}).get("flops")
    for d, c in cap.items():
        if d == "fp32" or not base:
            continue
        if c.get("flops") is None:
            print(f"dtype      {d}: not supported here ({c.get('why', '')[:80]})")
            continue
        what = {"fast": "FAST", "no faster": "no faster than fp32", "slow": "SLOW (emulated: train in fp32)"}
        print(f"dtype      {d} is {what[c['verdict']]}: {c['flops'] / 1e9:,.1f} GFLOP/s vs fp32 "
              f"{base / 1e9:,.1f} GFLOP/s ({c['ratio_to_fp32']:.3g}× fp32; {c['source']})")
    if "calibration" in info:
        c = info["calibration"]
        print("calibrated " + ("none: MFU divides by a peak measured in each process — run `labkit calibrate`"
                               if c is None else f"{c['describe']}" + ("" if c["fresh"] else
                                                                      " (STALE: conditions changed)")))
    if info["topology"]:
        print("topology (nvidia-smi topo -m):")
        print(info["topology"])
    return 0

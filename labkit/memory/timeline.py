"""Allocated memory through one training step — forward, backward, optimizer step — measured live.

``torch.profiler`` with ``profile_memory=True`` records every allocation and free together with the
allocator's running total ("Total Allocated" on each ``[memory]`` event of the Chrome trace; PyTorch
docs, *torch.profiler*, ``profile_memory``). On a CPU that total counts only what was allocated after
profiling started, so :func:`step_memory` adds the bytes the model and optimizer already held (exact,
:func:`labkit.memory.tensors.measure_model_state`); on a GPU the CUDA caching allocator's total is
absolute and nothing is added. The three phases are ``record_function`` ranges, so the samples can be
cut at the phase boundaries.

What one first step of a fresh model shows (the picture of Korthikanti et al. 2022 §4 and ZeRO §3):
forward saves activations (the curve climbs), backward frees them while the gradients appear (the peak
comes early in backward: saved activations still alive beside the logits' gradient), and the first
``optimizer.step()`` allocates Adam's two moments (they stay for the rest of training).

Taught in chapter 13 (memory anatomy, §3).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from labkit.memory.tensors import measure_model_state

PHASES = ("forward", "backward", "optimizer")
_DEVICE_TYPE = {"cpu": 0, "cuda": 1}     # c10::DeviceType in the profiler's "Device Type"

__all__ = ["PHASES", "StepMemory", "step_memory", "memory_samples"]


@dataclass
class StepMemory:
    """Allocated bytes through one step: ``samples`` (t_ms, allocated, phase; one row per allocation
    or free, the baseline included), ``phases`` (phase, start_ms, end_ms, start_bytes, end_bytes),
    ``baseline`` (bytes held before the step). Taught in chapter 13 (memory anatomy, §3)."""

    samples: pd.DataFrame
    phases: pd.DataFrame
    baseline: int
    device: str

    def change(self, phase: str) -> int:
        """Bytes allocated at the end of ``phase`` minus at its start (what the phase left behind)."""
        if phase not in PHASES:
            raise ValueError(f"phase={phase!r}: one of {PHASES}")
        row = self.phases.set_index("phase").loc[phase]
        return int(row["end_bytes"] - row["start_bytes"])

    @property
    def peak_bytes(self) -> int:
        return int(self.samples["allocated"].max())

    @property
    def peak_phase(self) -> str:
        return str(self.samples.loc[self.samples["allocated"].idxmax(), "phase"])


def memory_samples(trace: dict, device_type: str = "cpu") -> pd.DataFrame:
    """The ``[memory]`` events of a Chrome trace as (ts_us, allocated, bytes), in time order, for one
    device type ("cpu" or "cuda"). Taught in chapter 13."""
    if device_type not in _DEVICE_TYPE:
        raise ValueError(f"device_type={device_type!r}: one of {sorted(_DEVICE_TYPE)}")
    want = _DEVICE_TYPE[device_type]
    rows = [(float(e["ts"]), int(e["args"]["Total Allocated"]), int(e["args"].get("Bytes", 0)))
            for e in trace.get("traceEvents", [])
            if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == want]
    return pd.DataFrame(sorted(rows), columns=["ts_us", "allocated", "bytes"])


def step_memory(model, optimizer, idx, targets=None) -> StepMemory:
    """Run one training step (forward, backward, ``optimizer.step()``) under ``torch.profiler`` with
    ``profile_memory=True`` and return the allocated bytes through it (:class:`StepMemory`).

    ``model(idx, targets)`` must return ``(logits, loss)`` (``labkit.models.GPT``). The logits are
    dropped after the forward, as a training loop that only keeps the loss does. Gradients are not
    zeroed afterwards: they are part of what the step leaves behind. Taught in chapter 13 (§3).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")     # no "USDT: profiler_start" lines (see train/loop.py)
    device = idx.device.type
    if device not in _DEVICE_TYPE:
        raise ValueError(f"idx is on {idx.device}; step_memory measures cpu or cuda tensors")
    held = measure_model_state(model, optimizer)
    baseline = held.model_states if device == "cpu" else 0   # CUDA's total already counts them
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.json"
        with profile(activities=activities, profile_memory=True) as prof:
            with record_function("forward"):
                logits, loss = model(idx, targets)
                del logits
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
            if device == "cuda":
                torch.cuda.synchronize(idx.device)
        with contextlib.redirect_stdout(None):
            prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    spans = {e["name"]: (float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in trace["traceEvents"]
             if e.get("cat") == "user_annotation" and e.get("name") in PHASES}
    mem = memory_samples(trace, device)
    t0, t_end = spans["forward"][0], spans["optimizer"][1]
    mem = mem[(mem["ts_us"] >= t0) & (mem["ts_us"] <= t_end)]
    ts, total = mem["ts_us"].to_numpy(), mem["allocated"].to_numpy() + baseline

    def at(t):      # allocated just after time t: the last event at or before it (baseline before any)
        i = np.searchsorted(ts, t, side="right") - 1
        if i >= 0:
            return int(total[i])
        return int(total[0] - mem["bytes"].iloc[0]) if ts.size else int(baseline)

    phase_of = np.full(ts.size, "", dtype=object)
    for name, (a, b) in spans.items():
        phase_of[(ts >= a) & (ts <= b)] = name
    samples = pd.DataFrame({"t_ms": np.concatenate([[0.0], (ts - t0) / 1e3]),
                            "allocated": np.concatenate([[at(t0 - 1e-3)], total]).astype(np.int64),
                            "phase": np.concatenate([["forward"], phase_of])})
    phases = pd.DataFrame([{"phase": p, "start_ms": (spans[p][0] - t0) / 1e3, "end_ms": (spans[p][1] - t0) / 1e3,
                            "start_bytes": at(spans[p][0] - 1e-3), "end_bytes": at(spans[p][1])} for p in PHASES])
    return StepMemory(samples=samples, phases=phases, baseline=int(baseline), device=device)

"""Allocated memory through one training step — forward, backward, optimizer step — measured live.

``torch.profiler`` with ``profile_memory=True`` records every allocation and free together with the
allocator's running total ("Total Allocated" on each ``[memory]`` event of the Chrome trace; PyTorch
docs, *torch.profiler*, ``profile_memory``). On a CPU that total counts only what was allocated after
profiling started, so :class:`StepMemoryRecorder` adds the bytes the model and optimizer already held (exact,
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

__all__ = ["PHASES", "StepMemory", "StepMemoryRecorder", "memory_samples"]


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


class StepMemoryRecorder:
    """Record allocated memory through one step of *your* loop, cut at named phases::

        rec = memory.StepMemoryRecorder(model, opt)
        with rec:
            with rec.phase("forward"):
                loss = model(idx, targets)[1]        # keep only the loss: the logits are freed
            with rec.phase("backward"):
                loss.backward()
            with rec.phase("optimizer"):
                opt.step()
        rec.result                                   # a StepMemory

    The step is yours (labkit's one training loop stays ``labkit.train``); the recorder runs
    ``torch.profiler`` with ``profile_memory=True`` around it, each phase a ``record_function`` range.
    ``device``: "cpu" or "cuda" (whose allocator to read). Taught in chapter 13 (memory anatomy, §3).
    """

    def __init__(self, model, optimizer=None, device: str = "cpu"):
        if device not in _DEVICE_TYPE:
            raise ValueError(f"device={device!r}: one of {sorted(_DEVICE_TYPE)}")
        self.model, self.optimizer, self.device = model, optimizer, device
        self.names: list[str] = []
        self.result: StepMemory | None = None
        self._prof = None

    def phase(self, name: str):
        """A ``record_function`` range named ``name`` (one of :data:`PHASES`, each once, in order)."""
        from torch.profiler import record_function

        if self._prof is None:
            raise RuntimeError("rec.phase(...) belongs inside `with rec:`")
        if name not in PHASES or name in self.names:
            raise ValueError(f"phase={name!r}: each of {PHASES} once (recorded so far: {self.names})")
        self.names.append(name)
        return record_function(name)

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # no "USDT: profiler_start" lines (see train/loop.py)
        held = measure_model_state(self.model, self.optimizer)
        self._baseline = held.model_states if self.device == "cpu" else 0   # CUDA's total already counts them
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        self._prof = profile(activities=acts, profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        self._prof.__exit__(*exc)
        if exc[0] is None:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "step.json"
                with contextlib.redirect_stdout(None):
                    self._prof.export_chrome_trace(str(path))
                trace = json.loads(path.read_text())
            self.result = _step_from_trace(trace, self.names, self._baseline, self.device)
        return False


def _step_from_trace(trace: dict, names: list[str], baseline: int, device: str) -> StepMemory:
    spans = {e["name"]: (float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in trace["traceEvents"]
             if e.get("cat") == "user_annotation" and e.get("name") in names}
    missing = [p for p in PHASES if p not in spans]
    if missing:
        raise ValueError(f"the step recorded no {missing} phase: wrap forward, backward and optimizer in rec.phase(...)")
    mem = memory_samples(trace, device)
    t0, t_end = spans[PHASES[0]][0], spans[PHASES[-1]][1]
    # "Total Allocated" is the allocator's process-wide count of blocks allocated while a profiler was on
    # and not yet freed while one was on: a tensor made under an earlier profiler and freed after it stays
    # counted (c10's ProfiledCPUMemoryReporter). So measure from the count just before the step starts.
    before = mem[mem["ts_us"] < t0]
    mem = mem[(mem["ts_us"] >= t0) & (mem["ts_us"] <= t_end)]
    if len(before):
        stale = int(before["allocated"].iloc[-1])
    else:
        stale = int(mem["allocated"].iloc[0] - mem["bytes"].iloc[0]) if len(mem) else 0
    ts, total = mem["ts_us"].to_numpy(), mem["allocated"].to_numpy() - stale + baseline

    def at(t):      # allocated just after time t: the last event at or before it
        i = np.searchsorted(ts, t, side="right") - 1
        if i >= 0:
            return int(total[i])
        return int(baseline)

    phase_of = np.full(ts.size, "", dtype=object)
    for name, (a, b) in spans.items():
        phase_of[(ts >= a) & (ts <= b)] = name
    samples = pd.DataFrame({"t_ms": np.concatenate([[0.0], (ts - t0) / 1e3]),
                            "allocated": np.concatenate([[at(t0 - 1e-3)], total]).astype(np.int64),
                            "phase": np.concatenate([[PHASES[0]], phase_of])})
    phases = pd.DataFrame([{"phase": p, "start_ms": (spans[p][0] - t0) / 1e3, "end_ms": (spans[p][1] - t0) / 1e3,
                            "start_bytes": at(spans[p][0] - 1e-3), "end_bytes": at(spans[p][1])} for p in PHASES])
    return StepMemory(samples=samples, phases=phases, baseline=int(baseline), device=device)

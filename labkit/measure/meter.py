"""A step and phase meter for real training loops, cheap enough to leave on.

::

    meter = Meter(tokens_per_step=B * T * world, flops_per_token=fpt, peak_flops=peak, n_devices=world)
    for batch in loader_iter:
        with meter.step():
            with meter.phase("data"):
                x, y = next(it)
            with meter.phase("forward"):
                loss = model(x, y)
            with meter.phase("backward"):
                loss.backward()
            with meter.phase("optimizer"):
                opt.step(); opt.zero_grad()
    print(meter.log_line()); record = meter.to_record()

How it times (chapter 7): on a GPU, kernels run asynchronously — a host clock around ``loss.backward()``
measures the *launch*, not the work. The meter therefore records CUDA events (``record()`` only, no
host synchronisation per step) and resolves them lazily: when you ask for a summary/log/record, or
when the bounded ring of pending steps (``max_pending``) fills, the *oldest* steps are resolved (their
events completed long ago, so this rarely waits). On CPU it uses ``time.perf_counter``. The first
``warmup_steps`` are not recorded (allocator warm-up, cuDNN autotune, compilation). Statistics are
median / p10 / p90 (:class:`labkit.record.Stat`).

With the host clock the meter also reads this process's CPU seconds per step (``time.process_time``, all
threads): ``record.extra["cpu_step_time"]``. On an oversubscribed CPU the wall time of a step carries the
scheduler's share of the cores — the neighbours' load — while its CPU time carries the step's own work;
CPU time misses waiting (sleeps, I/O, another rank), so it is a figure for CPU-bound steps (chapter 28, lab 11:
a regression monitor on a shared machine).

A ``"data"`` phase timed with CUDA events measures how long the *GPU* sat idle waiting for the host to
deliver the batch — the exposed data wait, which is what matters; likewise ``"comm"`` times what the
stream could see of a blocking collective.

The clock is injectable (``clock=``): :class:`CudaEventClock` takes an ``event_cls``, so tests drive the
CUDA branch with a fake event class and no GPU.

Taught in chapter 7 (timing).
"""
from __future__ import annotations

import dataclasses
import time

from labkit import checks
from labkit.record import RunRecord, Stat, environment_versions


class PerfCounterClock:
    """Host clock: marks are ``time.perf_counter()`` floats. Taught in chapter 7 (timing)."""

    kind = "perf_counter"

    def mark(self):
        return time.perf_counter()

    def elapsed(self, start, end) -> float:
        return end - start


class CudaEventClock:
    """Device clock: marks are recorded CUDA events; :meth:`elapsed` waits only on the *end* event.

    ``event_cls`` defaults to ``torch.cuda.Event``; any class with ``record()``, ``synchronize()`` and
    ``elapsed_time(other) -> ms`` works (tests pass a fake). Taught in chapter 7 (timing).
    """

    kind = "cuda_event"

    def __init__(self, event_cls=None):
        if event_cls is None:
            import torch

            event_cls = torch.cuda.Event
        self._event_cls = event_cls

    def mark(self):
        ev = self._event_cls(enable_timing=True)
        ev.record()
        return ev

    def elapsed(self, start, end) -> float:
        end.synchronize()          # returns at once if the GPU passed this event long ago
        return start.elapsed_time(end) / 1e3


class _Phase:
    __slots__ = ("_meter", "_name", "_start")

    def __init__(self, meter, name):
        self._meter, self._name, self._start = meter, name, None

    def __enter__(self):
        m = self._meter
        if m._ranges is not None:
            m._ranges.range_push(self._name)
        if m._current is not None:
            self._start = m._clock.mark()
        return self

    def __exit__(self, *exc):
        m = self._meter
        cur = m._current
        if cur is not None and self._start is not None:
            cur[3].append((self._name, self._start, m._clock.mark()))
        self._start = None
        if m._ranges is not None:
            m._ranges.range_pop()
        return False


class _Step:
    __slots__ = ("_meter", "tokens")

    def __init__(self, meter):
        self._meter, self.tokens = meter, None

    def __enter__(self):
        m = self._meter
        if m._ranges is not None:
            m._ranges.range_push(f"step {m._seen}")
        m._begin(self.tokens)
        return self

    def __exit__(self, *exc):
        m = self._meter
        m._end(failed=exc[0] is not None)
        if m._ranges is not None:
            m._ranges.range_pop()
        return False


class Meter:
    """Times optimizer steps and named phases; reports tokens/s, MFU/HFU and a :class:`RunRecord`.

    ``tokens_per_step`` is the **global** number of real tokens per step (override per step with
    ``step(tokens=...)``); ``flops_per_token``/``hardware_flops_per_token`` per token (chapter 3);
    ``peak_flops`` per device (:func:`labkit.hardware.resolve_peak`); ``n_devices`` all devices.
    ``device=None`` means "auto" (CUDA events when CUDA is available, else perf_counter).
    ``ranges="nvtx"`` also opens an NVTX range per step (``step N``) and per phase on a CUDA device, so
    an Nsight Systems timeline shows the meter's phases (chapter 10); any object with ``range_push(name)``
    and ``range_pop()`` works (tests pass a fake).

    Taught in chapter 7 (timing).
    """

    def __init__(self, *, device=None, warmup_steps: int = 2, tokens_per_step: int | None = None,
                 flops_per_token: float | None = None, hardware_flops_per_token: float | None = None,
                 peak_flops: float | None = None, peak_source: str | None = None, n_devices: int = 1,
                 dtype: str | None = None, label: str = "run", clock=None, max_pending: int = 256,
                 ranges=None):
        checks.count("warmup_steps", warmup_steps, at_least=0)
        checks.count("n_devices", n_devices)
        checks.count("max_pending", max_pending, at_least=2)
        for name, v in (("tokens_per_step", tokens_per_step), ("flops_per_token", flops_per_token),
                        ("hardware_flops_per_token", hardware_flops_per_token), ("peak_flops", peak_flops)):
            if v is not None:           # None: not known, so no tokens/s, MFU or HFU
                checks.positive(name, v)
        if dtype is not None:
            from labkit.hardware.catalogue import normalize_dtype

            dtype = normalize_dtype(dtype)
        if clock is None:
            from labkit.hardware.measure import resolve_device

            dev = resolve_device("auto" if device is None else device)
            clock = CudaEventClock() if dev.type == "cuda" else PerfCounterClock()
            self.device = str(dev)
        else:
            default = {"cuda_event": "cuda", "perf_counter": "cpu"}.get(getattr(clock, "kind", ""), "custom")
            self.device = str(device) if device is not None else default
        self._clock = clock
        if ranges == "nvtx":        # thin CUDA branch: NVTX ranges for Nsight Systems (chapter 10)
            import torch

            ranges = torch.cuda.nvtx if self.device.startswith("cuda") else None
        self._ranges = ranges
        self.warmup_steps = warmup_steps
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.hardware_flops_per_token = hardware_flops_per_token
        self.peak_flops = peak_flops
        self.peak_source = peak_source if peak_source is not None else ("user" if peak_flops else None)
        self.n_devices = n_devices
        self.dtype = dtype
        self.label = label
        self.max_pending = max_pending
        self._seen = 0                # steps begun, warm-up included
        self._current = None          # [start, end, tokens, [(phase, s, e), ...], CPU seconds at start]
        self._host = getattr(clock, "kind", "") == "perf_counter"   # CPU seconds per step: host clock only
        self._cpu_steps: list[float] = []
        self._pending: list = []
        self._steps: list[float] = []
        self._tokens: list = []
        self._phases: dict[str, list[float]] = {}
        self._per_step: list[dict[str, float]] = []   # each measured step's phases (chapter 25's controller)
        self._phase_objs: dict[str, _Phase] = {}
        self._step_obj = _Step(self)

    # ------------------------------------------------------------------ recording
    def step(self, tokens: int | None = None) -> _Step:
        """Context manager around one optimizer step; ``tokens`` = global real tokens of this step.

        Taught in chapter 7 (timing).
        """
        self._step_obj.tokens = tokens
        return self._step_obj

    def phase(self, name: str) -> _Phase:
        """Context manager around one phase of the current step ("data", "forward", "backward",
        "optimizer", "comm" or any name); repeated phases in one step add up.

        Taught in chapter 7 (timing).
        """
        obj = self._phase_objs.get(name)
        if obj is None:
            if not isinstance(name, str) or not name:
                raise ValueError(f"phase name={name!r} must be a non-empty string")
            obj = self._phase_objs[name] = _Phase(self, name)
        return obj

    def _begin(self, tokens):
        if self._current is not None:
            raise RuntimeError("meter.step() entered while a step is open (nested steps are not allowed)")
        self._seen += 1
        if self._seen <= self.warmup_steps:
            return
        if tokens is not None:
            if isinstance(tokens, bool) or int(tokens) <= 0:
                raise ValueError(f"tokens={tokens!r} must be a positive int (real tokens in the step)")
            tokens = int(tokens)
        self._current = [self._clock.mark(), None, tokens if tokens is not None else self.tokens_per_step, [],
                         time.process_time() if self._host else None]

    def _end(self, failed: bool):
        cur = self._current
        if cur is None:
            return
        self._current = None
        if failed:
            return
        cur[1] = self._clock.mark()
        if cur[4] is not None:
            self._cpu_steps.append(time.process_time() - cur[4])
        self._pending.append(cur)
        if len(self._pending) >= self.max_pending:
            self._resolve(len(self._pending) // 2)

    def _resolve(self, n: int | None = None):
        todo = self._pending if n is None else self._pending[:n]
        el = self._clock.elapsed
        for start, end, tokens, phases, _ in todo:
            self._steps.append(el(start, end))
            self._tokens.append(tokens)
            per: dict[str, float] = {}
            for name, s, e in phases:
                per[name] = per.get(name, 0.0) + el(s, e)
            for name, v in per.items():
                self._phases.setdefault(name, []).append(v)
            self._per_step.append(per)
        self._pending = [] if n is None else self._pending[n:]

    # ------------------------------------------------------------------ reading
    @property
    def n_steps(self) -> int:
        """Measured (post-warm-up), completed steps; never synchronises. Chapter 7 (timing)."""
        return len(self._steps) + len(self._pending)

    def recent(self, lag: int = 0) -> dict[str, float] | None:
        """The phase seconds of the measured step ``lag`` steps before the latest (None if there is none).

        Resolves only up to that step: on CPU (``lag=0``) nothing waits; with CUDA events ``lag=1`` reads
        the step before the one just enqueued, whose events the GPU has normally passed — so a controller
        between steps (chapter 25's adaptive accumulation) adds no synchronisation per step. Chapter 7.
        """
        lag = checks.count("lag", lag, at_least=0)
        i = self.n_steps - 1 - lag
        if i < 0:
            return None
        if i >= len(self._steps):
            self._resolve(i + 1 - len(self._steps))
        return dict(self._per_step[i])

    @property
    def step_times(self) -> list[float]:
        """Seconds per measured step (resolves pending events). Chapter 7 (timing)."""
        self._resolve()
        return list(self._steps)

    def summary(self) -> dict:
        """Statistics so far: step_time and phases (:class:`Stat`), shares, tokens/s, MFU, HFU.

        An impossible MFU/HFU (> 100%) is not returned as a number: ``mfu`` is None and
        ``mfu_error`` holds the explanation from :func:`labkit.flops.mfu.mfu`.

        Taught in chapter 7 (timing) and chapter 4 (MFU and HFU).
        """
        from labkit.flops import mfu as mfu_mod

        self._resolve()
        out: dict = {"label": self.label, "n_steps": len(self._steps), "warmup_steps": self.warmup_steps,
                     "device": self.device, "clock": getattr(self._clock, "kind", type(self._clock).__name__),
                     "step_time": None, "phases": {}, "phase_share": {}, "tokens_per_s": None,
                     "tokens_per_s_per_device": None, "mfu": None, "hfu": None,
                     "peak_flops": self.peak_flops, "peak_source": self.peak_source, "dtype": self.dtype}
        if not self._steps:
            return out
        total = sum(self._steps)
        out["step_time"] = Stat.of(self._steps)
        for name, vals in self._phases.items():
            out["phases"][name] = Stat.of(vals)
            out["phase_share"][name] = sum(vals) / total if total > 0 else None
        if total > 0 and all(t is not None for t in self._tokens):
            tps = sum(self._tokens) / total
            out["tokens_per_s"] = tps
            out["tokens_per_s_per_device"] = tps / self.n_devices
            if self.peak_flops:
                for key, fpt, fn, arg in (("mfu", self.flops_per_token, mfu_mod.mfu, "flops_per_token"),
                                          ("hfu", self.hardware_flops_per_token, mfu_mod.hfu,
                                           "hardware_flops_per_token")):
                    if fpt:
                        try:
                            out[key] = fn(tokens_per_s=tps, n_devices=self.n_devices,
                                          peak_flops=self.peak_flops, **{arg: fpt})
                        except ValueError as e:
                            out[f"{key}_error"] = str(e)
        return out

    def set_peak(self, peak_flops: float, source: str) -> None:
        """Divide MFU/HFU by another per-device peak from now on (e.g. one re-measured on an idle
        machine) and say where it came from. Taught in chapter 4 (MFU's denominator)."""
        self.peak_flops, self.peak_source = checks.positive("peak_flops", peak_flops), source

    def log_line(self) -> str:
        """One line for a training log: step time (median, p10–p90), phase shares, tok/s, MFU.

        Taught in chapter 7 (timing).
        """
        s = self.summary()
        if s["step_time"] is None:
            return f"{self.label}: no measured steps yet ({self._seen} seen, {self.warmup_steps} warm-up)"
        st = s["step_time"]
        parts = [f"{self.label}: {st.n} steps, step {st.median * 1e3:.2f} ms "
                 f"(p10 {st.p10 * 1e3:.2f}, p90 {st.p90 * 1e3:.2f})"]
        if s["phase_share"]:
            parts.append(" ".join(f"{k} {v:.0%}" for k, v in s["phase_share"].items() if v is not None))
        if s["tokens_per_s"] is not None:
            parts.append(f"{s['tokens_per_s']:,.0f} tok/s ({s['tokens_per_s_per_device']:,.0f}/device)")
        if s["mfu"] is not None:
            parts.append(f"MFU {s['mfu']:.1%}" + (f" HFU {s['hfu']:.1%}" if s["hfu"] is not None else "")
                         + (f" [peak {self.peak_source}]" if self.peak_source else ""))
        elif "mfu_error" in s:
            parts.append("MFU refused (>100%: check peak, tokens, devices)")
        return " | ".join(parts)

    def to_record(self, **fields) -> RunRecord:
        """A :class:`RunRecord` of what was measured; ``fields`` override/add record fields.

        Taught in chapter 7 (timing); the record itself in chapter 14.
        """
        s = self.summary()
        share = s["phase_share"]
        device = {"name": self.device, "kind": self.device.split(":")[0], "count": self.n_devices,
                  "clock": s["clock"]}
        peak_mem = None
        import torch

        if self.device.startswith("cuda") and torch.cuda.is_available():
            device["name"] = torch.cuda.get_device_name(self.device)
            peak_mem = int(torch.cuda.max_memory_allocated(self.device))
        extra = {k: s[k] for k in ("mfu_error", "hfu_error") if k in s}
        if self._cpu_steps and len(self._cpu_steps) == len(self._steps):
            extra["cpu_step_time"] = dataclasses.asdict(Stat.of(self._cpu_steps))   # this process's CPU s/step
        tokens_per_step = self.tokens_per_step
        real = [t for t in self._tokens if t is not None]
        if real and len(real) == len(self._tokens) and min(real) != max(real):
            # steps of different sizes (chapter 25): the record's tokens per step is their mean (tokens/s
            # above is already total real tokens ÷ total time); the range says they varied
            tokens_per_step = round(sum(real) / len(real))
            extra["tokens_per_step_varied"] = {"min": min(real), "max": max(real), "mean": sum(real) / len(real),
                                               "steps": len(real)}
        rec = RunRecord(
            label=self.label, step_time=s["step_time"],
            tokens_per_step=tokens_per_step, tokens_per_s=s["tokens_per_s"], n_devices=self.n_devices,
            model_flops_per_token=self.flops_per_token, hardware_flops_per_token=self.hardware_flops_per_token,
            peak_flops=self.peak_flops, peak_source=self.peak_source, dtype=self.dtype,
            mfu=s["mfu"], hfu=s["hfu"] if s["hfu"] is not None else None, phases=dict(s["phases"]),
            comm_wait_share=share.get("comm"), data_wait_share=share.get("data"),
            peak_memory_bytes=peak_mem, device=device, versions=environment_versions(), extra=extra,
        )
        for k, v in fields.items():
            if not hasattr(rec, k):
                raise ValueError(f"to_record: {k!r} is not a RunRecord field")
            setattr(rec, k, v)
        return rec

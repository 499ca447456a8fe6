"""Tokens/s, MFU and phase times of a Hugging Face ``transformers.Trainer`` run, in its own logs.

::

    from labkit.integrations.hf import ThroughputCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[ThroughputCallback()])
    trainer.train()      # every log line gains labkit/tokens_per_s, labkit/mfu, labkit/step_time_s, ...

How it measures (the Trainer gives hooks, not a loop): one :class:`labkit.measure.meter.Meter` step runs from
one ``on_step_end`` to the next, so the step time is what a token really costs — with phases
``data`` (``on_step_end`` → ``on_step_begin``: fetching the next batch, and the Trainer's own logging
and saving of the previous step), ``forward_backward`` (``on_step_begin`` → ``on_pre_optimizer_step``:
every micro-batch of the accumulation, and gradient clipping), ``optimizer`` (→ ``on_optimizer_step``)
and ``other`` (scheduler and zero_grad, → ``on_step_end``). Tokens are counted from each batch the model
sees (a forward pre-hook, training mode only): the ``attention_mask`` sum when present, else the
``input_ids`` element count, summed on the device with no per-step synchronisation and read when a
log line is written. FLOPs per token come from the model's config
(:func:`labkit.integrations.loop.flops_per_token_of`, at the batches' sequence length) unless you
give ``flops_per_token=``; the peak from :func:`labkit.hardware.resolve_peak` for the Trainer's dtype
(bf16/fp16/fp32) unless you give ``peak=`` (FLOP/s or a catalogue name). Figures are over the
measured steps since the previous log line (after ``warmup_steps``; the whole run: ``cb.meter.summary()``)
and are **per rank**: ``labkit/tokens_per_s`` is this
rank's tokens/s × world size.

Taught in chapter 7 (timing) and chapter 4 (MFU).
"""
from __future__ import annotations

from transformers import TrainerCallback

from labkit import checks
from labkit.integrations import shapes
from labkit.measure.meter import Meter

__all__ = ["ThroughputCallback"]

_PREFIX = "labkit/"


class ThroughputCallback(TrainerCallback):
    """A ``TrainerCallback`` that logs tokens/s, MFU and phase times (see the module docstring).

    ``flops_per_token``: model FLOPs per token (default: from the model's config, ``method``);
    ``peak``: "auto", a catalogue name or FLOP/s per device; ``warmup_steps``: steps not measured.
    After training, :attr:`meter` holds every measured step (``meter.to_record()``).

    Taught in chapter 7 (timing) and chapter 4 (MFU).
    """

    def __init__(self, *, flops_per_token: float | None = None, peak="auto", warmup_steps: int = 2,
                 method: str = "palm"):
        self.flops_per_token = None if flops_per_token is None else checks.positive("flops_per_token",
                                                                                     flops_per_token)
        if not isinstance(peak, str):
            checks.positive("peak", peak)
        self.peak = peak
        self.warmup_steps = checks.count("warmup_steps", warmup_steps, at_least=0)
        self.method = checks.one_of("method", method, ("palm", "6N", "megatron"))
        self.meter: Meter | None = None
        self._hook = None
        self._step = None
        self._phase = None
        self._tokens = None          # tokens of the open step (a device tensor or int; no sync)
        self._per_step: list = []    # tokens of each completed step, warm-up included
        self._seq_len = None
        self._model = None
        self.mfu_error: str | None = None
        self._logged = 0             # measured steps already reported in a log line

    # ------------------------------------------------------------------ counting tokens
    def _count(self, module, args, kwargs):
        if not module.training:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        if mask is not None:
            n = mask.sum()
        elif ids is not None and hasattr(ids, "numel"):
            n = ids.numel()
        else:
            return
        if ids is not None and getattr(ids, "ndim", 0) >= 2:
            self._seq_len = int(ids.shape[-1])
        self._tokens = n if self._tokens is None else self._tokens + n

    # ------------------------------------------------------------------ the Trainer's hooks
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from labkit.hardware.peak import resolve_peak

        dtype = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
        if isinstance(self.peak, str):
            peak, source = resolve_peak(str(args.device) if self.peak == "auto" else self.peak, dtype)
        else:
            peak, source = resolve_peak(peak_flops=self.peak)
        self.meter = Meter(device=args.device, warmup_steps=self.warmup_steps, peak_flops=peak,
                           peak_source=source, dtype=dtype, label="trainer")
        self._model = model
        if model is not None and hasattr(model, "register_forward_pre_hook"):
            self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)
        self._per_step, self._tokens, self._logged = [], None, 0
        self._open_step()

    def _open_step(self):
        self._step = self.meter.step()
        self._step.__enter__()
        self._enter("data")

    def _enter(self, name):
        if self._phase is not None:
            self._phase.__exit__(None, None, None)
        self._phase = self.meter.phase(name)
        self._phase.__enter__()

    def on_step_begin(self, args, state, control, **kwargs):
        if self._step is not None:
            self._enter("forward_backward")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._step is not None:
            self._enter("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self._step is not None:
            self._enter("other")

    def on_step_end(self, args, state, control, **kwargs):
        if self._step is None:
            return
        self._phase.__exit__(None, None, None)
        self._phase = None
        self._step.__exit__(None, None, None)
        self._per_step.append(self._tokens if self._tokens is not None else 0)
        self._tokens = None
        self._open_step()

    def on_train_end(self, args, state, control, **kwargs):
        if self._step is not None:       # the step opened after the last one never ran: dropped
            if self._phase is not None:
                self._phase.__exit__(None, None, None)
                self._phase = None
            self._step.__exit__(RuntimeError, None, None)
            self._step = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.meter is None or logs is None:
            return
        figures = self.figures(world_size=max(1, int(getattr(args, "world_size", 1) or 1)))
        logs.update(figures)
        hist = state.log_history
        if hist and hist[-1].get("step") == state.global_step:   # the Trainer stored its copy first
            hist[-1].update(figures)

    # ------------------------------------------------------------------ reading
    def figures(self, world_size: int = 1) -> dict:
        """What goes into the log: ``labkit/tokens_per_s`` (× ``world_size``), ``…_per_device``,
        ``labkit/mfu`` (when a FLOP count and peak are known and it is ≤ 100 %; otherwise
        :attr:`mfu_error` says why), ``labkit/step_time_s``
        (median) and ``labkit/<phase>_s`` medians, over the measured steps since the previous call (the
        Trainer calls it once per log line). Empty when no step was measured since.

        Taught in chapter 7 (timing) and chapter 4 (MFU).
        """
        from labkit.flops import mfu as mfu_mod
        from labkit.record import Stat

        times = self.meter.step_times                      # resolves pending steps (one sync on a GPU)
        start, self._logged = self._logged, len(times)
        window = times[start:]
        if not window:
            return {}
        first = len(self._per_step) - len(times) + start
        for i in range(first, len(self._per_step)):      # device counts read once: one sync per log line
            if not isinstance(self._per_step[i], (int, float)):
                self._per_step[i] = float(self._per_step[i])
        tokens = float(sum(self._per_step[first:]))
        out = {_PREFIX + "step_time_s": Stat.of(window).median}
        for name, vals in self.meter._phases.items():     # every phase runs in every step: aligned with times
            if len(vals) == len(times):
                out[f"{_PREFIX}{name}_s"] = Stat.of(vals[start:]).median
        times = window
        total = sum(times)
        if tokens > 0 and total > 0:
            tps = tokens / total
            out[_PREFIX + "tokens_per_s_per_device"] = tps
            out[_PREFIX + "tokens_per_s"] = tps * world_size
            fpt = self.flops_per_token
            if fpt is None and self._model is not None:
                try:
                    fpt, _ = shapes.flops_per_token(self._model, seq_len=self._seq_len, method=self.method)
                except ValueError:
                    fpt = None
            if fpt:
                try:
                    out[_PREFIX + "mfu"] = mfu_mod.mfu(tokens_per_s=tps, flops_per_token=fpt, n_devices=1,
                                                       peak_flops=self.meter.peak_flops)
                except ValueError as e:      # > 100 %: kept out of the logs, explained here
                    self.mfu_error = str(e)
        return out

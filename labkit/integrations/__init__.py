"""labkit where users already train: a Hugging Face ``Trainer`` callback and a plain-loop helper.

- :class:`labkit.integrations.hf.ThroughputCallback` — tokens/s, MFU and phase times of a
  ``transformers.Trainer`` run, timed with :class:`labkit.measure.meter.Meter`, written into the Trainer's logs
  (needs ``transformers``; imported only when you import ``labkit.integrations.hf``).
- :func:`labkit.integrations.loop.meter_for` — a :class:`~labkit.measure.meter.Meter` for your own loop, with
  FLOPs per token and the peak filled in from your model.

Taught in chapter 7 (timing) and chapter 4 (MFU).
"""
from __future__ import annotations

from labkit.integrations.loop import flops_per_token_of, meter_for

__all__ = ["flops_per_token_of", "meter_for"]

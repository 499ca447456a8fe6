"""Your own training loop, measured: a :class:`labkit.measure.meter.Meter` with FLOPs per token and the peak
filled in from your model (the plain-loop recipe of the README)::

    meter = meter_for(model, tokens_per_step=B * T, dtype="bf16")
    for x, y in loader:
        with meter.step():
            with meter.phase("forward"): loss = loss_fn(model(x), y)
            with meter.phase("backward"): loss.backward()
            with meter.phase("optimizer"): opt.step(); opt.zero_grad()
    print(meter.log_line())

Taught in chapter 7 (timing) and chapter 4 (MFU).
"""
from __future__ import annotations

from labkit import checks
from labkit.hardware.peak import resolve_peak
from labkit.integrations import shapes
from labkit.measure.meter import Meter

__all__ = ["flops_per_token_of", "meter_for"]


def flops_per_token_of(model, *, seq_len: int | None = None, method: str = "palm") -> tuple[float, str]:
    """Training model FLOPs per token of ``model`` and how they were found.

    A ``transformers`` model (anything with a ``config`` naming layers, width, heads, vocabulary): its
    :class:`labkit.flops.ModelShape` and :func:`labkit.flops.model_flops_per_token` with ``method``
    ("palm" default, "6N", "megatron"; full attention, not halved for causal masks — labkit's
    convention), at ``seq_len`` (default the config's context). A :class:`~labkit.flops.ModelShape`:
    the same. Any other torch module: 6·N with N its parameters outside embedding lookups (a tied
    embedding counts once, as the output layer) — attention's T-dependent term is then missing.

    Taught in chapter 3 (FLOPs).
    """
    return shapes.flops_per_token(model, seq_len=seq_len, method=method)


def _model_device(model):
    params = getattr(model, "parameters", None)
    if params is None:
        return None
    for p in params():
        return p.device
    return None


def meter_for(model=None, *, tokens_per_step: int, dtype: str = "bf16", flops_per_token: float | None = None,
              peak="auto", n_devices: int = 1, seq_len: int | None = None, method: str = "palm",
              **meter_kwargs) -> Meter:
    """A :class:`~labkit.measure.meter.Meter` for your loop: tokens/s, MFU and phase times with no arithmetic.

    ``flops_per_token`` defaults to :func:`flops_per_token_of` ``(model)``; ``peak`` is a FLOP/s number
    per device, a catalogue name ("H100-SXM") or "auto" (the catalogue for a known GPU, else the peak
    measured on this device — :func:`labkit.hardware.resolve_peak` for ``dtype``). The meter's device
    is the model's (CUDA events on a GPU, perf_counter on a CPU) unless ``device=`` is given; other
    keyword arguments go to :class:`~labkit.measure.meter.Meter` (``warmup_steps``, ``label``, ...).

    Taught in chapter 7 (timing) and chapter 4 (MFU).
    """
    checks.count("tokens_per_step", tokens_per_step)
    if flops_per_token is None:
        if model is None:
            raise ValueError("meter_for: give model= (to derive FLOPs per token) or flops_per_token=")
        flops_per_token, how = flops_per_token_of(model, seq_len=seq_len, method=method)
    else:
        flops_per_token, how = checks.positive("flops_per_token", flops_per_token), "user"
    device = meter_kwargs.pop("device", None)
    if device is None and model is not None:
        device = _model_device(model)
    if isinstance(peak, str):
        where = str(device) if peak == "auto" and device is not None else peak
        peak_flops, source = resolve_peak(where, dtype)
    else:
        peak_flops, source = resolve_peak(peak_flops=peak)
    meter_kwargs.setdefault("label", f"run (FLOPs {how})")
    return Meter(device=device, tokens_per_step=tokens_per_step, flops_per_token=flops_per_token,
                 peak_flops=peak_flops, peak_source=source, n_devices=n_devices, dtype=dtype, **meter_kwargs)

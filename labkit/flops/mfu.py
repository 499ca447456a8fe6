"""Model and hardware FLOPs utilisation (MFU, HFU) and throughput per device.

Definitions (Chowdhery et al. 2022, PaLM, App. B):

- **MFU** = achieved *model* FLOP/s ÷ (n_devices × peak). Model FLOPs are what the architecture
  needs per token (no recomputation), so MFU compares runs fairly across implementations.
- **HFU** = achieved *hardware* FLOP/s ÷ (n_devices × peak): FLOPs the hardware actually executed,
  recomputation included; HFU ≥ MFU.

``tokens_per_s`` is always **global** (all ranks together). An MFU above 100% is impossible, so it
is refused with an error that names the inputs that are probably wrong.

Taught in chapter 4 (MFU and HFU).
"""
from __future__ import annotations

import math

from labkit import checks

__all__ = ["achieved_flops", "tokens_per_s_per_device", "step_tokens_per_s", "mfu", "hfu",
           "tokens_per_s_for_mfu", "mfu_from_flops", "hfu_from_flops"]


def achieved_flops(tokens_per_s: float, flops_per_token: float) -> float:
    """Achieved FLOP/s = tokens/s × FLOPs per token (global if tokens/s is global).

    Taught in chapter 4 (MFU and HFU).
    """
    tps, fpt = checks.positive("tokens_per_s", tokens_per_s), checks.positive("flops_per_token", flops_per_token)
    return checks.finite_result("achieved FLOP/s", tps * fpt, tokens_per_s=tokens_per_s,
                                flops_per_token=flops_per_token)


def tokens_per_s_per_device(tokens_per_s: float, n_devices: int) -> float:
    """Global tokens/s divided by the number of devices. Taught in chapter 4 (MFU and HFU)."""
    return checks.positive("tokens_per_s", tokens_per_s) / checks.count("n_devices", n_devices)


def step_tokens_per_s(tokens_per_step: int, step_time_s: float) -> float:
    """Global tokens per optimizer step ÷ step time. Taught in chapter 4 (MFU and HFU)."""
    tokens = checks.positive("tokens_per_step", tokens_per_step)
    t = checks.nonneg("step_time_s", step_time_s)
    if t == 0:
        raise ValueError("step_time_s=0 is not valid: use a time > 0 (a zero step time means the clock did "
                         "not see the work: asynchronous GPU work timed without synchronisation?)")
    return checks.finite_result("tokens/s", tokens / t, tokens_per_step=tokens_per_step, step_time_s=step_time_s)


def _diagnose_over_100(kind, u, tokens_per_s, fpt, fpt_name, n, peak) -> str:
    """Order the suspects by how far over 100% the figure is; name the parameters."""
    peak_h = (f"peak_flops={peak:.4g} FLOP/s may be for the wrong device or dtype (an A100's 312e12 on "
              f"an H100 is 3.2x too low; bf16 for an fp8 run 2x; fp32 for a bf16 run >10x)")
    tok_h = (f"tokens_per_s={tokens_per_s:.4g} must be GLOBAL with n_devices={n} counting ALL devices "
             f"(global tokens with n_devices=1, or tokens summed over ranks twice, inflate MFU by the rank count)")
    fpt_h = (f"{fpt_name}={fpt:.4g} must be per token (not per sequence, per batch or per step)")
    time_h = ("the step time may be too small: asynchronous GPU work timed with a host clock and no "
              "synchronize/CUDA events measures the launch, not the work")
    if u <= 3.5:
        order = [peak_h, tok_h, time_h, fpt_h]
    elif u <= 1000:
        order = [tok_h, time_h, peak_h, fpt_h]
    else:
        order = [fpt_h, time_h, tok_h, peak_h]
    return (f"{kind} = {u:.1%} > 100% is impossible: {u * peak:.4g} FLOP/s per device exceeds the peak "
            f"{peak:.4g}. Most likely: {order[0]}. Other suspects: " + "; ".join(order[1:]) + ".")


def _utilisation(kind: str, tokens_per_s, flops_per_token, n_devices, peak_flops, fpt_name) -> float:
    tps = checks.positive("tokens_per_s", tokens_per_s)
    fpt = checks.positive(fpt_name, flops_per_token)
    n = checks.count("n_devices", n_devices)
    peak = checks.positive("peak_flops", peak_flops)
    u = tps * fpt / (n * peak)
    if u == 0 or not math.isfinite(u):    # under- or overflow: extreme inputs, no figure to diagnose
        raise ValueError(f"{kind} = {u} from tokens_per_s={tokens_per_s!r}, {fpt_name}={flops_per_token!r}, "
                         f"n_devices={n_devices!r}, peak_flops={peak_flops!r}: the inputs are beyond any "
                         "meaningful range")
    if u > 1.0:
        raise ValueError(_diagnose_over_100(kind, u, tps, fpt, fpt_name, n, peak))
    return u


def mfu(*, tokens_per_s: float, flops_per_token: float, n_devices: int, peak_flops: float) -> float:
    """Model FLOPs utilisation in (0, 1]: tokens_per_s × flops_per_token / (n_devices × peak_flops).

    ``tokens_per_s`` global; ``flops_per_token`` model FLOPs (see
    :func:`labkit.flops.model_flops_per_token`); ``peak_flops`` dense, per device, for the run's
    dtype (:func:`labkit.hardware.resolve_peak`). PaLM App. B. Raises ValueError above 100%.

    Taught in chapter 4 (MFU and HFU).
    """
    return _utilisation("MFU", tokens_per_s, flops_per_token, n_devices, peak_flops, "flops_per_token")


def hfu(*, tokens_per_s: float, hardware_flops_per_token: float, n_devices: int, peak_flops: float) -> float:
    """Hardware FLOPs utilisation: as :func:`mfu` with executed FLOPs (recomputation included).

    ``hardware_flops_per_token`` from :func:`labkit.flops.hardware_flops_per_token`. PaLM App. B.

    Taught in chapter 4 (MFU and HFU).
    """
    return _utilisation("HFU", tokens_per_s, hardware_flops_per_token, n_devices, peak_flops,
                        "hardware_flops_per_token")


def tokens_per_s_for_mfu(target_mfu: float, *, flops_per_token: float, n_devices: int, peak_flops: float) -> float:
    """Global tokens/s a run needs to reach ``target_mfu`` (the inverse of :func:`mfu`).

    Taught in chapter 4 (MFU and HFU).
    """
    t = checks.fraction("target_mfu", target_mfu, open_low=True)
    n, peak = checks.count("n_devices", n_devices), checks.positive("peak_flops", peak_flops)
    fpt = checks.positive("flops_per_token", flops_per_token)
    return checks.finite_result("tokens/s", t * n * peak / fpt, positive=True, target_mfu=target_mfu, n_devices=n_devices,
                                peak_flops=peak_flops, flops_per_token=flops_per_token)


def _from_flops(kind: str, achieved, peak_flops, name: str) -> float:
    a = checks.positive(name, achieved)
    peak = checks.positive("peak_flops", peak_flops)
    u = a / peak
    if u == 0 or not math.isfinite(u):
        raise ValueError(f"{kind} = {u} from {name}={achieved!r}, peak_flops={peak_flops!r}: the inputs are "
                         "beyond any meaningful range")
    if u > 1.0:
        raise ValueError(f"{kind} = {u:.1%} > 100% is impossible: {name}={a:.4g} FLOP/s exceeds "
                         f"peak_flops={peak:.4g}. Most likely: {name} is for the whole job, not one device "
                         "(divide by the device count), or peak_flops is for another device or dtype")
    return u


def mfu_from_flops(achieved_flops_per_device: float, peak_flops: float) -> float:
    """MFU from an achieved *model* FLOP/s per device, the way papers quote it (Megatron-LM,
    Narayanan et al. SC21 Table 1: "TFLOP/s per GPU"; Llama 3, Dubey et al. 2024 Table 4: 400
    TFLOP/s per GPU at 41 % BF16 MFU of an H100's 989 TFLOP/s dense peak). Per device, dense peak
    for the run's dtype; above 100 % is refused.

    Taught in chapter 4 (MFU and HFU).
    """
    return _from_flops("MFU", achieved_flops_per_device, peak_flops, "achieved_flops_per_device")


def hfu_from_flops(achieved_hardware_flops_per_device: float, peak_flops: float) -> float:
    """HFU from the executed FLOP/s per device (recomputation included), as :func:`mfu_from_flops`.

    Taught in chapter 4 (MFU and HFU).
    """
    return _from_flops("HFU", achieved_hardware_flops_per_device, peak_flops, "achieved_hardware_flops_per_device")

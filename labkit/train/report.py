"""The run record of a training run, built in one place.

:func:`meter_for` sets up the :class:`~labkit.measure.meter.Meter` with the run's accounting — global tokens per
step, model and hardware FLOPs per token (PaLM App. B; recomputation adds a forward to HFU), the
per-device peak of the compute dtype (:func:`labkit.hardware.resolve_peak`) and the device count.
:func:`build` turns the meter's timings and the run's facts into one :class:`~labkit.record.RunRecord`;
:func:`combine` adds what only the launcher sees (every rank's losses and peak RSS) to rank 0's.

Peak memory: ``torch.cuda.max_memory_allocated`` on GPU; on CPU the process's peak RSS
(``resource.getrusage().ru_maxrss``, KiB on Linux, bytes on macOS — it includes the Python/torch
runtime, ≈ 200 MB, not only tensors); ``record.extra["peak_memory_kind"]`` says which.

Taught in chapter 4 (MFU of a real run) and chapter 14 (the baseline record).
"""
from __future__ import annotations

import resource
import sys


def meter_for(cfg, n_devices: int, device):
    """A Meter that divides by the right numbers for ``cfg`` on ``n_devices``. Taught in chapter 4."""
    from labkit import flops, hardware
    from labkit.measure.meter import Meter

    mcfg = cfg.model_config
    shape = mcfg.shape()
    if cfg.compute_dtype != "fp32" and device.type == "cpu":
        warn_if_slow(device, cfg.compute_dtype)
    peak, source = hardware.resolve_peak(device, cfg.compute_dtype, cfg.peak_flops)
    replicas = n_devices // (cfg.tp * cfg.pp * cfg.cp)   # tp/pp/cp ranks share a batch: only dp ranks add tokens
    return Meter(device=device, warmup_steps=cfg.warmup_steps,
                 tokens_per_step=cfg.micro_batch * cfg.first_accum * replicas * mcfg.seq_len,
                 flops_per_token=flops.model_flops_per_token(shape),
                 hardware_flops_per_token=flops.hardware_flops_per_token(
                     shape, recompute=cfg.recompute),   # chapter 21: the policy's recomputed FLOPs
                 peak_flops=peak, peak_source=source, n_devices=n_devices, dtype=cfg.compute_dtype,
                 label=cfg.label, ranges="nvtx")     # NVTX ranges per step and phase on CUDA (chapter 10)


def warn_if_slow(device, dtype: str) -> None:
    """Warn, with the measured ratio, when ``dtype`` is emulated on this CPU (e.g. bf16 at ≈ 1/150 of fp32
    on CPUs without AVX512-BF16/AMX): the run is valid but slow. Taught in chapter 17 (mixed precision)."""
    import warnings

    from labkit.hardware import capability

    c = capability(device, (dtype,))[dtype]
    if c["verdict"] == "slow":
        ratio = c.get("ratio_to_fp32")
        warnings.warn(f"{dtype} is slow on this CPU ({ratio:.3g}× the fp32 matmul rate; {c['source']}): "
                      "train in fp32 here (labkit.hardware.best_dtype says which is fast)"
                      if ratio is not None else f"{dtype} is not supported on this device", UserWarning,
                      stacklevel=3)


def peak_memory(device) -> tuple[int, str]:
    """(peak bytes, what was measured) of this process on ``device``. Taught in chapter 13."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda.max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "ru_maxrss (process peak RSS)"


def device_name(device) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def build(meter, cfg, requested, *, device, losses, wall_s: float, rank: int,
          trace_files=(), facts=None):
    """The record of one rank's run: the meter's timings, MFU/HFU, losses, memory, config, versions.

    ``cfg`` is the config that ran, ``requested`` the one asked for (they differ when an injection
    changed the batch); the record's ``config`` is what ran plus ``facts`` (the injection's sizes).
    A live peak measured on a loaded machine can come out below what training reached (MFU > 100 %):
    then the peak is measured again (up to 3 times, each longer) and the best figure divides
    (labkit.hardware.remeasure_peak); `labkit calibrate` avoids this altogether.
    """
    import torch
    import torch.distributed as dist

    from labkit import flops, hardware
    from labkit.record import environment_versions

    tries = 0       # a loaded machine can depress even the re-measurement: up to 3, each longer
    while (meter.peak_source and meter.peak_source.startswith("measured:") and "mfu_error" in meter.summary()
           and tries < 3):
        tries += 1
        better = hardware.remeasure_peak(device, cfg.compute_dtype, max_seconds=2.0 * tries)
        meter.set_peak(max(meter.peak_flops, better.flops), f"measured:{better.describe()} (re-measured after "
                                                             "training)")
    mem, mem_kind = peak_memory(device)
    mcfg = cfg.model_config
    n_params = flops.n_params(mcfg.shape())     # the full model, also when this rank holds shards
    config = {**cfg.to_dict(), **(facts or {})}
    if requested.inject != "none":
        config.setdefault("micro_batch_requested", requested.micro_batch)
    record = meter.to_record(loss=[float(v) for v in losses], peak_memory_bytes=mem, config=config,
                             versions=environment_versions())
    record.device.update({"name": device_name(device), "kind": device.type,
                          "backend": dist.get_backend() if dist.is_initialized() else None,
                          "count": meter.n_devices})
    record.extra.update({
        "peak_memory_kind": mem_kind, "n_params": int(n_params), "model": mcfg.to_dict(),
        "flops_method": "palm (6N + 12·L·H·Q·T, PaLM App. B)", "wall_s": wall_s, "rank": rank,
        "threads": torch.get_num_threads(), "strategy": cfg.memory_strategy,
    })
    if trace_files:
        record.extra["trace_files"] = list(trace_files)
    return record


def combine(result):
    """Rank 0's record of a launch, with every rank's loss curve and peak RSS and all trace files."""
    record = result.value
    record.extra["losses_per_rank"] = [r.loss for r in result.values]
    record.extra["rank_peak_rss_bytes"] = [r.peak_rss_bytes for r in result.ranks]
    traces = [f for r in result.values for f in r.extra.get("trace_files", [])]
    if traces:
        record.extra["trace_files"] = traces
    return record

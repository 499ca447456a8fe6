"""The GPU-only paths of labkit, one check each, through the real labkit API.

=====================  ================================================================  =========
check                  what runs, and what passes                                        chapters
=====================  ================================================================  =========
meter_cuda_events      a :class:`~labkit.measure.meter.Meter` on CUDA events around queued bf16   7
                       matmuls vs a synchronised wall clock: events/wall in [0.85, 1.02]
                       and the host's launch time a small share of the step
nccl_collectives       2+ NCCL ranks (:func:`labkit.launch`): an all-reduce gives the      11, 5
                       exact sum; all-reduce / all-gather / reduce-scatter bus bandwidth
                       (:mod:`labkit.comm.bench`); skipped on one GPU
ddp_train              :func:`labkit.train.run` with ``parallel="ddp"`` on every GPU      19
                       (NCCL), bf16: finite losses that fall
fsdp2_train            the same with FSDP2 ``fully_shard`` and a bf16                     20
                       ``MixedPrecisionPolicy``
memory_model           one bf16 training run: ``torch.cuda.max_memory_allocated`` vs      13
                       :mod:`labkit.memory.estimate` (model states + activations), the
                       ratio in a band
matmul_peak            :func:`labkit.hardware.measure_matmul_peak` bf16 vs the            6, 4
                       catalogue's dense bf16 peak of this GPU, the fraction in a band
mfu_reference          MFU of the reference GPT at ~1B parameters (``"1b"``) in bf16,     4
                       dividing by the catalogue peak: above a floor
=====================  ================================================================  =========

Bands are plausibility bands, not performance claims: a number outside one means a path or a model is
broken (a meter that times the launch, a memory model off by 2×), not that the GPU is slow.

Taught in the chapters named per check.
"""
from __future__ import annotations

import math
import time

from labkit.selftest.base import Check, Failed, Skip

__all__ = ["CHECKS", "check_by_name"]

EVENT_WALL_BAND = (0.85, 1.02)     # events/wall around a GPU-bound loop: gaps only from event records
HOST_SHARE_MAX = 0.5               # host time to *launch* a step / its GPU time (chapter 7's point)


def _band(name: str, value: float, band, figures: dict, what: str) -> None:
    """Raise :class:`Failed` when ``value`` is outside ``band`` (None: not judged on this backend)."""
    if band is None:
        return
    lo, hi = band
    if not (lo <= value <= hi):
        raise Failed(f"{name} = {value:.3g} is outside [{lo:g}, {hi:g}]: {what}", figures)


# ------------------------------------------------------------------------------------------ meter
def meter_cuda_events(backend, plan, budget_s) -> dict:
    """A Meter on CUDA events vs a synchronised host clock around the same steps. Chapter 7 (timing)."""
    from labkit.measure.meter import CudaEventClock, Meter

    work, flops = backend.matmul_workload(plan["meter_n"], plan["meter_matmuls"])
    meter = Meter(clock=CudaEventClock(event_cls=backend.event_cls()), device=backend.kind, warmup_steps=0,
                  label="selftest:meter")
    work()                                   # warm-up: cuBLAS handles, kernel selection
    backend.synchronize()
    launch_s = []
    t0 = time.perf_counter()
    for _ in range(plan["meter_steps"]):
        with meter.step():
            h0 = time.perf_counter()
            work()
            launch_s.append(time.perf_counter() - h0)
    backend.synchronize()
    wall = time.perf_counter() - t0
    steps = meter.step_times
    events = sum(steps)
    median_step = sorted(steps)[len(steps) // 2]
    host_share = (sorted(launch_s)[len(launch_s) // 2] / median_step) if median_step > 0 else math.inf
    figures = {"steps": len(steps), "events_total_s": events, "wall_s": wall, "events_over_wall": events / wall,
               "step_median_ms": median_step * 1e3, "host_launch_median_ms": sorted(launch_s)[len(launch_s) // 2] * 1e3,
               "host_launch_share": host_share, "tflops_per_s": flops / median_step / 1e12 if median_step else None,
               "clock": meter.summary()["clock"]}
    if figures["clock"] != "cuda_event":
        raise Failed(f"the meter used the clock {figures['clock']!r}, not CUDA events", figures)
    _band("events/wall", events / wall, EVENT_WALL_BAND if backend.asynchronous else None, figures,
          "CUDA events around the steps do not add up to the synchronised wall time")
    if backend.asynchronous and host_share > HOST_SHARE_MAX:
        raise Failed(f"the host took {host_share:.0%} of a step's GPU time just to launch it: the work is not "
                     "queued asynchronously (a hidden synchronisation in the step?)", figures)
    return figures


# ------------------------------------------------------------------------------------------ NCCL
def _collectives_rank(sizes, iters):
    """Each rank: an all-reduce with a known sum, then labkit.comm.bench's timing of three collectives."""
    import torch
    import torch.distributed as dist

    from labkit.comm.bench import bench_rank
    from labkit.launcher.worker import init_distributed

    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(x)
    exact = bool(torch.all(x == world * (world + 1) / 2).item())
    raw = bench_rank(("all_reduce", "all_gather", "reduce_scatter"), sizes, iters=iters, warmup=2)
    return {"rank": rank, "world": world, "backend": dist.get_backend(), "exact_sum": exact, "raw": raw}


def nccl_collectives(backend, plan, budget_s) -> dict:
    """NCCL ranks on every GPU: a correct all-reduce and bus bandwidths. Chapter 11 (communication)."""
    from labkit.comm.bench import results_to_table

    n = min(backend.device_count(), 8)
    if n < 2:
        raise Skip(f"one GPU visible: a {backend.dist_backend} launch needs 2+ ranks, one per GPU",
                   {"n_devices": n})
    res = backend.launch(_collectives_rank, n, args=(plan["comm_sizes"], plan["comm_iters"]), timeout_s=budget_s)
    values = res.values
    table = results_to_table(values[0]["raw"])
    figures = {"nranks": n, "backend": values[0]["backend"], "exact_sum_on_every_rank": all(v["exact_sum"] for v in values),
               "launch_wall_s": res.wall_s}
    for op, df in table.groupby("op", sort=False):
        big = df[df["size"] == df["size"].max()].iloc[0]
        figures[f"{op}_busbw_GBps"] = float(big["busbw"])
        figures[f"{op}_bytes"] = int(big["size"])
    if figures["backend"] != backend.dist_backend:
        raise Failed(f"the ranks ran on {figures['backend']!r}, not {backend.dist_backend!r}", figures)
    if not figures["exact_sum_on_every_rank"]:
        raise Failed("an all-reduce of 1..n gave a wrong sum on some rank", figures)
    return figures


# ------------------------------------------------------------------------------------------ training
def _train_figures(rec) -> dict:
    st = rec.step_time
    return {"nranks": rec.n_devices, "backend": rec.device.get("backend"), "device": rec.device.get("name"),
            "n_params": rec.extra.get("n_params"), "step_median_ms": st.median * 1e3 if st else None,
            "tokens_per_s": rec.tokens_per_s, "mfu": rec.mfu, "peak_source": rec.peak_source,
            "loss_first": rec.loss[0] if rec.loss else None, "loss_last": rec.loss[-1] if rec.loss else None,
            "peak_memory_bytes": rec.peak_memory_bytes, "peak_memory_kind": rec.extra.get("peak_memory_kind")}


def _judge_training(rec, backend, figures: dict) -> dict:
    if figures["backend"] != backend.dist_backend:
        raise Failed(f"the ranks trained on {figures['backend']!r}, not {backend.dist_backend!r}", figures)
    if not rec.loss or not all(math.isfinite(v) for v in rec.loss):
        raise Failed(f"losses are not all finite: {rec.loss}", figures)
    if not rec.loss[-1] < rec.loss[0]:
        raise Failed(f"the loss did not fall: {rec.loss[0]:.4f} -> {rec.loss[-1]:.4f}", figures)
    if figures["nranks"] == 1:
        figures["note"] = "one GPU: the parallel wrapper ran on a single rank (no gradient traffic between GPUs)"
    return figures


def _parallel_train(parallel: str, backend, plan, budget_s, **extra) -> dict:
    from labkit.train.config import TrainConfig

    n = min(backend.device_count(), 8)
    cfg = TrainConfig(model=plan["train_model"], micro_batch=plan["train_micro"], steps=plan["train_steps"],
                      warmup_steps=2, dtype=backend.dtype if not extra.get("mp_policy") else "fp32",
                      parallel=parallel, device=backend.train_device, label=f"selftest:{parallel}", **extra)
    rec = backend.train_run(cfg, n, timeout_s=budget_s)
    return _judge_training(rec, backend, _train_figures(rec))


def ddp_train(backend, plan, budget_s) -> dict:
    """DDP on every GPU (NCCL) in bf16 through the one training loop. Chapter 19 (DDP)."""
    return _parallel_train("ddp", backend, plan, budget_s)


def fsdp2_train(backend, plan, budget_s) -> dict:
    """FSDP2 ``fully_shard`` on every GPU with a bf16 mixed-precision policy. Chapter 20 (FSDP)."""
    return _parallel_train("fsdp", backend, plan, budget_s, mp_policy=plan["fsdp_mp_policy"])


# ------------------------------------------------------------------------------------------ memory
def predicted_peak_bytes(model: str, micro_batch: int, dtype: str) -> dict:
    """labkit.memory.estimate's bytes for one rank training ``model``: AdamW model states (fp32 master
    weights under autocast) + activations kept for backward (flash attention: no s×s scores; the output
    layer included). Chapter 13 (memory anatomy)."""
    from labkit.flops import n_params
    from labkit.memory.estimate import activation_bytes, model_state_bytes
    from labkit.model.config import gpt_config

    mcfg = gpt_config(model)
    states = model_state_bytes(int(n_params(mcfg.shape())), strategy="ddp",
                               precision="bf16_autocast" if dtype == "bf16" else "fp32", optimizer="adamw")
    acts = activation_bytes(mcfg, micro_batch, dtype_bytes=2 if dtype == "bf16" else 4,
                            flash_attention=mcfg.attention == "sdpa", include_head=True)
    return {"model_states": states.model_states, "activations": acts, "total": states.model_states + acts}


def memory_model(backend, plan, budget_s) -> dict:
    """``max_memory_allocated`` of a bf16 training run vs the memory model. Chapter 13 (memory)."""
    from labkit.train.config import TrainConfig

    cfg = TrainConfig(model=plan["memory_model"], micro_batch=plan["memory_micro"], steps=3, warmup_steps=1,
                      dtype=backend.dtype, device=backend.train_device, label="selftest:memory")
    rec = backend.train_run(cfg, 1, timeout_s=budget_s)
    pred = predicted_peak_bytes(cfg.model, cfg.micro_batch, cfg.dtype)
    measured = rec.peak_memory_bytes
    figures = {"model": cfg.model, "micro_batch": cfg.micro_batch, "measured_bytes": measured,
               "measured_kind": rec.extra.get("peak_memory_kind"), "predicted_bytes": pred["total"],
               "predicted_model_states_bytes": pred["model_states"], "predicted_activation_bytes": pred["activations"]}
    if figures["measured_kind"] != backend.memory_kind:
        raise Failed(f"the run measured {figures['measured_kind']!r}, not {backend.memory_kind!r}", figures)
    if not measured or measured <= 0:
        raise Failed(f"measured peak memory is {measured!r}", figures)
    figures["measured_over_predicted"] = measured / pred["total"]
    _band("measured/predicted", figures["measured_over_predicted"], plan["memory_band"], figures,
          "the memory model and max_memory_allocated disagree by more than workspaces and transient "
          "copies explain")
    return figures


# ------------------------------------------------------------------------------------------ peak
def matmul_peak(backend, plan, budget_s) -> dict:
    """Measured bf16 matmul peak vs the catalogue's dense peak of this GPU. Chapter 6 and chapter 4."""
    from labkit.hardware.catalogue import lookup

    m = backend.measure_peak(backend.dtype, max_seconds=min(plan["peak_seconds"], budget_s / 2),
                             sizes=plan["peak_sizes"])
    name = backend.device_name(0)
    figures = {"dtype": m.dtype, "measured_tflops": m.flops / 1e12, "best_shape": list(m.shape),
               "sweep_s": m.seconds, "device_name": name}
    try:
        spec = lookup(name)
    except ValueError:
        raise Skip(f"{name!r} is not in labkit's catalogue: measured {m.flops / 1e12:,.1f} TFLOP/s, "
                   "no datasheet peak to compare with", figures) from None
    cat = spec.peak(m.dtype)
    figures.update(catalogue=spec.name, catalogue_tflops=cat / 1e12, fraction_of_catalogue=m.flops / cat)
    _band("measured/catalogue", m.flops / cat, plan["peak_band"], figures,
          "a matmul sweep reaches 60-85% of the dense datasheet peak on healthy data-centre GPUs; below half "
          "means a throttled or shared GPU or a wrong catalogue row")
    return figures


# ------------------------------------------------------------------------------------------ MFU
def mfu_reference(backend, plan, budget_s) -> dict:
    """MFU of the reference GPT ("1b" ≈ 1.0e9 parameters) in bf16 on one GPU. Chapter 4 (MFU)."""
    from labkit.train.config import TrainConfig

    cfg = TrainConfig(model=plan["mfu_model"], micro_batch=plan["mfu_micro"], steps=plan["mfu_steps"],
                      warmup_steps=3, dtype=backend.dtype, device=backend.train_device, label="selftest:mfu")
    rec = backend.train_run(cfg, 1, timeout_s=budget_s)
    figures = _train_figures(rec)
    figures.update(model=cfg.model, micro_batch=cfg.micro_batch, seq_len=cfg.model_config.seq_len,
                   peak_flops=rec.peak_flops, hfu=rec.hfu)
    if cfg.model != "1b":
        figures["note"] = (f"model {cfg.model!r} ({figures['n_params'] or 0:.3g} parameters), not the ~1B reference "
                           "(--quick or a CPU rehearsal)")
    if rec.mfu is None:
        raise Failed(f"no MFU: {rec.extra.get('mfu_error', 'the run gave no tokens/s or no peak')}", figures)
    if backend.asynchronous and not str(rec.peak_source).startswith("catalogue:"):
        figures["note"] = (figures.get("note", "") + "; " if "note" in figures else "") + \
            f"MFU divides by {rec.peak_source}, not a catalogue peak"
    floor = plan["mfu_floor"]
    if floor is not None and rec.mfu < floor:
        raise Failed(f"MFU {rec.mfu:.1%} is below {floor:.0%}: a ~1B GPT in bf16 should keep a data-centre GPU "
                     "busier (a slow loader, a host synchronisation per step, or the wrong peak)", figures)
    return figures


CHECKS = (
    Check("meter_cuda_events", "CUDA-event Meter vs a synchronised wall clock", "7", 30, 15, meter_cuda_events),
    Check("matmul_peak", "measured bf16 matmul peak vs the catalogue", "6, 4", 45, 20, matmul_peak),
    Check("nccl_collectives", "NCCL launch: all-reduce correctness and bus bandwidth", "11, 5", 60, 40,
          nccl_collectives),
    Check("ddp_train", "DDP training steps on the GPUs (NCCL, bf16)", "19", 70, 40, ddp_train),
    Check("fsdp2_train", "FSDP2 training steps on the GPUs (bf16 mixed precision)", "20", 70, 40, fsdp2_train),
    Check("memory_model", "memory model vs torch.cuda.max_memory_allocated", "13", 60, 35, memory_model),
    Check("mfu_reference", "MFU of the ~1B reference GPT in bf16", "4", 135, 50, mfu_reference),
)


def check_by_name(names) -> tuple:
    """The checks named in ``names`` (in CHECKS order); ValueError naming an unknown one. Chapter 7."""
    known = {c.name: c for c in CHECKS}
    names = list(names)
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"check {bad[0]!r} is not known; choose from {list(known)}")
    return tuple(c for c in CHECKS if c.name in names)

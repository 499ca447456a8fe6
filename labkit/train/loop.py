"""The reference training loop: one :class:`~labkit.train.config.TrainConfig` in, one
:class:`~labkit.record.RunRecord` out — the only training loop in labkit.

The same code runs a tiny GPT on CPU gloo ranks and a 1B GPT on GPUs with NCCL. Per optimizer step
(chapter 14's baseline, instrumented with :class:`labkit.measure.meter.Meter` phases ``data`` / ``forward`` /
``backward`` / ``comm`` / ``optimizer``)::

    for each of `accum` micro-batches:           # gradient accumulation (chapter 15)
        data      next(loader) → device
        forward   (bf16/fp16 autocast if dtype says so) loss / accum
        backward  loss.backward()  — DDP/FSDP gradient sync only on the last micro-batch (no_sync)
                  (scaler.scale(loss).backward() with a loss scale, chapter 18)
    comm          only with inject="comm": the padded all-reduce
    optimizer     AdamW step (scaler.step + update: skipped on overflow), zero_grad — in the implementation
                  cfg.optimizer_impl names (for-loop / foreach / fused, labkit.train.optim, chapter 17)
    (no phase)    only with inject="host"/"straggler": the host stall, outside every op and phase
                  (straggler_by="link": none — the slow rank's gradient buckets wait in its collectives);
                  with inject="work": the extra multiplies (op ``inject:work``), after the optimizer
    (between)     chapter 25 (labkit.train.adaptive.AdaptiveRun): the next step's accumulation and learning
                  rate, the held-out evaluation, the weight average

With ``pp`` > 1 (chapter 24) the pipeline schedule's ``step`` takes the place of the forward/backward of the
``accum`` micro-batches (:func:`labkit.train.pipeline.step`: phases ``data``, ``pipeline``, ``comm``) — the same
loop, data, optimizer and record; with ``tp`` > 1 the model's blocks are split and each micro-batch's forward and
backward run under :func:`labkit.train.tensor_parallel.loss_context` (the vocabulary-parallel cross-entropy).
With ``moe_experts`` (chapter 26) the loop only adds, after each step's last backward, the expert-gradient
reduction of ``ep`` > 1 and the step's routing counts (:func:`labkit.train.expert_parallel.after_backward`,
``record.extra["moe"]``).

Parallelism is applied from outside the model by :func:`labkit.train.parallel.parallelize`; bottleneck
injections by :mod:`labkit.train.inject`; the record is built by :mod:`labkit.train.report`. With
``cuda_graphs`` the model's forward and backward are captured once and replayed (:mod:`labkit.train.graphs`,
chapter 17).

Global batch = micro_batch × accum × world ranks sequences of seq_len tokens. The data order depends
only on the seed and the global batch (see :func:`labkit.data.make_loader`), so 1 process with
micro_batch·world, or accum·micro_batch, sees the same samples per step as W ranks — the loss curves
agree to float tolerance in fp32 (tests/test_train.py). The per-step loss is averaged over ranks once,
at the end (one all-reduce; no sync per step).

With fp16, a loss scale or ``grad_stats``, every step is logged before its optimizer step (its scale,
whether a gradient was inf/NaN, per-layer gradient statistics) and after it (applied or skipped, the next
scale): ``record.extra["loss_scale_log"]`` and ``["grad_stats"]`` (:mod:`labkit.train.precision`, chapter 18).

Taught in chapter 4 (MFU of a real run), chapter 14 (the baseline record), chapter 15 (micro-batch,
accumulation, recomputation) and chapter 18 (mixed precision).
"""
from __future__ import annotations

import contextlib
import os
import time

from labkit.record import RunRecord
from labkit.train import inject, report
from labkit.train.config import TrainConfig
from labkit.train.optim import build_optimizer
from labkit.train.parallel import parallelize, sync_context, world
from labkit.train.tensor_parallel import local_loss, loss_context


def _device(cfg: TrainConfig):
    import torch

    from labkit.hardware.measure import resolve_device

    dev = resolve_device(cfg.device)
    if dev.type == "cuda" and dev.index is None:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK={local} but only {torch.cuda.device_count()} GPU(s): use device='cpu' "
                             "or at most one rank per GPU")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    return dev


def build_model(cfg: TrainConfig, device):
    """The GPT of ``cfg``, seeded (same initial weights on every rank), on ``device``, wrapped by
    :func:`~labkit.train.parallel.parallelize`. Taught in chapter 19 (DDP) and chapter 20 (FSDP)."""
    import torch

    from labkit.model.gpt import GPT

    torch.manual_seed(cfg.seed)
    return parallelize(GPT(cfg.model_config).to(device), cfg, device)


def _autocast(cfg: TrainConfig, device):
    import torch

    cache = False if cfg.cuda_graphs else None   # CUDA-graph capture needs the weight-cast cache off (ch. 17)
    if cfg.dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache)
    if cfg.dtype == "fp16":
        return torch.autocast(device_type=device.type, dtype=torch.float16, cache_enabled=cache)
    return contextlib.nullcontext()


def _scaler(cfg: TrainConfig, device):
    """The loss scaler of ``cfg`` (chapter 18): torch.amp.GradScaler, a static scale, or None."""
    if cfg.scaling == "dynamic":
        import torch

        return torch.amp.GradScaler(device.type, init_scale=cfg.scale_init,
                                    growth_interval=cfg.scale_growth_interval)
    if cfg.scaling == "static":
        from labkit.train.precision import StaticScaler

        return StaticScaler(cfg.loss_scale)
    return None


def forward_backward(model, micro_batches, cfg: TrainConfig, device, meter=None, scaler=None, accum=None):
    """Accumulate gradients over ``accum`` (default ``cfg.accum``; chapter 25 varies it) micro-batches from ``micro_batches`` (an iterator of
    (x, y)); returns the summed loss.

    Each micro-batch's loss is divided by ``cfg.accum`` so the accumulated gradient equals the gradient
    of the mean loss over the whole k·b batch; with a loss ``scaler`` the backward runs on the scaled loss
    (chapter 18). Taught in chapter 15 (gradient accumulation).
    """
    import torch

    phase = meter.phase if meter is not None else (lambda name: contextlib.nullcontext())
    if getattr(model, "schedule", None) is not None:    # pp > 1: the schedule's step is forward/backward
        from labkit.train import pipeline

        return pipeline.step(model, micro_batches, cfg, device, phase, _autocast(cfg, device))
    k = cfg.first_accum if accum is None else accum
    total = torch.zeros((), device=device)
    for j in range(k):
        with phase("data"):
            x, y = next(micro_batches)
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
        with sync_context(model, cfg, last=j == k - 1), loss_context(model):   # tp: the vocab-parallel loss
            with phase("forward"), _autocast(cfg, device):
                _, loss = model(x, y)
                loss = loss / k
            with phase("backward"):
                (scaler.scale(loss) if scaler is not None else loss).backward()
        total += local_loss(loss).detach().float()
    return total


def _dataset(cfg: TrainConfig):
    """The run's token windows: the pre-tokenised memmap packed, padded documents, or tokenised on the fly
    (chapter 22)."""
    from labkit import data

    seq = cfg.model_config.seq_len
    if cfg.dataset == "on_the_fly":                        # chapter 22: tokenise in __getitem__
        return data.OnTheFlyDataset(seq)
    if cfg.packing:
        return data.TokenDataset(data.load_tokens(), seq)
    return data.PaddedDataset(data.load_tokens(), seq, data.tokenizer().token_to_id(data.EOS))  # one doc per row


def _batches(cfg: TrainConfig, slowdown_s: float, world_size: int, device):
    """Cycle through the loader forever, reshuffling each epoch (DistributedSampler.set_epoch); the data
    is sharded over the data-parallel ranks only (tp/pp groups read the same batches); with ``val_every``
    the held-out windows are not in it (:func:`labkit.train.adaptive.held_out`)."""
    from labkit import data
    from labkit.train.adaptive import held_out
    from labkit.train.parallel import data_shard

    replicas, index = data_shard(cfg, world_size, world()[1])
    ds = held_out(cfg, _dataset(cfg))[0]
    persistent = cfg.num_workers > 0 if cfg.persistent_workers is None else cfg.persistent_workers
    pin = device.type == "cuda" if cfg.pin_memory is None else cfg.pin_memory
    loader = data.make_loader(ds, cfg.micro_batch, num_workers=cfg.num_workers, pin_memory=pin,
                              prefetch_factor=cfg.prefetch_factor, persistent_workers=persistent,
                              slowdown_s=slowdown_s, seed=cfg.seed, distributed=replicas > 1,
                              num_replicas=replicas, rank=index)
    if len(loader) == 0:       # a small training set (chapter 25): every rank needs a whole micro-batch
        raise ValueError(f"TrainConfig.train_sequences={cfg.train_sequences} gives no micro-batch of "
                         f"{cfg.micro_batch} on each of {replicas} data-parallel ranks: use at least "
                         f"{cfg.micro_batch * replicas}")
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _profiler(cfg: TrainConfig, device, rank: int):
    if not cfg.profile_dir:
        return None, []
    import os
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile, schedule

    # Kineto prints "USDT:… profiler_start/stop" lines to stderr at every start and stop, at a level only
    # its "log nothing" setting (6) silences; a user's own KINETO_LOG_LEVEL is kept
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    out = Path(cfg.profile_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank{rank}.json"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if cfg.profile_steps is None:   # skip 1 step (allocations, lazy init), warm the profiler 1, record ≤ 3
        active = max(1, min(3, cfg.steps - 2))
        wait, warm = (1 if cfg.steps >= 3 else 0), (1 if cfg.steps >= 2 else 0)
    else:                           # the last profile_steps steps, the one before them warms the profiler
        active = cfg.profile_steps
        warm = 1 if cfg.steps > active else 0
        wait = cfg.steps - active - warm
    prof = profile(activities=acts, schedule=schedule(wait=wait, warmup=warm, active=active, repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(str(path)))
    return prof, [str(path)]


def train(cfg: TrainConfig, *, probe=None) -> RunRecord:
    """Train in this process (one rank of a launch, or alone) and return the run record.

    With ``parallel`` "ddp"/"fsdp"/"fsdp1" torch.distributed must be initialised (it is in a
    :func:`labkit.launch` rank; under torchrun it is initialised here from the environment).
    ``probe(model, optimizer, cfg) -> dict``, if given, runs at the end of the last step after the optimizer
    step and before the gradients are cleared — when parameters, gradients and optimizer state are all
    live — and its result is ``record.extra["probe"]`` (e.g. the model state's exact bytes,
    :mod:`labkit.memory.measure`).
    Taught in chapter 4 (MFU), chapter 14 (baseline record) and chapter 15 (accumulation).
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"train needs a TrainConfig, got {type(cfg).__name__}")
    import torch
    import torch.distributed as dist

    ranks_needed = cfg.parallel != "single" or cfg.tp * cfg.pp > 1
    if ranks_needed and not dist.is_initialized() and "WORLD_SIZE" in os.environ:
        from labkit.launcher.worker import init_distributed

        init_distributed()
    n, rank = world()
    if ranks_needed and not dist.is_initialized():
        raise ValueError(f"parallel={cfg.parallel!r}, tp={cfg.tp}, pp={cfg.pp} needs torch.distributed: use "
                         "labkit.train.run(cfg, nprocs) or torchrun")
    if cfg.parallel == "single" and n > cfg.tp * cfg.pp:
        raise ValueError(f"parallel='single' on {n} ranks would train {n} independent models; "
                         "use 'ddp' or 'fsdp'")
    if cfg.inject in ("comm", "straggler") and n < 2:
        raise ValueError(f"inject={cfg.inject!r} needs ranks that wait for each other: run it on 2 or more ranks")
    device = _device(cfg)
    requested = cfg
    cfg, facts = inject.plan(cfg, device)
    model = build_model(cfg, device)
    if cfg.cuda_graphs:                                    # chapter 17: capture forward + backward once
        from labkit.train.graphs import graph_model

        model = graph_model(model, cfg, device, autocast=lambda: _autocast(cfg, device))
    opt = build_optimizer(model, cfg)                      # chapter 17: for-loop / foreach / fused AdamW
    batches = _batches(cfg, cfg.data_slowdown_s, n, device)

    probed = {}
    scaler = _scaler(cfg, device)                          # chapter 18: loss scaling and its log
    scale_log, grad_log, moe_log = [], [], []

    from labkit.train.adaptive import AdaptiveRun, held_out

    between = AdaptiveRun(cfg, model, opt, device, held_out(cfg, _dataset(cfg))[1], n,       # chapter 25: accum, lr, val, SWA
                          autocast=lambda: _autocast(cfg, device))

    def step(meter=None, pad=None, last=False, stall=0.0, accum=None, work=0):
        loss = forward_backward(model, batches, cfg, device, meter, scaler, accum)
        if cfg.moe_experts:                   # chapter 26: expert gradients (ep > 1), the step's routing counts
            from labkit.train.expert_parallel import after_backward

            moe_log.append(after_backward(model, meter.phase if meter else lambda _: contextlib.nullcontext()))
        if scaler is not None or cfg.dtype == "fp16" or cfg.grad_stats:
            _monitor(model, opt, scaler, scale_log, grad_log, cfg)
        if cfg.max_grad_norm is not None:     # chapter 25: once, after the last micro-batch, on unscaled grads
            between.clip(scaler)
        if pad is not None:
            from torch.profiler import record_function

            with (meter.phase("comm") if meter else contextlib.nullcontext()), record_function("comm:all_reduce"):
                dist.all_reduce(pad)
        with meter.phase("optimizer") if meter else contextlib.nullcontext():
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
                _log_scale(scale_log, scaler, opt)
            else:
                opt.step()
                if scale_log:
                    _log_scale(scale_log, None, opt)
            if last and probe is not None:
                probed.update(probe(model, opt, cfg))
            opt.zero_grad(set_to_none=True)
        if work:
            inject.do_work(work, device)        # lab 11: a regression of known size, real compute
        if stall:     # the host stall (in the step, in no op and no phase), or the straggler's matmuls (ops)
            inject.block(cfg, stall, stall_reps, device)
        return loss

    pad, stall, work, stall_reps = None, 0.0, 0, 0
    if cfg.inject == "work":
        with inject.rewound(model, opt, scaler, (scale_log, grad_log, moe_log, between._norms)):
            work = inject.size_work(cfg, step, device)                  # three real steps, undone after
        facts.update(work_matmuls_used=work, work_flops_used=inject.work_flops(work))
        batches = _batches(cfg, cfg.data_slowdown_s, n, device)        # from the first batch, as a clean run
    if cfg.inject in ("data", "comm", "host", "straggler"):
        with inject.rewound(model, opt, scaler, (scale_log, grad_log, moe_log, between._norms)):
            slow, pad_mb, stall_s, stall_reps = inject.calibrate(cfg, step, device)   # two real steps, undone after
        facts.update(data_slowdown_s_used=slow, comm_pad_mb_used=pad_mb, host_stall_s_used=stall_s,
                     host_stall_reps_used=stall_reps)
        stall = stall_s if inject.stalls_here(cfg, rank, n) else 0.0
        if stall and cfg.straggler_by == "data":     # the straggler's loader sleeps per sample instead
            slow, stall = stall / (cfg.micro_batch * cfg.first_accum), 0.0
        if stall and cfg.straggler_by == "link":     # its link: gradient buckets held back in its collectives
            from labkit.train.slow_link import slow_straggler_link

            facts["link_gbit_s_used"] = slow_straggler_link(stall, 4 * inject._n_params(cfg), n)
            stall = 0.0
        batches = _batches(cfg, slow or cfg.data_slowdown_s, n, device)   # from the first batch, as a clean run
        if pad_mb:
            pad = torch.zeros(max(1, int(pad_mb * 2**20 / 4)), device=device)
    meter = report.meter_for(cfg, n, device)
    prof, trace_files = _profiler(cfg, device, rank)
    losses = []
    a, b = cfg.inject_steps or (0, cfg.steps)           # chapter 25: an injection switched on and off by step
    ckpt, start = _checkpointer(cfg, model, opt, rank, n, batches)   # chapter 27: resume, saves, failure
    t0 = time.perf_counter()
    with prof if prof is not None else contextlib.nullcontext():
        for i in range(start, cfg.steps):
            if ckpt is not None:
                ckpt.before_step(i)
            k, on = between.before_step(), a <= i < b
            with meter.step(tokens=meter.tokens_per_step // cfg.first_accum * k):
                losses.append(step(meter, pad if on else None, last=i == cfg.steps - 1, stall=stall if on else 0.0,
                                   accum=k, work=work if on else 0))
            between.after_step(i, meter)
            if ckpt is not None:
                ckpt.after_step(i)          # outside the step's timing: the save's stall is recorded apart
            if prof is not None:
                prof.step()
    final_wait = ckpt.finish() if ckpt is not None else 0.0
    wall = time.perf_counter() - t0
    loss_t = torch.stack(losses).float()
    if n > 1:   # the loss of the global batch = mean over ranks (equal local batch sizes); with pp > 1 only
        dist.all_reduce(loss_t, op=dist.ReduceOp.SUM)     # the n/pp last-stage ranks hold a loss, the rest 0
        loss_t /= n // cfg.pp
    record = report.build(meter, cfg, requested, device=device, losses=loss_t.tolist(),
                          wall_s=wall, rank=rank, trace_files=trace_files, facts=facts)
    record.extra.update(between.extra(meter))
    if probe is not None:
        record.extra["probe"] = probed
    if ckpt is not None:
        record.extra["checkpoint"] = ckpt.extra(cfg.steps - start, final_wait)
    if cfg.tp * cfg.pp * cfg.cp > 1:
        from labkit.train.parallel import layout

        record.extra["layout"] = layout(cfg, n, rank)
    if cfg.inter_node_gbit_s or cfg.straggler_by == "link":
        from labkit.train.slow_link import report as link_report

        record.extra["slow_link"] = link_report()
    if cfg.moe_experts:                                    # chapter 26: tokens per expert, load imbalance
        from labkit.train.expert_parallel import moe_record

        record.extra["moe"] = moe_record(moe_log[-cfg.steps:], model, cfg, n)
    if cfg.cuda_graphs:
        record.extra["cuda_graphs"] = dict(getattr(model, "labkit_cuda_graphs", {}))
    hook_state = getattr(getattr(model, "_orig_mod", model), "labkit_comm_hook_state", None)
    if hook_state is not None:   # PowerSGD's own count of the gradient elements it was given and all-reduced
        record.extra["powersgd_numel"] = {"before": int(hook_state.total_numel_before_compression),
                                          "after": int(hook_state.total_numel_after_compression)}
    if scale_log:
        record.extra["loss_scale_log"] = scale_log[-cfg.steps:]     # not the injection's calibration steps
        record.extra["loss_scale"] = {"scaling": cfg.scaling, "init": cfg.scale_init,
                                      "growth_interval": cfg.scale_growth_interval, "backoff": 0.5, "growth": 2.0}
    if grad_log:
        record.extra["grad_stats"] = grad_log[-cfg.steps:]
    return record


def _checkpointer(cfg: TrainConfig, model, opt, rank: int, n: int, batches):
    """Chapter 27: the run's :class:`~labkit.train.checkpoint.Checkpointer` (None without checkpoint
    options) and the step to start at — after a resume the loader is fast-forwarded over the steps done."""
    if not (cfg.checkpoint_every or cfg.resume_from is not None or cfg.fail_at_step is not None):
        return None, 0
    from labkit.train.checkpoint import Checkpointer

    ckpt = Checkpointer(cfg, model, opt, rank, n)
    if ckpt.root is not None:
        ckpt.root.mkdir(parents=True, exist_ok=True)
    start = ckpt.resume()
    for _ in range(start * cfg.first_accum):
        next(batches)
    return ckpt, start


def _monitor(model, opt, scaler, scale_log, grad_log, cfg) -> None:
    """Before the optimizer step (chapter 18): the step's scale and overflow, and per-layer gradient
    statistics of the gradients as backward left them (× the scale) when ``cfg.grad_stats``."""
    from labkit.train import precision

    scale = float(scaler.get_scale()) if scaler is not None else 1.0
    scale_log.append({"step": len(scale_log), "scale": scale, "overflow": precision.nonfinite_grads(model),
                      "steps_before": precision.optimizer_steps(opt)})
    if cfg.grad_stats:
        grad_log.append(precision.grad_stats(model, scale=scale))


def _log_scale(scale_log, scaler, opt) -> None:
    """After the optimizer step: whether it was applied (Adam's step counter moved) and the next scale."""
    from labkit.train import precision

    row = scale_log[-1]
    row["applied"] = precision.optimizer_steps(opt) > row.pop("steps_before")
    row["next_scale"] = float(scaler.get_scale()) if scaler is not None else row["scale"]

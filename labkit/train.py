"""The reference training loop: one frozen :class:`TrainConfig` in, one :class:`~labkit.record.RunRecord` out.

The same code runs a tiny GPT on CPU gloo ranks and a 1B GPT on GPUs with NCCL. What it does per
optimizer step (chapter 14's baseline, instrumented with :class:`labkit.meter.Meter` phases
``data`` / ``forward`` / ``backward`` / ``optimizer``)::

    for each of `accum` micro-batches:           # gradient accumulation (chapter 15)
        data      next(loader) → device
        forward   (bf16 autocast if dtype="bf16") loss / accum
        backward  loss.backward()  — DDP/FSDP gradient sync only on the last micro-batch
    optimizer     AdamW step, zero_grad

Parallelism is applied from outside the model (:mod:`labkit.models` is single-device code):

- ``"single"``: one process;
- ``"ddp"``: ``DistributedDataParallel(bucket_cap_mb=…)``, ``no_sync()`` on all but the last
  micro-batch (PyTorch DDP notes, https://pytorch.org/docs/stable/notes/ddp.html);
- ``"fsdp"``: FSDP2 ``fully_shard`` per transformer block and on the root, on
  ``init_device_mesh(device, (world,))``, with ``reshard_after_forward`` and an optional
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``; gradient sync is switched off for all
  but the last micro-batch (``set_requires_gradient_sync``)
  (https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html).

Global batch = micro_batch × accum × world ranks sequences of seq_len tokens. The data order depends
only on the seed and the global batch (see :func:`labkit.data.make_loader`), so 1 process with
micro_batch·world, or accum·micro_batch, sees the same samples per step as W ranks — the loss curves
agree to float tolerance in fp32 (tests/test_train.py).

Loss: the per-step loss is averaged over ranks once, at the end (one all-reduce; no sync per step).
Peak memory: ``torch.cuda.max_memory_allocated`` on GPU; on CPU the process's peak RSS
(``resource.getrusage().ru_maxrss`` — it includes the Python/torch runtime, ≈ 200 MB, not only
tensors); ``record.extra["peak_memory_kind"]`` says which.

Taught in chapter 4 (MFU of a real run), chapter 14 (the baseline record) and chapter 15 (micro-batch,
accumulation, recomputation).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.record import RunRecord, environment_versions

PARALLEL = ("single", "ddp", "fsdp")
DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (see the module docstring). Taught in chapter 14."""

    model: str = "tiny"
    seq_len: int | None = None          # None → the model size's seq_len
    micro_batch: int = 8                # sequences per rank per micro-batch
    accum: int = 1                      # micro-batches per optimizer step
    steps: int = 20                     # optimizer steps, warm-up included
    warmup_steps: int = 3               # excluded from the timing statistics (not from the loss curve)
    dtype: str = "fp32"                 # "fp32" | "bf16" (autocast; never fp16 on CPU)
    parallel: str = "single"            # "single" | "ddp" | "fsdp"
    bucket_cap_mb: float = 25.0         # DDP
    reshard_after_forward: bool = True  # FSDP2
    mp_policy: str | None = None        # FSDP2: None | "bf16"
    checkpoint: bool = False            # activation checkpointing per block
    compile: bool = False               # torch.compile
    attention: str = "sdpa"             # "sdpa" | "naive"
    lr: float = 3e-4
    seed: int = 0
    num_workers: int = 0
    data_slowdown_s: float = 0.0        # sleep per sample in the loader (labkit.data.SlowDataset)
    profile_dir: str | None = None      # torch.profiler chrome traces, one file per rank
    device: str = "auto"
    peak_flops: float | None = None     # per device; None → labkit.hardware.resolve_peak
    label: str = "train"

    def __post_init__(self):
        from labkit.model_config import ATTENTIONS, SIZES

        def bad(name, valid):
            raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r} is not valid; {valid}")

        if self.model not in SIZES:
            bad("model", f"choose one of {sorted(SIZES)}")
        for name in ("micro_batch", "accum", "steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(name, "use an int ≥ 1")
        if not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps < self.steps:
            bad("warmup_steps", f"use an int with 0 ≤ warmup_steps < steps={self.steps}")
        if self.seq_len is not None and (not isinstance(self.seq_len, int) or self.seq_len < 1):
            bad("seq_len", "use None or an int ≥ 1")
        if self.seq_len is not None and self.seq_len > SIZES[self.model].seq_len:
            bad("seq_len", f"the {self.model!r} model has at most seq_len={SIZES[self.model].seq_len}")
        if self.dtype not in DTYPES:
            bad("dtype", f"choose one of {DTYPES} (fp16 is not offered: ≈1 GFLOP/s on CPU)")
        if self.parallel not in PARALLEL:
            bad("parallel", f"choose one of {PARALLEL}")
        if self.mp_policy not in (None, "bf16"):
            bad("mp_policy", "choose None or 'bf16'")
        if self.mp_policy and self.parallel != "fsdp":
            bad("mp_policy", "a MixedPrecisionPolicy applies to parallel='fsdp' only")
        if self.attention not in ATTENTIONS:
            bad("attention", f"choose one of {ATTENTIONS}")
        if not self.bucket_cap_mb > 0:
            bad("bucket_cap_mb", "use a size in MB > 0")
        if not self.lr > 0:
            bad("lr", "use a learning rate > 0")
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            bad("num_workers", "use an int ≥ 0")
        if not self.data_slowdown_s >= 0:
            bad("data_slowdown_s", "use seconds ≥ 0")

    @property
    def model_config(self):
        from labkit.model_config import gpt_config

        return gpt_config(self.model, seq_len=self.seq_len, attention=self.attention, checkpoint=self.checkpoint)

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- pieces
def _world():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _device(cfg: TrainConfig):
    import torch

    from labkit.hardware import resolve_device

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
    """The GPT of ``cfg``, seeded, on ``device``, wrapped for ``cfg.parallel`` (and compiled).

    Taught in chapter 19 (DDP) and chapter 20 (FSDP2: per-block ``fully_shard``)."""
    import torch

    from labkit.models import GPT

    torch.manual_seed(cfg.seed)     # same initial weights on every rank (FSDP2 shards them in place)
    model = GPT(cfg.model_config).to(device)
    world, _ = _world()
    if cfg.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device] if device.type == "cuda" else None,
                    bucket_cap_mb=cfg.bucket_cap_mb)
    elif cfg.parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (world,))
        kw = {"mesh": mesh, "reshard_after_forward": cfg.reshard_after_forward}
        if cfg.mp_policy == "bf16":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:       # one all-gather / reduce-scatter unit per block
            fully_shard(block, **kw)
        fully_shard(model, **kw)         # the rest: embeddings (tied with the head), final norm
    if cfg.compile:
        model = torch.compile(model)
    return model


def _sync_context(model, cfg: TrainConfig, last: bool):
    """Skip gradient synchronisation on all but the last micro-batch of an accumulation."""
    inner = getattr(model, "_orig_mod", model)
    if cfg.parallel == "ddp" and not last:
        return inner.no_sync()
    if cfg.parallel == "fsdp":
        inner.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def _autocast(cfg: TrainConfig, device):
    import torch

    if cfg.dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def forward_backward(model, micro_batches, cfg: TrainConfig, device, meter=None):
    """Accumulate gradients over ``micro_batches`` (an iterator of (x, y)); returns the summed loss.

    Each micro-batch's loss is divided by ``cfg.accum`` so the accumulated gradient equals the gradient
    of the mean loss over the whole k·b batch. Taught in chapter 15 (gradient accumulation).
    """
    import torch

    phase = meter.phase if meter is not None else (lambda name: contextlib.nullcontext())
    total = torch.zeros((), device=device)
    for j in range(cfg.accum):
        with phase("data"):
            x, y = next(micro_batches)
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
        with _sync_context(model, cfg, last=j == cfg.accum - 1):
            with phase("forward"), _autocast(cfg, device):
                _, loss = model(x, y)
                loss = loss / cfg.accum
            with phase("backward"):
                loss.backward()
        total += loss.detach()
    return total


def _batches(loader):
    """Cycle through the loader forever, reshuffling each epoch (DistributedSampler.set_epoch)."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _profiler(cfg: TrainConfig, device, rank: int):
    if not cfg.profile_dir:
        return None, []
    from torch.profiler import ProfilerActivity, profile, schedule

    out = Path(cfg.profile_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank{rank}.json"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # skip 1 step (allocations, lazy init), warm the profiler 1 step, record up to 3
    active = max(1, min(3, cfg.steps - 2))
    sched = schedule(wait=1 if cfg.steps >= 3 else 0, warmup=1 if cfg.steps >= 2 else 0, active=active, repeat=1)
    prof = profile(activities=acts, schedule=sched,
                   on_trace_ready=lambda p: p.export_chrome_trace(str(path)))
    return prof, [str(path)]


def _peak_memory(device) -> tuple[int, str]:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda.max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "ru_maxrss (process peak RSS)"


# ----------------------------------------------------------------------------- train / run
def train(cfg: TrainConfig) -> RunRecord:
    """Train in this process (one rank of a launch, or alone) and return the run record.

    With ``parallel`` "ddp"/"fsdp" torch.distributed must be initialised (it is in a
    :func:`labkit.launch` rank; under torchrun it is initialised here from the environment).
    Taught in chapter 4 (MFU), chapter 14 (baseline record) and chapter 15 (accumulation).
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"train needs a TrainConfig, got {type(cfg).__name__}")
    import torch
    import torch.distributed as dist

    from labkit import data, flops, hardware
    from labkit.meter import Meter

    if cfg.parallel != "single" and not dist.is_initialized() and "WORLD_SIZE" in os.environ:
        from labkit.launcher import init_distributed

        init_distributed()
    world, rank = _world()
    if cfg.parallel != "single" and not dist.is_initialized():
        raise ValueError(f"parallel={cfg.parallel!r} needs torch.distributed: use labkit.train.run(cfg, nprocs) "
                         "or torchrun")
    if cfg.parallel == "single" and world > 1:
        raise ValueError(f"parallel='single' on {world} ranks would train {world} independent models; "
                         "use 'ddp' or 'fsdp'")
    device = _device(cfg)
    mcfg = cfg.model_config
    model = build_model(cfg, device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    tokens = data.load_tokens()
    loader = data.make_loader(data.TokenDataset(tokens, mcfg.seq_len), cfg.micro_batch,
                              num_workers=cfg.num_workers, pin_memory=device.type == "cuda",
                              persistent_workers=cfg.num_workers > 0, slowdown_s=cfg.data_slowdown_s,
                              seed=cfg.seed, distributed=world > 1)
    batches = _batches(loader)

    shape = mcfg.shape()
    fpt = flops.model_flops_per_token(shape)
    hfpt = flops.hardware_flops_per_token(shape, recompute="full" if cfg.checkpoint else "none")
    peak_dtype = "bf16" if (cfg.dtype == "bf16" or cfg.mp_policy == "bf16") else "fp32"
    peak, peak_src = hardware.resolve_peak(device, peak_dtype, cfg.peak_flops)
    tokens_per_step = cfg.micro_batch * cfg.accum * world * mcfg.seq_len
    meter = Meter(device=device, warmup_steps=cfg.warmup_steps, tokens_per_step=tokens_per_step,
                  flops_per_token=fpt, hardware_flops_per_token=hfpt, peak_flops=peak, peak_source=peak_src,
                  n_devices=world, dtype=peak_dtype, label=cfg.label)
    prof, trace_files = _profiler(cfg, device, rank)
    losses = []
    t0 = time.perf_counter()
    with prof if prof is not None else contextlib.nullcontext():
        for _ in range(cfg.steps):
            with meter.step(tokens=tokens_per_step):
                loss = forward_backward(model, batches, cfg, device, meter)
                with meter.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            losses.append(loss)
            if prof is not None:
                prof.step()
    wall = time.perf_counter() - t0
    loss_t = torch.stack(losses).float()
    if world > 1:   # the loss of the global batch = mean over ranks (equal local batch sizes)
        dist.all_reduce(loss_t, op=dist.ReduceOp.SUM)
        loss_t /= world
    peak_mem, mem_kind = _peak_memory(device)
    n_params = sum(p.numel() for p in getattr(model, "_orig_mod", model).parameters())
    if cfg.parallel == "fsdp":
        n_params = flops.n_params(shape)   # local shards only; report the full model
    if peak_src.startswith("measured:") and "mfu_error" in meter.summary():
        # the live peak was taken on a loaded machine and came out below what training reached:
        # measure once more and divide by the better figure (labkit.hardware.remeasure_peak)
        better = hardware.remeasure_peak(device, peak_dtype)
        meter.peak_flops = max(peak, better.flops)
        meter.peak_source = f"measured:{better.describe()} (re-measured after training)"
    record = meter.to_record(loss=[float(v) for v in loss_t.tolist()], peak_memory_bytes=peak_mem,
                             config=cfg.to_dict(), versions=environment_versions())
    record.device.update({"name": _device_name(device), "kind": device.type,
                          "backend": dist.get_backend() if dist.is_initialized() else None, "count": world})
    record.tokens_per_step = tokens_per_step
    record.extra.update({
        "peak_memory_kind": mem_kind, "n_params": int(n_params), "model": mcfg.to_dict(),
        "flops_method": "palm (6N + 12·L·H·Q·T, PaLM App. B)", "wall_s": wall, "rank": rank,
        "threads": torch.get_num_threads(),
    })
    if trace_files:
        record.extra["trace_files"] = trace_files
    return record


def _device_name(device) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def _rank_entry(cfg: TrainConfig) -> RunRecord:
    """What each launched rank runs (importable, so labkit.launch can start it)."""
    return train(cfg)


def run(cfg: TrainConfig, nprocs: int = 1, *, timeout_s: float = 600, stream: bool = False) -> RunRecord:
    """Train ``cfg`` on ``nprocs`` fresh ranks through :func:`labkit.launch`; rank 0's record.

    ``record.extra["losses_per_rank"]`` holds every rank's loss curve (identical after the all-reduce),
    ``extra["rank_peak_rss_bytes"]`` every rank's peak RSS. ``parallel="single"`` needs ``nprocs=1``.
    Taught in chapter 4 (MFU), chapter 14 (baseline record), chapter 19/20 (DDP/FSDP).
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"run needs a TrainConfig, got {type(cfg).__name__}")
    if cfg.parallel == "single" and nprocs != 1:
        raise ValueError(f"nprocs={nprocs} with parallel='single': use parallel='ddp' or 'fsdp' for > 1 rank")
    from labkit.launcher import launch

    res = launch(_rank_entry, nprocs, args=(cfg,), timeout_s=timeout_s, stream=stream, rank0_only=True)
    record = res.value
    record.extra["losses_per_rank"] = [r.loss for r in res.values]
    record.extra["rank_peak_rss_bytes"] = [r.peak_rss_bytes for r in res.ranks]
    traces = [f for r in res.values for f in r.extra.get("trace_files", [])]
    if traces:
        record.extra["trace_files"] = traces
    return record

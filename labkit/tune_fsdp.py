"""A small FSDP training rank for knobs :class:`labkit.train.TrainConfig` does not cover.

FSDP1 (``FullyShardedDataParallel``): ``sharding_strategy``, ``limit_all_gathers``, ``backward_prefetch``,
``forward_prefetch``, bf16 ``MixedPrecision``; FSDP2 (``fully_shard``): ``reshard_after_forward`` and
explicit prefetching (``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``).
On CPU FSDP1 needs ``device_id=torch.device("cpu")`` (PLATFORM_NOTES); HYBRID_SHARD on one host
degrades to NO_SHARD. Same data, model, optimizer (AdamW) and :class:`labkit.meter.Meter` as
:mod:`labkit.train`, so records compare.

Taught in chapter 19 (DDP) and chapter 20 (FSDP knobs); swept by :func:`labkit.tune.sweep`.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

from labkit.record import RunRecord

SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
BACKWARD_PREFETCH = (None, "BACKWARD_PRE", "BACKWARD_POST")


@dataclass(frozen=True)
class FsdpConfig:
    """One FSDP run. ``version`` 1 (FullyShardedDataParallel) or 2 (fully_shard). Taught in chapter 20."""

    model: str = "tiny"
    micro_batch: int = 4
    accum: int = 1
    steps: int = 8
    warmup_steps: int = 2
    version: int = 1
    sharding_strategy: str = "FULL_SHARD"     # FSDP1
    limit_all_gathers: bool = True            # FSDP1
    backward_prefetch: str | None = "BACKWARD_PRE"   # FSDP1
    forward_prefetch: bool = False            # FSDP1
    reshard_after_forward: bool = True        # FSDP2
    prefetch: int = 0                         # FSDP2 explicit prefetch depth (0 = implicit only)
    mp_policy: str | None = None              # None | "bf16"
    checkpoint: bool = False
    lr: float = 3e-4
    seed: int = 0
    device: str = "auto"
    peak_flops: float | None = None
    label: str = "fsdp"

    def __post_init__(self):
        if self.version not in (1, 2):
            raise ValueError(f"FsdpConfig.version={self.version!r} must be 1 or 2")
        if self.sharding_strategy not in SHARDING:
            raise ValueError(f"FsdpConfig.sharding_strategy={self.sharding_strategy!r}; valid: {SHARDING}")
        if self.backward_prefetch not in BACKWARD_PREFETCH:
            raise ValueError(f"FsdpConfig.backward_prefetch={self.backward_prefetch!r}; valid: {BACKWARD_PREFETCH}")
        if self.mp_policy not in (None, "bf16"):
            raise ValueError(f"FsdpConfig.mp_policy={self.mp_policy!r}; valid: None, 'bf16'")
        for k in ("micro_batch", "accum", "steps"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"FsdpConfig.{k}={v!r} must be an int >= 1")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"FsdpConfig.warmup_steps={self.warmup_steps} must be in [0, steps={self.steps})")
        if self.prefetch < 0:
            raise ValueError(f"FsdpConfig.prefetch={self.prefetch} must be >= 0")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _wrap(model, cfg: FsdpConfig, device, world: int):
    import torch

    from labkit.models import Block

    if cfg.version == 1:
        from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        mp = (MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16)
              if cfg.mp_policy == "bf16" else None)
        return FSDP(model, sharding_strategy=ShardingStrategy[cfg.sharding_strategy],
                    auto_wrap_policy=ModuleWrapPolicy({Block}), mixed_precision=mp,
                    backward_prefetch=BackwardPrefetch[cfg.backward_prefetch] if cfg.backward_prefetch else None,
                    forward_prefetch=cfg.forward_prefetch, limit_all_gathers=cfg.limit_all_gathers,
                    device_id=device if device.type == "cpu" else device.index)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw = {"mesh": init_device_mesh(device.type, (world,)), "reshard_after_forward": cfg.reshard_after_forward}
    if cfg.mp_policy == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = list(model.blocks)
    for b in blocks:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    if cfg.prefetch:
        for i, b in enumerate(blocks):
            b.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + cfg.prefetch])
            b.set_modules_to_backward_prefetch(blocks[max(0, i - cfg.prefetch):i][::-1])
    return model


def fsdp_rank(cfg: FsdpConfig) -> RunRecord:
    """Train ``cfg`` on this rank (torch.distributed initialised, e.g. by labkit.launch); rank's record.

    Taught in chapter 20 (FSDP knobs).
    """
    import torch
    import torch.distributed as dist

    from labkit import data, flops, hardware
    from labkit.memory import model_state_bytes
    from labkit.meter import Meter
    from labkit.models import GPT, gpt_config
    from labkit.record import environment_versions

    world, rank = dist.get_world_size(), dist.get_rank()
    device = hardware.resolve_device(cfg.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(cfg.seed)
    mcfg = gpt_config(cfg.model, checkpoint=cfg.checkpoint)
    model = _wrap(GPT(mcfg).to(device), cfg, device, world)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    loader = data.make_loader(data.TokenDataset(data.load_tokens(), mcfg.seq_len), cfg.micro_batch,
                              seed=cfg.seed, distributed=world > 1)
    it = iter(loader)
    shape = mcfg.shape()
    dtype = "bf16" if cfg.mp_policy == "bf16" else "fp32"
    peak, src = hardware.resolve_peak(device, dtype, cfg.peak_flops)
    tps = cfg.micro_batch * cfg.accum * world * mcfg.seq_len
    meter = Meter(device=device, warmup_steps=cfg.warmup_steps, tokens_per_step=tps,
                  flops_per_token=flops.model_flops_per_token(shape),
                  hardware_flops_per_token=flops.hardware_flops_per_token(
                      shape, recompute="full" if cfg.checkpoint else "none"),
                  peak_flops=peak, peak_source=src, n_devices=world, dtype=dtype, label=cfg.label)
    losses = []
    for _ in range(cfg.steps):
        with meter.step(tokens=tps):
            total = torch.zeros((), device=device)
            for j in range(cfg.accum):
                with meter.phase("data"):
                    try:
                        x, y = next(it)
                    except StopIteration:
                        it = iter(loader)
                        x, y = next(it)
                    x, y = x.to(device), y.to(device)
                last = j == cfg.accum - 1
                sync = contextlib.nullcontext()
                if not last and cfg.version == 1:
                    sync = model.no_sync()
                elif cfg.version == 2:
                    model.set_requires_gradient_sync(last)
                with sync:
                    with meter.phase("forward"):
                        _, loss = model(x, y)
                        loss = loss / cfg.accum
                    with meter.phase("backward"):
                        loss.backward()
                total += loss.detach().float()
            with meter.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        losses.append(total)
    loss_t = torch.stack(losses)
    dist.all_reduce(loss_t)
    loss_t /= world
    strategy = {"FULL_SHARD": "fsdp_full", "SHARD_GRAD_OP": "fsdp_grad_op", "NO_SHARD": "fsdp_no_shard",
                "HYBRID_SHARD": "fsdp_hybrid"}[cfg.sharding_strategy] if cfg.version == 1 else (
        "fsdp_full" if cfg.reshard_after_forward else "fsdp_grad_op")
    pred = model_state_bytes(flops.n_params(shape), strategy=strategy, n_ranks=world, precision="fp32")
    rec = meter.to_record(loss=[float(v) for v in loss_t.tolist()], config=cfg.to_dict(),
                          versions=environment_versions())
    if rec.peak_memory_bytes is None:
        import resource

        rec.peak_memory_bytes = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        rec.extra["peak_memory_kind"] = "ru_maxrss (process peak RSS)"
    rec.extra.update({"n_params": flops.n_params(shape), "model_state_bytes_pred": pred.model_states,
                      "strategy": strategy, "rank": rank})
    rec.device["backend"] = dist.get_backend()
    dist.barrier()
    return rec

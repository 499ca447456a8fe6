"""The one place that applies parallelism to a single-device model.

:mod:`labkit.model.gpt` knows nothing about ranks; :func:`parallelize` wraps a model the way a learner
would wrap their own (torchtitan's seam: build the model, then apply AC, sharding or replication, then
compile). Order matters and follows the PyTorch docs:

1. activation checkpointing by ``cfg.checkpoint``'s policy (chapter 21): every block, every k-th block
   (``checkpoint_wrapper``, non-reentrant) or the attention core only — before DDP / FSDP2 wrap the blocks;
   for FSDP1 (every block only) after wrapping (``apply_activation_checkpointing``);
2. ``"ddp"``: ``DistributedDataParallel(bucket_cap_mb=…, gradient_as_bucket_view=…, static_graph=…)``
   (https://pytorch.org/docs/stable/notes/ddp.html; chapter 19), with an optional communication hook (chapter 23:
   fp16 / bf16 compression, PowerSGD; https://pytorch.org/docs/stable/ddp_comm_hooks.html);
   ``"fsdp"``: FSDP2 ``fully_shard`` per block and on the root (``fsdp_wrap="block"``) or on the root
   only (``"model"``: one unit, the whole model gathered at once) over ``init_device_mesh(device, (world,))``,
   with ``reshard_after_forward`` (True, False, None = torch's default — True except the root — or an
   int: the group size parameters are resharded to after forward, so backward all-gathers over that
   smaller group), an optional ``MixedPrecisionPolicy(bf16 params, fp32 reduce)``, ``CPUOffloadPolicy``
   (``cpu_offload``; ``pin_memory`` only on CUDA: pinning fails on a CPU-only build) and explicit
   prefetching ``prefetch`` blocks ahead in the passes ``prefetch_mode`` names
   (https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html);
   ``"fsdp1"``: ``FullyShardedDataParallel`` with a per-block wrap policy, ``sharding_strategy``,
   ``backward_prefetch``, ``forward_prefetch``, ``limit_all_gathers`` and bf16 ``MixedPrecision``; on
   CPU it needs ``device_id=cpu``; HYBRID_SHARD on one host degrades to NO_SHARD (PLATFORM_NOTES);
3. ``torch.compile``.

With ``tp`` > 1 or ``pp`` > 1 (chapter 24) the ranks form a device mesh ``(pp, dp, cp, tp)``
(``init_device_mesh`` with named dimensions, tp innermost as in Megatron: the ranks of one tensor-parallel
group are neighbours), and the order is torchtitan's: tensor parallelism over ``tp``
(:mod:`labkit.train.tensor_parallel`), ring attention over ``cp`` if cp > 1 (chapter 26,
:mod:`labkit.train.context_parallel`), the pipeline cut into this rank's stages (:mod:`labkit.train.pipeline`),
then per stage checkpointing and DDP / FSDP2 over ``dp`` — over dp·cp flattened when cp > 1 (DDP over
tensor-parallel parameters through torch's ``_pre_dp_module_transform``, which hands DDP their local shards).
The data is sharded over ``dp`` only: the ranks of one tp/pp/cp group read the same micro-batches.

With ``ep`` > 1 (chapter 26, a MoE GPT: :mod:`labkit.train.expert_parallel`) expert parallelism shares the dp
ranks (DeepSpeed-MoE's and torchtitan's choice; tp = pp = cp = 1 here): the dp ranks are factored as
``(edp, ep)``, each ep group splits every MoE layer's experts evenly and exchanges tokens with two
``all_to_all_single`` per layer forward, DDP all-reduces the non-expert gradients over all dp ranks and the
expert gradients are reduced over their edp group.

:func:`sync_context` switches gradient synchronisation off for all but the last micro-batch of an
accumulation (DDP and FSDP1 ``no_sync()``; FSDP2 ``set_requires_gradient_sync``) unless ``no_sync=False``,
and with FSDP2 ``reshard_after_backward=False`` keeps parameters unsharded between micro-batches.

Taught in chapter 19 (DDP), chapter 20 (FSDP), chapter 24 (tensor and pipeline parallelism) and chapter 26
(expert parallelism).
"""
from __future__ import annotations

import contextlib


def world() -> tuple[int, int]:
    """(world size, rank) of the initialised process group, or (1, 0) alone. Taught in chapter 19."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


MESH_DIMS = ("pp", "dp", "cp", "tp")      # outermost → innermost


def mesh_shape(cfg, n: int) -> dict:
    """The sizes of the mesh dimensions ``pp, dp, cp, tp`` for ``cfg`` on ``n`` ranks (dp = n / (tp·pp)).
    Taught in chapter 24."""
    cp = getattr(cfg, "cp", 1)
    inner = cfg.tp * cfg.pp * cp
    if n % inner:
        raise ValueError(f"tp={cfg.tp} × pp={cfg.pp} × cp={cp} = {inner} ranks per model replica does not divide "
                         f"the {n} ranks: tp · pp · cp · dp must equal the world size (use {inner}·k ranks)")
    dp = n // inner
    if cfg.parallel == "single" and dp > 1:
        raise ValueError(f"parallel='single' with dp={dp} (= {n} ranks / (tp={cfg.tp} × pp={cfg.pp})) would train "
                         f"{dp} independent replicas: use parallel='ddp' or 'fsdp' over dp, or {inner} ranks")
    return {"pp": cfg.pp, "dp": dp, "cp": cp, "tp": cfg.tp}


def coords(cfg, n: int, rank: int) -> dict:
    """This rank's index on each mesh dimension (row-major over ``pp, dp, cp, tp``: tp varies fastest).
    Taught in chapter 24."""
    shape, out, rest = mesh_shape(cfg, n), {}, rank
    for name in reversed(MESH_DIMS):
        rest, out[name] = divmod(rest, shape[name])
    return {name: out[name] for name in MESH_DIMS}


def data_shard(cfg, n: int, rank: int) -> tuple[int, int]:
    """(replicas, index) of this rank's data shard: the data-parallel dimension only. Taught in chapter 24."""
    if cfg.tp * cfg.pp * getattr(cfg, "cp", 1) == 1:
        return n, rank
    return mesh_shape(cfg, n)["dp"], coords(cfg, n, rank)["dp"]


def layout(cfg, n: int, rank: int) -> dict:
    """The run record's note of the layout: mesh, this rank's coordinates, its stages, the schedule and the
    predicted bubble (p−1)/(v·m). Taught in chapter 24."""
    from labkit.train import pipeline

    shape = mesh_shape(cfg, n)
    out = {"mesh": shape, "dims": list(MESH_DIMS), "coords": coords(cfg, n, rank), "dp_strategy": cfg.parallel,
           "sequence_parallel": cfg.sequence_parallel}
    if cfg.pp > 1:
        n_stages = cfg.pp * cfg.virtual_stages
        spans = pipeline.split_layers(cfg.model_config.n_layers, n_stages)
        here = pipeline.stage_indices(out["coords"]["pp"], cfg.pp, cfg.virtual_stages)
        out.update(pp_schedule=cfg.pp_schedule, virtual_stages=cfg.virtual_stages, micro_batches=cfg.accum,
                   stage_blocks=[list(s) for s in spans], stages_here=here,
                   bubble_predicted=pipeline.bubble_fraction(cfg.pp, cfg.accum, cfg.virtual_stages))
    if getattr(cfg, "cp", 1) > 1:                        # chapter 26: which chunks of each sequence are here
        from labkit.train.ring_attention import chunk_ids

        out.update(cp_balanced=cfg.cp_balanced, cp_chunks=list(chunk_ids(out["coords"]["cp"], cfg.cp, cfg.cp_balanced)))
    return out


def _model_parallel(model, cfg, device, n: int):
    """tp/pp > 1: the mesh, tensor parallelism, ring attention (cp > 1), the pipeline cut, then checkpointing
    and DP (over dp·cp) per stage."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = mesh_shape(cfg, n)
    mesh = init_device_mesh(device.type, tuple(shape.values()), mesh_dim_names=MESH_DIMS)
    if cfg.tp > 1:
        from labkit.train.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(model, mesh["tp"], sequence_parallel=cfg.sequence_parallel,
                              vocab_parallel=cfg.vocab_parallel)
    if shape["cp"] > 1:               # chapter 26: the ring over cp, on this rank's n_heads/tp heads
        from labkit.train.context_parallel import apply_context_parallel

        apply_context_parallel(model, mesh["cp"].get_group(), balanced=cfg.cp_balanced)
    dp_mesh = grad_mesh(mesh, shape)                    # gradients are averaged over dp·cp

    def wrap(part):
        if cfg.checkpoint_policy != "none":
            _checkpoint_blocks(part, cfg.checkpoint_policy)
        if cfg.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            if cfg.tp > 1:   # DDP does not take DTensor parameters: torch's TP+DDP bridge hands it the shards
                from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

                from labkit.train.tensor_parallel import untie_for_ddp

                retie = untie_for_ddp(part)   # the bridge localises each parameter once: the head rejoins by a hook
                _pre_dp_module_transform(part)
                retie()
            part = DDP(part, process_group=dp_mesh.get_group(), bucket_cap_mb=cfg.bucket_cap_mb,
                       device_ids=[device] if device.type == "cuda" else None,
                       find_unused_parameters=cfg.pp > 1)   # pp: no bucket rebuild (one backward per micro-batch)
            if cfg.inter_node_gbit_s:                 # chapter 29: a slow link between "nodes"
                from labkit.train.slow_link import install

                install(part, cfg, dp_mesh.get_group())
        elif cfg.parallel == "fsdp":
            part = _fsdp2(part, cfg, device, dp_mesh.size(), mesh=dp_mesh)
        return part

    if cfg.pp > 1:
        from labkit.train import pipeline

        return pipeline.build(model, cfg, mesh, device, wrap, dp_mesh=dp_mesh)
    return wrap(model)


def grad_mesh(mesh, shape: dict):
    """The 1-D mesh whose ranks average each gradient: ``dp``, or with cp > 1 the ``dp`` and ``cp`` dimensions
    flattened (torchtitan's ``dp_shard_cp``): the cp ranks of a replica hold the same weights and each took
    the gradient of its own share of the tokens. Taught in chapter 26."""
    if shape["cp"] == 1:
        return mesh["dp"]
    return mesh["dp", "cp"]._flatten("dp_cp")


def _checkpoint_blocks(model, policy="full") -> None:
    """Apply an activation-checkpointing policy (:func:`labkit.model.config.checkpoint_policy`): wrap the
    blocks it checkpoints whole, or mark every attention core for recomputation ("attention"). Chapter 21."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from labkit.model.config import checkpoint_policy, checkpointed_blocks

    n = len(model.blocks)
    if checkpoint_policy(policy, n) == "attention":
        for block in model.blocks:
            block.attn.recompute_core = True
        return
    for i in checkpointed_blocks(policy, n):
        model.blocks[i] = checkpoint_wrapper(model.blocks[i])


def comm_hook(ddp, cfg, device):
    """Register ``cfg.comm_hook`` on a DDP model: ``"fp16"`` / ``"bf16"`` cast each bucket before the
    all-reduce and back after (torch's ``default_hooks``); ``"powersgd"`` all-reduces two rank-r factors P, Q
    of each large gradient matrix instead of the matrix, with error feedback (Vogels et al. 2019,
    torch's ``powerSGD_hook``); returns the hook's state (None for the casts). Taught in chapter 23."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    if cfg.comm_hook == "bf16" and device.type != "cuda":
        raise ValueError("comm_hook='bf16' needs CUDA and NCCL: torch's bf16_compress_hook refuses a CPU-only "
                         "build; use 'fp16' on gloo")
    if cfg.comm_hook in ("fp16", "bf16"):
        ddp.register_comm_hook(None, getattr(default_hooks, f"{cfg.comm_hook}_compress_hook"))
        return None
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=cfg.powersgd_rank,
                               start_powerSGD_iter=cfg.powersgd_start_iter)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    return state


def _fsdp2(model, cfg, device, n: int, mesh=None):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    raf = cfg.reshard_after_forward
    if not isinstance(raf, bool) and isinstance(raf, int) and (raf > n or n % raf):
        raise ValueError(f"TrainConfig.reshard_after_forward={raf} is not valid on {n} ranks: an int must divide "
                         f"the ranks (a group size in {[d for d in range(2, n + 1) if n % d == 0]}), or use "
                         "True / False / None")
    kw = {"mesh": mesh if mesh is not None else init_device_mesh(device.type, (n,)), "reshard_after_forward": raf}
    if cfg.mp_policy == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cfg.cpu_offload:
        from torch.distributed.fsdp import CPUOffloadPolicy

        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    blocks = list(model.blocks) if cfg.fsdp_wrap == "block" else []
    for block in blocks:              # one all-gather / reduce-scatter unit per block
        fully_shard(block, **kw)
    fully_shard(model, **kw)          # the rest: embeddings (tied with the head), final norm — or everything
    if cfg.prefetch:
        for i, b in enumerate(blocks):
            if cfg.prefetch_mode in ("both", "forward"):
                b.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + cfg.prefetch])
            if cfg.prefetch_mode in ("both", "backward"):
                b.set_modules_to_backward_prefetch(blocks[max(0, i - cfg.prefetch):i][::-1])
    return model


def _fsdp1(model, cfg, device):
    import torch
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from labkit.model.gpt import Block

    mp = (MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16)
          if cfg.mp_policy == "bf16" else None)
    wrapped = FSDP(model, sharding_strategy=ShardingStrategy[cfg.sharding_strategy],
                   auto_wrap_policy=ModuleWrapPolicy({Block}) if cfg.fsdp_wrap == "block" else None,
                   mixed_precision=mp,
                   backward_prefetch=BackwardPrefetch[cfg.backward_prefetch] if cfg.backward_prefetch else None,
                   forward_prefetch=cfg.forward_prefetch, limit_all_gathers=cfg.limit_all_gathers,
                   device_id=device if device.type == "cpu" else device.index)
    if cfg.checkpoint_policy == "full":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

        apply_activation_checkpointing(wrapped, check_fn=lambda m: isinstance(m, Block))
    return wrapped


def parallelize(model, cfg, device):
    """``model`` (single-device, already on ``device``) wrapped for ``cfg``: checkpointing, DDP / FSDP2 /
    FSDP1, compile — see the module docstring. Taught in chapter 19 (DDP) and chapter 20 (FSDP)."""
    import torch

    n, _ = world()
    if cfg.ep > 1:                    # chapter 26: experts split over ep, DDP over the rest
        from labkit.train.expert_parallel import parallelize_ep

        return parallelize_ep(model, cfg, device, n)
    if cfg.tp * cfg.pp > 1:
        return _model_parallel(model, cfg, device, n)
    if getattr(cfg, "cp", 1) > 1:        # chapter 26: ring attention over cp; DDP/FSDP2 below reduce over dp·cp
        from labkit.train.context_parallel import apply_context_parallel, cp_group

        apply_context_parallel(model, cp_group(mesh_shape(cfg, n), device), balanced=cfg.cp_balanced)
    if cfg.checkpoint_policy != "none" and cfg.parallel != "fsdp1":
        _checkpoint_blocks(model, cfg.checkpoint_policy)
    if cfg.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device] if device.type == "cuda" else None, bucket_cap_mb=cfg.bucket_cap_mb,
                    gradient_as_bucket_view=cfg.gradient_as_bucket_view, static_graph=cfg.static_graph)
        if cfg.comm_hook:
            model.labkit_comm_hook_state = comm_hook(model, cfg, device)   # PowerSGD's counters, read by the loop
        if cfg.inter_node_gbit_s:                     # chapter 29: a slow link between "nodes"
            from labkit.train.slow_link import install

            install(model, cfg)
        if cfg.straggler_by == "link":                # chapter 9: one rank's slow link (sized after calibration)
            from labkit.train.slow_link import install_straggler

            install_straggler(model)
    elif cfg.parallel == "fsdp":
        model = _fsdp2(model, cfg, device, n)
    elif cfg.parallel == "fsdp1":
        model = _fsdp1(model, cfg, device)
    if cfg.compile:
        model = torch.compile(model)
    return model


def sync_context(model, cfg, last: bool):
    """Skip gradient synchronisation on all but the last micro-batch of an accumulation (``cfg.no_sync``;
    DDP/FSDP1 ``no_sync()``, FSDP2 ``set_requires_gradient_sync``); with FSDP2 and
    ``cfg.reshard_after_backward=False`` keep the parameters gathered until the last (chapter 15)."""
    inner = getattr(model, "_orig_mod", model)
    skip = cfg.no_sync and not last
    if cfg.parallel in ("ddp", "fsdp1") and skip:
        return inner.no_sync()
    if cfg.parallel == "fsdp":
        inner.set_requires_gradient_sync(not skip)
        if not cfg.reshard_after_backward:
            inner.set_reshard_after_backward(last)
    return contextlib.nullcontext()

"""TrainConfig's checks for the options of chapters 17 (fusion), 22 (the data pipeline), 24 (tensor and
pipeline parallelism) and 25 (adaptive accumulation): each takes the config and its ``bad(name, valid)``
reporter, so every error names the field, its value and what is valid. Split from ``config.py`` (one file
a learner reads in one sitting); ``TrainConfig.__post_init__`` calls them."""
from __future__ import annotations

from labkit import checks

DATASETS = ("memmap", "on_the_fly")                                        # chapter 22
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")   # torch.distributed.pipelining schedules (chapter 24)
OPTIMIZER_IMPLS = ("auto", "for-loop", "foreach", "fused")   # AdamW implementations (chapter 17)
LR_RULES = ("sqrt", "linear", "none")             # accum="adaptive": how the lr follows accumulation (chapter 25)


def check_model_parallel(cfg, bad) -> None:
    """Chapter 24's knobs (tp · pp · dp = the world size is checked where the world is known:
    labkit.train.parallel.mesh_shape)."""
    for name in ("tp", "pp", "virtual_stages"):
        checks.count(f"TrainConfig.{name}", getattr(cfg, name))
    checks.flag("TrainConfig.sequence_parallel", cfg.sequence_parallel)
    checks.flag("TrainConfig.vocab_parallel", cfg.vocab_parallel)
    if cfg.pp_schedule not in PP_SCHEDULES:
        bad("pp_schedule", f"choose one of {PP_SCHEDULES}")
    m = cfg.model_config
    if cfg.tp > 1 and (m.n_heads % cfg.tp or m.ff % cfg.tp):
        bad("tp", f"n_heads={m.n_heads} and d_ff={m.ff} of model {cfg.model!r} must both be divisible by tp "
            "(each rank holds whole heads and an equal slice of the MLP)")
    if cfg.tp > 1 and cfg.vocab_parallel and m.vocab_size % cfg.tp:
        bad("vocab_parallel", f"the vocabulary-parallel head needs vocab_size={m.vocab_size} of model {cfg.model!r} "
            f"divisible by tp={cfg.tp} (pad the vocabulary, as Megatron does, or vocab_parallel=False)")
    if cfg.sequence_parallel and cfg.tp == 1:
        bad("sequence_parallel", "sequence parallelism splits the activations of tensor-parallel ranks: it needs tp ≥ 2")
    if cfg.sequence_parallel and cfg.pp > 1:
        bad("sequence_parallel", "sequence parallelism with pp > 1 is not supported here: use tp alone")
    if cfg.sequence_parallel and m.seq_len % cfg.tp:
        bad("sequence_parallel", f"seq_len={m.seq_len} must be divisible by tp={cfg.tp}")
    v = cfg.virtual_stages
    if cfg.pp_schedule == "interleaved1f1b" and cfg.pp > 1 and v < 2:
        bad("virtual_stages", "pp_schedule='interleaved1f1b' needs virtual_stages ≥ 2 (with 1 it is 1F1B)")
    if v > 1 and (cfg.pp == 1 or cfg.pp_schedule != "interleaved1f1b"):
        bad("virtual_stages", "virtual stages need pp ≥ 2 and pp_schedule='interleaved1f1b'")
    if cfg.pp * v > m.n_layers:
        bad("pp", f"pp={cfg.pp} × virtual_stages={v} stages need at least as many blocks; model {cfg.model!r} "
            f"has n_layers={m.n_layers}")
    if cfg.pp > 1 and cfg.pp_schedule != "gpipe" and cfg.accum < cfg.pp:
        bad("accum", f"{cfg.pp_schedule} needs at least pp={cfg.pp} micro-batches (accum ≥ pp), else stages idle "
            "for the whole step")
    if cfg.pp > 1 and cfg.pp_schedule == "interleaved1f1b" and cfg.accum % max(1, cfg.accum // cfg.pp):
        bad("accum", f"interleaved1f1b runs rounds of accum // pp micro-batches: accum={cfg.accum} must be a "
            f"multiple of {cfg.accum // cfg.pp} (e.g. a multiple of pp={cfg.pp})")
    from labkit.train.context_parallel import check_config

    check_config(cfg, bad)                                  # chapter 26's cp, cp_balanced
    if cfg.tp * cfg.pp > 1:
        rules = {"compile": cfg.compile, "cpu_offload": cfg.cpu_offload, "grad_stats": cfg.grad_stats,
                 "comm_hook": cfg.comm_hook is not None, "inject": cfg.inject != "none",
                 "parallel": cfg.parallel == "fsdp1"}
        for name, used in rules.items():
            if used:
                bad(name, f"not supported with tp={cfg.tp}, pp={cfg.pp} in labkit (tensor/pipeline parallelism "
                    "composes with parallel='single', 'ddp' or 'fsdp', eager, without injections)")
        if cfg.scaling != "off":
            bad("loss_scale", "loss scaling is not supported with tp/pp > 1 here: use fp32 or bf16")


def check_moe(cfg, bad) -> None:
    """Chapter 26's knobs: experts, top-k, the balance loss and ep (ep dividing the dp ranks is checked where
    the world is known: labkit.train.expert_parallel.ep_mesh)."""
    checks.count("TrainConfig.moe_experts", cfg.moe_experts, at_least=0)
    checks.count("TrainConfig.moe_top_k", cfg.moe_top_k)
    checks.nonneg("TrainConfig.moe_aux_loss", cfg.moe_aux_loss)
    checks.count("TrainConfig.ep", cfg.ep)
    E = cfg.moe_experts
    if E == 1:
        bad("moe_experts", "use 0 (dense MLPs) or ≥ 2 experts")
    if E and cfg.moe_top_k > E:
        bad("moe_top_k", f"each token picks moe_top_k distinct experts: it must be ≤ moe_experts={E}")
    if not E and (cfg.moe_aux_loss or cfg.ep > 1):
        bad("moe_aux_loss" if cfg.moe_aux_loss else "ep", "it applies to a mixture of experts: set moe_experts ≥ 2")
    if cfg.ep > 1 and E % cfg.ep:
        bad("ep", f"moe_experts={E} must be divisible by ep (each rank holds moe_experts/ep experts)")
    if not E:
        return
    rules = {"tp": cfg.tp > 1, "pp": cfg.pp > 1, "checkpoint": bool(cfg.checkpoint), "compile": cfg.compile,
             "cuda_graphs": cfg.cuda_graphs, "inject": cfg.inject != "none"}
    if cfg.ep > 1:
        rules.update(parallel=cfg.parallel != "ddp", val_every=cfg.val_every > 0,
                     max_grad_norm=cfg.max_grad_norm is not None, checkpoint_every=cfg.checkpoint_every > 0,
                     resume_from=cfg.resume_from is not None, loss_scale=cfg.scaling != "off",
                     comm_hook=cfg.comm_hook is not None)
    for name, used in rules.items():
        if used:
            bad(name, f"not supported with moe_experts={E}, ep={cfg.ep} in labkit (a MoE runs with tp = pp = 1, "
                "without recomputation, compile, CUDA graphs or injections; ep > 1 with parallel='ddp', no "
                "held-out evaluation, clipping, checkpoints, loss scaling or comm hook)")


def check_adaptive(cfg, bad) -> None:
    """Chapter 25's knobs: ``accum`` an int or "adaptive"; the controller's knobs with "adaptive" only."""
    if cfg.accum != "adaptive":
        checks.count("TrainConfig.accum", cfg.accum)
    for name in ("accum_window", "accum_cap", "accum_hysteresis", "val_sequences", "val_patience"):
        checks.count(f"TrainConfig.{name}", getattr(cfg, name))
    checks.count("TrainConfig.accum_start", cfg.accum_start, at_most=cfg.accum_cap)
    checks.one_of("TrainConfig.accum_lr_rule", cfg.accum_lr_rule, LR_RULES)
    if cfg.accum != "adaptive":
        for name, default in (("accum_start", 1), ("accum_window", 10), ("accum_cap", 8),
                              ("accum_hysteresis", 2), ("accum_lr_rule", "sqrt")):
            if getattr(cfg, name) != default:
                bad(name, "the controller's knobs apply to accum='adaptive' only")
    elif cfg.pp != 1:
        bad("accum", "accum='adaptive' is not offered with pipeline parallelism (pp > 1): the schedule fixes "
            "its micro-batches when it is built")
    elif cfg.inject in ("data", "compute", "memory") or cfg.memory_budget_mb is not None:
        bad("inject", "accum='adaptive' runs with inject 'none', 'comm', 'host' or 'straggler' (the data, "
            "compute and memory injections and a memory budget resize the accumulation themselves)")
    checks.count("TrainConfig.val_every", cfg.val_every, at_least=0)
    if cfg.train_sequences is not None:
        checks.count("TrainConfig.train_sequences", cfg.train_sequences, at_least=cfg.micro_batch)
    if cfg.max_grad_norm is not None:
        checks.positive("TrainConfig.max_grad_norm", cfg.max_grad_norm)
    if cfg.swa_start is not None:
        checks.count("TrainConfig.swa_start", cfg.swa_start, at_least=0, at_most=cfg.steps - 1)
        if cfg.parallel not in ("single", "ddp"):
            bad("swa_start", "the weight average keeps whole parameters: parallel 'single' or 'ddp'")
        if not cfg.val_every:
            bad("swa_start", "the weight average is only evaluated on the held-out split: set val_every ≥ 1")
    if cfg.inject_steps is not None:
        ok = (isinstance(cfg.inject_steps, (tuple, list)) and len(cfg.inject_steps) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) for v in cfg.inject_steps)
              and 0 <= cfg.inject_steps[0] < cfg.inject_steps[1] <= cfg.steps)
        if not ok:
            bad("inject_steps", f"give (a, b) with 0 ≤ a < b ≤ steps={cfg.steps} (the injection is on "
                "for steps a ≤ i < b), or None")
        if cfg.inject not in ("comm", "host", "straggler"):
            bad("inject_steps", "switching by step applies to inject 'comm', 'host' or 'straggler'")
        object.__setattr__(cfg, "inject_steps", tuple(cfg.inject_steps))


def check_data(cfg, bad) -> None:
    """Chapter 22's loader options: the worker-only knobs need workers; padding needs document ends."""
    if cfg.prefetch_factor is not None:
        checks.count("TrainConfig.prefetch_factor", cfg.prefetch_factor)
        if cfg.num_workers == 0:
            bad("prefetch_factor", "it counts batches per worker: it needs num_workers > 0 (or None)")
    for name in ("persistent_workers", "pin_memory"):
        if getattr(cfg, name) is not None:
            checks.flag(f"TrainConfig.{name}", getattr(cfg, name))
    if cfg.persistent_workers and cfg.num_workers == 0:
        bad("persistent_workers", "True keeps worker processes alive: it needs num_workers > 0 (or None)")
    if cfg.dataset not in DATASETS:
        bad("dataset", f"choose one of {DATASETS}")
    checks.flag("TrainConfig.packing", cfg.packing)
    if not cfg.packing and cfg.dataset != "memmap":
        bad("packing", "packing=False pads one document per row from the token file: it needs dataset='memmap'")


def check_fusion(cfg, bad) -> None:
    """Chapter 17's options: the AdamW implementation and CUDA graphs (whose capture needs static shapes,
    one device and no recomputation inside the graph; the device itself is checked when the run starts)."""
    if cfg.optimizer_impl not in OPTIMIZER_IMPLS:
        bad("optimizer_impl", f"choose one of {OPTIMIZER_IMPLS}")
    checks.flag("TrainConfig.cuda_graphs", cfg.cuda_graphs)
    if not cfg.cuda_graphs:
        return
    if cfg.tp * cfg.pp > 1:
        bad("cuda_graphs", f"CUDA graphs apply to one device's whole model here, not to tp={cfg.tp} × "
            f"pp={cfg.pp} shards; use tp=pp=1")
    if cfg.parallel != "single":
        bad("cuda_graphs", "CUDA graphs apply to parallel='single' only here (graphing under DDP/FSDP needs "
            "their collectives captured too)")
    if cfg.compile:
        bad("cuda_graphs", "choose one: compile=True with CUDA graphs is torch.compile(mode='reduce-overhead'), "
            "which labkit does not configure; use cuda_graphs=True alone or compile=True alone")
    if cfg.checkpoint or cfg.inject == "memory":
        bad("cuda_graphs", "activation checkpointing (checkpoint=True, inject='memory') re-runs forward inside "
            "backward, which a captured graph does not allow here")
    if cfg.device == "cpu":
        bad("cuda_graphs", "CUDA graphs need a CUDA device; device='cpu' has none")

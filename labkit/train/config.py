"""``TrainConfig``: everything that defines a training run, frozen and validated.

One config for every run labkit makes — the chapters' baselines, ``labkit run``, the tuning sweeps,
the memory measurements and the injected bottlenecks of ``labkit diagnose --inject``:

- **batch**: ``micro_batch`` sequences per rank per micro-batch × ``accum`` micro-batches per step ×
  ranks = the global batch, in sequences of ``seq_len`` tokens (chapter 15);
- **parallelism** (applied from outside the model by :mod:`labkit.train.parallel`): ``"single"``,
  ``"ddp"`` (``bucket_cap_mb``, None = torch's default with its 1 MiB first bucket; ``gradient_as_bucket_view``,
  ``static_graph`` — chapter 19; ``comm_hook`` = ``"fp16"`` / ``"bf16"`` compression or ``"powersgd"`` with
  ``powersgd_rank`` and ``powersgd_start_iter``, chapter 23), ``"fsdp"`` = FSDP2 ``fully_shard`` (``reshard_after_forward`` True /
  False / None = torch's default / an int, explicit ``prefetch`` depth and ``prefetch_mode``, ``mp_policy``,
  ``cpu_offload``, ``fsdp_wrap`` granularity — chapter 20), ``"fsdp1"`` = ``FullyShardedDataParallel``
  (``sharding_strategy``, ``limit_all_gathers``, ``backward_prefetch``, ``forward_prefetch``,
  ``mp_policy``); ``checkpoint`` (activation recomputation: False/True or a policy — every k-th block,
  the attention core only; chapter 21), ``compile``;
- **tensor and pipeline parallelism** (chapter 24; :mod:`labkit.train.tensor_parallel`,
  :mod:`labkit.train.pipeline`): ``tp`` ranks split each block Megatron-style (``sequence_parallel`` splits
  the activations between them along the sequence), ``pp`` pipeline stages run by ``pp_schedule``
  (``"gpipe"``, ``"1f1b"``, ``"interleaved1f1b"`` with ``virtual_stages`` chunks per rank) whose
  micro-batches are the ``accum`` micro-batches; ``parallel`` then applies over the remaining
  dp = ranks / (tp·pp) ("single" when dp = 1);
- **context parallelism** (chapter 26; :mod:`labkit.train.context_parallel`): ``cp`` ranks share each
  sequence, attention by a ring over them (``cp_balanced``: causal load balancing); dp = ranks / (tp·pp·cp);
- **mixture of experts** (chapter 26; :mod:`labkit.model.moe`, :mod:`labkit.train.expert_parallel`): ``moe_experts``
  top-k (``moe_top_k``) routed MLPs per block, ``moe_aux_loss`` the weight of Switch's balance loss, ``ep``
  expert-parallel ranks sharing the dp ranks (parallel="ddp", tp = pp = 1);
- **fusion and launch overhead** (chapter 17): ``optimizer_impl`` = ``"auto"`` (torch's choice),
  ``"for-loop"`` (one set of ops per parameter tensor), ``"foreach"`` (horizontally fused ``_foreach_*``
  ops over all tensors) or ``"fused"`` (one fused AdamW kernel), built by :mod:`labkit.train.optim`;
  ``cuda_graphs`` (the model's forward and backward captured once as CUDA graphs and replayed —
  ``torch.cuda.make_graphed_callables``, :mod:`labkit.train.graphs`; CUDA only, ``parallel="single"``);
- **precision** (chapter 18): ``dtype`` = ``"fp32"``, ``"bf16"`` or ``"fp16"`` autocast; ``loss_scale``
  (``"auto"`` = dynamic under fp16, ``"dynamic"`` = ``torch.amp.GradScaler`` from ``scale_init`` growing
  after ``scale_growth_interval`` clean steps, a number = a static scale, ``"off"``); ``grad_stats`` (per-layer
  gradient statistics each step, :func:`labkit.train.precision.grad_stats`). fp16 runs at ≈ 1 GFLOP/s on CPUs
  without native fp16 matmuls: allowed for the numerics, never for speed;
- **accumulation under data parallelism** (chapter 15): ``no_sync`` (default True) synchronises gradients
  on the last of the ``accum`` micro-batches only — DDP and FSDP1 ``no_sync()``, FSDP2
  ``set_requires_gradient_sync`` — and False on every micro-batch (``accum`` syncs per step);
  ``reshard_after_backward=False`` (FSDP2) keeps the all-gathered parameters between the micro-batches
  of a step (``set_reshard_after_backward``), resharding after the last, so they are not re-gathered
  per micro-batch (with ``reshard_after_forward=False``: once per step) — more memory, fewer all-gathers;
- **injected bottlenecks** (chapters 2, 9, 14; sized by :mod:`labkit.train.inject`): ``inject`` =
  ``"data"`` (the loader sleeps per sample), ``"comm"`` (an extra padded all-reduce per step — an
  oversized bucket), ``"compute"`` (micro-batches of one sequence, accumulated to the same tokens),
  ``"memory"`` (an activation budget that forces a smaller micro-batch and recomputation), ``"host"``
  (every rank's training thread blocks outside any op once per step, as a hidden host sync would) and
  ``"straggler"`` (the same block on one rank only, ``straggler_rank``, so the others wait for it at the
  collectives; ``straggler_by="compute"`` spends it in matrix multiplies instead, ``"data"`` in that rank's
  loader, ``"link"`` on that rank's link: its DDP gradient buckets are held back, on its communication thread,
  by a ring all-reduce's bandwidth term over a link sized to add the same time, :mod:`labkit.train.slow_link`),
  ``"work"`` (every rank multiplies ``work_matmuls`` 128×128 matrices per step: a code regression of
  known size, lab 11); ``inject_share`` is the share of a clean step the data/comm/host/straggler/work
  injection adds unless ``data_slowdown_s``/``comm_pad_mb``/``host_stall_s``/``work_matmuls`` fix it;
- **the data pipeline** (chapter 22): ``num_workers``, ``prefetch_factor``, ``persistent_workers``,
  ``pin_memory`` (the DataLoader's), ``dataset`` = ``"memmap"`` (the pre-tokenised token file) or
  ``"on_the_fly"`` (tokenised per sample), ``packing`` (False: one padded document per row);
- **adaptive accumulation** (chapter 25, :mod:`labkit.train.adaptive`): ``accum="adaptive"`` and the ``accum_*``
  knobs; ``val_every``/``val_sequences``/``val_patience`` (held-out split and guard), ``swa_start``,
  ``train_sequences``, ``inject_steps=(a, b)`` (an injection on for steps a ≤ i < b), ``max_grad_norm``;
- **measurement**: ``warmup_steps`` (excluded from timing), ``profile_dir`` (one Chrome trace per
  rank; ``profile_steps`` = how many of the last steps to record), ``peak_flops`` (per device; None →
  :func:`labkit.hardware.resolve_peak`).

Taught in chapter 14 (the baseline record) and chapter 15 (micro-batch, accumulation, recomputation).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit import checks
from labkit.train import option_checks as config_checks
from labkit.train.option_checks import DATASETS, LR_RULES, OPTIMIZER_IMPLS, PP_SCHEDULES  # noqa: F401

PARALLEL = ("single", "ddp", "fsdp", "fsdp1")
DTYPES = ("fp32", "bf16", "fp16")
COMM_HOOKS = (None, "fp16", "bf16", "powersgd")                            # DDP communication hooks
LOSS_SCALES = ("auto", "dynamic", "off")                                  # or a number: a static scale
INJECTIONS = ("none", "data", "compute", "comm", "memory", "host", "straggler", "work")
#: what slows the straggler rank (chapter 9's critical path): a block outside any op, extra compute in ops,
#: a slow loader, or a slow link (its gradient buckets held back in its collectives) on that rank only
STRAGGLER_KINDS = ("host", "compute", "data", "link")
SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")     # FSDP1
BACKWARD_PREFETCH = (None, "BACKWARD_PRE", "BACKWARD_POST")                # FSDP1
FSDP_WRAP = ("block", "model")                   # FSDP units: one per transformer block + root, or the root only
PREFETCH_MODES = ("both", "forward", "backward")  # FSDP2 explicit prefetch: which passes


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (see the module docstring). Taught in chapter 14."""

    model: str = "tiny"
    seq_len: int | None = None          # None → the model size's seq_len
    micro_batch: int = 8                # sequences per rank per micro-batch
    accum: int | str = 1                # micro-batches per optimizer step, or "adaptive" (chapter 25)
    steps: int = 20                     # optimizer steps, warm-up included
    warmup_steps: int = 3               # excluded from the timing statistics (not from the loss curve)
    dtype: str = "fp32"                 # "fp32" | "bf16" | "fp16" (autocast; fp16/bf16 may be emulated on CPU)
    # --- mixed precision (chapter 18): loss scaling and the gradient monitor
    loss_scale: str | float = "auto"    # "auto" (dynamic under fp16, off otherwise) | "dynamic" | "off" | S
    scale_init: float = 65536.0         # dynamic: the first scale (2**16, GradScaler's and the source's)
    scale_growth_interval: int = 2000   # dynamic: clean steps in a row before the scale doubles
    grad_stats: bool = False            # per-layer gradient statistics every step (labkit.train.precision)
    parallel: str = "single"            # "single" | "ddp" | "fsdp" (FSDP2) | "fsdp1"
    bucket_cap_mb: float | None = 25.0  # DDP: MiB per bucket (every bucket); None = torch's default: 25, first 1
    gradient_as_bucket_view: bool = False  # DDP: .grad are views into the buckets (no second gradient copy)
    static_graph: bool = False          # DDP: the graph is the same every step (torch's static_graph=True)
    comm_hook: str | None = None        # DDP: None | "fp16" | "bf16" (CUDA + NCCL only) | "powersgd"
    powersgd_rank: int = 1              # DDP PowerSGD: matrix approximation rank
    powersgd_start_iter: int = 2        # DDP PowerSGD: plain all-reduce before this iteration (torch needs > 1)
    reshard_after_forward: bool | int | None = True  # FSDP2: True | False | None (torch's default) | int
    prefetch: int = 0                   # FSDP2 explicit prefetch depth (0 = implicit only)
    mp_policy: str | None = None        # FSDP2/FSDP1: None | "bf16" (bf16 params, fp32 reduction)
    sharding_strategy: str = "FULL_SHARD"             # FSDP1
    limit_all_gathers: bool = True                    # FSDP1
    backward_prefetch: str | None = "BACKWARD_PRE"    # FSDP1
    forward_prefetch: bool = False                    # FSDP1
    # -- FSDP2 knobs of chapter 20 (fully_shard) --
    cpu_offload: bool = False           # CPUOffloadPolicy: shards, grads, optimizer step on the host
    fsdp_wrap: str = "block"            # "block" (a unit per block + root) | "model" (one unit) — also FSDP1
    prefetch_mode: str = "both"         # with prefetch ≥ 1: "both" | "forward" | "backward"
    checkpoint: bool | str = False      # False/"none" | True/"full" | "every:k" | "attention" (chapter 21)
    compile: bool = False               # torch.compile
    # -- fusion and launch overhead (chapter 17) --
    optimizer_impl: str = "auto"        # AdamW: "auto" (torch's choice) | "for-loop" | "foreach" | "fused"
    cuda_graphs: bool = False           # forward + backward captured as CUDA graphs and replayed (CUDA only)
    attention: str = "sdpa"             # labkit.kernels.attention: sdpa, naive, or a forced backend (flash, math, ...)
    lr: float = 3e-4
    seed: int = 0
    num_workers: int = 0
    data_slowdown_s: float = 0.0        # sleep per sample in the loader (labkit.data.SlowDataset)
    # -- the data pipeline (chapter 22) --
    prefetch_factor: int | None = None  # batches each worker keeps ready (None → torch's 2); needs num_workers > 0
    persistent_workers: bool | None = None  # keep workers across epochs (None → True when num_workers > 0)
    pin_memory: bool | None = None      # page-locked batches (None → on CUDA only; True on CPU: torch warns, no-op)
    dataset: str = "memmap"             # "memmap" (pre-tokenised token file) | "on_the_fly" (tokenise per sample)
    packing: bool = True                # False: one document per row, padded (memmap only; labkit.data.PaddedDataset)
    inject: str = "none"                # one of INJECTIONS (labkit.train.inject)
    inject_share: float = 0.4           # share of a clean step the data/comm/host/straggler injection adds
    comm_pad_mb: float = 0.0            # extra all-reduce payload per step (inject="comm"; 0 → sized)
    memory_budget_mb: float | None = None  # activation budget (inject="memory"; None → half a sample's)
    host_stall_s: float = 0.0           # per-step block outside any op (inject="host"/"straggler"; 0 → sized)
    straggler_rank: int | None = None   # the slow rank of inject="straggler" (None → the last rank)
    straggler_by: str = "host"          # what makes it slow: one of STRAGGLER_KINDS (labkit.train.inject)
    work_matmuls: int = 0               # inject="work": 128×128 multiplies per step (0 → sized from inject_share)
    profile_dir: str | None = None      # torch.profiler chrome traces, one file per rank
    profile_steps: int | None = None    # record the last N steps (None → up to 3 after 2 skipped)
    device: str = "auto"
    peak_flops: float | None = None     # per device; None → labkit.hardware.resolve_peak
    label: str = "train"
    # gradient accumulation under data parallelism (chapter 15)
    no_sync: bool = True                # sync gradients on the last micro-batch only; False: on every one
    reshard_after_backward: bool = True  # FSDP2: False keeps parameters gathered between micro-batches
    # tensor and pipeline parallelism (chapter 24): mesh (pp, dp, cp, tp), dp = ranks / (tp·pp)
    tp: int = 1                         # tensor-parallel ranks per block (Megatron column/row split)
    pp: int = 1                         # pipeline stages (ranks), micro-batches = accum
    pp_schedule: str = "1f1b"           # one of PP_SCHEDULES
    virtual_stages: int = 1             # model chunks per pipeline rank (interleaved1f1b: ≥ 2)
    sequence_parallel: bool = False     # with tp > 1: activations between TP regions split along the sequence
    vocab_parallel: bool = True         # with tp > 1: the tied embedding/head and the loss split over the vocabulary
    # context parallelism (chapter 26, labkit.train.context_parallel): each sequence split over cp ranks
    cp: int = 1                         # ranks sharing one sequence; attention by a ring (labkit.train.ring_attention)
    cp_balanced: bool = True            # rank r holds chunks r and 2cp−1−r (causal load balancing)
    # mixture of experts and expert parallelism (chapter 26; labkit.model.moe, labkit.train.expert_parallel)
    moe_experts: int = 0                # 0 = dense MLPs; ≥ 2 = every block's MLP a top-k mixture of that many
    moe_top_k: int = 2                  # experts per token
    moe_aux_loss: float = 0.0           # weight of the Switch load-balancing loss (0 = off)
    ep: int = 1                         # expert-parallel ranks (share the dp ranks; experts split evenly)
    # adaptive accumulation and its safeguards (chapter 25, labkit.train.adaptive)
    accum_start: int = 1                # accum="adaptive": the first steps' accumulation
    accum_window: int = 10              # steps whose comm/compute ratios are averaged (the source's 10)
    accum_cap: int = 8                  # the largest accumulation (the source's 8)
    accum_hysteresis: int = 2           # change only when the wanted value moves by at least this (source: 2)
    accum_lr_rule: str = "sqrt"         # lr × √(k/start) (AdamW) | "linear" (SGD, Goyal) | "none"
    inject_steps: tuple | None = None   # (a, b): the injection is on for steps a ≤ i < b only; None = always
    val_every: int = 0                  # evaluate the held-out split every N steps (0 = never)
    val_sequences: int = 32             # held-out windows (the corpus' last ones, never trained on)
    train_sequences: int | None = None  # train on the corpus' first N windows only (a small set to overfit)
    val_patience: int = 3               # accum="adaptive": lower accumulation after this many rising val losses
    swa_start: int | None = None        # average the weights from this step on (SWA); needs val_every
    max_grad_norm: float | None = None  # clip the global gradient norm once per step, after the last
                                        # micro-batch and after unscaling (None = no clipping)
    # fault tolerance (chapter 27, labkit.train.checkpoint): DCP saves every N steps, resume, an injected failure
    checkpoint_every: int = 0           # save model + optimizer + step every N optimizer steps (0 = never)
    checkpoint_dir: str | None = None   # where step_NNNNNNN/ checkpoints, progress.json and fault markers go
    checkpoint_mode: str = "sync"       # "sync" (dcp.save) | "async" (dcp.async_save: stage, write in background)
    resume_from: str | None = None      # a checkpoint directory, or "latest" under checkpoint_dir
    fail_at_step: int | None = None     # rank fail_rank os._exit's at the start of this step, once (marker file)
    fail_rank: int = 0
    # a slow link between "nodes" of consecutive ranks (chapter 29, labkit.train.slow_link): DDP buckets whose
    # group spans nodes wait for a flat ring all-reduce of their bytes over inter_node_gbit_s
    ranks_per_node: int | None = None   # ranks per "node" (None = no slow link)
    inter_node_gbit_s: float | None = None  # the link between "nodes", Gb/s
    link_overlap: bool = False          # the link's delay in the comm thread, overlapping backward (lab 12);
                                        # False: it blocks backward before each bucket's all-reduce

    def __post_init__(self):
        from labkit.model.config import ATTENTIONS, SIZES

        def bad(name, valid):
            raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r} is not valid; {valid}")

        if self.model not in SIZES:
            bad("model", f"choose one of {sorted(SIZES)}")
        for name in ("micro_batch", "steps"):
            checks.count(f"TrainConfig.{name}", getattr(self, name))
        config_checks.check_adaptive(self, bad)
        checks.count("TrainConfig.warmup_steps", self.warmup_steps, at_least=0, at_most=self.steps - 1)
        if self.seq_len is not None:
            checks.count("TrainConfig.seq_len", self.seq_len, at_most=SIZES[self.model].seq_len)
        if self.dtype not in DTYPES:
            bad("dtype", f"choose one of {DTYPES}")
        self._check_precision(bad)
        if self.parallel not in PARALLEL:
            bad("parallel", f"choose one of {PARALLEL}")
        if self.mp_policy not in (None, "bf16"):
            bad("mp_policy", "choose None or 'bf16'")
        if self.mp_policy and self.parallel not in ("fsdp", "fsdp1"):
            bad("mp_policy", "a mixed-precision policy applies to parallel='fsdp' or 'fsdp1' only")
        if self.comm_hook not in COMM_HOOKS:
            bad("comm_hook", f"choose one of {COMM_HOOKS}")
        if self.comm_hook and self.parallel != "ddp":
            bad("comm_hook", "a communication hook applies to parallel='ddp' only (FSDP has mp_policy's reduce dtype)")
        checks.count("TrainConfig.powersgd_rank", self.powersgd_rank)
        checks.count("TrainConfig.powersgd_start_iter", self.powersgd_start_iter, at_least=2)
        if self.sharding_strategy not in SHARDING:
            bad("sharding_strategy", f"choose one of {SHARDING}")
        if self.backward_prefetch not in BACKWARD_PREFETCH:
            bad("backward_prefetch", f"choose one of {BACKWARD_PREFETCH}")
        if self.attention not in ATTENTIONS:
            bad("attention", f"choose one of {ATTENTIONS}")
        if self.inject not in INJECTIONS:
            bad("inject", f"choose one of {INJECTIONS}")
        self._check_checkpoint(bad)
        for name in ("limit_all_gathers", "forward_prefetch", "compile", "cpu_offload"):
            checks.flag(f"TrainConfig.{name}", getattr(self, name))
        self._check_fsdp2_knobs(bad)
        config_checks.check_fusion(self, bad)
        checks.count("TrainConfig.prefetch", self.prefetch, at_least=0)
        checks.count("TrainConfig.num_workers", self.num_workers, at_least=0)
        self._check_ddp_knobs(bad)
        config_checks.check_data(self, bad)
        checks.positive("TrainConfig.lr", self.lr)
        checks.nonneg("TrainConfig.data_slowdown_s", self.data_slowdown_s)
        checks.nonneg("TrainConfig.comm_pad_mb", self.comm_pad_mb)
        checks.nonneg("TrainConfig.host_stall_s", self.host_stall_s)
        if self.straggler_rank is not None:
            checks.count("TrainConfig.straggler_rank", self.straggler_rank, at_least=0)
        if self.straggler_by not in STRAGGLER_KINDS:
            bad("straggler_by", f"choose one of {STRAGGLER_KINDS}")
        if self.straggler_by != "host" and self.inject != "straggler":
            bad("straggler_by", "it says what slows the straggler: use it with inject='straggler'")
        if self.straggler_by == "link":
            self._check_link_straggler(bad)
        checks.fraction("TrainConfig.inject_share", self.inject_share, open_low=True, open_high=True)
        checks.count("TrainConfig.work_matmuls", self.work_matmuls, at_least=0, at_most=10**7)
        if self.work_matmuls and self.inject != "work":
            bad("work_matmuls", "it sizes the extra work of inject='work': set inject='work' (or leave it 0)")
        if self.memory_budget_mb is not None:
            checks.positive("TrainConfig.memory_budget_mb", self.memory_budget_mb)
        if self.profile_steps is not None:
            checks.count("TrainConfig.profile_steps", self.profile_steps, at_most=self.steps)
        if self.peak_flops is not None:
            checks.positive("TrainConfig.peak_flops", self.peak_flops)
        # gradient accumulation under data parallelism (chapter 15)
        for name in ("no_sync", "reshard_after_backward"):
            checks.flag(f"TrainConfig.{name}", getattr(self, name))
        if not self.reshard_after_backward and self.parallel != "fsdp":
            bad("reshard_after_backward", "False applies to parallel='fsdp' (FSDP2 set_reshard_after_backward) only")
        config_checks.check_moe(self, bad)
        config_checks.check_model_parallel(self, bad)
        from labkit.train.fault_options import validate

        validate(self, bad)
        from labkit.train.slow_link import check_config

        check_config(self, bad)

    def _check_link_straggler(self, bad) -> None:
        """``straggler_by="link"`` is a DDP communication hook on plain data parallelism (chapter 9)."""
        if self.parallel != "ddp" or self.tp * self.pp * self.cp * self.ep > 1:
            bad("straggler_by", "the slow link holds back DDP gradient buckets: use parallel='ddp' without tp/pp/cp/ep")
        if self.comm_hook is not None or self.ranks_per_node is not None:
            bad("straggler_by", "the slow link is itself a DDP communication hook: use it without comm_hook and "
                "without ranks_per_node/inter_node_gbit_s")
        if self.inject_steps is not None:
            bad("straggler_by", "the slow link is on for the whole run: use it without inject_steps")

    def _check_ddp_knobs(self, bad) -> None:
        """Chapter 19's DDP knobs: ``bucket_cap_mb`` (None = torch's default, 25 MiB with a 1 MiB first
        bucket — labkit.comm.buckets.ddp_caps), ``gradient_as_bucket_view``, ``static_graph``."""
        if self.bucket_cap_mb is not None:
            checks.positive("TrainConfig.bucket_cap_mb", self.bucket_cap_mb)
        for name in ("gradient_as_bucket_view", "static_graph"):
            checks.flag(f"TrainConfig.{name}", getattr(self, name))
            if getattr(self, name) and self.parallel != "ddp":
                bad(name, "it is a DistributedDataParallel option: it applies to parallel='ddp' only (FSDP has "
                    "no gradient buckets)")

    @property
    def adaptive(self) -> bool:
        """Whether the controller chooses the accumulation (chapter 25)."""
        return self.accum == "adaptive"

    @property
    def first_accum(self) -> int:
        """The accumulation of the first step: ``accum``, or ``accum_start`` when adaptive (chapter 25)."""
        return self.accum_start if self.adaptive else self.accum

    def _check_precision(self, bad) -> None:
        """fp16 is allowed knowingly: on a CPU without native fp16/bf16 matmuls (no AVX512-FP16/AMX) its
        matmuls run at ≈ 1 GFLOP/s, 100× below fp32 — fine for chapter 18's numerics, not for speed
        (``labkit doctor`` and :func:`labkit.hardware.capability` say which this CPU is)."""
        ls = self.loss_scale
        if isinstance(ls, str):
            if ls not in LOSS_SCALES:
                bad("loss_scale", f"choose one of {LOSS_SCALES} or a positive number (a static scale)")
        else:
            checks.positive("TrainConfig.loss_scale", ls)
        checks.positive("TrainConfig.scale_init", self.scale_init)
        checks.count("TrainConfig.scale_growth_interval", self.scale_growth_interval)
        checks.flag("TrainConfig.grad_stats", self.grad_stats)
        if self.scaling != "off" and self.parallel in ("fsdp", "fsdp1"):
            bad("loss_scale", "loss scaling under FSDP needs a sharded scaler, which labkit does not offer: use "
                "dtype='fp32' with mp_policy='bf16' (bf16 needs no loss scaling), or parallel='ddp'")

    @property
    def scaling(self) -> str:
        """How this run scales its loss: "dynamic" (torch.amp.GradScaler), "static" or "off" (chapter 18)."""
        if self.loss_scale == "auto":
            return "dynamic" if self.dtype == "fp16" else "off"
        return self.loss_scale if isinstance(self.loss_scale, str) else "static"

    def _check_fsdp2_knobs(self, bad) -> None:
        """Chapter 20's FSDP2 knobs (the divisor check of an int reshard needs the world: parallel.py)."""
        raf = self.reshard_after_forward
        if not (raf is None or isinstance(raf, bool) or (isinstance(raf, int) and raf >= 2)):
            bad("reshard_after_forward", "choose True, False, None (torch's default: True except the root) or "
                "an int ≥ 2 dividing the ranks (the group size parameters are resharded to after forward; "
                "1 would mean False)")
        if self.fsdp_wrap not in FSDP_WRAP:
            bad("fsdp_wrap", f"choose one of {FSDP_WRAP}")
        if self.prefetch_mode not in PREFETCH_MODES:
            bad("prefetch_mode", f"choose one of {PREFETCH_MODES}")
        if self.prefetch_mode != "both" and not self.prefetch:
            bad("prefetch_mode", "a prefetch direction needs prefetch ≥ 1 (the number of blocks fetched ahead)")
        if self.cpu_offload and self.parallel != "fsdp":
            bad("cpu_offload", "CPU offload (FSDP2 CPUOffloadPolicy) applies to parallel='fsdp' only")
        if self.fsdp_wrap != "block" and self.parallel not in ("fsdp", "fsdp1"):
            bad("fsdp_wrap", "wrapping granularity applies to parallel='fsdp' or 'fsdp1' only")
        if self.prefetch and self.fsdp_wrap == "model":
            bad("prefetch", "explicit prefetch moves between blocks: it needs fsdp_wrap='block'")

    def _check_checkpoint(self, bad) -> None:
        """Chapter 21's policy: a clear error for a value no policy names (labkit.model.config)."""
        from labkit.model.config import SIZES, checkpoint_policy

        if not isinstance(self.checkpoint, (bool, str)):
            raise ValueError(f"TrainConfig.checkpoint must be True or False, or a policy name ('none', 'full', "
                             f"'attention', 'every:k'), got {type(self.checkpoint).__name__} {self.checkpoint!r}")
        try:
            policy = checkpoint_policy(self.checkpoint, SIZES[self.model].n_layers)
        except ValueError as e:
            bad("checkpoint", str(e).split(": ", 1)[-1])
        if self.parallel == "fsdp1" and policy not in ("none", "full"):
            bad("checkpoint", "FSDP1 (apply_activation_checkpointing) takes True/'full' only here; use parallel="
                "'fsdp' for 'every:k' or 'attention'")

    @property
    def checkpoint_policy(self) -> str:
        """The canonical checkpointing policy: "none", "full", "every:k" or "attention" (chapter 21)."""
        from labkit.model.config import checkpoint_policy

        return checkpoint_policy(self.checkpoint)

    @property
    def recompute(self) -> str:
        """What this run recomputes, as flops/memory models name it: "none", "full", "every:k" or "selective"."""
        from labkit.model.config import recompute_mode

        return recompute_mode(self.checkpoint)

    @property
    def model_config(self):
        """The GPT's :class:`~labkit.model.config.GPTConfig` (checkpointing is applied by the trainer)."""
        from labkit.model.config import gpt_config

        moe = (dict(n_experts=self.moe_experts, top_k=self.moe_top_k, aux_loss_coef=self.moe_aux_loss)
               if self.moe_experts else {})
        return gpt_config(self.model, seq_len=self.seq_len, attention=self.attention, **moe)

    @property
    def compute_dtype(self) -> str:
        """The dtype whose peak the run's MFU divides by: bf16/fp16 under autocast or a bf16 policy."""
        if self.dtype == "fp16":
            return "fp16"
        return "bf16" if (self.dtype == "bf16" or self.mp_policy == "bf16") else "fp32"

    @property
    def memory_strategy(self) -> str:
        """This run's name in :data:`labkit.memory.estimate.STRATEGIES` (what each rank stores)."""
        if self.parallel in ("single", "ddp"):
            return "ddp"
        if self.parallel == "fsdp":   # None and an int reshard too (None keeps the root, an int a group)
            return "fsdp_grad_op" if self.reshard_after_forward is False else "fsdp_full"
        return {"FULL_SHARD": "fsdp_full", "SHARD_GRAD_OP": "fsdp_grad_op", "NO_SHARD": "fsdp_no_shard",
                "HYBRID_SHARD": "fsdp_hybrid"}[self.sharding_strategy]

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

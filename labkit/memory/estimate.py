"""Memory per rank, predicted: model states and activations (the communication buffers are in
:mod:`labkit.memory.buffers`).

Taught in chapter 13 (memory anatomy), chapter 20 (FSDP / ZeRO) and chapter 21 (activation
checkpointing).

**Model states** (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", §3.1 and Figure 1): mixed-precision Adam keeps 2Ψ bytes of fp16/bf16 parameters,
2Ψ of gradients and KΨ of optimizer state (fp32 master copy, momentum, variance: K = 12) — 16Ψ in all.
ZeRO stage 1 (P_os) shards the KΨ over N_d ranks, stage 2 (P_os+g) also the gradients, stage 3
(P_os+g+p) also the parameters::

    DDP     (2 + 2 + K)·Ψ           ZeRO-2  2Ψ + (2 + K)·Ψ/N_d
    ZeRO-1  2Ψ + 2Ψ + K·Ψ/N_d       ZeRO-3  (2 + 2 + K)·Ψ/N_d

Figure 1 (Ψ = 7.5 B, N_d = 64): 120 GB, 31.4 GB, 16.6 GB, 1.9 GB — decimal GB (1e9 bytes), not GiB.
PyTorch FSDP maps onto the same stages: FULL_SHARD (FSDP2 ``reshard_after_forward=True``) = ZeRO-3,
SHARD_GRAD_OP (FSDP2 ``reshard_after_forward=False``) = ZeRO-2 (parameters stay unsharded between
forward and backward), NO_SHARD = DDP, HYBRID_SHARD = ZeRO-3 inside a shard group (a node), replicated
across groups.

Precisions (bytes per parameter: params / grads / optimizer):

- ``"fp32"``: 4 / 4 / 8 (Adam m and v);
- ``"bf16_mixed"``: 2 / 2 / 12 — the paper's accounting (DeepSpeed, Megatron: low-precision params and
  grads, fp32 master + m + v in the optimizer);
- ``"bf16_autocast"``: 4 / 4 / 8 — torch autocast and FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16)``:
  the fp32 parameters *are* the master weights; bf16 copies are transient (counted in buffers).

**Activations** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", §4, eq. 1–2 and Table 2), bytes per layer with 16-bit activations: ``sbh(34 + 5as/h)``
(s sequence, b micro-batch, h hidden, a heads); with tensor parallel t and sequence parallel
``sbh(34/t + 5as/(ht))``; selective recomputation (recompute the attention core) ``34·sbh/t``; full
recomputation keeps only each layer's input, ``2sbh``. The 34 assumes an MLP width of 4h; the general
count is ``sb(18h + 4·d_ff)``. The 5as²b is the materialised score matrix: softmax output 2as²b, its dropout
mask as²b, the dropout output 2as²b (§4.1); a fused kernel (FlashAttention, Dao et al. 2022) stores none of
it, only a·s·b fp32 log-sum-exp values. Naming the ``attention`` implementation that runs switches to an
itemised count of the bytes each saved tensor has (:func:`attention_saved_bytes`; chapter 16).

Units: :func:`fmt_bytes` prints GiB (2^30) or GB (1e9) and says which.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace

from labkit import checks
from labkit.model.recompute_policy import (
    checkpoint_policy,
    checkpointed_blocks,
    recompute_mode,
    recompute_share,
)
from labkit.units import GB, GIB, KB, KIB, MB, MIB

__all__ = ["GiB", "STRATEGIES", "PRECISIONS", "OPTIMIZERS", "fmt_bytes", "canonical_strategy", "MemoryBreakdown",
           "model_state_bytes", "activation_bytes", "attention_saved_bytes", "ATTENTION_STORES",
           "pipeline_in_flight", "stage_activation_bytes"]

GiB = GIB   # the spelling chapter 13 prints

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp_full", "fsdp_grad_op", "fsdp_no_shard", "fsdp_hybrid")
_ALIASES = {"fsdp2": "fsdp_full", "full_shard": "fsdp_full", "shard_grad_op": "fsdp_grad_op",
            "no_shard": "fsdp_no_shard", "hybrid_shard": "fsdp_hybrid", "fsdp": "fsdp_full", "zero0": "ddp",
            "fsdp2_no_reshard": "fsdp_grad_op"}
# which of (params, grads, optimizer) each strategy shards
_SHARDS = {"ddp": (False, False, False), "fsdp_no_shard": (False, False, False),
           "zero1": (False, False, True), "zero2": (False, True, True), "fsdp_grad_op": (False, True, True),
           "zero3": (True, True, True), "fsdp_full": (True, True, True), "fsdp_hybrid": (True, True, True)}
PRECISIONS = {"fp32": (4, 4, 4), "bf16_mixed": (2, 2, 4), "bf16_autocast": (4, 4, 4)}
# optimizer state: number of fp32 tensors per parameter (+ the fp32 master copy in bf16_mixed)
OPTIMIZERS = {"adam": 2, "adamw": 2, "sgd_momentum": 1, "sgd": 0}


def fmt_bytes(n: float, unit: str = "GiB") -> str:
    """``n`` bytes as text in ``unit`` ("GiB", "GB", "MiB", "MB", "KiB", "kB", "B"), naming the unit.

    GB = 1e9 bytes, GiB = 2^30 = 1.074 GB: DeepSpeed's estimators print GiB values labelled "GB".
    Taught in chapter 13 (memory anatomy).
    """
    units = {"GiB": GIB, "GB": GB, "MiB": MIB, "MB": MB, "KiB": KIB, "kB": KB, "B": 1}
    checks.one_of("unit", unit, units)
    n = checks.nonneg("n", n)
    return f"{n / units[unit]:,.2f} {unit}" if unit != "B" else f"{int(n):,} B"


def canonical_strategy(strategy: str) -> str:
    """Normalise a strategy name ("FULL_SHARD", "fsdp2", "zero3" …). Taught in chapter 20."""
    if not isinstance(strategy, str):
        raise checks.ArgumentTypeError(f"strategy must be a str such as 'zero3' or 'FULL_SHARD', "
                                       f"got {type(strategy).__name__} {strategy!r:.60}")
    s = strategy.strip().lower().replace("-", "_")
    s = _ALIASES.get(s, s)
    if s not in _SHARDS:
        raise ValueError(f"strategy={strategy!r} is not valid; choose one of {STRATEGIES} "
                         f"(aliases: {sorted(_ALIASES)})")
    return s


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per rank by category. ``optimizer`` includes the fp32 master copy when there is one.

    Taught in chapter 13 (memory anatomy) and chapter 20.
    """

    params: float
    grads: float
    optimizer: float
    activations: float = 0.0
    buffers: float = 0.0
    n_params: int = 0
    strategy: str = ""
    n_ranks: int = 1
    precision: str = ""
    source: str = "predicted"            # "predicted" or "measured"
    detail: dict = field(default_factory=dict)

    @property
    def model_states(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.model_states + self.activations + self.buffers

    def with_(self, **kw) -> MemoryBreakdown:
        return replace(self, **kw)

    def as_dict(self) -> dict:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "model_states": self.model_states, "activations": self.activations, "buffers": self.buffers,
                "total": self.total}

    def table(self, unit: str = "GiB") -> str:
        head = (f"{self.source} memory per rank — {self.strategy or '?'}, {self.n_ranks} rank(s), "
                f"{self.precision or '?'}, {self.n_params:,} params")
        rows = [f"  {k:<13}{fmt_bytes(v, unit):>16}" for k, v in self.as_dict().items()]
        return "\n".join([head, *rows])


def _numels(n_params, name: str = "n_params") -> list:
    """Parameter element counts from an int, a list of shapes/numels or an nn.Module (deduplicated).

    An int (NumPy ints too) or an integral float (7.5e9) is a count Ψ >= 0; a list holds counts or shapes (tuples of ints >= 0)."""
    if hasattr(n_params, "parameters"):
        seen, out = set(), []
        for p in n_params.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(tuple(p.shape))
        return out
    if isinstance(n_params, (list, tuple)):
        out = []
        for i, item in enumerate(n_params):
            if isinstance(item, (tuple, list)):
                out.append(tuple(checks.count(f"{name}[{i}] dim {j}", d, at_least=0) for j, d in enumerate(item)))
            else:
                out.append(checks.count(f"{name}[{i}]", item, at_least=0))
        return out
    if isinstance(n_params, numbers.Real) and not isinstance(n_params, bool):   # 7.5e9 is a count; 7.5e9+0.5 is not
        return [checks.whole(name, n_params, at_least=0, at_most=2**63 - 1)]
    raise checks.ArgumentTypeError(f"{name} must be an int >= 0 (or an integral float such as 7.5e9), a list of "
                                   f"parameter sizes or an nn.Module, "
                                   f"got {type(n_params).__name__} {n_params!r:.60}")


def _shard_elems(item, n: int, rank: int, exact: bool) -> float:
    """Elements of one parameter held by ``rank`` when sharded over ``n`` ranks.

    A shape (tuple) is sharded on dim 0 with torch.chunk semantics, as FSDP2 does (rank r holds rows
    [r·⌈d0/n⌉, (r+1)·⌈d0/n⌉)); a bare count is divided evenly (ZeRO's Ψ/N_d).
    """
    if isinstance(item, tuple):
        numel = math.prod(item) if item else 1
        if not exact or not item:
            return numel / n if item else (numel if rank == 0 else 0)
        d0, rest = item[0], numel // item[0] if item[0] else 0
        chunk = math.ceil(d0 / n)
        rows = max(0, min(chunk, d0 - rank * chunk))
        return rows * rest
    return item / n


def model_state_bytes(n_params, *, strategy: str = "ddp", n_ranks: int = 1, precision: str = "bf16_mixed",
                      optimizer: str = "adam", shard_size: int | None = None, rank: int = 0) -> MemoryBreakdown:
    """Per-rank bytes of parameters, gradients and optimizer state (ZeRO paper §3.1, Figure 1).

    ``n_params``: a count Ψ, a list of parameter shapes, or an ``nn.Module`` (then FSDP2's dim-0
    sharding of each parameter is reproduced exactly for ``rank``). ``shard_size`` is the shard group of
    ``fsdp_hybrid`` (default: all ranks). Taught in chapter 13 and chapter 20.
    """
    strat = canonical_strategy(strategy)
    checks.one_of("precision", precision, PRECISIONS)
    checks.one_of("optimizer", optimizer, OPTIMIZERS)
    n_ranks = checks.count("n_ranks", n_ranks)
    rank = checks.count("rank", rank, at_least=0, at_most=n_ranks - 1)
    if shard_size is not None:
        shard_size = checks.count("shard_size", shard_size)
    group = n_ranks
    if strat == "fsdp_hybrid":
        group = shard_size or n_ranks
        if n_ranks % group:
            raise ValueError(f"shard_size={group} must divide n_ranks={n_ranks}")
    items = _numels(n_params)
    full = float(sum(math.prod(i) if isinstance(i, tuple) else i for i in items))
    exact = hasattr(n_params, "parameters")
    local = float(sum(_shard_elems(i, group, rank % group, exact) for i in items))
    pb, gb, ob = PRECISIONS[precision]
    n_opt = OPTIMIZERS[optimizer] + (1 if precision == "bf16_mixed" else 0)  # + fp32 master copy
    sp, sg, so = _SHARDS[strat]
    params = (local if sp else full) * pb
    grads = (local if sg else full) * gb
    opt = (local if so else full) * ob * n_opt
    return MemoryBreakdown(params=params, grads=grads, optimizer=opt, n_params=int(full), strategy=strat,
                           n_ranks=n_ranks, precision=precision,
                           detail={"bytes_per_param": (pb, gb, ob * n_opt), "K": ob * n_opt,
                                   "shard_group": group, "optimizer": optimizer})


# what the attention core keeps for backward, by implementation (labkit.kernels.attention's names)
ATTENTION_STORES = {"naive": "scores", "math": "scores", "sdpa": "lse", "flash": "lse", "efficient": "lse",
                    "cudnn": "lse"}


def attention_saved_bytes(attention: str, *, batch: int, heads: int, seq_len: int, head_dim: int = 1,
                          dtype_bytes: int = 2, dropout: bool = False, causal: bool = True,
                          output: bool = False, mask_bytes: int = 1) -> int:
    """Bytes one attention core saves for backward beyond Q, K and V, by implementation.

    Scores materialised ("naive", "math"): the softmax output ``B·a·s²·b`` (B = ``dtype_bytes``), with
    ``dropout`` its mask ``mask_bytes·a·s²·b`` and the dropped copy ``B·a·s²·b`` — Korthikanti et al. 2022's
    5as²b at B = 2 with CUDA's 1-byte masks (PyTorch's CPU dropout keeps a scaled noise tensor of the input's
    dtype instead, aten/src/ATen/native/Dropout.cpp: ``mask_bytes = B`` there); labkit's "naive" also keeps its ``s×s`` boolean causal mask (s² bytes; MATH does not).
    Fused ("sdpa" — a fused kernel wherever one applies — "flash", "efficient", "cudnn"): no s×s tensor;
    the softmax log-sum-exp, ``4·a·s·b`` (fp32; Dao et al. 2022, Algorithm 2), and with ``output`` the
    kernel's output O (``B·b·a·s·d``; in labkit's GPT it is the output projection's input, counted there).
    Not counted: MATH's scaled copies of Q and K (up to ``2·B·b·a·s·d``) where the explicit version's matmuls
    take views (micro-batch 1). On a CPU "sdpa" with dropout runs MATH (the flash kernel has no dropout).
    Taught in chapter 16 (attention kernels).
    """
    checks.one_of("attention", attention, ATTENTION_STORES)
    b, a, s, d = (checks.count(n, x) for n, x in (("batch", batch), ("heads", heads), ("seq_len", seq_len),
                                                  ("head_dim", head_dim)))
    B = checks.count("dtype_bytes", dtype_bytes)
    mb = checks.count("mask_bytes", mask_bytes)
    dropout, causal, output = (checks.flag(n, x) for n, x in (("dropout", dropout), ("causal", causal),
                                                              ("output", output)))
    if ATTENTION_STORES[attention] == "scores":
        n = B * a * s * s * b + ((mb + B) * a * s * s * b if dropout else 0)
        return n + (s * s if attention == "naive" and causal else 0)
    return 4 * a * s * b + (B * b * a * s * d if output else 0)


def activation_bytes(shape, micro_batch: int, *, recompute: str = "none", tp: int = 1,
                     sequence_parallel: bool = False, seq_len: int | None = None, dtype_bytes: int = 2,
                     flash_attention: bool = False, include_head: bool = False, attention: str | None = None,
                     dropout: bool | None = None, mask_bytes: int = 1) -> int:
    """Activation bytes kept for backward, whole model, one micro-batch (Korthikanti et al. 2022 §4).

    ``shape``: anything with ``n_layers, d_model, n_heads, seq_len`` (and optionally ``d_ff``,
    ``vocab_size``) — :class:`labkit.flops.ModelShape` or :class:`labkit.model.gpt.GPTConfig`.
    recompute: "none" → ``sb(18h + 4·d_ff) + 5as²b`` per layer (= sbh(34 + 5as/h) for d_ff = 4h),
    "selective" (or "attention") → drops the 5as²b attention term, "full" → ``2sbh`` (each layer's input
    only), "every:k" → ⌈L/k⌉ layers "full", the others "none" (chapter 21's policies).
    With tp > 1 the sbh terms divide by t only with ``sequence_parallel`` (else 10sbh stay replicated,
    eq. 2). ``flash_attention`` never stores the s×s scores (as selective). ``dtype_bytes`` rescales
    from the paper's 16-bit activations. ``include_head`` adds the output layer 4sbh + 4sbv (§4.3).

    ``attention`` (an implementation of :mod:`labkit.kernels.attention`: "naive", "math", "sdpa", "flash",
    "efficient", "cudnn") counts what that implementation really keeps, itemised per saved tensor at
    B = ``dtype_bytes``: per layer ``sb(8B·h + 2B·d_ff)`` (inputs of both layer norms, of the QKV, output and
    MLP projections, Q/K/V, the GELU's input) + ``2sbh`` dropout masks of ``mask_bytes`` each when ``dropout``
    (1 on CUDA, B on a CPU) + :func:`attention_saved_bytes`; the head's logits enter the loss in fp32 (4sbv),
    and the embedding's dropout mask is counted with the head. ``dropout`` defaults to
    the shape's (a GPTConfig's ``dropout > 0``), else True. At B = 2 with dropout and scores stored this is
    the paper's count. Taught in chapter 13 (memory anatomy), chapter 16 (attention kernels) and chapter 21.
    """
    for name in ("n_layers", "d_model", "n_heads", "seq_len"):
        if not hasattr(shape, name):
            raise checks.ArgumentTypeError(f"shape must have {name} (a labkit.flops.ModelShape or GPTConfig), "
                                           f"got {type(shape).__name__} {shape!r:.60}")
    L, h, a = (checks.count(f"shape.{k}", getattr(shape, k)) for k in ("n_layers", "d_model", "n_heads"))
    recompute_share(recompute, L)            # a clear error for a name no policy has (chapter 21)
    if recompute not in ("none", "selective", "full"):
        recompute = recompute_mode(checkpoint_policy(recompute, L))     # "attention" → "selective", "every:k"
    if recompute.startswith("every:"):      # ⌈L/k⌉ blocks keep only their input, the rest keep everything
        kw = dict(tp=tp, sequence_parallel=sequence_parallel, seq_len=seq_len, dtype_bytes=dtype_bytes,
                  flash_attention=flash_attention, attention=attention, dropout=dropout, mask_bytes=mask_bytes)
        n_ck = len(checkpointed_blocks(recompute, L))
        full = activation_bytes(shape, micro_batch, recompute="full", **kw)
        none = activation_bytes(shape, micro_batch, recompute="none", **kw)
        head = (activation_bytes(shape, micro_batch, recompute="none", include_head=True, **kw) - none
                if checks.flag("include_head", include_head) else 0)
        return int(round(n_ck / L * full + (L - n_ck) / L * none)) + head
    b = checks.count("micro_batch", micro_batch)
    t = checks.count("tp", tp)
    if h % t:
        raise ValueError(f"tp={tp} is not valid: it must divide d_model={h}")
    sequence_parallel = checks.flag("sequence_parallel", sequence_parallel)
    flash_attention = checks.flag("flash_attention", flash_attention)
    include_head = checks.flag("include_head", include_head)
    s = checks.count("shape.seq_len", shape.seq_len) if seq_len is None else checks.count("seq_len", seq_len)
    dtype_bytes = checks.count("dtype_bytes", dtype_bytes)
    d_ff = getattr(shape, "d_ff", None)
    ff = 4 * h if d_ff is None else checks.count("shape.d_ff", d_ff)
    mask_bytes = checks.count("mask_bytes", mask_bytes)
    dropout = None if dropout is None else checks.flag("dropout", dropout)
    if attention is not None:
        checks.one_of("attention", attention, ATTENTION_STORES)
        if flash_attention:
            raise ValueError(f"flash_attention=True and attention={attention!r}: name the attention only")
        if dropout is None:
            dropout = bool(getattr(shape, "dropout", 0.1) > 0)
        return _itemised(L, h, a, ff, s, b, t, sequence_parallel, recompute, dtype_bytes, attention,
                         dropout, include_head, getattr(shape, "vocab_size", None), mask_bytes)
    sbh_terms = 18 * h + 4 * ff            # = 34h when ff = 4h (Korthikanti eq. 1)
    s, b = float(s), float(b)               # float arithmetic: huge sizes overflow to inf, refused below
    if recompute == "full":
        per_layer = 2 * s * b * h / (t if sequence_parallel else 1)
    else:
        if t == 1 or sequence_parallel:
            lin = s * b * sbh_terms / t
        else:                               # eq. 2: 10sbh (layer norms, dropouts, inputs) not split by TP
            lin = s * b * (10 * h + (sbh_terms - 10 * h) / t)
        attn = 0 if (recompute == "selective" or flash_attention) else 5 * a * s * s * b / t
        per_layer = lin + attn
    total = L * per_layer
    if include_head:
        v = getattr(shape, "vocab_size", None)
        v = 0 if v is None else checks.count("shape.vocab_size", v)
        total += 4 * s * b * h / t + 4 * s * b * v / t
    total = checks.finite_result("activation bytes", total * dtype_bytes / 2, micro_batch=micro_batch,
                                 seq_len=seq_len, dtype_bytes=dtype_bytes)
    return int(round(total))


def pipeline_in_flight(pp: int, micro_batches: int, schedule: str = "1f1b", virtual_stages: int = 1) -> float:
    """Micro-batches whose activations the FIRST pipeline stage holds at its peak: 1 without a pipeline, m for GPipe,
    min(p, m) for 1F1B (p forwards before the first backward), min(p, m)·(1 + (p−1)/(pv)) interleaved with v chunks
    (Narayanan et al. 2021 §2.2; Korthikanti et al. 2022 §4.2.3); ``perf.predict``'s rule. Taught in chapters 24, 26."""
    p, m = checks.count("pp", pp), checks.count("micro_batches", micro_batches)
    v = checks.count("virtual_stages", virtual_stages)
    checks.one_of("schedule", schedule, ("gpipe", "1f1b", "interleaved"))
    if p == 1:
        return 1.0
    return {"gpipe": float(m), "1f1b": float(min(p, m)), "interleaved": min(p, m) * (1 + (p - 1) / (p * v))}[schedule]


def stage_activation_bytes(shape, micro_batch: int, *, pp: int, micro_batches: int, schedule: str = "1f1b",
                           virtual_stages: int = 1, cp: int = 1, seq_len: int | None = None, **kw) -> int:
    """Activation bytes the first pipeline stage keeps at its peak: :func:`activation_bytes` of one micro-batch of
    seq_len/cp tokens (context parallelism splits every sequence), × the stage's ⌈L/(p·v)⌉·v of L layers, ×
    :func:`pipeline_in_flight`. Under 1F1B with m ≥ p that is p micro-batches × L/p layers — the whole model's
    activations once: pipeline parallelism does not divide them (Korthikanti et al. 2022 §4.2.3). ``kw`` goes to
    :func:`activation_bytes` (tp, sequence_parallel, flash_attention, recompute, dtype_bytes, …). Taught in
    chapter 26 (long sequences) and chapter 24."""
    full = activation_bytes(shape, micro_batch, seq_len=seq_len, **kw)      # validates shape and seq_len
    L, s = shape.n_layers, shape.seq_len if seq_len is None else seq_len
    p, c, v = checks.count("pp", pp), checks.count("cp", cp), checks.count("virtual_stages", virtual_stages)
    if p * v > L or s % c:
        raise ValueError(f"pp={p}, virtual_stages={v}, cp={c} are not valid: pp·virtual_stages ≤ n_layers={L} "
                         f"and cp must divide seq_len={s}")
    one_mb = full if c == 1 else activation_bytes(shape, micro_batch, seq_len=s // c, **kw)
    layers = math.ceil(L / (p * v)) * v                     # the first (= slowest) stage's layers
    return int(round(one_mb * layers / L * pipeline_in_flight(p, micro_batches, schedule, v)))


def _itemised(L, h, a, ff, s, b, t, sp, recompute, B, attention, dropout, include_head, vocab, mb) -> int:
    """:func:`activation_bytes` for a named attention implementation (each saved tensor at its own size)."""
    masks = 2 * h * mb if dropout else 0                  # attention-output and MLP-output dropout masks
    if recompute == "full":
        per_layer = B * s * b * h / (t if sp else 1)
    else:
        every = s * b * (8 * B * h + 2 * B * ff + masks)
        unsplit = s * b * (4 * B * h + masks)             # eq. 2: layer-norm inputs, masks, QKV/fc inputs
        lin = every / t if (t == 1 or sp) else unsplit + (every - unsplit) / t
        core = 0 if recompute == "selective" else attention_saved_bytes(
            attention, batch=int(b), heads=a, seq_len=int(s), dtype_bytes=B, dropout=dropout, mask_bytes=mb)
        per_layer = lin + core / t
    total = L * per_layer
    if include_head:
        v = 0 if vocab is None else checks.count("shape.vocab_size", vocab)
        total += (2 * B * s * b * h + 4 * s * b * v) / t  # final norm and head inputs; fp32 logits of the loss
        total += s * b * h * mb if dropout else 0          # the embedding's dropout mask
    total = checks.finite_result("activation bytes", total, micro_batch=int(b), seq_len=int(s), dtype_bytes=B)
    return int(round(total))


def __getattr__(name: str):
    """The communication buffers moved to :mod:`labkit.memory.buffers`; their old names here still import,
    with a DeprecationWarning, through :mod:`labkit._compat` (this file never imports buffers)."""
    from labkit import _compat

    return _compat.moved_attribute(__name__, name)

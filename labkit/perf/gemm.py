"""The GEMM-shape term of the performance model: small or tp-split matmuls reach less of the peak than large ones.

:func:`labkit.perf.predict` prices compute at one *achievable fraction* of the dense peak. A matmul of
M×K by K×N reads and writes (M·K + K·N + M·N) operands for 2·M·N·K FLOPs: when that arithmetic intensity
(FLOPs per byte) falls below the GPU's FLOPs-to-bandwidth ratio the matmul is limited by memory bandwidth,
not by the tensor cores. The curve used here is that **roofline** as NVIDIA states it for GEMMs — time =
max(FLOPs / math rate, bytes / memory bandwidth), "math limited if arithmetic intensity > ops:byte ratio"
(NVIDIA, *Matrix Multiplication Background User's Guide*, sections "Math and Memory Bounds" and
"Dimension Quantization Effects",
https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html; the
roofline itself: Williams, Waterman & Patterson 2009, CACM 52(4)) — with the math rate the calibrated
achievable fraction of the datasheet peak and the bandwidth the datasheet HBM rate (:mod:`labkit.hardware`).
Tile and wave quantization (the guide's other effects) are not modelled: their steps depend on the kernel a
library picks.

Per layer and micro-batch of b sequences of s tokens, the GEMMs one GPU runs (:func:`layer_gemms`): the Q/K/V
and output projections and the MLP, their output (or input) dimension ÷ tp (Megatron's column/row split),
M = b·s tokens; with the attention scores stored (no flash attention) the batched QKᵀ (s×hd by hd×s) and
scores·V (s×s by s×hd) per local head, whose K = hd (or whose s×s output) makes them memory-bound on an
A100 for hd ≤ 128 — the dominant shape effect of small models; with flash attention the attention core is
one fused kernel that keeps the scores on chip, priced at the math rate. The backward's two GEMMs per
forward GEMM move the same three matrices, so the forward's efficiency is the step's.

:func:`shape_efficiency` is the FLOP-weighted efficiency of a step: ideal seconds (every GEMM FLOP at the math
rate) ÷ (the GEMMs' roofline seconds + the memory-bound kernels between them: LayerNorm, GELU, softmax,
dropout, residual adds, priced as :func:`activation_traffic_bytes` ÷ HBM bandwidth). Those kernels move bytes
∝ b·s·h per layer while the GEMMs do FLOPs ∝ b·s·h²/t, so a small d_model reaches less of the peak than a large
one — with stored s×s scores also ∝ a·s²/t; ``predict(..., gemm_shape=True)`` divides the compute by it, and
:func:`labkit.perf.calibrate_achievable` with ``gemm_shape=True`` then solves for the math rate of a
large-shape GEMM rather than the run's average. Checked against Megatron-LM's Table 1 (Narayanan et al.
2021): calibrated on its 145.6B row, its ten rows (1.7B at t = 1 to 1T at t = 8, p = 64) within 5 points of
HFU, where one flat fraction leaves the 1.7B row 12 points high (tests/test_perf_calibrate.py).

Taught in chapter 24 (choosing a parallel layout: why a small or finely split model reaches less of the peak).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["Gemm", "layer_gemms", "gemm_seconds", "activation_traffic_bytes", "shape_efficiency"]


@dataclass(frozen=True)
class Gemm:
    """``batch`` matmuls of (m×k)·(k×n) in one layer's forward on one GPU, named; ``fp8``: a linear layer's
    GEMM that an fp8 layout runs in fp8. Taught in chapter 24."""

    name: str
    m: int
    n: int
    k: int
    batch: int = 1
    fp8: bool = True

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    def bytes(self, operand_bytes: float) -> float:
        """Bytes moved at least once: both inputs and the output, ``operand_bytes`` each element."""
        return operand_bytes * self.batch * (self.m * self.k + self.k * self.n + self.m * self.n)


def layer_gemms(shape, *, micro_batch: int = 1, seq_len: int | None = None, tp: int = 1,
                flash_attention: bool = True, logits: bool = True) -> list:
    """The forward GEMMs of one transformer layer on one GPU of a ``tp``-way split, for ``micro_batch``
    sequences (see the module docstring), plus the logits GEMM (``logits=True``; once per model, not per
    layer: its ``batch`` is 1 and the caller weighs it). Taught in chapter 24."""
    from labkit import flops

    s = shape
    if not isinstance(s, flops.ModelShape):
        raise checks.ArgumentTypeError(f"shape must be a labkit.flops.ModelShape, got {type(shape).__name__}")
    b, t = checks.count("micro_batch", micro_batch), checks.count("tp", tp)
    seq = s.seq_len if seq_len is None else checks.count("seq_len", seq_len)
    if s.n_heads % t:
        raise ValueError(f"tp={t} must divide n_heads={s.n_heads}")
    tok, d, hd, h_loc = b * seq, s.d_model, s.hd, s.n_heads // t
    q, kv = s.n_heads * hd, s.kv_heads * hd
    experts = s.top_k if s.n_experts > 1 else 1
    up = 2 if s.ffn == "swiglu" else 1
    out = [Gemm("qkv", tok, max(1, (q + 2 * kv) // t), d), Gemm("proj", tok, d, max(1, q // t)),
           Gemm("mlp up", tok, max(1, s.ff // t), d, batch=up * experts),
           Gemm("mlp down", tok, d, max(1, s.ff // t), batch=experts)]
    if not checks.flag("flash_attention", flash_attention):
        out += [Gemm("scores QK^T", seq, seq, hd, batch=b * h_loc, fp8=False),
                Gemm("scores.V", seq, hd, seq, batch=b * h_loc, fp8=False)]
    if checks.flag("logits", logits):
        out.append(Gemm("logits", tok, max(1, s.vocab_size // t), d))
    return out


def gemm_seconds(g: Gemm, *, math_flops: float, memory_bw: float, operand_bytes: float) -> float:
    """Roofline seconds of ``g``: max(FLOPs / ``math_flops``, bytes / ``memory_bw``). Taught in chapter 24."""
    if not isinstance(g, Gemm):
        raise checks.ArgumentTypeError(f"g must be a labkit.perf.gemm.Gemm, got {type(g).__name__}")
    rate, bw = checks.positive("math_flops", math_flops), checks.positive("memory_bw", memory_bw)
    t = max(g.flops / rate, g.bytes(checks.positive("operand_bytes", operand_bytes)) / bw)
    return checks.finite_result("GEMM seconds", t, math_flops=math_flops, memory_bw=memory_bw)


def activation_traffic_bytes(shape, *, micro_batch: int, tp: int = 1, recompute: str = "none",
                             sequence_parallel: bool = False, flash_attention: bool = True, seq_len: int | None = None,
                             dtype_bytes: int = 2) -> float:
    """Bytes the memory-bound kernels between the GEMMs move per micro-batch on one GPU, all layers: the
    activations a layer stores for backward (:func:`labkit.memory.estimate.activation_bytes` with no
    recomputation — Korthikanti et al. 2022 §4, sbh(10 + 24/t) + 5as²b/t per layer: the outputs of the
    LayerNorms, GELU, softmax and dropout that elementwise kernels write) × the passes over them: forward,
    written by one kernel and read by the next (2); backward, the saved tensor and the incoming gradient
    read and the outgoing gradient written (3); ``recompute="full"`` reruns the forward (2 more): 5×, or 7×
    with full recomputation. Fused kernels (Megatron fuses bias+GELU, scale+mask+softmax) still make these
    passes; kernels that read more (LayerNorm's statistics) are not counted. Taught in chapter 24."""
    from labkit.memory.estimate import activation_bytes

    if not isinstance(shape, _model_shape()):
        raise checks.ArgumentTypeError(f"shape must be a labkit.flops.ModelShape, got {type(shape).__name__}")
    share = _rerun_share(recompute, shape.n_layers)
    stored = activation_bytes(shape, checks.count("micro_batch", micro_batch), recompute="none",
                              tp=checks.count("tp", tp), sequence_parallel=checks.flag("sequence_parallel", sequence_parallel),
                              seq_len=None if seq_len is None else checks.count("seq_len", seq_len),
                              dtype_bytes=checks.count("dtype_bytes", dtype_bytes),
                              flash_attention=checks.flag("flash_attention", flash_attention))
    return float(stored) * (5 + 2 * share)


def _model_shape():
    from labkit.flops import ModelShape

    return ModelShape


def _rerun_share(recompute, n_layers: int) -> float:
    """The share of the layers whose forward runs again (0 for "none"/"selective": the attention core only)."""
    from labkit.model.recompute_policy import recompute_share

    name, share = recompute_share(recompute, n_layers)
    return 0.0 if name in ("none", "selective") else float(share)


def shape_efficiency(shape, *, micro_batch: int, tp: int, cluster, dtype: str = "bf16", achievable: float = 0.5,
                     flash_attention: bool = True, seq_len: int | None = None, recompute: str = "none",
                     sequence_parallel: bool = False) -> float:
    """FLOP-weighted efficiency of one GPU's step in (0, 1]: Σ ideal GEMM seconds (at ``achievable`` × the
    dtype's dense peak) ÷ (Σ roofline seconds of the GEMMs (:func:`gemm_seconds`, the HBM bandwidth of the
    cluster's GPU) + the memory-bound kernels' :func:`activation_traffic_bytes` ÷ that bandwidth), the
    layers' GEMMs × n_layers plus the logits once. Forward shapes; backward and recomputation scale GEMM
    FLOPs and bytes alike, so the ratio of the GEMMs holds for the step (the traffic counts them itself).
    ``dtype`` "fp8": the linear layers' GEMMs at the fp8 peak with 1-byte operands, the attention core at
    the bf16 peak with 2-byte ones. Taught in chapter 24."""
    frac = checks.fraction("achievable", achievable, open_low=True)
    checks.one_of("dtype", dtype, ("fp32", "tf32", "bf16", "fp16", "fp8"))
    if not isinstance(shape, _model_shape()):
        raise checks.ArgumentTypeError(f"shape must be a labkit.flops.ModelShape, got {type(shape).__name__}")
    bw = getattr(getattr(cluster, "spec", None), "memory_bw", None)
    if not bw:
        raise ValueError(f"cluster {getattr(cluster, 'name', cluster)!r} has no catalogued HBM bandwidth: the GEMM "
                         "roofline needs one")
    low = "bf16" if dtype == "fp8" else dtype
    ideal = roof = 0.0
    for g in layer_gemms(shape, micro_batch=micro_batch, seq_len=seq_len, tp=tp, flash_attention=flash_attention):
        eight = dtype == "fp8" and g.fp8
        rate = frac * cluster.peak("fp8" if eight else low)
        size = 1 if eight else (4 if low in ("fp32", "tf32") else 2)
        weight = 1 if g.name == "logits" else shape.n_layers
        ideal += weight * g.flops / rate
        roof += weight * gemm_seconds(g, math_flops=rate, memory_bw=bw, operand_bytes=size)
    passes = 3 + _rerun_share(recompute, shape.n_layers)           # forward, 2 backward GEMMs, forward again
    act = 4 if low in ("fp32", "tf32") else 2
    traffic = activation_traffic_bytes(shape, micro_batch=micro_batch, tp=tp, recompute=recompute, seq_len=seq_len,
                                       sequence_parallel=sequence_parallel, flash_attention=flash_attention,
                                       dtype_bytes=act)
    ideal, roof = passes * ideal, passes * roof + traffic / bw
    return checks.finite_result("GEMM shape efficiency", ideal / roof, shape=shape)

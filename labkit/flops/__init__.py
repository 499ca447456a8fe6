"""FLOP counts of transformer training: the formulas, their conventions, and an exact counter.

The formulas are here; the live counter is ``flops/counter.py``; model and hardware FLOPs utilisation
(MFU, HFU) is ``flops/mfu.py`` (``labkit.flops.mfu``, chapter 4).

Conventions silently differ between papers and codebases; every function here names its own:

- **"6N"** (Kaplan et al. 2020, §2.1): training FLOPs per token = 6·N, forward 2·N (one multiply-add
  per parameter per token), backward twice the forward. labkit's N = parameters that multiply
  activations: all parameters except position embeddings and, for *untied* models, the input
  token-embedding table (a lookup costs no FLOPs; a tied table is counted once, as the output layer).
  For nanoGPT's tied GPT-2 this is exactly ``get_num_params()`` (123.65M).
- **"palm"** (Chowdhery et al. 2022, PaLM, App. B): 6·N + 12·L·H·Q·T per token, the second term the
  attention score (QKᵀ) and attention-over-values matmuls (L layers, H heads, head size Q, sequence
  T). Also nanoGPT ``estimate_mfu``.
- **"megatron"** (Narayanan et al. SC21, §5.1 and eq. 3; Korthikanti et al. 2022): every matmul
  counted from the shapes — Q/K/V projections with grouped-query attention (n_kv_heads), output
  projection, attention scores and values (2·T·H·Q each per token), the MLP (GELU: 2 matrices of
  d×d_ff; SwiGLU: 3), MoE (top_k active experts + the router), and the logits (2·d·V). No
  embeddings-lookup, norm, softmax or other elementwise FLOPs. Training = 3 × forward.
- **causal**: every formula counts the *full* T×T attention matrices unless ``causal=True``, which
  halves the attention terms (a causal kernel skips the masked half). PaLM, nanoGPT and Megatron
  eq. 3 do not halve; FlashAttention-style kernels do the halved work. Pick one, say which.
- **padding**: formulas are per token; :func:`flops_per_step` multiplies by the real (unpadded)
  token count you pass — padded positions are not useful model FLOPs.
- **recomputation** changes *hardware* FLOPs, never model FLOPs (PaLM App. B): ``"full"`` adds one
  forward of the transformer layers (6N -> 8N; Megatron eq. 3's factor 4 instead of 3), ``"selective"``
  (Korthikanti et al. 2022 §5) re-runs only the attention core (QKᵀ, softmax, ·V) forward.

A package: the formulas here, the exact counter of a live model in :mod:`labkit.flops.counter`
(:func:`count_flops`, re-exported).

Taught in chapter 3 (FLOPs).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, fields, replace

from labkit import checks
from labkit.flops.counter import FlopCount, count_flops
from labkit.model.recompute_policy import recompute_share

__all__ = ["METHODS", "RECOMPUTE", "PARAM_CONVENTIONS", "ModelShape", "presets", "preset", "n_params", "n_active_params",
           "n_matmul_params", "attention_core_flops_per_token", "forward_flops_per_token",
           "model_flops_per_token", "hardware_flops_per_token", "flops_per_step", "FlopCount", "count_flops"]

METHODS = ("palm", "6N", "megatron")
RECOMPUTE = ("none", "selective", "full")
#: Parameter-count conventions of :func:`n_params`: every parameter, or Megatron's eq. (2) (no final norm).
PARAM_CONVENTIONS = ("labkit", "megatron-eq2")


@dataclass(frozen=True)
class ModelShape:
    """Shape of a decoder-only transformer: everything the FLOP and parameter formulas need.

    ``d_ff`` defaults to 4·d_model, ``n_kv_heads`` to ``n_heads`` (no GQA), ``head_dim`` to
    d_model / n_heads. ``bias`` adds linear and LayerNorm biases (GPT-2 has them, Llama does not).

    Taught in chapter 3 (FLOPs).
    """

    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    seq_len: int
    d_ff: int | None = None
    n_kv_heads: int | None = None
    ffn: str = "gelu"
    n_experts: int = 1
    top_k: int = 1
    tied_embeddings: bool = True
    head_dim: int | None = None
    bias: bool = False
    norm: str = "layernorm"
    pos_emb: str = "learned"
    name: str = field(default="", compare=False)

    def __post_init__(self):
        # sizes are ints >= 1 (d_ff, n_kv_heads, head_dim may be None: derived); frozen, so a NumPy int
        # is stored back as a plain int with object.__setattr__
        for p in ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len", "n_experts", "top_k",
                  "d_ff", "n_kv_heads", "head_dim"):
            v = getattr(self, p)
            if v is not None or p not in ("d_ff", "n_kv_heads", "head_dim"):
                object.__setattr__(self, p, checks.count(p, v))
        for p in ("tied_embeddings", "bias"):
            object.__setattr__(self, p, checks.flag(p, getattr(self, p)))
        checks.one_of("ffn", self.ffn, ("gelu", "swiglu"))
        checks.one_of("norm", self.norm, ("layernorm", "rmsnorm"))
        checks.one_of("pos_emb", self.pos_emb, ("learned", "rope", "none"))
        if not isinstance(self.name, str):
            raise checks.ArgumentTypeError(f"name must be a str, got {type(self.name).__name__} {self.name!r}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                             "(or give head_dim)")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} must be <= n_experts={self.n_experts}")

    @property
    def ff(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def hd(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads


_PRESETS = {
    # nanoGPT / GPT-2 (Radford et al. 2019; https://github.com/karpathy/nanoGPT model.py)
    "gpt2-124m": dict(n_layers=12, d_model=768, n_heads=12, vocab_size=50257, seq_len=1024, bias=True),
    "gpt2-350m": dict(n_layers=24, d_model=1024, n_heads=16, vocab_size=50257, seq_len=1024, bias=True),
    "gpt2-774m": dict(n_layers=36, d_model=1280, n_heads=20, vocab_size=50257, seq_len=1024, bias=True),
    "gpt2-1.5b": dict(n_layers=48, d_model=1600, n_heads=25, vocab_size=50257, seq_len=1024, bias=True),
    # GPT-3 175B (Brown et al. 2020, Table 2.1)
    "gpt3-175b": dict(n_layers=96, d_model=12288, n_heads=96, vocab_size=50257, seq_len=2048, bias=True),
    # Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3)
    "llama3-8b": dict(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336, vocab_size=128256,
                      seq_len=8192, ffn="swiglu", tied_embeddings=False, norm="rmsnorm", pos_emb="rope"),
    "llama3-70b": dict(n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672, vocab_size=128256,
                       seq_len=8192, ffn="swiglu", tied_embeddings=False, norm="rmsnorm", pos_emb="rope"),
    "llama3-405b": dict(n_layers=126, d_model=16384, n_heads=128, n_kv_heads=8, d_ff=53248,
                        vocab_size=128256, seq_len=8192, ffn="swiglu", tied_embeddings=False,
                        norm="rmsnorm", pos_emb="rope"),
    # PaLM 540B (Chowdhery et al. 2022, Table 1: 118 layers, d 18432, 48 heads of 256, MQA, SwiGLU
    # with d_ff = 4d, shared input/output embeddings, 256k vocabulary, T = 2048)
    "palm-540b": dict(n_layers=118, d_model=18432, n_heads=48, head_dim=256, n_kv_heads=1, d_ff=73728,
                      vocab_size=256000, seq_len=2048, ffn="swiglu", pos_emb="rope"),
    # Mixtral 8x7B (Jiang et al. 2024): 8 experts, top-2
    "mixtral-8x7b": dict(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336, vocab_size=32000,
                         seq_len=4096, ffn="swiglu", n_experts=8, top_k=2, tied_embeddings=False,
                         norm="rmsnorm", pos_emb="rope"),
}


def presets() -> list[str]:
    """Names accepted by :func:`preset`. Taught in chapter 3 (FLOPs)."""
    return list(_PRESETS)


def preset(name: str, **overrides) -> ModelShape:
    """A published model's shape (cited in the source), optionally with fields overridden.

    Taught in chapter 3 (FLOPs).
    """
    checks.one_of("name", name, _PRESETS)
    known = sorted(f.name for f in fields(ModelShape))
    if set(overrides) - set(known):
        raise ValueError(f"preset({name!r}): unknown field(s) {sorted(set(overrides) - set(known))}; valid: {known}")
    return replace(ModelShape(**_PRESETS[name], name=name), **overrides)


# ------------------------------------------------------------------------------------------------
# Parameter counts
# ------------------------------------------------------------------------------------------------
def _mlp_params(s: ModelShape) -> int:
    d, ff = s.d_model, s.ff
    if s.ffn == "swiglu":
        return 3 * d * ff + (2 * ff + d if s.bias else 0)
    return 2 * d * ff + (ff + d if s.bias else 0)


def _layer_params(s: ModelShape, experts: int) -> int:
    d, q, kv = s.d_model, s.n_heads * s.hd, s.kv_heads * s.hd
    attn = d * q + 2 * d * kv + q * d + ((q + 2 * kv + d) if s.bias else 0)
    router = d * s.n_experts if s.n_experts > 1 else 0
    norm = (2 * d if (s.norm == "layernorm" and s.bias) else d) * 2
    return attn + experts * _mlp_params(s) + router + norm


def _check_shape(shape) -> ModelShape:
    if not isinstance(shape, ModelShape):
        raise checks.ArgumentTypeError(f"shape must be a labkit.flops.ModelShape (see preset()), "
                                       f"got {type(shape).__name__} {shape!r:.60}")
    return shape


def _count(s: ModelShape, experts: int, embeddings: bool, position_embeddings: bool | None,
           final_norm_counted: bool = True) -> int:
    embeddings = checks.flag("embeddings", embeddings)
    if position_embeddings is None:
        position_embeddings = embeddings
    position_embeddings = checks.flag("position_embeddings", position_embeddings)
    d = s.d_model
    final_norm = 2 * d if (s.norm == "layernorm" and s.bias) else d
    n = s.n_layers * _layer_params(s, experts) + (final_norm if final_norm_counted else 0)
    if embeddings:
        n += s.vocab_size * d * (1 if s.tied_embeddings else 2)
    if position_embeddings and s.pos_emb == "learned":
        n += s.seq_len * d
    return n


def n_params(shape: ModelShape, *, embeddings: bool = True, position_embeddings: bool | None = None,
             convention: str = "labkit") -> int:
    """Total parameters (all experts). ``embeddings=False`` drops token/position embeddings and an
    untied output layer (Kaplan et al.'s "non-embedding" N); ``position_embeddings`` defaults to
    ``embeddings`` (nanoGPT's ``get_num_params()`` = ``n_params(s, position_embeddings=False)``).

    ``convention`` (:data:`PARAM_CONVENTIONS`): ``"labkit"`` counts every parameter of the model, the final
    norm included (= ``GPT(cfg).n_params()``); ``"megatron-eq2"`` is Narayanan et al. 2021's eq. (2),
    P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)), which omits the final LayerNorm (2h for GPT): the
    figure Megatron-LM's papers and tables print (SC21 Table 1's 1.7 … 1008.0 billion).

    Taught in chapter 3 (FLOPs) and chapter 24 (published runs' parameter counts).
    """
    checks.one_of("convention", convention, PARAM_CONVENTIONS)
    return _count(_check_shape(shape), shape.n_experts, embeddings, position_embeddings,
                  final_norm_counted=convention == "labkit")


def n_active_params(shape: ModelShape, *, embeddings: bool = True,
                    position_embeddings: bool | None = None) -> int:
    """Parameters used per token: as :func:`n_params` but only ``top_k`` experts per MoE layer.

    Taught in chapter 3 (FLOPs).
    """
    s = _check_shape(shape)
    return _count(s, s.top_k if s.n_experts > 1 else 1, embeddings, position_embeddings)


def n_matmul_params(shape: ModelShape) -> int:
    """The N of "6N": active parameters that multiply activations (see the module docstring).

    Taught in chapter 3 (FLOPs).
    """
    n = n_active_params(_check_shape(shape), position_embeddings=False)
    if not shape.tied_embeddings:
        n -= shape.vocab_size * shape.d_model   # input lookup table: no FLOPs
    return n


# ------------------------------------------------------------------------------------------------
# FLOPs per token
# ------------------------------------------------------------------------------------------------
def _check(method: str, causal) -> float:
    checks.one_of("method", method, METHODS)
    return 0.5 if checks.flag("causal", causal) else 1.0


def _seq(shape: ModelShape, seq_len) -> int:
    return shape.seq_len if seq_len is None else checks.count("seq_len", seq_len)


def attention_core_flops_per_token(shape: ModelShape, *, causal: bool = False, seq_len: int | None = None) -> float:
    """Forward FLOPs per token of QKᵀ and attention·V over all layers: 4·L·H·Q·T (halved if causal).

    Taught in chapter 3 (FLOPs).
    """
    cf = _check("palm", causal)
    s = _check_shape(shape)
    return 4.0 * s.n_layers * s.n_heads * s.hd * _seq(s, seq_len) * cf


def forward_flops_per_token(shape: ModelShape, *, causal: bool = False, logits: bool = True,
                            seq_len: int | None = None) -> float:
    """Megatron-style forward FLOPs per token, matmul by matmul (Narayanan et al. SC21 §5.1).

    Per layer: 2·d·(H·Q + 2·H_kv·Q) for Q/K/V, 2·H·Q·d for the output projection, 2·2·T·H·Q for
    scores and values (× ½ if causal), MLP 2·2·d·d_ff (GELU) or 3·2·d·d_ff (SwiGLU) per active
    expert (× top_k), router 2·d·n_experts; plus logits 2·d·V once (``logits=False`` drops it).

    Taught in chapter 3 (FLOPs).
    """
    s = _check_shape(shape)
    logits = checks.flag("logits", logits)
    d, q, kv = s.d_model, s.n_heads * s.hd, s.kv_heads * s.hd
    proj = 2 * d * (q + 2 * kv) + 2 * q * d
    mlp_one = (6 if s.ffn == "swiglu" else 4) * d * s.ff
    experts = s.top_k if s.n_experts > 1 else 1
    router = 2 * d * s.n_experts if s.n_experts > 1 else 0
    layer = proj + experts * mlp_one + router
    total = s.n_layers * layer + attention_core_flops_per_token(s, causal=causal, seq_len=seq_len)
    if logits:
        total += 2 * d * s.vocab_size
    return float(total)


def model_flops_per_token(shape: ModelShape, *, method: str = "palm", causal: bool = False,
                          seq_len: int | None = None) -> float:
    """Training (forward + backward) *model* FLOPs per token — the MFU numerator per token.

    ``"6N"``: 6·N (N = :func:`n_matmul_params`); ``"palm"``: 6·N + 12·L·H·Q·T (PaLM App. B, nanoGPT
    estimate_mfu); ``"megatron"``: 3 × :func:`forward_flops_per_token`. ``causal=True`` halves the
    attention terms (no effect on "6N", which has none). ``seq_len`` overrides ``shape.seq_len``.

    Taught in chapter 3 (FLOPs).
    """
    cf = _check(method, causal)
    s = _check_shape(shape)
    if method == "6N":
        return 6.0 * n_matmul_params(s)
    if method == "palm":
        return 6.0 * n_matmul_params(s) + 12.0 * s.n_layers * s.n_heads * s.hd * _seq(s, seq_len) * cf
    return 3.0 * forward_flops_per_token(s, causal=causal, seq_len=seq_len)


def hardware_flops_per_token(shape: ModelShape, *, recompute: str = "none", method: str = "palm",
                             causal: bool = False, seq_len: int | None = None) -> float:
    """FLOPs the hardware executes per token (the HFU numerator): model FLOPs + recomputation.

    ``"full"``: one extra forward of the transformer layers — for ``"6N"`` 2·N (so 8N, the seeds'
    "8PD"), for ``"palm"`` 2·(N − output layer) + 4·L·H·Q·T, for ``"megatron"`` the layers' forward
    without logits (reproducing Narayanan et al. SC21 eq. 3: 4× layers + 3× logits).
    ``"selective"``/``"attention"`` (Korthikanti et al. 2022 §5): the attention core forward again,
    :func:`attention_core_flops_per_token` (≈0.9% extra for GPT-3 175B; Korthikanti et al. quote 2.7% because
    their accounting charges more than one forward of the core — labkit counts the one recomputed forward the
    policy executes). ``"every:k"``: ⌈L/k⌉ of the L layers recomputed, that share of ``"full"``'s extra.
    Taught in chapter 3 (FLOPs) and chapter 21 (recomputation in HFU).
    """
    s = _check_shape(shape)
    recompute, share = recompute_share(recompute, s.n_layers)
    model = model_flops_per_token(s, method=method, causal=causal, seq_len=seq_len)
    if recompute == "none":
        return model
    if recompute == "selective":
        return model + attention_core_flops_per_token(s, causal=causal, seq_len=seq_len)
    if method == "6N":
        return model + share * 2.0 * n_matmul_params(s)
    if method == "palm":
        head = s.vocab_size * s.d_model
        return model + share * (2.0 * (n_matmul_params(s) - head)
                                + attention_core_flops_per_token(s, causal=causal, seq_len=seq_len))
    return model + share * forward_flops_per_token(s, causal=causal, logits=False, seq_len=seq_len)


def flops_per_step(shape: ModelShape, tokens: int, *, method: str = "palm", causal: bool = False,
                   recompute: str = "none", hardware: bool = False, seq_len: int | None = None) -> float:
    """FLOPs of one optimizer step that processes ``tokens`` real (unpadded) tokens, all ranks.

    Model FLOPs by default; ``hardware=True`` includes ``recompute``. Padded positions cost the
    hardware time but are not model FLOPs: pass the count of real tokens (e.g. ``attention_mask.sum()``).

    Taught in chapter 3 (FLOPs).
    """
    if not isinstance(tokens, numbers.Integral) and hasattr(tokens, "item"):
        try:                                  # a tensor count, e.g. attention_mask.sum()
            tokens = tokens.item()
        except (ValueError, RuntimeError) as e:  # more than one element
            raise checks.ArgumentTypeError(f"tokens must be one count, got a {type(tokens).__name__} of many") from e
    tokens = checks.count("tokens", tokens)   # real, unpadded tokens in the step
    checks.one_of("recompute", recompute, RECOMPUTE)
    if checks.flag("hardware", hardware):
        per = hardware_flops_per_token(shape, recompute=recompute, method=method, causal=causal, seq_len=seq_len)
    else:
        if recompute != "none":
            raise ValueError(f"recompute={recompute!r} only changes hardware FLOPs; pass hardware=True")
        per = model_flops_per_token(shape, method=method, causal=causal, seq_len=seq_len)
    return per * tokens


def __getattr__(name: str):
    """This package's files on first use (``labkit.flops.<file>``), so the face stays cheap."""
    import importlib
    import pkgutil

    if name in {m.name for m in pkgutil.iter_modules(__path__)}:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

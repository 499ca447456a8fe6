"""The GPT's configuration and named sizes, without importing torch.

:class:`GPTConfig` (sizes and options), :data:`SIZES` (named presets) and :func:`gpt_config` live here so
that what only needs a shape — the CLI's ``--model`` choices, FLOP counts, memory models, a
``TrainConfig`` — does not pay torch's import; :mod:`labkit.model.gpt` builds the model from them and
re-exports all three.

Taught in chapter 3 (the model whose FLOPs we count).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from labkit import checks
from labkit.model.recompute_policy import (  # noqa: F401 - chapter 21's policies, re-exported
    CHECKPOINT_POLICIES,
    checkpoint_policy,
    checkpointed_blocks,
    recompute_mode,
)

__all__ = ["ATTENTIONS", "GPTConfig", "SIZES", "gpt_config"]

# chapter 16: "naive" materialises the scores; "sdpa" lets PyTorch choose a backend; the rest force one
# through torch.nn.attention.sdpa_kernel (labkit.kernels.attention: on a CPU only "flash" and "math" run)
ATTENTIONS = ("sdpa", "naive", "flash", "math", "efficient", "cudnn")


@dataclass(frozen=True)
class GPTConfig:
    """Size and options of :class:`GPT`. Taught in chapter 3 (model shape → FLOPs)."""

    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    seq_len: int
    d_ff: int | None = None          # MLP width; None → 4·d_model
    attention: str = "sdpa"          # one of ATTENTIONS (labkit.kernels.attention)
    checkpoint: bool = False         # activation checkpointing of every block (recompute in backward)
    dropout: float = 0.0
    n_experts: int = 0               # chapter 26: 0 = the dense MLP; ≥ 2 = a top-k MoE of that many MLPs (labkit.model.moe)
    top_k: int = 2                   # MoE: experts per token (≤ n_experts)
    aux_loss_coef: float = 0.0       # MoE: weight of the Switch balance loss added to the loss (0 = off)

    def __post_init__(self):
        # frozen: checked values (a NumPy int becomes a plain int) are stored with object.__setattr__
        put = lambda name, v: object.__setattr__(self, name, v)
        for name in ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len"):
            put(name, checks.count(name, getattr(self, name)))
        if self.d_model % self.n_heads:
            raise ValueError(f"GPTConfig: d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.d_ff is not None:
            put("d_ff", checks.count("d_ff", self.d_ff))
        checks.one_of("attention", self.attention, ATTENTIONS)
        put("checkpoint", checks.flag("checkpoint", self.checkpoint))
        put("dropout", checks.number("dropout", self.dropout, low=0, high=1, high_open=True))
        put("n_experts", checks.count("n_experts", self.n_experts, at_least=0))
        put("top_k", checks.count("top_k", self.top_k))
        put("aux_loss_coef", checks.nonneg("aux_loss_coef", self.aux_loss_coef))
        if self.n_experts == 1:
            raise ValueError("GPTConfig: n_experts=1 is not valid: use 0 for the dense MLP or ≥ 2 experts for a MoE")
        if self.n_experts and self.top_k > self.n_experts:
            raise ValueError(f"GPTConfig: top_k={self.top_k} must be ≤ n_experts={self.n_experts} "
                             "(each token picks top_k distinct experts)")

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model

    def shape(self):
        """The :class:`labkit.flops.ModelShape` of this model (GELU MLP, biases, learned positions, tied
        embeddings; a MoE's experts and top-k): ``labkit.flops.n_params(cfg.shape()) == GPT(cfg).n_params()``
        exactly."""
        from labkit.flops import ModelShape

        moe = dict(n_experts=self.n_experts, top_k=self.top_k) if self.n_experts else {}
        return ModelShape(**moe, n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads,
                          vocab_size=self.vocab_size, seq_len=self.seq_len, d_ff=self.ff,
                          ffn="gelu", tied_embeddings=True, bias=True, norm="layernorm", pos_emb="learned")

    def to_dict(self) -> dict:
        return asdict(self)


# Named sizes. vocab 4096 matches the shipped corpus tokenizer (labkit.data). "1b" ≈ 1.0e9 parameters:
# 12·L·d² in the blocks (Kaplan et al. 2020, Table 1) = 12·26·1792² = 1.002e9, plus 9 M embeddings.
# "bench" is the size where matmuls dominate on a CPU (benchmarks/bench_trainer.py).
SIZES: dict[str, GPTConfig] = {
    "tiny": GPTConfig(n_layers=2, d_model=128, n_heads=4, vocab_size=4096, seq_len=64),
    "small": GPTConfig(n_layers=4, d_model=256, n_heads=4, vocab_size=4096, seq_len=128),
    "bench": GPTConfig(n_layers=4, d_model=768, n_heads=12, vocab_size=4096, seq_len=256),
    "medium": GPTConfig(n_layers=12, d_model=768, n_heads=12, vocab_size=4096, seq_len=512),
    "1b": GPTConfig(n_layers=26, d_model=1792, n_heads=14, vocab_size=4096, seq_len=1024),
}


def gpt_config(name: str = "tiny", **overrides) -> GPTConfig:
    """A named size (``SIZES``) with fields overridden, e.g. ``gpt_config("tiny", attention="naive")``.

    Taught in chapter 3 (model shape → FLOPs).
    """
    if isinstance(name, GPTConfig):
        base = name
    else:
        try:
            known = name in SIZES
        except TypeError:                 # unhashable
            known = False
        if not known:
            raise ValueError(f"model size {name!r} is not known: name must be one of {sorted(SIZES)} "
                             "or a GPTConfig")
        base = SIZES[name]
    names = set(GPTConfig.__dataclass_fields__)
    bad = sorted(set(overrides) - names)
    if bad:
        raise ValueError(f"gpt_config: unknown field(s) {bad}; valid fields: {sorted(names)}")
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})


"""What DDP's communication hooks put on the wire per step: fp32, fp16/bf16 casts, PowerSGD's factors.

A DDP step all-reduces every gradient once. The hooks change what is all-reduced:

- ``fp16`` / ``bf16`` (torch ``default_hooks.fp16_compress_hook``): each bucket is cast to 2 bytes per element
  before the all-reduce and back after — half the bytes, at 2-byte precision (bf16 keeps fp32's range).
- ``powersgd`` (Vogels, Karimireddy & Jaggi, NeurIPS 2019, *PowerSGD: Practical Low-Rank Gradient
  Compression*; torch ``powerSGD_hook``): each gradient viewed as an n × m matrix (``shape[0]`` rows) is
  replaced by two factors P (n × r) and Q (m × r), each all-reduced in the gradient's dtype, with the error
  fed back into the next step; a matrix is compressed only when ``(n + m) · r · min_compression_rate < n · m``
  (torch's ``_should_compress``), others — biases, norms, small matrices — are all-reduced as they are. Before
  ``start_powerSGD_iter`` the hook all-reduces the plain gradients.

:func:`hook_elements` follows torch's rule element for element, so a run's own ``PowerSGDState`` counters
(``total_numel_before_compression`` / ``_after_``) give the same ratio (tests/test_comm_compression.py).
Pure (layer 1). Taught in chapter 23 (communication optimisation).
"""
from __future__ import annotations

import math

from labkit import checks

__all__ = ["HOOKS", "hook_elements", "hook_bytes", "param_shapes"]

HOOKS = (None, "fp16", "bf16", "powersgd")


def _shape(i: int, s) -> tuple[int, ...]:
    try:
        dims = tuple(s)
    except TypeError:
        raise TypeError(f"shapes[{i}] must be a tuple of dimensions, got {s!r}") from None
    if not dims:
        return (1,)
    return tuple(checks.count(f"shapes[{i}] dimension", d) for d in dims)


def hook_elements(shapes, hook: str | None = "powersgd", *, rank: int = 1,
                  min_compression_rate: float = 2.0) -> tuple[int, int]:
    """(elements a step would all-reduce without the hook, elements it all-reduces with it) for gradients of
    ``shapes``. For the casts the counts are equal (only the bytes per element change: :func:`hook_bytes`).
    Taught in chapter 23."""
    checks.one_of("hook", hook, HOOKS)
    rank = checks.count("rank", rank)
    rate = checks.positive("min_compression_rate", min_compression_rate)
    before = after = 0
    for i, s in enumerate(shapes):
        dims = _shape(i, s)
        numel = math.prod(dims)
        before += numel
        if hook != "powersgd":
            after += numel
            continue
        n = dims[0]
        m = numel // n
        r = min(n, m, rank)
        after += (n + m) * r if (n + m) * r * rate < n * m else numel
    return before, after


def hook_bytes(shapes, hook: str | None = None, *, grad_bytes: int = 4, rank: int = 1,
               min_compression_rate: float = 2.0) -> int:
    """Bytes all-reduced per step (the collective's payload S) for gradients of ``shapes`` in
    ``grad_bytes``-byte elements under ``hook``. Taught in chapter 23."""
    grad_bytes = checks.count("grad_bytes", grad_bytes)
    _, after = hook_elements(shapes, hook, rank=rank, min_compression_rate=min_compression_rate)
    return after * (2 if hook in ("fp16", "bf16") else grad_bytes)


def param_shapes(shape, *, fused_qkv: bool = False) -> list[tuple[int, ...]]:
    """The gradient tensors of a transformer of ``shape`` (a :class:`labkit.flops.ModelShape`) as torch stores
    them — ``nn.Linear`` weights out × in, biases and norm weights as vectors, embeddings vocab × d — the same
    parameters :func:`labkit.flops.n_params` counts. What :func:`hook_elements` needs for a model that is too
    big to build here. ``fused_qkv``: one (q + 2·kv) × d projection, as nanoGPT and labkit's GPT store it,
    instead of three (Hugging Face's Llama) — PowerSGD compresses the two layouts differently.
    Taught in chapter 23."""
    from labkit.flops import n_params

    n_params(shape)                                           # validates shape (a ModelShape)
    d, ff, q, kv = shape.d_model, shape.ff, shape.n_heads * shape.hd, shape.kv_heads * shape.hd
    b = shape.bias
    if checks.flag("fused_qkv", fused_qkv):
        layer = [(q + 2 * kv, d), (d, q)] + ([(q + 2 * kv,), (d,)] if b else [])
    else:
        layer = [(q, d), (kv, d), (kv, d), (d, q)] + ([(q,), (kv,), (kv,), (d,)] if b else [])
    mlp = ([(ff, d), (ff, d), (d, ff)] + ([(ff,), (ff,), (d,)] if b else []) if shape.ffn == "swiglu"
           else [(ff, d), (d, ff)] + ([(ff,), (d,)] if b else []))
    layer += mlp * shape.n_experts + ([(shape.n_experts, d)] if shape.n_experts > 1 else [])
    norm = [(d,), (d,)] if (shape.norm == "layernorm" and b) else [(d,)]
    layer += norm * 2
    out = layer * shape.n_layers + norm + [(shape.vocab_size, d)] * (1 if shape.tied_embeddings else 2)
    if shape.pos_emb == "learned":
        out.append((shape.seq_len, d))
    return out

"""A :class:`labkit.flops.ModelShape` from a ``transformers`` config object, and FLOPs per token of a
model: the small private helper behind :mod:`labkit.integrations` (GPT-2 names and Llama-style names).

Taught in chapter 3 (FLOPs).
"""
from __future__ import annotations

from dataclasses import replace

from labkit import checks
from labkit.flops import ModelShape, model_flops_per_token


def _get(cfg, *names, default=None):
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return default


def shape_from_config(cfg, seq_len: int | None = None) -> ModelShape:
    """The shape of a decoder-only ``transformers`` config: GPT-2's ``n_layer/n_embd/n_head/n_inner``
    or Llama/Mistral/Qwen/Mixtral's ``num_hidden_layers/hidden_size/num_attention_heads/
    num_key_value_heads/intermediate_size/num_local_experts/num_experts_per_tok``. A config it cannot
    read is a ValueError naming the missing fields. Taught in chapter 3 (FLOPs)."""
    layers = _get(cfg, "num_hidden_layers", "n_layer", "num_layers")
    d = _get(cfg, "hidden_size", "n_embd", "d_model")
    heads = _get(cfg, "num_attention_heads", "n_head")
    vocab = _get(cfg, "vocab_size")
    missing = [n for n, v in (("layers", layers), ("hidden size", d), ("heads", heads), ("vocab_size", vocab))
               if v is None]
    if missing:
        raise ValueError(f"config={type(cfg).__name__}: no {', '.join(missing)} found; pass flops_per_token= "
                         "yourself (labkit.flops.model_flops_per_token of a ModelShape you build)")
    big = 2**40          # a stated size past this is no real model (and would overflow the FLOP count)
    layers, d, heads, vocab = (checks.count(f"config {n}", v, at_most=big) for n, v in
                               (("layers", layers), ("hidden size", d), ("heads", heads), ("vocab_size", vocab)))
    gpt2_style = getattr(cfg, "n_embd", None) is not None
    swiglu = not gpt2_style and getattr(cfg, "intermediate_size", None) is not None
    experts = checks.count("config num_local_experts", _get(cfg, "num_local_experts", "num_experts", default=1),
                           at_most=big)
    T = seq_len if seq_len is not None else _get(cfg, "n_positions", "max_position_embeddings", default=2048)
    return ModelShape(
        n_layers=layers, d_model=d, n_heads=heads, vocab_size=vocab, seq_len=T,
        d_ff=_get(cfg, "n_inner", "intermediate_size"), n_kv_heads=_get(cfg, "num_key_value_heads"),
        ffn="swiglu" if swiglu else "gelu", n_experts=max(1, experts),
        top_k=_get(cfg, "num_experts_per_tok", default=1) if experts > 1 else 1,
        tied_embeddings=checks.flag("config.tie_word_embeddings", _get(cfg, "tie_word_embeddings", default=True)),
        head_dim=_get(cfg, "head_dim") if not gpt2_style else None,
        bias=gpt2_style, norm="layernorm" if gpt2_style else "rmsnorm",
        pos_emb="learned" if gpt2_style else "rope", name=str(getattr(cfg, "model_type", "") or ""))


def matmul_params(module) -> int:
    """Parameters that multiply activations: all of a module's parameters (each counted once, so a
    tied embedding counts as the output layer) except those only held by ``nn.Embedding`` lookups —
    labkit's N of the 6N convention. Taught in chapter 3 (FLOPs)."""
    import torch

    seen, embedding_only = {}, set()
    for m in module.modules():
        for p in m.parameters(recurse=False):
            if isinstance(m, torch.nn.Embedding):
                embedding_only.add(id(p))
            else:
                seen[id(p)] = p.numel()
    for m in module.modules():
        if isinstance(m, torch.nn.Embedding):
            for p in m.parameters(recurse=False):
                if id(p) in seen:        # tied: also used by a Linear (counted there)
                    embedding_only.discard(id(p))
    return int(sum(n for i, n in seen.items() if i not in embedding_only))


def flops_per_token(model, *, seq_len: int | None = None, method: str = "palm") -> tuple[float, str]:
    """Training FLOPs per token of ``model`` and how they were found: from its ``config`` when it has a
    ``transformers`` one or is labkit's own GPT (:func:`labkit.flops.model_flops_per_token`, ``method``), a
    :class:`ModelShape` as is, else 6·N over :func:`matmul_params`. Taught in chapter 3 (FLOPs)."""
    if isinstance(model, ModelShape):
        s = model if seq_len is None else replace(model, seq_len=checks.count("seq_len", seq_len))
        return model_flops_per_token(s, method=method), f"{method}:ModelShape"
    cfg = getattr(model, "config", None)
    if callable(getattr(cfg, "shape", None)):           # labkit's own GPT: its GPTConfig knows its shape
        s = cfg.shape() if seq_len is None else replace(cfg.shape(), seq_len=checks.count("seq_len", seq_len))
        return model_flops_per_token(s, method=method), f"{method}:labkit GPTConfig"
    if cfg is not None and not isinstance(cfg, dict):
        s = shape_from_config(cfg, seq_len)
        return model_flops_per_token(s, method=method), f"{method}:config({s.name or type(cfg).__name__})"
    if hasattr(model, "parameters"):
        n = matmul_params(model)
        if n <= 0:
            raise ValueError(f"model={type(model).__name__} has no parameters outside embeddings; "
                             "pass flops_per_token= yourself")
        return 6.0 * n, "6N:parameters"
    raise checks.ArgumentTypeError(f"model must be a torch module, a transformers model or a ModelShape, "
                                   f"got {type(model).__name__}")

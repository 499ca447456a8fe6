"""Model shapes from Hugging Face ``transformers`` configs, FLOPs from a bare parameter count, and one
call that sets a formula beside an exact count of your own model.

:func:`from_hf_config` reads a config *offline* — a ``transformers`` config object, its ``to_dict()``,
or a ``config.json`` path (or the folder holding it) — and returns the :class:`labkit.flops.ModelShape`
the FLOP and parameter formulas need. transformers itself is never imported. Supported ``model_type``:

- ``gpt2``: ``n_embd``, ``n_layer``, ``n_head``, ``n_positions``, ``n_inner`` (None → 4·d); GELU MLP,
  biases, LayerNorm, learned positions, tied embeddings.
- ``llama``, ``mistral``, ``qwen2``: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
  ``num_key_value_heads`` (GQA; absent → no GQA), ``intermediate_size``, ``head_dim`` (absent → d/H);
  SwiGLU, RMSNorm, rope, untied unless ``tie_word_embeddings``. Biases (Llama's ``attention_bias``,
  Qwen2's q/k/v biases) change parameter counts by < 0.1 % and no matmul FLOPs; ``bias`` is set only
  when both attention and MLP have them (Llama ``attention_bias`` and ``mlp_bias``).
- ``mixtral``: as Mistral plus ``num_local_experts`` and ``num_experts_per_tok`` (MoE, top-k routing).

``seq_len`` defaults to ``max_position_embeddings`` (``n_positions``); pass the length you train at.
Mistral's ``sliding_window`` is not discounted, like causal masking: the formulas count the full T×T
scores a dense kernel computes.

Taught in chapter 3 (FLOPs).
"""
from __future__ import annotations

import json
import math
import numbers
import os
from pathlib import Path

from labkit import checks
from labkit.flops import METHODS, ModelShape, model_flops_per_token

__all__ = ["HF_MODEL_TYPES", "from_hf_config", "flops_per_token_from_params", "compare"]

HF_MODEL_TYPES = ("gpt2", "llama", "mistral", "qwen2", "mixtral")
PARAM_CONVENTIONS = ("6N", "8N")


def _config_dict(cfg) -> dict:
    """The config as a plain dict, from a config object (``to_dict()``), a dict or a config.json path."""
    if isinstance(cfg, dict):
        return cfg
    if isinstance(cfg, (str, os.PathLike)):
        path = Path(cfg)
        if os.fspath(cfg) == "":
            raise ValueError("cfg='' is not valid: use a config.json path, a folder holding one, a dict or a "
                             "transformers config")
        if path.is_dir():
            path = path / "config.json"
        checks.refuse_special(f"cfg={os.fspath(cfg)!r}:", path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cfg={os.fspath(cfg)!r}: cannot read a config.json there ({type(e).__name__}: "
                             f"{str(e)[:120]})") from None
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"cfg={os.fspath(cfg)!r}: {path} is not JSON ({str(e)[:120]})") from None
        if not isinstance(doc, dict):
            raise ValueError(f"cfg={os.fspath(cfg)!r}: {path} holds a JSON {type(doc).__name__}, not a config object")
        return doc
    to_dict = getattr(cfg, "to_dict", None)
    if callable(to_dict):
        d = to_dict()
        if isinstance(d, dict):
            return d
    raise checks.ArgumentTypeError(f"cfg must be a transformers config, a dict or a config.json path, got "
                                   f"{type(cfg).__name__} {cfg!r:.60}")


MAX_DIM = 2**40     # any size a config states (layers, widths, vocabulary, context): far past real models


def _get(d: dict, key: str, default=None, *, required: bool = True):
    """A config's count ``key``: an int in [1, MAX_DIM] (a 10**400-layer config is refused, not overflowed)."""
    v = d.get(key, default)
    if v is None and required:
        raise ValueError(f"cfg: a {d.get('model_type')!r} config needs {key!r}; it has {sorted(d)[:12]}")
    if v is not None:
        v = checks.count(f"cfg {key}", v, at_most=MAX_DIM)
    return v


def from_hf_config(cfg, *, seq_len: int | None = None) -> ModelShape:
    """The :class:`~labkit.flops.ModelShape` of a ``transformers`` decoder config (see the module
    docstring for the families and the keys read). ``cfg``: a config object, a dict or a config.json
    path (or its folder). Unknown ``model_type`` → ValueError listing :data:`HF_MODEL_TYPES`.

    Taught in chapter 3 (FLOPs).
    """
    d = _config_dict(cfg)
    mt = d.get("model_type")
    if mt not in HF_MODEL_TYPES:
        raise ValueError(f"cfg model_type={mt!r} is not supported: choose one of {list(HF_MODEL_TYPES)} "
                         "(or build a labkit.flops.ModelShape yourself)")
    name = d.get("_name_or_path") or mt
    name = name if isinstance(name, str) else mt
    if mt == "gpt2":
        t = seq_len if seq_len is not None else _get(d, "n_positions")
        return ModelShape(n_layers=_get(d, "n_layer"), d_model=_get(d, "n_embd"), n_heads=_get(d, "n_head"),
                          vocab_size=_get(d, "vocab_size"), seq_len=t, d_ff=_get(d, "n_inner", required=False),
                          ffn="gelu",
                          tied_embeddings=checks.flag("tie_word_embeddings", d.get("tie_word_embeddings", True)),
                          bias=True, norm="layernorm", pos_emb="learned", name=name)
    t = seq_len if seq_len is not None else _get(d, "max_position_embeddings")
    heads = _get(d, "num_attention_heads")
    moe = {}
    if mt == "mixtral":
        moe = dict(n_experts=_get(d, "num_local_experts"), top_k=_get(d, "num_experts_per_tok"))
    attn_bias = checks.flag("attention_bias", d.get("attention_bias", False))   # both checked, then combined
    bias = checks.flag("mlp_bias", d.get("mlp_bias", False)) and attn_bias
    return ModelShape(n_layers=_get(d, "num_hidden_layers"), d_model=_get(d, "hidden_size"), n_heads=heads,
                      vocab_size=_get(d, "vocab_size"), seq_len=t, d_ff=_get(d, "intermediate_size"),
                      n_kv_heads=_get(d, "num_key_value_heads", required=False) or heads,
                      head_dim=_get(d, "head_dim", required=False),
                      ffn="swiglu", tied_embeddings=checks.flag("tie_word_embeddings",
                                                                d.get("tie_word_embeddings", False)),
                      bias=bias, norm="rmsnorm", pos_emb="rope", name=name, **moe)


def flops_per_token_from_params(n_params, *, convention: str = "6N") -> float:
    """Training FLOPs per token from a bare parameter count N, no shape needed.

    ``"6N"`` (Kaplan et al. 2020 §2.1): forward 2N + backward 4N, attention scores and causal masking
    ignored, N the parameters that multiply activations (exclude embedding *lookups*; see
    :mod:`labkit.flops`). ``"8N"``: the hardware FLOPs with full activation recomputation (one extra
    forward, PaLM App. B) — an HFU numerator, not MFU. ``n_params`` may be a float such as 7.5e9.

    Taught in chapter 3 (FLOPs).
    """
    checks.one_of("convention", convention, PARAM_CONVENTIONS)
    n = checks.positive("n_params", n_params)
    return checks.finite_result("FLOPs per token", (6.0 if convention == "6N" else 8.0) * n, n_params=n_params)


def compare(model, inputs, shape: ModelShape, *, method: str = "megatron", causal: bool = False,
            tokens: int | None = None) -> dict:
    """An exact count of ``model`` (:func:`labkit.flops.count_flops`, forward + backward) beside a
    formula for ``shape``: ``{"counted_per_token", "formula_per_token", "ratio", "tokens", "method",
    "counted": FlopCount}``, ratio = formula ÷ counted.

    ``tokens`` (default: the elements of ``input_ids`` or of the first tensor in ``inputs``) is how many
    tokens the pass processed; the formula is evaluated at the inputs' sequence length. With eager
    attention and ``causal=False`` the ``"megatron"`` formula is the count's convention (every matmul,
    full T×T scores); SDPA backward is counted 2.5× its forward by torch.

    Taught in chapter 3 (FLOPs).
    """
    from labkit.flops import count_flops

    checks.one_of("method", method, METHODS)
    if not isinstance(shape, ModelShape):
        raise checks.ArgumentTypeError(f"shape must be a labkit.flops.ModelShape, got {type(shape).__name__}")
    first = _first_tensor(inputs)
    if tokens is None:
        if first is None:
            raise ValueError("tokens: give the token count; no tensor found in inputs to count it from")
        tokens = math.prod(first.shape)
    tokens = checks.count("tokens", tokens)
    seq = int(first.shape[-1]) if first is not None and len(first.shape) else shape.seq_len
    counted = count_flops(model, inputs)
    formula = model_flops_per_token(shape, method=method, causal=causal, seq_len=seq)
    per = counted.total / tokens
    return {"counted_per_token": per, "formula_per_token": formula, "ratio": formula / per if per else math.inf,
            "tokens": tokens, "seq_len": seq, "method": method, "counted": counted}


def _first_tensor(inputs):
    if isinstance(inputs, dict):
        inputs = inputs.get("input_ids", next(iter(inputs.values()), None))
    if isinstance(inputs, (tuple, list)):
        inputs = inputs[0] if inputs else None
    shape = getattr(inputs, "shape", None)
    if shape is None or not all(isinstance(s, numbers.Integral) for s in shape):
        return None
    return inputs

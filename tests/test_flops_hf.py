"""FLOPs per token from `transformers` configs (issue #17), checked against an exact count.

The acceptance test: FLOPs per token from the configs of GPT-2, Llama-3-8B, Mistral-7B and Mixtral-8x7B,
built offline from their published config.json values, agree with an exact ``labkit.flops.count_flops``
(FlopCounterMode) count of the same architecture at small width (hidden sizes, layers, vocabulary and
sequence shrunk; GQA ratio, SwiGLU, expert count and top-k kept) within 2 %.

CONVENTION (both sides): model FLOPs = forward + backward (backward = 2 × forward) matmul FLOPs, each
multiply-add 2 FLOPs, including the attention scores QKᵀ and attention·V (full T×T: causal and
sliding-window masking NOT discounted — eager attention computes the whole matrix) and the logits;
embedding lookups, norms, softmax, activations, rotary embeddings and the loss are excluded; for MoE
only the top-k selected experts' matmuls plus the router. That is ``method="megatron", causal=False``;
the count uses ``attn_implementation="eager"`` and eager experts (FlopCounterMode counts every mm/bmm).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from labkit import flops, memory
from labkit.flops import mfu
from labkit.model import shapes

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

# Published config.json values (offline; only the keys that set the shape).
PUBLISHED = {
    # https://huggingface.co/openai-community/gpt2/blob/main/config.json
    "gpt2": (transformers.GPT2Config, "GPT2LMHeadModel",
             dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024, n_ctx=1024, vocab_size=50257)),
    # https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
    "llama3-8b": (transformers.LlamaConfig, "LlamaForCausalLM",
                  dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    # https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
    "mistral-7b": (transformers.MistralConfig, "MistralForCausalLM",
                   dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
                        sliding_window=4096, rope_theta=10000.0, tie_word_embeddings=False)),
    # https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
    "mixtral-8x7b": (transformers.MixtralConfig, "MixtralForCausalLM",
                     dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                          num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
                          num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6, tie_word_embeddings=False)),
}
# Parameter counts the model cards / HF report (sum of p.numel() of the full model).
PUBLISHED_PARAMS = {"gpt2": 124_439_808, "llama3-8b": 8_030_261_248, "mistral-7b": 7_241_732_096,
                    "mixtral-8x7b": 46_702_792_704}

# Small width: hidden /64, layers 2, vocab 512, T 32. Heads /4 keep the GQA ratio 4:1 (32:8 -> 8:2),
# d_ff/d = 3.5 is kept (14336/4096 -> 224/64), experts 8 and top-2 kept. GPT-2: 12 heads of 8.
SMALL = {
    "gpt2": dict(n_embd=96, n_layer=2, n_head=12, n_positions=32, n_ctx=32, vocab_size=512),
    "llama3-8b": dict(hidden_size=64, intermediate_size=224, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=32),
    "mistral-7b": dict(hidden_size=64, intermediate_size=224, num_hidden_layers=2, num_attention_heads=8,
                       num_key_value_heads=2, vocab_size=512, max_position_embeddings=32, sliding_window=16),
    "mixtral-8x7b": dict(hidden_size=64, intermediate_size=224, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=32),
}
SEQ, BATCH = 32, 2


def _config(name, small=False):
    cls, _, values = PUBLISHED[name]
    cfg = cls(**{**values, **(SMALL[name] if small else {})})
    if small:
        cfg.bos_token_id = cfg.eos_token_id = 0   # GPT-2's 50256 is outside the small vocabulary
    return cfg


def _model(name, cfg):
    cfg._attn_implementation = "eager"             # explicit bmm's: FlopCounterMode sees every matmul
    if hasattr(cfg, "num_local_experts"):
        cfg._experts_implementation = "eager"       # a loop over the selected experts only
    torch.manual_seed(0)
    return getattr(transformers, PUBLISHED[name][1])(cfg)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_full_config_shape_matches_the_published_model(name):
    """The shape read from the full published config has the model card's parameter count exactly."""
    shape = shapes.from_hf_config(_config(name))
    assert flops.n_params(shape) == PUBLISHED_PARAMS[name]
    assert shape.ffn == ("gelu" if name == "gpt2" else "swiglu")
    assert shape.kv_heads == (12 if name == "gpt2" else 8)
    assert (shape.n_experts, shape.top_k) == ((8, 2) if name == "mixtral-8x7b" else (1, 1))
    # the 6N term alone (no attention scores), from the config: Llama-3-8B's N = 8.03e9 - 0.53e9 lookup table
    assert shapes.flops_per_token_from_params(flops.n_matmul_params(shape)) == \
        flops.model_flops_per_token(shape, method="6N")


@pytest.mark.parametrize("name,preset,seq", [("gpt2", "gpt2-124m", 1024), ("llama3-8b", "llama3-8b", 8192),
                                             ("mixtral-8x7b", "mixtral-8x7b", 4096)])
def test_full_config_flops_equal_the_cited_presets(name, preset, seq):
    shape = shapes.from_hf_config(_config(name), seq_len=seq)
    for method in flops.METHODS:
        assert flops.model_flops_per_token(shape, method=method) == \
            flops.model_flops_per_token(flops.preset(preset), method=method)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_acceptance_config_flops_agree_with_an_exact_count_at_small_width(name):
    """Formula from the (small) config vs FlopCounterMode on the same HF model: within 2 % (in fact exact)."""
    cfg = _config(name, small=True)
    shape = shapes.from_hf_config(cfg)
    model = _model(name, cfg)
    assert flops.n_params(shape) == sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    r = shapes.compare(model, {"input_ids": ids, "labels": ids}, shape, method="megatron", causal=False)
    assert r["tokens"] == BATCH * SEQ and r["seq_len"] == SEQ
    assert r["ratio"] == pytest.approx(1.0, rel=0.02), (name, r["formula_per_token"], r["counted_per_token"])
    assert r["counted"].backward == pytest.approx(2 * r["counted"].forward, rel=0.02)


def test_from_dict_and_config_json_path_and_folder(tmp_path):
    cfg = _config("llama3-8b")
    d = cfg.to_dict()
    (tmp_path / "config.json").write_text(json.dumps(d))
    want = shapes.from_hf_config(cfg)
    assert shapes.from_hf_config(d) == want
    assert shapes.from_hf_config(tmp_path / "config.json") == want
    assert shapes.from_hf_config(str(tmp_path)) == want
    assert shapes.from_hf_config(d, seq_len=2048).seq_len == 2048


def test_qwen2_and_tied_embeddings():
    d = dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
             num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
             tie_word_embeddings=True)          # Qwen2-0.5B's config.json shape keys
    s = shapes.from_hf_config(d)
    assert s.tied_embeddings and s.kv_heads == 2 and s.hd == 64 and s.ffn == "swiglu"


def test_unknown_model_type_lists_the_supported_ones(tmp_path):
    with pytest.raises(ValueError, match=r"model_type='bert'.*gpt2.*llama.*mistral.*qwen2.*mixtral"):
        shapes.from_hf_config({"model_type": "bert", "hidden_size": 768})
    with pytest.raises(ValueError, match="llama.* config needs"):
        shapes.from_hf_config({"model_type": "llama", "hidden_size": 64})
    with pytest.raises(ValueError, match="cfg"):
        shapes.from_hf_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="cfg"):
        shapes.from_hf_config(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="cfg"):
        shapes.from_hf_config(42)
    with pytest.raises(ValueError, match="n_head"):
        shapes.from_hf_config({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 0,
                               "n_positions": 8, "vocab_size": 10})


def test_flops_from_a_bare_parameter_count():
    assert shapes.flops_per_token_from_params(7.5e9) == 4.5e10
    assert shapes.flops_per_token_from_params(124_000_000, convention="8N") == 8 * 124e6
    assert shapes.flops_per_token_from_params(np.float64(1e9)) == 6e9
    for bad, param in ((0, "n_params"), ("7e9", "n_params"), (float("nan"), "n_params"), (1e9, "convention")):
        kw = {"convention": "7N"} if param == "convention" else {}
        with pytest.raises(ValueError, match=param):
            shapes.flops_per_token_from_params(bad, **kw)


def test_compare_refuses_bad_arguments():
    with pytest.raises(ValueError, match="shape"):
        shapes.compare(lambda x: x, torch.zeros(2, 3), "gpt2")
    with pytest.raises(ValueError, match="method"):
        shapes.compare(lambda x: x, torch.zeros(2, 3), flops.preset("gpt2-124m"), method="kaplan")
    with pytest.raises(ValueError, match="tokens"):
        shapes.compare(lambda x: x, {"a": 1}, flops.preset("gpt2-124m"))


def test_mfu_from_achieved_flops_per_gpu_as_llama3_quotes_it():
    """Llama 3 (Dubey et al. 2024, Table 4): 430, 400 and 380 TFLOP/s per GPU on H100s quoted as
    43 %, 41 % and 38 % BF16 MFU, against the H100 SXM's 989 TFLOP/s dense BF16 peak."""
    peak = 989e12
    for tflops, quoted in ((430, 0.43), (400, 0.41), (380, 0.38)):
        assert mfu.mfu_from_flops(tflops * 1e12, peak) == pytest.approx(quoted, abs=0.01)
    assert mfu.hfu_from_flops(500e12, peak) == pytest.approx(500 / 989)
    with pytest.raises(ValueError, match=r"achieved_flops_per_device.*per device|> 100%"):
        mfu.mfu_from_flops(8 * 400e12, peak)
    with pytest.raises(ValueError, match="peak_flops"):
        mfu.mfu_from_flops(400e12, 0)


def test_memory_accepts_an_integral_float_parameter_count():
    assert memory.model_state_bytes(7.5e9).total == memory.model_state_bytes(7_500_000_000).total
    with pytest.raises(ValueError, match="n_params"):
        memory.model_state_bytes(7.5e9 + 0.5)
    with pytest.raises(ValueError, match="n_params"):
        memory.model_state_bytes(float("inf"))

"""labkit.flops: parameter counts and FLOP formulas against published numbers; exact counting."""
from __future__ import annotations

import os

import pytest

from labkit import flops as F


# ---------------------------------------------------------------- nanoGPT GPT-2 124M
def test_gpt2_124m_parameter_count_matches_nanogpt():
    # nanoGPT model.py (https://github.com/karpathy/nanoGPT/blob/master/model.py): GPT-2 124M with
    # tied wte/lm_head has 124,439,808 parameters; get_num_params() subtracts the position embedding
    # (wpe) and prints "number of parameters: 123.65M".
    s = F.preset("gpt2-124m")
    assert F.n_params(s) == 124_439_808
    assert F.n_params(s, position_embeddings=False) == 123_653_376
    assert f"{F.n_params(s, position_embeddings=False) / 1e6:.2f}M" == "123.65M"
    assert F.n_matmul_params(s) == 123_653_376          # the N of 6N for a tied model


def test_gpt2_124m_flops_per_token_matches_nanogpt_estimate_mfu():
    # nanoGPT model.py estimate_mfu: flops_per_token = 6*N + 12*L*H*Q*T with N = get_num_params(),
    # L, H, Q, T = n_layer, n_head, n_embd // n_head, block_size
    N, L, H, Q, T = 123_653_376, 12, 12, 64, 1024
    assert F.model_flops_per_token(F.preset("gpt2-124m"), method="palm") == 6 * N + 12 * L * H * Q * T
    # causal halving is an explicit choice: only the attention term halves
    full = F.model_flops_per_token(F.preset("gpt2-124m"), method="palm")
    half = F.model_flops_per_token(F.preset("gpt2-124m"), method="palm", causal=True)
    assert full - half == 6 * L * H * Q * T


def test_published_parameter_counts():
    # Llama 3 (Dubey et al. 2024, Table 3) 8B/70B/405B; Mixtral 8x7B (Jiang et al. 2024) 46.7B total,
    # 12.9B active; PaLM (Chowdhery et al. 2022, Table 1 / App. B) 540.35B
    assert F.n_params(F.preset("llama3-8b")) / 1e9 == pytest.approx(8.03, abs=0.01)
    assert F.n_params(F.preset("llama3-70b")) / 1e9 == pytest.approx(70.55, abs=0.01)
    assert F.n_params(F.preset("llama3-405b")) / 1e9 == pytest.approx(405.85, abs=0.01)
    mix = F.preset("mixtral-8x7b")
    assert F.n_params(mix) / 1e9 == pytest.approx(46.7, abs=0.05)
    assert F.n_active_params(mix) / 1e9 == pytest.approx(12.9, abs=0.05)
    assert F.n_params(F.preset("palm-540b")) / 1e9 == pytest.approx(540.35, abs=0.01)


# ---------------------------------------------------------------- Megatron-LM SC21 (Narayanan et al. 2021)
# Table 1 rows: (params B, heads, hidden, layers, GPUs, batch, TFLOP/s per GPU, % of peak, aggregate PF/s)
# https://arxiv.org/abs/2104.04473 ; V = 51,200, s = 2,048, A100 peak 312 TFLOP/s
MEGATRON_ROWS = [
    (1.7, 24, 2304, 24, 32, 512, 137, 44, 4.4),
    (7.5, 32, 4096, 36, 128, 512, 142, 46, 18.2),
    (39.1, 64, 8192, 48, 512, 1536, 138, 44, 70.8),
    (145.6, 96, 12288, 80, 1536, 2304, 148, 47, 227.1),
    (1008.0, 160, 25600, 128, 3072, 3072, 163, 52, 502.0),
]


def _megatron_shape(heads, h, layers):
    return F.ModelShape(n_layers=layers, d_model=h, n_heads=heads, vocab_size=51200, seq_len=2048, bias=True)


@pytest.mark.parametrize("row", MEGATRON_ROWS)
def test_megatron_sc21_table1(row):
    p_b, heads, h, n_layers, gpus, batch, tflops, pct, agg_pf = row
    l = n_layers  # noqa: E741 - the paper's symbol
    s, V = 2048, 51200
    shape = _megatron_shape(heads, h, l)
    # eq. (2): P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)); labkit adds only the final LayerNorm (2h)
    eq2 = 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    assert F.n_params(shape) == pytest.approx(eq2 + 2 * h, rel=1e-12)
    assert F.n_params(shape, convention="megatron-eq2") == pytest.approx(eq2, rel=1e-12)   # the named convention
    assert round(F.n_params(shape) / 1e9, 1) == p_b
    # eq. (3): F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration, with full recomputation
    eq3 = 96 * batch * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    ours = F.hardware_flops_per_token(shape, method="megatron", recompute="full") * batch * s
    assert ours == pytest.approx(eq3, rel=1e-12)
    # % of the 312 TFLOP/s A100 peak and the aggregate, within the table's rounding
    assert round(100 * tflops / 312) == pct
    assert abs(tflops * gpus / 1000 - agg_pf) <= 0.5 * gpus / 1000 + 0.05


def test_megatron_sc21_end_to_end_training_times():
    # SC21 §5.1 eq. (4): time ≈ 8·T·P / (n·X): GPT-3 175B, 300B tokens, 1024 GPUs at 140 TFLOP/s
    # "≈ 34 days"; 1T model, 450B tokens, 3072 GPUs at 163 TFLOP/s "≈ 84 days".
    day = 86400
    gpt3 = F.n_params(F.preset("gpt3-175b"))
    t_gpt3 = 300e9 * 8 * gpt3 / (1024 * 140e12) / day
    one_t = F.n_params(_megatron_shape(160, 25600, 128))
    t_1t = 450e9 * 8 * one_t / (3072 * 163e12) / day
    assert round(t_gpt3) == 34 and round(t_1t) == 84
    # 8·P is the 6N + full-recompute 2N convention of labkit's "6N" hardware count
    assert F.hardware_flops_per_token(F.preset("gpt3-175b"), method="6N", recompute="full") == \
        8 * F.n_matmul_params(F.preset("gpt3-175b"))


# ---------------------------------------------------------------- conventions
def test_6pd_vs_8pd_full_recompute():
    s = F.preset("gpt2-124m")
    n = F.n_matmul_params(s)
    assert F.model_flops_per_token(s, method="6N") == 6 * n
    assert F.hardware_flops_per_token(s, method="6N", recompute="full") == 8 * n
    assert F.hardware_flops_per_token(s, method="6N", recompute="none") == 6 * n


def test_selective_recompute_adds_only_attention_core():
    # Korthikanti et al. 2022 §5: selective recompute re-runs QK^T, softmax, dropout, ·V only
    s = F.preset("gpt3-175b")
    model = F.model_flops_per_token(s, method="megatron")
    sel = F.hardware_flops_per_token(s, method="megatron", recompute="selective")
    full = F.hardware_flops_per_token(s, method="megatron", recompute="full")
    assert sel - model == 4 * 96 * 12288 * 2048
    assert model < sel < full
    # one forward of the attention core: 4sh / (72h^2 + 12sh) per layer-token = 0.9% for GPT-3 175B.
    # (Korthikanti et al. quote 2.7%: their accounting charges more than one forward of the core;
    # labkit counts what the policy must execute at least, and says so in the docstring.)
    assert (sel - model) / model == pytest.approx(4 * 2048 / (72 * 12288 + 12 * 2048 + 6 * 50257 / 96), rel=1e-9)


def test_megatron_counts_gqa_swiglu_moe_and_logits():
    base = dict(n_layers=2, d_model=512, n_heads=8, vocab_size=1000, seq_len=128)
    dense = F.forward_flops_per_token(F.ModelShape(**base))
    gqa = F.forward_flops_per_token(F.ModelShape(**base, n_kv_heads=2))
    assert dense - gqa == 2 * 2 * 2 * 512 * (512 - 128)    # K and V projections shrink 4x, 2 layers
    swi = F.forward_flops_per_token(F.ModelShape(**base, ffn="swiglu", d_ff=1024))
    gelu = F.forward_flops_per_token(F.ModelShape(**base, d_ff=1024))
    assert swi - gelu == 2 * 2 * 512 * 1024
    moe = F.ModelShape(**base, n_experts=8, top_k=2)
    assert F.forward_flops_per_token(moe) - dense == 2 * (4 * 512 * 2048 + 2 * 512 * 8)
    assert F.forward_flops_per_token(F.ModelShape(**base), logits=False) == dense - 2 * 512 * 1000


def test_flops_per_step_counts_real_tokens():
    s = F.preset("gpt2-124m")
    per = F.model_flops_per_token(s)
    assert F.flops_per_step(s, 3000) == 3000 * per
    assert F.flops_per_step(s, 3000, hardware=True, recompute="full") == \
        3000 * F.hardware_flops_per_token(s, recompute="full")
    with pytest.raises(ValueError, match="hardware=True"):
        F.flops_per_step(s, 10, recompute="full")


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(n_layers=0), "n_layers=0"), (dict(d_model=-1), "d_model=-1"), (dict(n_heads=5), "divisible"),
    (dict(n_kv_heads=3), "n_kv_heads=3"), (dict(ffn="relu"), "ffn='relu'"),
    (dict(top_k=3, n_experts=2), "top_k=3"), (dict(seq_len=1.5), "seq_len must be an int, got float 1.5"),
])
def test_bad_shapes_name_the_parameter(kwargs, match):
    base = dict(n_layers=2, d_model=64, n_heads=4, vocab_size=100, seq_len=16)
    with pytest.raises(ValueError, match=match):
        F.ModelShape(**{**base, **kwargs})


def test_bad_arguments_name_the_parameter():
    s = F.preset("gpt2-124m")
    with pytest.raises(ValueError, match="method='7N'"):
        F.model_flops_per_token(s, method="7N")
    with pytest.raises(ValueError, match="recompute='some'"):
        F.hardware_flops_per_token(s, recompute="some")
    with pytest.raises(ValueError, match="tokens=0"):
        F.flops_per_step(s, 0)
    with pytest.raises(ValueError, match="gpt5"):
        F.preset("gpt5")
    with pytest.raises(TypeError, match="ModelShape"):
        F.n_params({"n_layers": 2})


# ---------------------------------------------------------------- exact counting
@pytest.mark.slow   # importing transformers alone takes 10-25 s on the 2-core CI machine
def test_exact_count_of_a_small_gpt2_matches_the_megatron_formula():
    # Convention aligned: full (not causal-halved) attention, matmul FLOPs only, embeddings 0,
    # training = forward + backward with backward = 2x forward for every matmul. HF GPT-2 with eager
    # attention runs QK^T and ·V as full bmm's, exactly what method="megatron", causal=False counts.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=256,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")
    x = torch.randint(0, 256, (2, 64))
    count = F.count_flops(model, {"input_ids": x, "labels": x})
    shape = F.ModelShape(n_layers=2, d_model=64, n_heads=4, vocab_size=256, seq_len=64, bias=True)
    analytic = F.model_flops_per_token(shape, method="megatron", causal=False) * x.numel()
    assert count.total == pytest.approx(analytic, rel=0.02)
    assert count.backward == pytest.approx(2 * count.forward, rel=0.01)
    assert "aten.bmm" in count.by_op and not any("embedding" in k for k in count.by_op)


def test_exact_count_of_a_plain_torch_block_matches_the_formula():
    # the same convention without transformers: one pre-norm block with explicit QK^T and ·V matmuls
    torch = pytest.importorskip("torch")
    nn = torch.nn
    d, h, t, v, b = 32, 4, 16, 50, 3

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv, self.o = nn.Embedding(v, d), nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down, self.head = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.Linear(d, v, bias=False)

        def forward(self, idx):
            x = self.emb(idx)
            q, k, val = self.qkv(x).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) / (d // h) ** 0.5, dim=-1)
            x = x + self.o((att @ val).transpose(1, 2).reshape(b, t, d))
            x = x + self.down(torch.nn.functional.gelu(self.up(x)))
            return self.head(x)

    c = F.count_flops(Tiny(), torch.randint(0, v, (b, t)))
    shape = F.ModelShape(n_layers=1, d_model=d, n_heads=h, vocab_size=v, seq_len=t, tied_embeddings=False)
    assert c.total == pytest.approx(F.model_flops_per_token(shape, method="megatron") * b * t, rel=0.02)


def test_cpu_sdpa_kernel_is_counted():
    # PLATFORM_NOTES: FlopCounterMode has no formula for _scaled_dot_product_flash_attention_for_cpu;
    # labkit registers torch's own sdpa helpers for it (forward 4·B·H·T²·Q FLOPs, full T×T).
    torch = pytest.importorskip("torch")
    b, h, t, q = 2, 4, 64, 16
    qkv = torch.randn(b, h, t, q, requires_grad=True)
    c = F.count_flops(lambda z: torch.nn.functional.scaled_dot_product_attention(z, z, z, is_causal=True), qkv)
    assert c.forward == 4 * b * h * t * t * q
    assert c.backward > 0 and any("for_cpu" in k for k in c.by_op)


def test_megatron_eq2_convention_omits_only_the_final_norm():
    """n_params(convention="megatron-eq2") = labkit's count − the final norm (2h LayerNorm, h RMSNorm), nothing
    else; a bad convention is refused by name. The formulas moved to a package (labkit.flops + .counter)
    with the same public names."""
    gpt = _megatron_shape(24, 2304, 24)
    assert F.n_params(gpt) - F.n_params(gpt, convention="megatron-eq2") == 2 * 2304
    llama = F.preset("llama3-8b")
    assert F.n_params(llama) - F.n_params(llama, convention="megatron-eq2") == llama.d_model
    assert F.n_params(gpt, embeddings=False) - F.n_params(gpt, embeddings=False, convention="megatron-eq2") == 4608
    with pytest.raises(ValueError, match="convention"):
        F.n_params(gpt, convention="eq2")
    from labkit.flops import counter
    assert F.count_flops is counter.count_flops and F.FlopCount is counter.FlopCount
    assert "PARAM_CONVENTIONS" in F.__all__ and F.PARAM_CONVENTIONS == ("labkit", "megatron-eq2")

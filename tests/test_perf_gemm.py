"""labkit.perf.gemm (chapter 24): the roofline of a GEMM and the shape efficiency of a step."""
import pytest

from labkit import flops
from labkit.memory.estimate import activation_bytes
from labkit.perf import cluster
from labkit.perf.gemm import Gemm, activation_traffic_bytes, gemm_seconds, layer_gemms, shape_efficiency

A100 = cluster("dgx-a100")


def test_a_gemm_is_math_bound_above_the_ridge_and_memory_bound_below():
    big, thin = Gemm("big", 4096, 4096, 4096), Gemm("thin", 4096, 4096, 16)
    rate, bw = 156e12, 2e12                                   # ridge: 78 FLOP/B
    assert gemm_seconds(big, math_flops=rate, memory_bw=bw, operand_bytes=2) == pytest.approx(big.flops / rate)
    t = gemm_seconds(thin, math_flops=rate, memory_bw=bw, operand_bytes=2)
    assert t == pytest.approx(2 * (4096 * 16 * 2 + 4096 * 4096) / bw) and t > thin.flops / rate
    with pytest.raises(ValueError, match="memory_bw"):
        gemm_seconds(big, math_flops=rate, memory_bw=0, operand_bytes=2)
    with pytest.raises(TypeError, match="Gemm"):
        gemm_seconds((1, 2, 3), math_flops=rate, memory_bw=bw, operand_bytes=2)


def test_layer_gemms_split_by_tp_and_add_the_scores_without_flash():
    s = flops.preset("gpt2-124m")
    one = {g.name: g for g in layer_gemms(s, micro_batch=2, tp=1, flash_attention=True)}
    two = {g.name: g for g in layer_gemms(s, micro_batch=2, tp=2, flash_attention=False)}
    assert one["qkv"].m == 2 * s.seq_len and one["qkv"].n == 3 * s.d_model and two["qkv"].n == 3 * s.d_model // 2
    assert two["mlp down"].k == s.ff // 2 and "scores QK^T" not in one and two["scores QK^T"].batch == 2 * 6
    full = {g.name: g for g in layer_gemms(s, micro_batch=2, tp=1, flash_attention=False)}
    per_layer = sum(g.flops for n, g in full.items() if n != "logits")
    assert per_layer * s.n_layers + full["logits"].flops == pytest.approx(
        flops.forward_flops_per_token(s) * 2 * s.seq_len)            # every forward matmul of 2 sequences, once
    with pytest.raises(ValueError, match="tp=5"):
        layer_gemms(s, tp=5)


def test_traffic_counts_korthikantis_activations_five_or_seven_passes():
    s = flops.preset("gpt2-124m")
    stored = activation_bytes(s, 1, tp=2, flash_attention=False)
    assert activation_traffic_bytes(s, micro_batch=1, tp=2, flash_attention=False) == 5 * stored
    assert activation_traffic_bytes(s, micro_batch=1, tp=2, flash_attention=False, recompute="full") == 7 * stored


def test_small_d_model_and_fine_tp_reach_less_of_the_peak():
    kw = dict(micro_batch=1, cluster=A100, dtype="bf16", achievable=0.6, flash_attention=False)
    small = shape_efficiency(flops.ModelShape(n_layers=24, d_model=2304, n_heads=24, vocab_size=51200, seq_len=2048),
                             tp=1, **kw)
    large = shape_efficiency(flops.ModelShape(n_layers=80, d_model=12288, n_heads=96, vocab_size=51200, seq_len=2048),
                             tp=8, **kw)
    assert 0 < small < large < 1 and large - small > 0.05
    shape = flops.preset("llama3-8b")
    assert shape_efficiency(shape, tp=8, **kw) < shape_efficiency(shape, tp=1, **kw)     # the split GEMMs shrink
    flash = shape_efficiency(shape, tp=1, **{**kw, "flash_attention": True})
    assert flash > shape_efficiency(shape, tp=1, **kw)                                   # no s×s scores in HBM
    with pytest.raises(ValueError, match="no catalogued HBM"):
        shape_efficiency(shape, tp=1, **{**kw, "cluster": object()})

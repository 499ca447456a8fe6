"""The performance model calibrated from one published run (labkit.perf.calibrate) and its fp8 layout dtype.

Published rows with full layouts: Megatron-Bridge's performance summary (NVIDIA-NeMo/Megatron-Bridge,
docs/performance-summary.md, "25.11 NeMo Container", System: DGX-H100, FP8-CS rows) and Llama 3's Table 4
(Dubey et al. 2024). Each check calibrates the achievable fraction on ONE row and predicts the others.
"""
import pytest

from labkit import flops
from labkit.perf import Layout, calibrate_achievable, cluster, predict

MB = "Megatron-Bridge performance summary, 25.11 container, DGX-H100 FP8-CS"
# (model, GPUs, global batch, layout kwargs, published tokens/s/GPU, published model TFLOP/s/GPU); sequence 8192,
# micro-batch 1; FSDP=1 → "fsdp", FSDP=0 → Megatron's distributed optimizer ("zero1") with sequence parallelism
MB_H100_FP8 = [
    ("llama3-8b", 8, 128, dict(strategy="fsdp"), 14451, 744),
    ("llama3-70b", 64, 128, dict(tp=4, pp=8, schedule="interleaved", virtual_stages=5, strategy="zero1",
                                 sequence_parallel=True), 1602, 719),
    ("llama3-405b", 1024, 512, dict(tp=8, pp=8, cp=2, schedule="interleaved", virtual_stages=8, strategy="zero1",
                                    sequence_parallel=True), 292, 737),
]


def _layout(gpus, kw):
    return Layout(dp=gpus // (kw.get("tp", 1) * kw.get("pp", 1) * kw.get("cp", 1)), dtype="fp8", **kw)


def test_the_published_tflops_count_causal_attention_as_labkit_does():
    """The transcription is self-consistent: model TFLOP/s ÷ tokens/s = labkit's causal FLOPs per token
    (Megatron's convention: 6N-style matmuls + causal attention) to 0.2 % on every row."""
    for name, *_, tok, tflops in MB_H100_FP8:
        fpt = flops.model_flops_per_token(flops.preset(name, seq_len=8192), method="megatron", causal=True)
        assert tflops * 1e12 / tok == pytest.approx(fpt, rel=2e-3), name


def test_fp8_calibrated_on_llama3_8b_predicts_70b_and_405b_within_5_points(capsys):
    """Calibrated on the 8B row (FSDP on one node), the 70B (TP4 PP8 v5) and 405B (TP8 PP8 CP2 v8) rows'
    MFU within 5 points; MFU in labkit's default convention against the bf16 peak for both sides."""
    name, gpus, B, kw, tok, _ = MB_H100_FP8[0]
    cal = calibrate_achievable(name, _layout(gpus, kw), cluster("dgx-h100", nodes=1), global_batch=B, seq_len=8192,
                               tokens_per_s_per_gpu=tok, source=MB)
    assert 0.3 < cal.achievable < 0.8 and "solved from" in cal.describe()
    for name, gpus, B, kw, tok, _ in MB_H100_FP8:
        pr = predict(name, _layout(gpus, kw), cluster("dgx-h100", nodes=gpus // 8), global_batch=B, seq_len=8192,
                     achievable=cal.achievable)
        published = tok * pr.model_flops_per_token / pr.peak_flops
        with capsys.disabled():
            print(f"\n{name} fp8 {gpus} GPUs: predicted MFU {pr.mfu:.1%} vs published {published:.1%} "
                  f"({pr.tokens_per_s_per_gpu:,.0f} vs {tok:,} tokens/s/GPU; calibrated {cal.achievable:.1%})", end="")
        assert abs(pr.mfu - published) <= 0.05, name
        assert any("fp8 dense peak" in a for a in pr.assumptions)


def test_fp8_makes_the_linear_layers_faster_not_the_attention():
    """fp8 halves the GEMM time of the linear layers only: the step is faster than bf16 but not 2×."""
    kw = dict(global_batch=64, seq_len=8192)
    bf16 = predict("llama3-8b", Layout(dp=8), cluster("dgx-h100"), **kw)
    fp8 = predict("llama3-8b", Layout(dp=8, dtype="fp8"), cluster("dgx-h100"), **kw)
    assert 1.3 < bf16.compute_s / fp8.compute_s < 2.0
    assert fp8.peak_flops == bf16.peak_flops            # MFU against the bf16 peak for both
    with pytest.raises(ValueError, match="fp8.*no catalogued peak"):
        predict("llama3-8b", Layout(dp=8, dtype="fp8"), cluster("dgx-a100"), **kw)


LLAMA3 = [(8192, 1, 64, 8192, 43), (16384, 1, 128, 8192, 41), (16384, 16, 8, 131072, 38)]


def test_llama3_405b_calibrated_on_the_8k_row_within_5_points(capsys):
    """Table 4 (BF16 MFU 43/41/38 %): calibrated on the 8K-GPU row, the 16K and the 16K CP16 rows within 5 points."""
    def lay(dp, cp):
        return Layout(dp=dp, tp=8, pp=16, cp=cp, strategy="zero2", schedule="interleaved", virtual_stages=4,
                      sequence_parallel=True)
    gpus, cp, dp, seq, pub = LLAMA3[0]
    fpt = flops.model_flops_per_token(flops.preset("llama3-405b", seq_len=seq))
    cal = calibrate_achievable("llama3-405b", lay(dp, cp), cluster("dgx-h100", nodes=gpus // 8), global_batch=2**24 // seq,
                               seq_len=seq, tokens_per_s_per_gpu=pub / 100 * 989.5e12 / fpt, source="Llama 3 Table 4")
    for gpus, cp, dp, seq, pub in LLAMA3:
        pr = predict("llama3-405b", lay(dp, cp), cluster("dgx-h100", nodes=gpus // 8), global_batch=2**24 // seq,
                     seq_len=seq, achievable=cal.achievable)
        with capsys.disabled():
            print(f"\nLlama 3 405B {gpus} cp{cp}: calibrated MFU {pr.mfu:.1%} vs published {pub}%", end="")
        assert abs(pr.mfu * 100 - pub) <= 5


@pytest.mark.parametrize("kw, match", [
    (dict(tokens_per_s_per_gpu=1e9, source="x"), "faster than the model allows"),
    (dict(tokens_per_s_per_gpu=1e4, source=""), "source must say"),
    (dict(tokens_per_s_per_gpu=1e4, source="x", achievable=0.5), "achievable is what"),
    (dict(tokens_per_s_per_gpu=-1, source="x"), "tokens_per_s_per_gpu"),
])
def test_calibration_refuses_what_it_cannot_solve(kw, match):
    with pytest.raises(ValueError, match=match):
        calibrate_achievable("llama3-8b", Layout(dp=8), cluster("dgx-h100"), global_batch=64, **kw)

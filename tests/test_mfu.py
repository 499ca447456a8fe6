"""labkit.flops.mfu: MFU/HFU definitions checked against published runs, and refusal of impossible inputs."""
from __future__ import annotations

import pytest

from labkit import flops as F
from labkit import hardware as hw
from labkit.flops import mfu as M


def test_palm_540b_mfu_and_hfu():
    # PaLM (Chowdhery et al. 2022), Table 3 and App. B: PaLM 540B trained at 238.3K tokens/s on 6144
    # TPU v4 chips (275 TFLOP/s bf16 peak each), 46.2% MFU, 57.8% HFU (with rematerialisation).
    palm = F.preset("palm-540b")
    fpt = F.model_flops_per_token(palm, method="palm")          # 6N + 12LHQT, not causal-halved
    peak = hw.lookup("TPUv4").peak("bf16")
    u = M.mfu(tokens_per_s=238.3e3, flops_per_token=fpt, n_devices=6144, peak_flops=peak)
    assert round(100 * u, 1) == 46.2
    # PaLM does not publish which activations it rematerialised. The published HFU must lie between
    # no recomputation and full recomputation (one extra forward) — and does:
    lo = M.hfu(tokens_per_s=238.3e3, hardware_flops_per_token=fpt, n_devices=6144, peak_flops=peak)
    hi = M.hfu(tokens_per_s=238.3e3, n_devices=6144, peak_flops=peak,
               hardware_flops_per_token=F.hardware_flops_per_token(palm, method="palm", recompute="full"))
    assert lo < 0.578 < hi
    # ... which means PaLM recomputed ≈ 75% of the forward pass (the fraction of hi - lo it covers)
    assert (0.578 - lo) / (hi - lo) == pytest.approx(0.75, abs=0.03)


@pytest.mark.parametrize(("gpus", "tflops", "reported_mfu"), [(8192, 430, 43), (16384, 400, 41), (16384, 380, 38)])
def test_llama3_405b_bf16_mfu_on_h100(gpus, tflops, reported_mfu):
    # Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models"), Table 4: 430 / 400 / 380 TFLOPs per
    # GPU and 43% / 41% / 38% BF16 MFU on H100 SXM (989 TFLOP/s dense bf16). The TFLOPs are rounded
    # to 10, the MFU to 1%; check some TFLOP/s within that rounding gives the reported MFU.
    peak = hw.lookup("NVIDIA H100 80GB HBM3").peak("bf16")
    ok = any(round(100 * M.mfu(tokens_per_s=1.0, flops_per_token=(tflops + d) * 1e12, n_devices=1,
                               peak_flops=peak)) == reported_mfu for d in range(-5, 6))
    assert ok
    # a wrong (sparse, 1979 TF) or wrong-part (A100) peak would not reproduce the table
    assert round(100 * tflops / 1979) != reported_mfu
    with pytest.raises(ValueError, match="> 100%"):
        M.mfu(tokens_per_s=1.0, flops_per_token=tflops * 1e12, n_devices=1, peak_flops=312e12)


def test_seed_examples_a100_and_6pd_vs_8pd():
    # the course seeds: A100 bf16 peak 312 TF; with full recompute HFU's numerator is 8PD, MFU's 6PD
    assert hw.lookup("A100-SXM-80GB").peak("bf16") == 312e12
    n = 1e9
    tps = 20_000.0
    m = M.mfu(tokens_per_s=tps, flops_per_token=6 * n, n_devices=1, peak_flops=312e12)
    h = M.hfu(tokens_per_s=tps, hardware_flops_per_token=8 * n, n_devices=1, peak_flops=312e12)
    assert m == pytest.approx(6 * n * tps / 312e12)
    assert h / m == pytest.approx(8 / 6)


def test_nanogpt_h100_104_percent_is_the_wrong_peak():
    # issue #2: nanoGPT's estimate_mfu divides by an A100's 312 TF; an H100 run then shows > 100%.
    fpt = F.model_flops_per_token(F.preset("gpt2-124m"))
    tps = 1.04 * 312e12 / fpt
    with pytest.raises(ValueError, match="Most likely: peak_flops"):
        M.mfu(tokens_per_s=tps, flops_per_token=fpt, n_devices=1, peak_flops=312e12)
    right = M.mfu(tokens_per_s=tps, flops_per_token=fpt, n_devices=1, peak_flops=hw.lookup("H100-SXM").peak("bf16"))
    assert right == pytest.approx(1.04 * 312 / 989.5)


def test_over_100_percent_names_tokens_when_far_over():
    with pytest.raises(ValueError, match="Most likely: tokens_per_s=.*GLOBAL"):
        M.mfu(tokens_per_s=8e5, flops_per_token=1e9, n_devices=1, peak_flops=1e14)   # 8x over
    with pytest.raises(ValueError, match="Most likely: flops_per_token"):
        M.mfu(tokens_per_s=1e9, flops_per_token=1e9, n_devices=1, peak_flops=1e14)   # 10^4x over


def test_tokens_per_s_helpers():
    assert M.tokens_per_s_per_device(1000.0, 4) == 250.0
    assert M.step_tokens_per_s(4096, 0.5) == 8192.0
    assert M.achieved_flops(10.0, 6.0) == 60.0
    t = M.tokens_per_s_for_mfu(0.5, flops_per_token=1e9, n_devices=2, peak_flops=1e12)
    assert M.mfu(tokens_per_s=t, flops_per_token=1e9, n_devices=2, peak_flops=1e12) == pytest.approx(0.5)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(tokens_per_s=0), "tokens_per_s=0"), (dict(tokens_per_s=-1.0), "tokens_per_s=-1.0"),
    (dict(flops_per_token=0), "flops_per_token=0"), (dict(n_devices=0), "n_devices=0"),
    (dict(n_devices=1.5), "n_devices must be an int, got float 1.5"), (dict(peak_flops=float("nan")), "peak_flops=nan"),
])
def test_bad_inputs_name_the_parameter(kwargs, match):
    base = dict(tokens_per_s=1e3, flops_per_token=1e9, n_devices=1, peak_flops=1e14)
    with pytest.raises(ValueError, match=match):
        M.mfu(**{**base, **kwargs})


def test_zero_step_time_is_refused():
    with pytest.raises(ValueError, match="step_time_s=0"):
        M.step_tokens_per_s(100, 0.0)
    with pytest.raises(ValueError, match="target_mfu"):
        M.tokens_per_s_for_mfu(1.5, flops_per_token=1, n_devices=1, peak_flops=1)

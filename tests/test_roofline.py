"""labkit.kernels.roofline: intensity, roof, ridge, and a live (tiny) matmul sweep (chapter 6)."""
import pytest

from labkit.kernels import roofline


def test_matmul_counts():
    assert roofline.matmul_flops(2, 3, 4) == 48
    assert roofline.matmul_bytes(2, 3, 4, "fp32") == (8 + 12 + 6) * 4
    assert roofline.matmul_bytes(2, 3, 4, "bf16") == (8 + 12 + 6) * 2
    ai = roofline.arithmetic_intensity(roofline.matmul_flops(4096, 4096, 4096),
                                       roofline.matmul_bytes(4096, 4096, 4096, "bf16"))
    assert ai == pytest.approx(4096 / 3, rel=1e-9)       # 2n^3 / (3 n^2 * 2 bytes)
    with pytest.raises(ValueError, match="dtype"):
        roofline.matmul_bytes(1, 1, 1, "fp4")
    with pytest.raises(ValueError, match="m=0 is not valid: use an int >= 1"):
        roofline.matmul_flops(0, 1, 1)


def test_roof_and_ridge():
    peak, bw = 989.5e12, 3.35e12              # H100 SXM bf16 dense, HBM3
    assert roofline.ridge_point(peak, bw) == pytest.approx(295.4, rel=1e-3)
    assert roofline.attainable(1.0, peak, bw) == pytest.approx(bw)
    assert roofline.attainable(1e4, peak, bw) == peak
    assert roofline.bound(1.0, peak, bw) == "memory"
    assert roofline.bound(1000.0, peak, bw) == "compute"
    with pytest.raises(ValueError, match="bandwidth"):
        roofline.ridge_point(peak, 0)


def test_default_shapes_span_the_ridge():
    shapes = roofline.default_shapes(fast=True)
    assert max(s[0] for s in roofline.default_shapes(device_type="cuda")) == 8192
    ais = [roofline.matmul_flops(*s) / roofline.matmul_bytes(*s, "fp32") for s in shapes]
    assert min(ais) < 1 and max(ais) > 100


def test_live_sweep_on_cpu():
    df = roofline.sweep_matmul([(1, 256, 256), (128, 128, 128)], device="cpu", dtype="fp32",
                               peak_flops=1e11, bandwidth=1e10, repeats=3)
    assert list(df["bound"]) == ["memory", "compute"]
    assert (df["FLOP/s"] > 0).all() and (df["time_s"] > 0).all()
    assert df["roof FLOP/s"].iloc[0] == pytest.approx(df["intensity"].iloc[0] * 1e10)
    with pytest.raises(ValueError, match=r"\(m, n, k\)"):
        roofline.sweep_matmul([(1, 2)], peak_flops=1.0, bandwidth=1.0)


def test_time_matmul_reports_spread():
    t = roofline.time_matmul(64, 64, 64, repeats=3)
    assert 0 < t.p10_s <= t.median_s <= t.p90_s and t.repeats == 3

"""labkit.perf.cost: wall-clock, device-hours and the 1/(1-d) - 1 rule of chapter 1."""
import math

import pytest

from labkit.perf import cost


def test_thirty_percent_drop_is_43_percent_more_time():
    assert cost.extra_wallclock_fraction(0.30) == pytest.approx(1 / 0.7 - 1)
    assert cost.extra_wallclock_fraction(0.30) == pytest.approx(0.4286, abs=1e-4)
    assert cost.extra_wallclock_fraction(0.0) == 0.0
    assert cost.extra_wallclock_fraction(0.5) == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [1.0, 1.5, -0.1, float("nan")])
def test_drop_must_be_a_fraction(bad):
    with pytest.raises(ValueError, match="throughput_drop"):
        cost.extra_wallclock_fraction(bad)


def test_tokens_per_s_inverts_mfu():
    # 8 devices at 40% of 1e15 FLOP/s, 6e9 FLOPs/token -> 0.4 * 8e15 / 6e9
    tps = cost.tokens_per_s_at(mfu=0.4, peak_flops=1e15, n_devices=8, flops_per_token=6e9)
    assert tps == pytest.approx(0.4 * 8e15 / 6e9)
    with pytest.raises(ValueError, match="mfu must be a fraction"):
        cost.tokens_per_s_at(mfu=40, peak_flops=1e15, n_devices=8, flops_per_token=6e9)


def test_training_cost_llama3_405b_order_of_magnitude():
    # Llama 3 (Dubey et al. 2024): 405B params, 15.6T tokens, H100 bf16 dense 989 TFLOP/s, MFU ~ 0.40
    c = cost.training_cost(tokens=15.6e12, flops_per_token=6 * 405e9, n_devices=16384, peak_flops=989e12,
                           mfu=0.40, price_per_device_hour=2.0, device_power_w=700, pue=1.1)
    assert c.total_flops == pytest.approx(3.79e25, rel=0.01)          # paper: 3.8e25
    assert 20e6 < c.device_hours < 35e6                                # model card: 30.84M GPU-hours
    assert c.cost == pytest.approx(2.0 * c.device_hours)
    assert c.energy_kwh == pytest.approx(700 * 16384 * c.wall_s * 1.1 / 3.6e6)
    assert c.days == pytest.approx(c.wall_s / 86400)
    assert c.cost_per_million_tokens == pytest.approx(c.cost / 15.6e6)
    assert "device-hours" in c.summary() and "tokens" in c.as_dict()


def test_drop_scales_cost_by_the_rule():
    base = cost.training_cost(tokens=1e12, flops_per_token=6e9, n_devices=64, tokens_per_s=1e6,
                              price_per_device_hour=3.0)
    slow = cost.training_cost(tokens=1e12, flops_per_token=6e9, n_devices=64, tokens_per_s=0.7e6,
                              price_per_device_hour=3.0)
    assert slow.cost / base.cost - 1 == pytest.approx(cost.extra_wallclock_fraction(0.3))
    assert base.energy_kwh is None


def test_training_cost_input_errors():
    with pytest.raises(ValueError, match="give tokens_per_s, or both mfu and peak_flops"):
        cost.training_cost(tokens=1e9, flops_per_token=6e9, n_devices=1, mfu=0.3)
    with pytest.raises(ValueError, match="not both"):
        cost.training_cost(tokens=1e9, flops_per_token=6e9, n_devices=1, mfu=0.3, tokens_per_s=1.0)
    with pytest.raises(ValueError, match="n_devices"):
        cost.training_cost(tokens=1e9, flops_per_token=6e9, n_devices=0, tokens_per_s=1.0)
    with pytest.raises(ValueError, match="pue"):
        cost.training_cost(tokens=1e9, flops_per_token=6e9, n_devices=1, tokens_per_s=1.0,
                           device_power_w=700, pue=0.5)
    with pytest.raises(TypeError, match="tokens must be a number"):
        cost.wallclock_s("many", 1.0)


def test_wallclock_and_deadline_are_inverse():
    tps = cost.throughput_for_deadline(1e12, days=30)
    assert cost.wallclock_s(1e12, tps) == pytest.approx(30 * 86400)
    assert math.isclose(tps, 1e12 / (30 * 86400))

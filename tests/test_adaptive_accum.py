"""labkit.train.adaptive: the source's DynamicGradAccum rule (window, cap, hysteresis, never below 1) and the
safeguards of chapter 25 (learning-rate rules, the validation guard)."""
from __future__ import annotations

import math

import pytest

from labkit.train.adaptive import AccumController, ValidationGuard, scaled_lr, simulate


def _ks(log):
    return [k for _, _, k in log]


def test_window_decides_only_when_full():
    ctl = AccumController(window=10)
    ks = [ctl.observe(0.01, 0.04, 1) for _ in range(10)]
    assert ks == [1] * 9 + [4]                      # round(mean 4.0) after the 10th step, not before


def test_cap_and_floor():
    ctl = AccumController(window=3, cap=8)
    assert [ctl.observe(0.01, 1.0, 1) for _ in range(3)][-1] == 8          # ratio 100 → capped at 8
    low = AccumController(window=3, start=8)
    assert [low.observe(8 * 0.01, 0.0, 8) for _ in range(3)][-1] == 1      # ratio 0 → never below 1


def test_hysteresis_ignores_moves_of_one():
    ctl = AccumController(window=4, hysteresis=2, start=3)
    assert {ctl.observe(3 * 0.01, 0.04, 3) for _ in range(12)} == {3}      # wants 4: a move of 1 is ignored
    assert [ctl.observe(3 * 0.01, 0.05, 3) for _ in range(4)][-1] == 5     # a move of 2 is taken


def test_the_window_restarts_after_a_change():
    ctl = AccumController(window=5)
    for _ in range(5):
        ctl.observe(0.01, 0.04, 1)
    assert ctl.accum == 4
    ks = [ctl.observe(4 * 0.01, 0.005, 4) for _ in range(5)]               # cheap link: ratio 0.5 per micro-batch
    assert ks == [4] * 4 + [1]


def test_per_step_ratio_oscillates_and_per_micro_batch_settles():
    steady = _ks(simulate(0.01, 0.04, steps=60))
    literal = _ks(simulate(0.01, 0.04, steps=60, per="step"))
    assert set(steady[20:]) == {4}
    changes = sum(a != b for a, b in zip(literal[:-1], literal[1:], strict=True))
    assert changes >= 4 and set(literal[20:]) == {1, 4}


def test_a_slow_link_raises_accumulation_and_its_removal_lowers_it():
    log = simulate(0.01, lambda i: 0.06 if 20 <= i < 50 else 0.005, steps=90)
    ks = _ks(log)
    assert ks[19] == 1 and max(ks[20:55]) >= 4 and ks[-1] == 1


def test_scaled_lr_rules():
    assert scaled_lr(3e-4, 4, rule="sqrt") == pytest.approx(6e-4)
    assert scaled_lr(0.1, 8, 2, rule="linear") == pytest.approx(0.4)
    assert scaled_lr(1e-3, 8, rule="none") == 1e-3
    assert scaled_lr(1e-3, 2, rule="sqrt") == pytest.approx(1e-3 * math.sqrt(2))


def test_validation_guard_lowers_after_patience_rises():
    g = ValidationGuard(patience=3)
    ks = [g.update(v, 8) for v in (3.0, 3.1, 3.2, 3.3)]
    assert ks == [8, 8, 8, 4] and g.triggered == [(3.3, 8, 4)]
    g2 = ValidationGuard(patience=3)
    assert [g2.update(v, 8) for v in (3.0, 3.1, 3.05, 3.2, 3.3)] == [8] * 5     # a fall resets the count
    assert ValidationGuard(patience=1).update(2.0, 1) == 1


@pytest.mark.parametrize("kwargs, match", [({"window": 0}, "window"), ({"cap": 0}, "cap"),
                                           ({"start": 9}, "start"), ({"per": "epoch"}, "per"),
                                           ({"hysteresis": True}, "hysteresis")])
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AccumController(**kwargs)


def test_bad_observations_are_named():
    ctl = AccumController()
    with pytest.raises(ValueError, match="compute_s"):
        ctl.observe(0.0, 0.1)
    with pytest.raises(ValueError, match="comm_s"):
        ctl.observe(0.1, -1)
    with pytest.raises(ValueError, match="rule"):
        scaled_lr(1e-3, 2, rule="cubic")
    with pytest.raises(ValueError, match="val_loss"):
        ValidationGuard().update(float("nan"), 2)


def test_hysteresis_leaves_a_dead_band_one_above_the_target():
    # comm 5 × a micro-batch (capped at 4); the window straddling the switch averages ≈ 2: the rule moves 4 → 2,
    # then wants 1 — a move of 1, which hysteresis 2 ignores for good (chapter 25's dead band)
    ks = _ks(simulate(0.01, lambda i: 0.05 if 4 <= i < 14 else 0.0, steps=40, window=4, cap=4))
    assert max(ks) == 4 and set(ks[20:]) == {2}
    assert _ks(simulate(0.01, lambda i: 0.05 if 4 <= i < 14 else 0.0, steps=40, window=4, cap=4, hysteresis=1))[-1] == 1

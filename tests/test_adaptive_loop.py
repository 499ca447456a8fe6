"""Adaptive accumulation in the one training loop (chapter 25): TrainConfig's knobs are validated, the
loop runs each step at the controller's accumulation with the learning rate its rule gives, the meter
counts each step's real tokens, the held-out split is never trained on, and on 2 live gloo ranks a slow
link switched on and off by step raises accumulation and lowers it again."""
from __future__ import annotations

import math

import pytest

from labkit.measure.meter import Meter, PerfCounterClock
from labkit.train import TrainConfig, run, train
from labkit.train.adaptive import held_out

BASE = TrainConfig(model="tiny", steps=8, warmup_steps=1, peak_flops=1e12, micro_batch=4)


@pytest.mark.parametrize("changes, match", [
    ({"accum": "auto"}, "accum"), ({"accum": 0}, "accum"),
    ({"accum_window": 4}, "accum='adaptive' only"), ({"accum_lr_rule": "linear"}, "accum='adaptive' only"),
    ({"accum": "adaptive", "accum_start": 9}, "accum_start"), ({"accum": "adaptive", "accum_lr_rule": "cube"}, "rule"),
    ({"accum": "adaptive", "inject": "compute"}, "inject"), ({"accum": "adaptive", "memory_budget_mb": 1.0}, "inject"),
    ({"inject": "comm", "inject_steps": (3, 2)}, "inject_steps"), ({"inject": "comm", "inject_steps": (0, 99)}, "inject_steps"),
    ({"inject_steps": (1, 3)}, "inject_steps"), ({"swa_start": 2}, "val_every"),
    ({"swa_start": 2, "val_every": 1, "parallel": "fsdp"}, "swa_start"), ({"val_every": -1}, "val_every"),
])
def test_bad_adaptive_settings_are_named(changes, match):
    with pytest.raises(ValueError, match=match):
        BASE.replace(**changes)


def test_adaptive_config_defaults_are_the_sources():
    cfg = BASE.replace(accum="adaptive")
    assert (cfg.accum_window, cfg.accum_cap, cfg.accum_hysteresis, cfg.first_accum) == (10, 8, 2, 1)
    assert cfg.adaptive and not BASE.adaptive and BASE.first_accum == 1
    assert BASE.replace(inject="comm", inject_steps=[2, 5]).inject_steps == (2, 5)


def test_meter_recent_reads_one_step_without_resolving_the_rest():
    m = Meter(clock=PerfCounterClock(), warmup_steps=1, tokens_per_step=10)
    assert m.recent() is None
    for k in (1, 2, 3):
        with m.step(tokens=10 * k):
            with m.phase("forward"):
                pass
            if k == 3:
                with m.phase("comm"):
                    pass
    assert set(m.recent()) == {"forward", "comm"} and set(m.recent(1)) == {"forward"}
    assert m.recent(2) is None                     # the warm-up step is not measured
    rec = m.to_record()
    assert rec.tokens_per_step == 25 and rec.extra["tokens_per_step_varied"] == {"min": 20, "max": 30,
                                                                                   "mean": 25.0, "steps": 2}


def test_controller_drives_the_loop_and_the_lr_follows():
    # one process: no communication, ratio 0 → from 4 the controller returns to 1 after a window of 3
    rec = train(BASE.replace(accum="adaptive", accum_start=4, accum_window=3))
    ks, lrs = rec.extra["accum_per_step"], rec.extra["lr_per_step"]
    assert ks == [4, 4, 4, 4, 1, 1, 1, 1]          # 1 warm-up step, then 3 measured steps fill the window
    assert lrs[0] == pytest.approx(3e-4) and lrs[-1] == pytest.approx(3e-4 / math.sqrt(4))
    assert rec.extra["tokens_per_step_each"] == [k * 4 * 64 for k in ks]
    varied = rec.extra["tokens_per_step_varied"]
    assert (varied["min"], varied["max"]) == (256, 1024)
    # tokens/s = the real tokens of the measured steps ÷ their total time, not the first step's size × steps
    real = sum(rec.extra["tokens_per_step_each"][1:])
    assert rec.tokens_per_s == pytest.approx(real / (rec.step_time.mean * rec.step_time.n), rel=1e-6)


def test_held_out_windows_are_never_trained_on_and_swa_is_evaluated():
    cfg = BASE.replace(val_every=2, val_sequences=8, swa_start=3)
    train_set, (x, y) = held_out(cfg)
    assert x.shape == (8, 64) and max(train_set.indices) == len(train_set.dataset) - 9
    rec = train(cfg)
    log = rec.extra["val_log"]
    assert [r["step"] for r in log] == [1, 3, 5, 7] and all(r["val_loss"] > 0 for r in log)
    assert "swa_val_loss" not in log[0] and log[-1]["swa_val_loss"] != log[-1]["val_loss"]
    assert log[1]["swa_val_loss"] == pytest.approx(log[1]["val_loss"])    # an average of one step's weights


def test_validation_guard_lowers_accumulation_in_the_loop():
    # a learning rate far too high makes the held-out loss rise; the guard halves accumulation after 2 rises
    cfg = BASE.replace(accum="adaptive", accum_start=8, accum_window=100, lr=0.5, accum_lr_rule="none",
                       steps=10, val_every=1, val_patience=2, val_sequences=8)
    rec = train(cfg)
    lowered = [r for r in rec.extra["val_log"] if "guard_lowered_to" in r]
    assert lowered and lowered[0]["guard_lowered_to"] == 4 and rec.extra["accum_per_step"][-1] < 8


@pytest.mark.slow
def test_a_slow_link_raises_accumulation_on_live_ranks_and_its_removal_lowers_it():
    cfg = TrainConfig(model="tiny", parallel="ddp", micro_batch=4, accum="adaptive", accum_window=4, accum_cap=4,
                      steps=22, warmup_steps=1, inject="comm", comm_pad_mb=384, inject_steps=(3, 13),
                      peak_flops=1e12)
    rec = run(cfg, 2, timeout_s=400)
    ks = rec.extra["accum_per_step"]
    assert ks[:3] == [1, 1, 1] and max(ks[3:13]) >= 3 and ks[-1] < max(ks[3:13])     # 1, or 2 (hysteresis dead band)
    assert rec.extra["losses_per_rank"][0] == rec.extra["losses_per_rank"][1]


def test_clipping_once_per_step_records_the_norm_and_bad_thresholds_are_named():
    rec = train(BASE.replace(steps=3, max_grad_norm=0.01, accum=2))
    norms = rec.extra["grad_norm_per_step"]
    assert len(norms) == 3 and all(n > 0.01 for n in norms)       # the norm before clipping
    with pytest.raises(ValueError, match="max_grad_norm"):
        BASE.replace(max_grad_norm=0)


def test_averaged_gradient_norm_does_not_grow_with_accumulation():
    from labkit.train.accum import grad_norms

    mean = grad_norms(BASE, (1, 4))
    summed = grad_norms(BASE, (1, 4), summed=True)
    assert mean[4] < 1.5 * mean[1]                   # the mean over more samples: no growth with k
    assert summed[4] == pytest.approx(4 * mean[4]) and summed[1] == pytest.approx(mean[1])
    with pytest.raises(ValueError, match="accum"):
        grad_norms(BASE, (0,))


def test_a_small_training_set_is_the_first_windows_and_too_small_is_named():
    cfg = BASE.replace(train_sequences=8, val_every=1, val_sequences=4)
    train_set, _ = held_out(cfg)
    assert list(train_set.indices) == list(range(8))
    assert list(held_out(BASE.replace(train_sequences=8))[0].indices) == list(range(8))
    with pytest.raises(ValueError, match="train_sequences"):
        BASE.replace(train_sequences=2)                     # below one micro-batch of 4

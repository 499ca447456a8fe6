"""labkit.measure.ab: the A/B primitive — verdicts on known effects, interleaving, same seed, the CUDA fence,
argument checks, and live CPU work (chapter 28; tuning chapters 15–21)."""
from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
import torch

from labkit import checks
from labkit.measure.ab import NO_DIFFERENCE, ORDERS, ab_compare, ab_train
from labkit.record import RunRecord, Stat
from labkit.train import TrainConfig


def normal(mean, sd, seed, scale=1.0):
    """A callable returning scale × N(mean, sd) draws from its own generator (deterministic)."""
    rng = np.random.default_rng(seed)
    return lambda: scale * float(rng.normal(mean, sd))


# ------------------------------------------------------------------ verdicts on known effects
def test_ten_percent_slower_is_slower():
    r = ab_compare(normal(100, 2, 1), normal(100, 2, 2, scale=1.10), rounds=30, warmup=1)
    assert r.verdict == "slower" and r.differs and not r.timed
    assert r.ratio == pytest.approx(1.10, abs=0.02)
    assert r.ci[0] < 1.10 < r.ci[1] and r.ci[0] > 1.03
    assert r.resolution < 0.03                      # N(100, 2): the same code agrees with itself to < 3 %


def test_a_vs_a_is_unchanged():
    a = normal(100, 2, 3)
    r = ab_compare(a, a, rounds=30, warmup=1)
    assert r.verdict == "unchanged" and not r.differs
    assert r.ci[0] > 0.97 and r.ci[1] < 1.03 and r.resolution <= 0.03


def test_direction_follows_the_metric():
    assert ab_compare(normal(100, 2, 4), normal(100, 2, 5, scale=1 / 1.1), rounds=30).verdict == "faster"
    # tokens/s: 10 % more is faster
    assert ab_compare(normal(100, 2, 6), normal(100, 2, 7, scale=1.1), rounds=30,
                      metric="throughput").verdict == "faster"


def test_noise_wider_than_the_effect_is_no_difference_at_this_resolution():
    rng_a, rng_b = np.random.default_rng(8), np.random.default_rng(9)
    r = ab_compare(lambda: 100 * float(np.exp(0.3 * rng_a.standard_normal())),
                   lambda: 102 * float(np.exp(0.3 * rng_b.standard_normal())), rounds=12, warmup=0)
    assert r.verdict == NO_DIFFERENCE and r.resolution > 0.03
    assert "NO DIFFERENCE AT THIS RESOLUTION" in r.report() and "resolution ±" in r.report()


def test_an_effect_the_noise_floor_also_shows_is_not_called_a_difference():
    """B is 5 % slower than A, but a call right after B is 8 % slower (B thrashes a cache), which A'
    suffers more often than A: the same code moved 8 % against itself, so 5 % is not claimed."""
    last = {"arm": None}

    def a():
        value = 108.0 if last["arm"] == "b" else 100.0
        last["arm"] = "a"
        return value

    b_draw = normal(105, 0.5, 10)

    def b():
        last["arm"] = "b"
        return b_draw()

    r = ab_compare(a, b, rounds=60, warmup=0)
    assert r.versus.verdict == "slower" and r.ratio == pytest.approx(1.05, abs=0.01)
    assert r.resolution >= 0.07 and r.verdict == NO_DIFFERENCE


# ------------------------------------------------------------------ how it runs
def test_rounds_are_interleaved_and_rotated():
    log, n = [], {"i": 0}

    def tagged(name):
        def fn():
            n["i"] += 1
            log.append(name)
            return float(n["i"])           # the call's index: which sample came from which position
        return fn

    r = ab_compare(tagged("a"), tagged("b"), rounds=6, warmup=1, min_effect=0.5)
    assert log[:2] == ["a", "b"]                                         # one warm-up call per arm
    rounds = [log[2 + 3 * i: 5 + 3 * i] for i in range(6)]
    assert rounds[0] == ["a", "b", "a"] and rounds[1] == ["b", "a", "a"] and rounds[2] == ["a", "a", "b"]
    assert rounds[3:] == rounds[:3]
    assert r.order[:3] == ("A B A'", "B A' A", "A' A B") and len(r.order) == 6
    for i in range(6):                   # the sample of each arm is the call at that arm's position
        arms = ORDERS[i % 3]
        base = 2 + 3 * i
        assert r.a[i] == base + arms.index("A") + 1
        assert r.a2[i] == base + arms.index("A'") + 1
        assert r.b[i] == base + arms.index("B") + 1
    for arm in ("A", "B", "A'"):         # every arm takes every position once per 3 rounds
        assert sorted(o.index(arm) for o in ORDERS) == [0, 1, 2]


def test_every_call_sees_the_same_seed_and_setup_runs_before_each():
    seen, setups = [], []

    def draw():
        seen.append((random.random(), float(np.random.random()), float(torch.rand(1))))
        return 1.0

    ab_compare(draw, draw, rounds=3, warmup=1, seed=7, setup=lambda: setups.append(1))
    assert len(seen) == 2 + 9 and len(set(seen)) == 1 and len(setups) == 11
    seen.clear()
    ab_compare(draw, draw, rounds=3, warmup=0, seed=None)
    assert len(set(seen)) == 9                      # seed=None: no re-seeding


def test_the_device_fence_brackets_every_timed_call():
    log = []

    def work():
        log.append("work")

    r = ab_compare(work, work, rounds=3, warmup=2, sync=lambda: log.append("sync"), min_effect=0.5)
    assert r.timed and r.clock == "wall" and all(t > 0 for t in r.a + r.b + r.a2)
    assert log == ["sync", "work", "sync"] * (2 * 2 + 3 * 3)


def test_a_cuda_device_synchronises_through_torch(monkeypatch):
    fenced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: fenced.append(device))
    ab_compare(lambda: None, lambda: None, rounds=3, warmup=1, device="cuda:0", min_effect=0.5)
    assert len(fenced) == 2 * (2 + 9) and fenced[0] == torch.device("cuda:0")
    fenced.clear()
    ab_compare(lambda: None, lambda: None, rounds=3, warmup=0, device="cpu", min_effect=0.5)
    assert fenced == []                              # the CPU needs no fence


def test_report_and_dict():
    r = ab_compare(normal(0.010, 0.0002, 11), normal(0.010, 0.0002, 12, scale=1.2), rounds=9,
                   labels=("eager", "compiled"))
    text = r.report()
    assert "SLOWER" in text and "compiled/eager" in text and "noise floor" in text and len(text.splitlines()) == 5
    d = json.loads(json.dumps(r.to_dict()))
    assert d["verdict"] == "slower" and len(d["a"]) == 9 and d["versus"]["verdict"] == "slower"
    assert d["floor"]["n_baseline"] == 9 and d["differs"] is True and d["labels"] == ["eager", "compiled"]


def test_one_verdict_one_confidence_from_one_test():
    """Four runs each, every B above every A: the bootstrap puts > 99 % of resamples beyond the threshold while the
    Mann–Whitney normal approximation gives p = 0.06 — the report states the bootstrap's verdict and confidence
    alone, once, and says which test it is, never the other test's p beside it (issue #34)."""
    from labkit.measure import regress

    a, b = [1.05, 1.01, 0.87, 1.21], [1.33, 1.55, 1.17, 1.34]
    v = regress.compare(a, b, higher_is_better=False)
    assert v.verdict == "slower" and v.confidence > 0.99 and v.p_value > 0.05     # the two tests disagree
    text = v.report()
    assert "Mann" not in text and "p =" not in text and text.count("confidence") == 1
    assert f"bootstrap confidence {v.confidence:.1%}" in text and "100%" not in text   # not rounded to certainty
    assert regress.confidence_text(1.0) == "bootstrap confidence > 99.9 %"
    assert regress.confidence_text(0.5) == "bootstrap confidence 50%"
    assert regress.confidence_text(0.995) == "bootstrap confidence 99.5%"
    with pytest.raises(ValueError, match="confidence"):
        regress.confidence_text(1.5)


def test_ab_report_states_one_verdict_and_one_confidence():
    r = ab_compare(normal(0.010, 0.0002, 11), normal(0.010, 0.0002, 12, scale=1.2), rounds=9)
    text = r.report()
    assert "Mann" not in text and "p =" not in text
    assert text.count("confidence") == 1 and "bootstrap" in text
    verdict_lines = [ln for ln in text.splitlines() if ln.strip().startswith(("SLOWER", "FASTER", "UNCHANGED", "NO "))]
    assert len(verdict_lines) == 1 and "SLOWER" in verdict_lines[0] and "confidence" in verdict_lines[0]


# ------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize("kw, match", [
    ({"rounds": 2}, "rounds"), ({"rounds": 10.0}, "rounds"), ({"rounds": True}, "rounds"),
    ({"warmup": -1}, "warmup"), ({"metric": "speed"}, "metric"), ({"min_effect": 0}, "min_effect"),
    ({"min_effect": 1.5}, "min_effect"), ({"ci_level": 1}, "ci_level"), ({"seed": -1}, "seed"),
    ({"setup": 5}, "setup"), ({"sync": "yes"}, "sync"), ({"labels": ("A",)}, "labels"),
    ({"clock": "gpu"}, "clock"), ({"unit": 1}, "unit"),
    ({"clock": "cpu", "sync": lambda: None}, "clock='cpu'"),
])
def test_bad_arguments_name_the_parameter(kw, match):
    with pytest.raises(ValueError, match=match):
        ab_compare(lambda: 1.0, lambda: 1.0, **kw)


def test_bad_callables_and_bad_figures():
    with pytest.raises(checks.ArgumentTypeError, match="run_a must be a zero-argument callable"):
        ab_compare(3, lambda: 1.0)
    for bad in (-1.0, 0.0, float("nan"), "fast", True):
        with pytest.raises(ValueError, match=r"B \(round 1\) returned"):
            ab_compare(lambda: 1.0, lambda bad=bad: bad, warmup=0, rounds=3)
    with pytest.raises(TypeError, match="both callables must either"):
        ab_compare(lambda: None, lambda: 2.0, warmup=1, rounds=3)


def test_ab_train_checks_its_configs():
    with pytest.raises(TypeError, match="cfg_b must be a labkit.train.TrainConfig"):
        ab_train(TrainConfig(), {"model": "tiny"})
    with pytest.raises(ValueError, match="same seed"):
        ab_train(TrainConfig(seed=0), TrainConfig(seed=1))
    with pytest.raises(ValueError, match="nprocs"):
        ab_train(TrainConfig(), TrainConfig(), nprocs=0)


def test_ab_train_compares_one_median_step_per_run(monkeypatch):
    """Each run contributes its median step time (not its pooled steps); throughput = tokens/step ÷ it."""
    import labkit.train.loop as loop

    rng = np.random.default_rng(13)
    trained = []

    def fake_train(cfg, probe=None):
        trained.append(cfg.label)
        step = 0.1 * cfg.micro_batch / 8 * float(rng.normal(1, 0.01))
        return RunRecord(label=cfg.label, step_time=Stat(median=step, p10=step * 0.5, p90=step * 2, n=17),
                         tokens_per_step=cfg.micro_batch * 64)

    monkeypatch.setattr(loop, "train", fake_train)
    a, b = TrainConfig(micro_batch=8, label="mb8"), TrainConfig(micro_batch=16, label="mb16")
    r = ab_train(a, b, rounds=6)
    assert trained[:2] == ["mb8", "mb16"] and len(trained) == 2 + 18
    assert r.verdict == "slower" and r.ratio == pytest.approx(2.0, rel=0.05) and r.labels == ("mb8", "mb16")
    assert len(r.a) == 6 and all(0.09 < v < 0.11 for v in r.a)
    # same tokens/s (twice the tokens in twice the time): per-token throughput is unchanged
    assert ab_train(a, b, rounds=6, metric="throughput").verdict in ("unchanged", NO_DIFFERENCE)
    assert "ms" in r.report() and r.unit == "s"


def test_ab_train_measures_longer_until_resolved(monkeypatch):
    """max_rounds: a 20 % effect under 30 % run-to-run noise is 'no difference' at 3 rounds; the A/B is run
    again with 6, 12, 24 rounds until it is told (or max_rounds is reached), and the longer A/B is returned."""
    import labkit.train.loop as loop

    rng = np.random.default_rng(5)

    def fake_train(cfg, probe=None):
        step = (0.1 if cfg.micro_batch == 8 else 0.12) * float(np.exp(rng.normal(0, 0.3)))
        return RunRecord(label=cfg.label, step_time=Stat(median=step, p10=step, p90=step, n=4),
                         tokens_per_step=64)

    monkeypatch.setattr(loop, "train", fake_train)
    a, b = TrainConfig(micro_batch=8, label="A"), TrainConfig(micro_batch=9, label="B")
    assert ab_train(a, b, rounds=3, warmup=0).verdict == NO_DIFFERENCE
    r = ab_train(a, b, rounds=3, warmup=0, max_rounds=96)
    assert r.verdict == "slower" and r.rounds in (6, 12, 24, 48, 96) and len(r.a) == r.rounds
    capped = ab_train(a, b, rounds=3, warmup=0, max_rounds=3)          # no room to measure longer
    assert capped.rounds == 3
    with pytest.raises(ValueError, match="max_rounds"):
        ab_train(a, b, rounds=6, max_rounds=4)


def test_ab_train_same_ranks_runs_every_arm_in_one_launch_and_reports_its_time(monkeypatch):
    """same_ranks=True: one run_many call in call_order's interleaved order; the samples come from the records in
    that order, every run is kept with its arm, and the report's time is the launch's (not ~0 s)."""
    import time

    import labkit.train.launch as launch

    calls = []

    def fake_run_many(cfgs, nprocs, timeout_s=600):
        calls.append([c.label for c in cfgs])
        time.sleep(0.05)
        return [RunRecord(label=c.label, step_time=Stat(median=0.1 if c.label == "A" else 0.2, p10=0.1, p90=0.2, n=3),
                          tokens_per_step=64) for c in cfgs]

    monkeypatch.setattr(launch, "run_many", fake_run_many)
    a, b = TrainConfig(label="A", parallel="ddp"), TrainConfig(label="B", parallel="ddp")
    r = ab_train(a, b, nprocs=2, rounds=3, warmup=1, same_ranks=True)
    assert len(calls) == 1 and len(calls[0]) == len(r.runs) == 2 * 1 + 9
    assert [x["arm"] for x in r.runs].count("B") == 1 + 3 and r.verdict == "slower"
    assert r.wall_s >= 0.05 and f"{r.wall_s:.1f} s" in r.report()


@pytest.mark.slow
def test_ab_train_live():
    """Two real tiny runs, one thread (a loaded machine makes OpenMP threads wait on each other):
    16× the micro-batch takes longer per step. The effect is sized to the primitive's resolution on a
    loaded machine: with 4× (2.4× the step) and 3 rounds, a fresh-clone CI run beside two busy loops saw
    one A' run hit by load move A against itself by more than the effect, and the verdict was no
    difference. 16× makes the step ~10× (84 vs 830 ms alone, load 12 on 2 cores): load that moved A
    against A' by 9× would have to hit only A's runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base = TrainConfig(model="tiny", steps=6, warmup_steps=1, peak_flops=1e12, micro_batch=2)
        r = ab_train(base, base.replace(micro_batch=32), rounds=3, warmup=0)
    finally:
        torch.set_num_threads(threads)
    assert r.verdict == "slower" and r.ratio > 3 and r.versus.n_baseline == 3, r.report()


# ------------------------------------------------------------------ live
def _busy(seconds):
    def fn():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    return fn


def test_live_wall_clock_busy_waits():
    """The wall clock (perf_counter) path, live: a 40 ms busy-wait is slower than a 10 ms one. A loaded
    machine only lengthens calls (preemption, ~10 ms slices at load 10 on 2 cores), so the waits are
    long against a slice and no ratio is asserted, only the floors. Beside two busy loops and other jobs
    (load 8 on 2 cores) A's own calls spread 75 % and the primitive rightly answered "no difference at this
    resolution": a wall clock cannot promise "slower" there, but it must never say faster or unchanged."""
    r = ab_compare(_busy(0.010), _busy(0.040), rounds=12, warmup=1)
    assert r.verdict in ("slower", NO_DIFFERENCE) and r.ratio > 1, r.report()
    assert r.timed and r.clock == "wall" and r.unit == "s"
    assert min(r.a + r.a2) >= 0.010 and min(r.b) >= 0.040


def _matmuls(n, size=128):
    m = torch.randn(size, size, generator=torch.Generator().manual_seed(0)) / size ** 0.5

    def fn():
        x = m
        for _ in range(n):
            x = torch.tanh(x @ m)
    return fn


def test_live_cpu_work():
    """~5 ms of matmuls: A vs A makes no claim; 1.5× the work is slower (CPU clock: the work, not the
    scheduler's share of a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        same = ab_compare(_matmuls(20), _matmuls(20), rounds=30, clock="cpu")
        slow = ab_compare(_matmuls(20), _matmuls(30), rounds=30, clock="cpu")
    finally:
        torch.set_num_threads(threads)
    assert same.verdict in ("unchanged", NO_DIFFERENCE), same.report()
    assert slow.verdict == "slower" and slow.ratio > 1.2, slow.report()


def test_ab_train_max_s_stops_measuring_longer_within_its_budget(monkeypatch):
    """max_s: no doubled A/B is started that would end past the budget (at twice the last one's time); the last,
    inconclusive A/B is returned instead of a killed cell. The fake launch takes 20 ms per run and the two arms are
    the same code with scattered step times (never told apart), so without a budget it would go on to 48 rounds."""
    import math

    import labkit.train.launch as launch

    def fake_run_many(cfgs, nprocs, timeout_s=600):
        time.sleep(0.02 * len(cfgs))
        return [RunRecord(label=c.label, step_time=Stat.of([0.1 * (1 + 0.3 * math.sin(2.3 * i))]), tokens_per_step=64)
                for i, c in enumerate(cfgs)]

    monkeypatch.setattr(launch, "run_many", fake_run_many)
    a, b = TrainConfig(label="A", parallel="ddp"), TrainConfig(label="B", parallel="ddp")
    t0 = time.perf_counter()
    r = ab_train(a, b, nprocs=2, rounds=3, warmup=1, same_ranks=True, max_rounds=48, max_s=1.0)
    assert r.verdict == NO_DIFFERENCE and r.rounds in (3, 6) and time.perf_counter() - t0 < 5
    with pytest.raises(ValueError, match="max_rounds"):
        ab_train(a, b, nprocs=2, rounds=3, same_ranks=True, max_s=1.0)
    with pytest.raises(ValueError, match="max_s"):
        ab_train(a, b, nprocs=2, rounds=3, same_ranks=True, max_rounds=6, max_s=-1)

"""labkit.perf.validate.runs: interleaved repeats, the median run, and the paired wrapper cost.

Trainers and launches are replaced by fakes whose step times are given, so every assertion is about
which run is kept and in which order the runs were made — never a timing.
"""
from types import SimpleNamespace

import pytest

from labkit.comm.models import AlphaBeta
from labkit.perf import steptime
from labkit.perf.validate import cells as pv
from labkit.perf.validate import runs
from labkit.train import TrainConfig


def _rec(median, label="r"):
    return SimpleNamespace(label=label, step_time=SimpleNamespace(median=median, p10=median, p90=median, n=3),
                           extra={}, tokens_per_step=512, hardware_flops_per_token=1e6, n_devices=1)


def test_median_run_keeps_the_middle_run_and_every_repeats_median_in_order():
    a, b, c = _rec(0.3, "a"), _rec(0.1, "b"), _rec(0.2, "c")
    pick = runs.median_run([a, b, c])
    assert pick is c and pick.extra["run_medians_s"] == [0.3, 0.1, 0.2]
    assert runs.median_run([_rec(0.2, "x"), _rec(0.4, "y")]).label == "x"       # even count: the lower middle
    assert runs.run_medians(pick) == [0.3, 0.1, 0.2]
    assert runs.run_medians(_rec(0.5)) == [0.5]                                  # one run: its own median
    assert runs.run_medians(SimpleNamespace(step_time=SimpleNamespace(median=0.7))) == [0.7]   # no extra at all
    with pytest.raises(ValueError, match="at least one record"):
        runs.median_run([])
    with pytest.raises(ValueError, match="step_time.median"):
        runs.median_run([_rec(0.0)])


def test_rank_cells_interleave_the_configs_repeat_by_repeat(monkeypatch):
    """A B, A B, A B — not A A A, B B B: a slow moment of the machine falls on both configurations."""
    import labkit.train as train_mod

    order, speed = [], iter([0.10, 0.20, 0.50, 0.60, 0.12, 0.22])     # the second repeat lands in a slow moment

    def fake_train(cfg):
        order.append(cfg.label)
        return _rec(next(speed), cfg.label)

    monkeypatch.setattr(train_mod, "train", fake_train)
    a, b = (TrainConfig(model="tiny", steps=3, warmup_steps=1, label=x) for x in "AB")
    out = runs._rank_cells([a, b], 3)
    assert order == ["A", "B", "A", "B", "A", "B"]
    assert [r.step_time.median for r in out] == [0.12, 0.22]                    # the slow repeat is outvoted
    assert out[0].extra["run_medians_s"] == [0.10, 0.50, 0.12]


def test_paired_wrapper_cost_is_the_median_of_run_by_run_differences():
    """Plain and wrapped runs of the same repeat share the machine's moment: (wrapped − plain) per repeat,
    then the median — not the difference of two medians taken at different moments."""
    plain, wrapped = _rec(0.1), _rec(0.1)
    plain.extra["run_medians_s"] = [0.10, 0.30, 0.11]          # repeat 2: both slow (the machine, not the wrapper)
    wrapped.extra["run_medians_s"] = [0.13, 0.33, 0.14]
    got = pv._paired_unit_s(wrapped, plain, units=3, accum=1)
    assert got == pytest.approx(0.01)
    assert got == pytest.approx(steptime.unit_overhead_s(0.13, 0.10, 3, 1))
    drift_plain, drift_wrapped = _rec(0.1), _rec(0.1)     # the machine slows between the two runs of a repeat
    drift_plain.extra["run_medians_s"] = [0.10, 0.30, 0.10]
    drift_wrapped.extra["run_medians_s"] = [0.13, 0.13, 0.33]
    assert pv._paired_unit_s(drift_wrapped, drift_plain, 3, 1) == pytest.approx(0.01)   # the median pair wins
    assert pv._paired_unit_s(_rec(0.14), _rec(0.11), 3, 1) == pytest.approx(0.01)     # one run each: the difference


def test_measure_steps_and_concurrent_rates_check_repeats_before_launching(monkeypatch):
    from labkit.launcher import parent

    launched = []
    monkeypatch.setattr(parent, "launch", lambda *a, **k: launched.append((a, k)))
    cfg = TrainConfig(model="tiny", steps=3, warmup_steps=1)
    with pytest.raises(ValueError, match="repeats=0"):
        runs.measure_steps([cfg], 1, repeats=0)
    with pytest.raises(ValueError, match="repeats=0"):
        runs.measure_concurrent_rates([cfg], 2, repeats=0)
    with pytest.raises(ValueError, match="parallel='single'"):
        runs.measure_concurrent_rates([cfg.replace(parallel="ddp")], 2)
    assert launched == []


def test_validate_calibrates_each_rank_count_just_before_measuring_it(monkeypatch):
    """The launches of one round: the 1-rank calibration and the 1-rank cells together; then per n: n's
    links, n's cells followed in the same launch by n's concurrent rate — every launch with the same
    number of interleaved repeats; the concurrent rate is never a launch of its own."""
    from test_perf_validate import fake_record as rec

    order = []

    def fake_steps(cfgs, n, *, repeats, **kw):
        order.append(("steps", n, repeats, sum("calibration" in c.label for c in cfgs), len(cfgs)))
        return [rec(c, n, 0.1) for c in cfgs]

    def fake_then(cfgs, plain, n, *, repeats, **kw):
        order.append(("steps+rates", n, repeats, len(plain), len(cfgs)))
        return [rec(c, n, 0.1) for c in cfgs], [pv.compute_rate(rec(c, 1, 0.15)) for c in plain]

    def fake_links(n, ops, **kw):
        order.append(("links", n))
        return {op: AlphaBeta(alpha_s=1e-4, beta_s_per_byte=1e-9, op=op, nranks=n) for op in ops}

    monkeypatch.setattr(pv, "measure_steps", fake_steps)
    monkeypatch.setattr(pv, "measure_steps_then_rates", fake_then)
    monkeypatch.setattr(pv, "measure_concurrent_rates", lambda *a, **k: pytest.fail("a separate rate launch"))
    monkeypatch.setattr(pv, "fit_gloo_links", fake_links)
    v = pv.validate(models=("tiny",), parallels=("ddp",), nranks=(1, 2, 4), micro_batch={"tiny": 2}, steps=3,
                    warmup_steps=1, repeats=5)
    assert order == [("steps", 1, 5, 2, 3), ("links", 2), ("steps+rates", 2, 5, 1, 1), ("links", 4),
                     ("steps+rates", 4, 5, 1, 1)]
    assert len(v.table) == 3 and "5 interleaved repeats" in v.format()
    assert v.calibration.slowdown("tiny", 4) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="repeats=0"):
        pv.validate(models=("tiny",), repeats=0)
    with pytest.raises(ValueError, match="parallel='single'"):
        runs.measure_steps_then_rates([TrainConfig(model="tiny", steps=3, warmup_steps=1, parallel="ddp")],
                                      [TrainConfig(model="tiny", steps=3, warmup_steps=1, parallel="ddp")], 2)


def test_independent_ranks_keep_computing_until_every_rank_has_measured(monkeypatch, tmp_path):
    """Each rank measures its runs, leaves a flag, then trains filler runs until every rank's flag is there:
    no rank measures a step while another sits idle. The rate reported is the slowest rank's."""
    import labkit.train as train_mod

    calls = []

    def fake_train(cfg):
        calls.append(cfg.label)
        if cfg.label == "filler" and calls.count("filler") == 3:
            (tmp_path / "done.1").touch()                       # the other rank finishes while this one fills
        return _rec(0.1, cfg.label)

    monkeypatch.setattr(train_mod, "train", fake_train)
    a = TrainConfig(model="tiny", steps=3, warmup_steps=1, label="A")
    out = runs._independent_cells([a], 2, str(tmp_path), world=(0, 2))
    assert calls == ["A", "A", "filler", "filler", "filler"] and (tmp_path / "done.0").exists()
    assert out == [runs.compute_rate(_rec(0.1))]
    assert runs.pace([[3.0, 5.0], [2.0, 6.0]], cores=2) == [2.0, 5.0]         # a core each: the slowest rank
    four = runs.pace([[3.0], [2.0], [3.0], [6.0]], cores=2)                 # shared cores: harmonic mean
    assert four == [pytest.approx(4 / (1 / 3 + 1 / 2 + 1 / 3 + 1 / 6))]
    with pytest.raises(ValueError, match="one equal-length list"):
        runs.pace([[1.0], [1.0, 2.0]], cores=2)
    with pytest.raises(ValueError, match="rate=0"):
        runs.pace([[0.0]], cores=2)


def test_steps_then_rates_keeps_rank0_records_and_the_slowest_rate_and_removes_its_flags(monkeypatch):
    from pathlib import Path

    from labkit.launcher import parent

    seen = {}

    def fake_launch(target, n, *, args=(), **kw):
        seen["flags"], seen["n"] = Path(args[-1]), n
        assert seen["flags"].is_dir() and target is runs._steps_then_independent
        return SimpleNamespace(values=[(["rank0 record"], [30e9]), (["rank1 record"], [24e9])])

    monkeypatch.setattr(parent, "launch", fake_launch)
    ddp = TrainConfig(model="tiny", steps=3, warmup_steps=1, parallel="ddp")
    recs, rates = runs.measure_steps_then_rates([ddp], [ddp.replace(parallel="single")], 2, repeats=2)
    monkeypatch.setattr(parent, "cores_available", lambda: 2)
    recs, rates = runs.measure_steps_then_rates([ddp], [ddp.replace(parallel="single")], 2, repeats=2)
    assert recs == ["rank0 record"] and rates == [24e9] and seen["n"] == 2
    assert not seen["flags"].exists()                                   # no folder left behind

    def failing(target, n, *, args=(), **kw):
        seen["flags"] = Path(args[-1])
        raise RuntimeError("a rank died")

    monkeypatch.setattr(parent, "launch", failing)
    with pytest.raises(RuntimeError, match="a rank died"):
        runs.measure_concurrent_rates([ddp.replace(parallel="single")], 2)
    assert not seen["flags"].exists()                                   # not even when the launch fails

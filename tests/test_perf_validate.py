"""labkit.perf.validate: the performance model fed with this machine's measured compute and link.

The arithmetic is checked with fakes (a fake record, a fixed α–β, a parameter count, a Calibration of
fixed numbers, launches replaced by fakes); one slow test runs the whole machinery on real gloo ranks and
checks only that it produces figures — never a timing.
"""
from types import SimpleNamespace

import pytest

from labkit import flops
from labkit.comm.models import AlphaBeta
from labkit.perf import steptime
from labkit.perf.validate import cells as pv
from labkit.perf.validate.fit import fit_unit_cycle, fsdp_cycle_s, fsdp_unit_bytes
from labkit.train import TrainConfig

P = 1_000_000          # parameters (a count: no meta model needed)


def _cfg(parallel="ddp", **kw):
    return TrainConfig(model="tiny", micro_batch=8, steps=3, warmup_steps=1, parallel=parallel, device="cpu", **kw)


def _link(n, alpha=1e-4, beta=1e-9, op="all_reduce"):
    return AlphaBeta(alpha_s=alpha, beta_s_per_byte=beta, op=op, nranks=n)


def _compute(cfg, n, rate, over=1.0):
    mcfg = cfg.model_config
    return cfg.micro_batch * mcfg.seq_len * flops.hardware_flops_per_token(mcfg.shape()) / rate * over


def test_oversubscription_is_ranks_times_threads_over_cores():
    assert pv.oversubscription(1, 2) == 1.0
    assert pv.oversubscription(2, 2) == 1.0
    assert pv.oversubscription(4, 2) == 2.0
    assert pv.oversubscription(2, 2, threads_per_rank=2) == 2.0
    assert pv.oversubscription(3, 8, threads_per_rank=2) == 1.0
    with pytest.raises(ValueError, match="cores=0"):
        pv.oversubscription(2, 0)
    with pytest.raises(ValueError, match="nranks"):
        pv.oversubscription("2", 2)


def test_compute_rate_from_a_fake_record():
    rec = SimpleNamespace(step_time=SimpleNamespace(median=0.1), tokens_per_step=512,
                          hardware_flops_per_token=6e6, n_devices=1)
    assert pv.compute_rate(rec) == pytest.approx(512 * 6e6 / 0.1)
    rec2 = SimpleNamespace(**{**vars(rec), "n_devices": 2})
    assert pv.compute_rate(rec2) == pytest.approx(512 * 6e6 / 0.1 / 2)
    with pytest.raises(TypeError, match="step_time"):
        pv.compute_rate(SimpleNamespace(**{**vars(rec), "step_time": None}))
    with pytest.raises(ValueError, match="median"):
        pv.compute_rate(SimpleNamespace(**{**vars(rec), "step_time": SimpleNamespace(median=0.0)}))


def test_ddp_step_is_compute_plus_one_ring_all_reduce_per_bucket():
    cfg = _cfg("ddp", bucket_cap_mb=1000.0)             # one bucket of all P fp32 gradients
    a, b, rate = 1e-4, 1e-9, 20e9
    p = pv.predict_step(cfg, 2, flops_per_s=rate, alpha_beta=_link(2, a, b), cores=2, params=P)
    assert p.compute_s == pytest.approx(_compute(cfg, 2, rate))
    assert p.comm_s == pytest.approx(2 * a + 1.0 * 4 * P * b)          # 2(n−1)α + 2(n−1)/n·S·β, n = 2
    assert p.step_s == pytest.approx(p.compute_s + p.comm_s)             # no overlap
    assert (p.oversubscription, p.alpha_s, p.beta_s_per_byte, p.flops_per_s) == (1.0, a, b, rate)
    many = pv.predict_step(_cfg("ddp", bucket_cap_mb=1.0), 2, flops_per_s=rate, alpha_beta=_link(2, a, b),
                           cores=2, params=P)
    assert many.comm_s == pytest.approx(4 * 2 * a + 4 * P * b)           # 4 buckets: 4× the latency


def test_four_ranks_on_two_cores_slow_compute_by_two():
    cfg, rate = _cfg("ddp", bucket_cap_mb=1000.0), 20e9
    p = pv.predict_step(cfg, 4, flops_per_s=rate, alpha_beta=_link(4), cores=2, params=P)
    assert p.oversubscription == 2.0
    assert p.compute_s == pytest.approx(2 * _compute(cfg, 4, rate))
    assert p.comm_s == pytest.approx(6 * 1e-4 + 2 * 3 / 4 * 4 * P * 1e-9)


def test_fsdp2_step_prices_gloo_reduce_scatter_as_all_reduce():
    cfg = _cfg("fsdp")                                   # tiny: 2 blocks + root = 3 units, reshard after forward
    a, b, rate = 1e-4, 1e-9, 20e9
    p = pv.predict_step(cfg, 2, flops_per_s=rate, alpha_beta=_link(2, a, b), cores=2, params=P)
    unit = 4 * P / 3
    all_gather = a + 0.5 * unit * b                      # (n−1)α + (n−1)/n·S·β
    reduce_scatter = 2 * a + 1.0 * unit * b              # gloo: an all-reduce of the full input
    assert p.comm_s == pytest.approx(3 * 2 * all_gather + 3 * reduce_scatter)
    assert p.step_s == pytest.approx(_compute(cfg, 2, rate) + p.comm_s)
    keep = pv.predict_step(_cfg("fsdp", reshard_after_forward=False), 2, flops_per_s=rate,
                           alpha_beta=_link(2, a, b), cores=2, params=P)
    assert keep.comm_s == pytest.approx(3 * all_gather + 3 * reduce_scatter)


def test_fsdp2_collectives_priced_with_their_own_fits():
    """op_links: FSDP2's all-gathers and reduce-scatters each take their own α–β (the reduce-scatter as a
    ring reduce-scatter: its fit already holds how gloo runs it); DDP and a missing op keep alpha_beta."""
    cfg, a, b = _cfg("fsdp"), 1e-4, 1e-9
    ag_l, rs_l = _link(2, 3e-4, 2e-9, "all_gather"), _link(2, 5e-4, 4e-9, "reduce_scatter")
    unit = 4 * P / 3
    t = steptime.data_parallel_comm_s(cfg, P, 3, 2, _link(2, a, b), reduce_scatter_as_all_reduce=True,
                                      op_links={"all_gather": ag_l, "reduce_scatter": rs_l})
    all_gather = 3e-4 + 0.5 * unit * 2e-9                # (n−1)α + (n−1)/n·S·β, the all-gather fit
    reduce_scatter = 5e-4 + 0.5 * unit * 4e-9            # the same ring formula, the reduce-scatter fit
    assert t == pytest.approx(3 * 2 * all_gather + 3 * reduce_scatter)
    only_ag = steptime.data_parallel_comm_s(cfg, P, 3, 2, _link(2, a, b), reduce_scatter_as_all_reduce=True,
                                            op_links={"all_gather": ag_l})
    assert only_ag == pytest.approx(3 * 2 * all_gather + 3 * (2 * a + unit * b))   # rs: all-reduce, alpha_beta
    p = pv.predict_step(cfg, 2, flops_per_s=20e9, alpha_beta=_link(2, a, b), cores=2, params=P,
                        op_links={"all_gather": ag_l, "reduce_scatter": rs_l})
    assert p.comm_s == pytest.approx(t)
    ddp = _cfg("ddp")
    assert steptime.data_parallel_comm_s(ddp, P, 1, 2, _link(2, a, b), op_links={"all_gather": ag_l}) == \
        pytest.approx(steptime.data_parallel_comm_s(ddp, P, 1, 2, _link(2, a, b)))
    assert steptime.data_parallel_comm_s(cfg, P, 3, 1, None, op_links={"all_gather": _link(1)}) == 0.0
    with pytest.raises(ValueError, match="op_links key='all_reduce'"):
        steptime.data_parallel_comm_s(cfg, P, 3, 2, _link(2), op_links={"all_reduce": _link(2)})
    with pytest.raises(ValueError, match="fitted on 4 ranks"):
        steptime.data_parallel_comm_s(cfg, P, 3, 2, _link(2), op_links={"all_gather": _link(4)})
    with pytest.raises(TypeError, match="op_links must be a dict"):
        steptime.data_parallel_comm_s(cfg, P, 3, 2, _link(2), op_links=[ag_l])
    with pytest.raises(TypeError, match="alpha_s and beta_s_per_byte"):
        steptime.data_parallel_comm_s(cfg, P, 3, 2, _link(2), op_links={"all_gather": 1e-4})


def test_fit_gloo_links_fits_each_collective_to_its_own_sweep(monkeypatch):
    """A fake benchmark whose times follow a known ring α–β per op: each op's fit recovers its own."""
    import pandas as pd

    from labkit import comm
    from labkit.comm.models import ring_time
    from labkit.perf.validate.fit import fit_gloo_links

    truth = {"all_reduce": (2e-4, 1e-9), "all_gather": (4e-4, 3e-9), "reduce_scatter": (9e-4, 5e-9)}
    calls = []

    def fake_benchmark(ops, sizes, n, **kw):
        calls.append((tuple(ops), n, kw["backend"]))
        rows = [{"op": op, "size": s, "p10_us": ring_time(op, s, n, alpha=truth[op][0], beta=truth[op][1]) * 1e6,
                 "time_us": 2 * ring_time(op, s, n, alpha=truth[op][0], beta=truth[op][1]) * 1e6}
                for op in ops for s in sizes]
        return SimpleNamespace(table=pd.DataFrame(rows))

    monkeypatch.setattr(comm, "benchmark", fake_benchmark)
    fits = fit_gloo_links(4)
    assert calls == [(("all_reduce", "all_gather", "reduce_scatter"), 4, "gloo")]
    for op, (a, b) in truth.items():
        assert fits[op].op == op and fits[op].nranks == 4
        assert fits[op].alpha_s == pytest.approx(a, rel=1e-6) and fits[op].beta_s_per_byte == pytest.approx(b, rel=1e-6)
    med = fit_gloo_links(2, ("reduce_scatter",), stat="median")
    assert list(med) == ["reduce_scatter"] and med["reduce_scatter"].alpha_s == pytest.approx(2 * 9e-4, rel=1e-6)
    assert pv.fit_gloo_link(2).op == "all_reduce"
    with pytest.raises(ValueError, match="ops='broadcast'"):
        fit_gloo_links(2, ("broadcast",))
    with pytest.raises(ValueError, match="at least one"):
        fit_gloo_links(2, ())
    with pytest.raises(ValueError, match="nranks=1"):
        fit_gloo_links(1)


def test_one_rank_has_no_communication_and_default_params_build_the_meta_model():
    cfg = _cfg("ddp")
    p = pv.predict_step(cfg, 1, flops_per_s=10e9, alpha_beta=None, cores=2)
    assert p.comm_s == 0.0 and p.step_s == pytest.approx(_compute(cfg, 1, 10e9))
    exact = pv.predict_step(cfg, 2, flops_per_s=10e9, alpha_beta=_link(2), cores=2)      # exact buckets
    counted = pv.predict_step(cfg, 2, flops_per_s=10e9, alpha_beta=_link(2), cores=2,
                              params=flops.n_params(cfg.model_config.shape()))
    assert exact.comm_s > 0 and exact.comm_s == pytest.approx(counted.comm_s, rel=0.05)


def test_predict_step_rejects_bad_input():
    with pytest.raises(ValueError, match="cfg.parallel='single'.*'ddp', 'fsdp'"):
        pv.predict_step(_cfg("single"), 1, flops_per_s=1e9, alpha_beta=None, cores=2)
    with pytest.raises(ValueError, match="alpha_beta=None is not valid with nranks=2"):
        pv.predict_step(_cfg(), 2, flops_per_s=1e9, alpha_beta=None, cores=2, params=P)
    with pytest.raises(ValueError, match="fitted on 4 ranks, not nranks=2"):
        pv.predict_step(_cfg(), 2, flops_per_s=1e9, alpha_beta=_link(4), cores=2, params=P)
    with pytest.raises(ValueError, match="flops_per_s=0"):
        pv.predict_step(_cfg(), 1, flops_per_s=0, alpha_beta=None, cores=2)
    with pytest.raises(TypeError, match="TrainConfig"):
        pv.predict_step({"parallel": "ddp"}, 1, flops_per_s=1e9, alpha_beta=None, cores=2)


def test_validate_and_measure_reject_bad_requests_before_launching():
    with pytest.raises(ValueError, match="models='huge'"):
        pv.validate(models=("huge",))
    with pytest.raises(ValueError, match="parallels='fsdp1'"):
        pv.validate(parallels=("fsdp1",))
    with pytest.raises(ValueError, match="target=2"):
        pv.validate(target=2)
    with pytest.raises(ValueError, match="parallel='single'"):
        pv.measure_steps([_cfg("single")], 2)
    with pytest.raises(ValueError, match="at least one"):
        pv.measure_steps([], 2)
    with pytest.raises(ValueError, match="nranks=1"):
        pv.fit_gloo_link(1)


def _cal(**kw):
    """A Calibration from fixed numbers (no runs): tiny at 20 GFLOP/s alone, 10 with 2 ranks computing."""
    base = dict(rates={("tiny", 1): 20e9, ("tiny", 2): 10e9}, unit_s={("tiny", "fsdp"): 2e-3, ("tiny", "ddp"): 0.0},
                units={("tiny", "fsdp"): 3, ("tiny", "ddp"): 1}, links={2: _link(2)},
                steps={("tiny", "single"): 0.1, ("tiny", "fsdp"): 0.106, ("tiny", "ddp"): 0.1}, cores=2,
                threads_per_rank=1, sources=["a source"])
    return pv.Calibration(**{**base, **kw})


def test_concurrency_slowdown_and_wrapper_terms():
    assert steptime.concurrency_slowdown(20e9, 10e9) == pytest.approx(2.0)
    assert steptime.concurrency_slowdown(20e9, 25e9) == pytest.approx(0.8)        # a measurement, not clamped
    assert steptime.unit_overhead_s(0.13, 0.10, 3) == pytest.approx(0.01)
    assert steptime.unit_overhead_s(0.13, 0.10, 3, micro_batches=2) == pytest.approx(0.005)
    assert steptime.unit_overhead_s(0.099, 0.10, 3) == 0.0                          # faster wrapped run: noise
    assert steptime.wrapper_overhead_s(0.01, 3, 2, slowdown=1.5) == pytest.approx(0.09)
    with pytest.raises(ValueError, match="rate_concurrent=0"):
        steptime.concurrency_slowdown(1e9, 0)
    with pytest.raises(ValueError, match="n_units=0"):
        steptime.unit_overhead_s(0.2, 0.1, 0)
    with pytest.raises(ValueError, match="slowdown=0"):
        steptime.wrapper_overhead_s(0.01, 3, slowdown=0)


def test_a_concurrent_rate_is_not_slowed_again_and_the_wrapper_adds_on():
    cfg, rate = _cfg("ddp", bucket_cap_mb=1000.0), 10e9
    over = pv.predict_step(cfg, 4, flops_per_s=rate, alpha_beta=_link(4), cores=2, params=P)
    conc = pv.predict_step(cfg, 4, flops_per_s=rate, alpha_beta=_link(4), cores=2, params=P, concurrent_rate=True,
                           overhead_s=0.03)
    assert over.oversubscription == 2.0 and conc.oversubscription == 1.0
    assert conc.compute_s == pytest.approx(over.compute_s / 2) and conc.comm_s == pytest.approx(over.comm_s)
    assert conc.step_s == pytest.approx(conc.compute_s + conc.comm_s + 0.03) and conc.overhead_s == 0.03
    with pytest.raises(ValueError, match="overhead_s=-1"):
        pv.predict_step(cfg, 1, flops_per_s=rate, alpha_beta=None, cores=2, overhead_s=-1)


def test_wrapped_units_are_fsdp_units_or_ddp_buckets():
    assert pv.wrapped_units(_cfg("fsdp")) == _cfg().model_config.n_layers + 1
    assert pv.wrapped_units(_cfg("ddp", bucket_cap_mb=1000.0), params=P) == 1
    assert pv.wrapped_units(_cfg("ddp", bucket_cap_mb=1.0), params=P) == 4           # 4 MB of fp32 in 1 MB buckets
    with pytest.raises(ValueError, match="cfg.parallel='single'"):
        pv.wrapped_units(_cfg("single"))


def test_calibration_predicts_from_its_measured_terms():
    cal, cfg = _cal(), _cfg("fsdp")
    p1, p2 = cal.predict(cfg, 1), cal.predict(cfg, 2)
    assert cal.slowdown("tiny", 2) == pytest.approx(2.0)
    assert p1.compute_s == pytest.approx(_compute(cfg, 1, 20e9)) and p1.comm_s == 0.0
    assert p1.overhead_s == pytest.approx(2e-3 * 3)                                  # per unit × units × 1
    assert p2.compute_s == pytest.approx(_compute(cfg, 2, 10e9)) and p2.oversubscription == 1.0
    assert p2.overhead_s == pytest.approx(2e-3 * 3 * 2.0)                             # slowed like compute
    assert p2.step_s == pytest.approx(p2.compute_s + p2.comm_s + p2.overhead_s)
    text = cal.format()
    assert "slowdown x2.00" in text and "2.00 ms per unit x 3 units" in text and "a source" in text
    ops = {"all_gather": _link(2, 3e-4, 2e-9, "all_gather"), "reduce_scatter": _link(2, 5e-4, 4e-9, "reduce_scatter")}
    own = _cal(op_links={2: ops})
    assert own.predict(cfg, 2).comm_s == pytest.approx(steptime.data_parallel_comm_s(
        cfg, pv._meta_model(cfg), 3, 2, _link(2), reduce_scatter_as_all_reduce=True, op_links=ops))
    assert own.predict(cfg, 2).comm_s != pytest.approx(p2.comm_s) and own.predict(cfg, 1).comm_s == 0.0
    assert "2 ranks, all_gather: alpha 300.0 us/step" in own.format() and "reduce_scatter: alpha 500.0" in own.format()


def test_calibrate_and_validate_never_predict_from_the_runs_they_check(monkeypatch):
    """With the launches replaced by fakes: calibration runs are their own (plain / 1-rank wrapped /
    concurrent plain, labelled 'calibration'), the validated runs are others, and each prediction is the
    calibration's arithmetic. One 1-rank launch holds the calibration and the 1-rank cells; per n > 1 the
    links and the unit cycle come first, then one launch measures the cells and then the concurrent rate."""
    launched = _fake_launches(monkeypatch)
    v = pv.validate(models=("tiny",), nranks=(1, 2), micro_batch={"tiny": 2}, steps=3, warmup_steps=1)
    assert launched[0] == [("tiny single calibration", "single", 1), ("tiny ddp calibration", "ddp", 1),
                           ("tiny fsdp calibration", "fsdp", 1), ("tiny ddp x1", "ddp", 1), ("tiny fsdp x1", "fsdp", 1)]
    assert [op for _, op, _ in launched[1]] == ["all_reduce", "all_gather", "reduce_scatter"]
    assert launched[2] == [("cycle calibration", "synthetic", 2)]
    assert launched[3] == [("tiny ddp x2", "ddp", 2), ("tiny fsdp x2", "fsdp", 2),
                           ("tiny x2 concurrent calibration", "single", 2)] and len(launched) == 4
    assert v.calibration.cycles[2].nranks == 2 and "FSDP2 unit cycle on 2 ranks" in v.format()
    assert set(v.calibration.op_links[2]) == {"all_gather", "reduce_scatter"} and v.calibration.links[2].op == "all_reduce"
    cal = v.calibration
    assert cal.unit_s[("tiny", "fsdp")] == pytest.approx(0.03 / 3) and cal.unit_s[("tiny", "ddp")] == 0.0
    assert cal.slowdown("tiny", 2) == pytest.approx(1.5)
    row = v.table.set_index(["parallel", "ranks"]).loc[("fsdp", 2)]
    assert row["pred_step_ms"] == pytest.approx(cal.predict(_cfg_like("fsdp"), 2).step_s * 1e3)
    assert row["pred_wrapper_ms"] == pytest.approx(0.03 * 1.5 * 1e3)
    text = v.format()
    assert "predicted ms" in text and "within 15%?" in text and "FSDP2" in text and "repeat a calibration" in text
    cal2 = pv.calibrate({"tiny": _cfg_like("single")}, (1, 2), ("ddp",), repeats=2)   # calibration alone
    assert cal2.rates[("tiny", 2)] == pytest.approx(cal.rates[("tiny", 2)]) and cal2.links[2].op == "all_reduce"
    assert launched[-2] == [("tiny x2 concurrent calibration", "single", 2)]             # its own launch here


def fake_record(cfg, n, step):
    """A stand-in for rank 0's RunRecord of ``cfg`` on ``n`` ranks with a median step of ``step`` seconds."""
    mc = cfg.model_config
    return SimpleNamespace(step_time=SimpleNamespace(median=step, p10=step, p90=step, n=3),
                           tokens_per_step=cfg.micro_batch * mc.seq_len * n,
                           hardware_flops_per_token=flops.hardware_flops_per_token(mc.shape()), n_devices=n)


def _fake_launches(monkeypatch, machine_speed=lambda: 1.0):
    """Replace every launch of perf_validate by arithmetic; returns the list of launches made (each a list
    of (label, parallel, ranks) in the order run). Validated steps are slowed by ``machine_speed()``
    (called once per launch that holds validated runs: a machine whose speed drifts)."""
    launched, rec = [], fake_record

    def steps(cfgs, n):
        k = machine_speed() if any("calibration" not in c.label for c in cfgs) else 1.0
        return [rec(c, n, (1.0 if "calibration" in c.label else k) * {"single": 0.1, "ddp": 0.1, "fsdp": 0.13}[c.parallel]
                    * (1.5 if n > 1 else 1)) for c in cfgs]

    def rates(cfgs, n):
        return [pv.compute_rate(rec(c, 1, 0.1)) / 1.5 for c in cfgs]

    def fake_steps(cfgs, n, **kw):
        launched.append([(c.label, c.parallel, n) for c in cfgs])
        return steps(cfgs, n)

    def fake_concurrent(cfgs, n, **kw):
        launched.append([(c.label, c.parallel, n) for c in cfgs])
        return rates(cfgs, n)

    def fake_steps_then_rates(cfgs, plain, n, **kw):
        launched.append([(c.label, c.parallel, n) for c in [*cfgs, *plain]])
        return steps(cfgs, n), rates(plain, n)

    monkeypatch.setattr(pv, "measure_steps_then_rates", fake_steps_then_rates)
    monkeypatch.setattr(pv, "measure_steps", fake_steps)
    monkeypatch.setattr(pv, "measure_concurrent_rates", fake_concurrent)
    def fake_links(n, ops, **kw):
        launched.append([("link calibration", op, n) for op in ops])
        return {op: _link(n, alpha={"all_reduce": 1e-4, "all_gather": 3e-4, "reduce_scatter": 5e-4}[op], op=op)
                for op in ops}

    monkeypatch.setattr(pv, "fit_gloo_links", fake_links)

    def fake_cycle(n, **kw):
        launched.append([("cycle calibration", "synthetic", n)])
        return fit_unit_cycle((1e6, 4e6), (5e-3, 11e-3), n)

    monkeypatch.setattr(pv, "fsdp_unit_cycle", fake_cycle)
    return launched


def test_rounds_compare_medians_and_show_the_machines_own_spread(monkeypatch):
    """Three rounds on a machine whose validated runs come out 1.0×, 1.3×, 1.1× as slow: each round is
    calibrated and measured afresh, the table holds the median measurement (1.1×) and the spread (30 %)."""
    speeds = iter([1.0, 1.0, 1.3, 1.3, 1.1, 1.1])           # two measurement launches (1 and 2 ranks) per round
    launched = _fake_launches(monkeypatch, machine_speed=lambda: next(speeds))
    v = pv.validate(models=("tiny",), parallels=("ddp",), nranks=(1, 2), micro_batch={"tiny": 2}, steps=3,
                    warmup_steps=1, rounds=3)
    assert len(v.rounds) == 6 and len(v.table) == 2 and sum("calibration" in x[0][0] for x in launched) == 6
    assert [x for x in launched if x[0][0] == "link calibration"][0] == [("link calibration", "all_reduce", 2)]
    assert not [x for x in launched if x[0][0] == "cycle calibration"]         # DDP alone: no FSDP2 cycle
    row = v.table.set_index("ranks").loc[1]
    assert row["meas_step_ms"] == pytest.approx(110.0) and row["meas_spread"] == pytest.approx(0.3)
    assert row["error"] == pytest.approx(row["pred_step_ms"] / 110.0 - 1)
    text = v.format()
    assert "spread" in text and "30%" in text and "3 rounds" in text
    errs = [row["pred_step_ms"] / (100.0 * k) - 1 for k in (1.0, 1.3, 1.1)]   # the prediction is the same each round
    assert row["round_errors"] == pytest.approx(errs) and "by round" in text
    assert "/".join(f"{e:+.0%}" for e in errs) in text
    with pytest.raises(ValueError, match="rounds=0"):
        pv.validate(models=("tiny",), rounds=0)


def test_unit_cycle_fit_is_a_line_through_the_measured_costs():
    c = fit_unit_cycle((0.5e6, 2e6, 5e6), (3e-3 + 2e-9 * 0.5e6, 3e-3 + 2e-9 * 2e6, 3e-3 + 2e-9 * 5e6), 2)
    assert c.alpha_s == pytest.approx(3e-3) and c.beta_s_per_byte == pytest.approx(2e-9)
    assert c.cost(1e6) == pytest.approx(5e-3) and c.nranks == 2
    assert fit_unit_cycle((1e6, 2e6), (1e-3, -1e-3), 2).cost(2e6) == 0.0          # a negative fit is clamped
    assert "3.00 ms + 2.000 ns/B" in c.format() and "2.00 MB 7.00 ms" in c.format()
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit_unit_cycle((1e6, 1e6), (1e-3, 2e-3), 2)
    with pytest.raises(ValueError, match="one cost per size"):
        fit_unit_cycle((1e6, 2e6, 3e6), (1e-3, 2e-3), 2)


def test_unit_cycle_calibration_launches_only_the_synthetic_module(monkeypatch):
    """Two launches (1 rank, then n), each of the synthetic Linear units alone — never a TrainConfig or
    a GPT; the cost per unit is n-rank − 1-rank time at each size."""
    import torch

    from labkit.launcher import parent
    from labkit.perf.validate import fit

    launches = []

    def fake_launch(target, n, *, args=(), **kw):
        launches.append((target, n, args))
        sizes = args[0]
        return SimpleNamespace(value=[(1e-3 if n == 1 else 4e-3 + 1e-9 * b) for b in sizes])

    monkeypatch.setattr(parent, "launch", fake_launch)
    c = fit.fsdp_unit_cycle(2, (0.5e6, 2e6, 5e6), n_units=3, iters=4, warmup=1)
    assert [(t, n) for t, n, _ in launches] == [(fit._cycle_cells, 1), (fit._cycle_cells, 2)]
    assert all(a == ([0.5e6, 2e6, 5e6], 3, 4, 1, 1, 2) for _, _, a in launches)  # sizes and counts only
    assert c.alpha_s == pytest.approx(3e-3) and c.beta_s_per_byte == pytest.approx(1e-9)
    assert c.one_rank_s == (1e-3,) * 3 and c.nranks == 2
    model, d = fit._synthetic_units(2e6, 3)
    assert len(model) == 3 and all(isinstance(m, torch.nn.Linear) for m in model[0]) and len(model[0]) == 2
    assert len(fit._synthetic_units(2e6, 1, layers=6)[0][0]) == 6
    assert sum(p.numel() for p in model[0].parameters()) * 4 == pytest.approx(2e6, rel=0.01) and d > 8
    with pytest.raises(ValueError, match="nranks=1"):
        fit.fsdp_unit_cycle(1)
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit.fsdp_unit_cycle(2, (1e6,))
    assert len(launches) == 2                                                       # bad requests launch nothing


def test_fsdp2_on_n_ranks_is_priced_by_the_unit_cycle_instead_of_alpha_beta():
    cfg, cyc = _cfg("fsdp"), fit_unit_cycle((1e6, 4e6), (5e-3, 11e-3), 2)          # 3 ms + 2 ns/B per unit
    model = pv._meta_model(cfg)
    units = fsdp_unit_bytes(model)
    assert len(units) == cfg.model_config.n_layers + 1 and len(set(units[:-1])) == 1
    assert sum(units) == sum(p.numel() for p in dict.fromkeys(model.parameters())) * 4
    want = sum(3e-3 + 2e-9 * b for b in units)
    p = pv.predict_step(cfg, 2, flops_per_s=20e9, alpha_beta=_link(2), cores=2, unit_cycle=cyc, overhead_s=0.01)
    assert p.comm_s == pytest.approx(want)                                           # the cycle, not α–β as well
    assert p.step_s == pytest.approx(p.compute_s + want + 0.01)
    assert fsdp_cycle_s(units, 3, cyc) == pytest.approx(3 * want)                     # per micro-batch
    plain = pv.predict_step(cfg, 2, flops_per_s=20e9, alpha_beta=_link(2), cores=2)
    assert plain.comm_s != pytest.approx(want)
    ddp = pv.predict_step(_cfg("ddp"), 2, flops_per_s=20e9, alpha_beta=_link(2), cores=2, unit_cycle=cyc)
    assert ddp.comm_s == pytest.approx(pv.predict_step(_cfg("ddp"), 2, flops_per_s=20e9, alpha_beta=_link(2),
                                                       cores=2).comm_s)              # DDP ignores it
    assert pv.predict_step(cfg, 1, flops_per_s=20e9, alpha_beta=None, cores=2, unit_cycle=cyc).comm_s == 0.0
    with pytest.raises(ValueError, match="measured on 2 ranks, not nranks=4"):
        pv.predict_step(cfg, 4, flops_per_s=20e9, alpha_beta=_link(4), cores=2, unit_cycle=cyc)
    with pytest.raises(TypeError, match="UnitCycle"):
        fsdp_cycle_s(units, 1, {"alpha_s": 1})
    with pytest.raises(TypeError, match="labkit GPT"):
        fsdp_unit_bytes(P)
    cal = _cal(cycles={2: cyc})
    assert cal.predict(cfg, 2).comm_s == pytest.approx(want) and "FSDP2 unit cycle on 2 ranks" in cal.format()


def _cfg_like(parallel):
    return TrainConfig(model="tiny", micro_batch=2, steps=3, warmup_steps=1, dtype="fp32", device="cpu",
                       parallel=parallel, label="tiny")


@pytest.mark.slow   # three launches of real gloo ranks: ≈ 15 s idle, a minute on a busy 2-core machine
def test_validate_end_to_end_on_two_gloo_ranks():
    v = pv.validate(models=("tiny",), parallels=("ddp",), nranks=(2,), micro_batch={"tiny": 2}, steps=3,
                    warmup_steps=1, link_iters=2, timeout_s=300)
    assert list(v.table["ranks"]) == [2] and v.calibration.links[2].nranks == 2
    row = v.table.iloc[0]
    assert row["pred_step_ms"] > 0 and row["pred_comm_ms"] > 0 and row["meas_step_ms"] > 0
    assert row["meas_steps"] == 2 and v.calibration.rates[("tiny", 2)] > 0
    assert "within 15%" in v.format()

"""labkit.perf_validate: the performance model fed with this machine's measured compute and link.

The arithmetic is checked with fakes (a fake record, a fixed α–β, a parameter count); one slow test runs
the whole machinery on real gloo ranks and checks only that it produces figures — never a timing.
"""
from types import SimpleNamespace

import pandas as pd
import pytest

from labkit import flops
from labkit import perf_validate as pv
from labkit.comm.models import AlphaBeta
from labkit.train import TrainConfig

P = 1_000_000          # parameters (a count: no meta model needed)


def _cfg(parallel="ddp", **kw):
    return TrainConfig(model="tiny", micro_batch=8, steps=3, warmup_steps=1, parallel=parallel, device="cpu", **kw)


def _link(n, alpha=1e-4, beta=1e-9):
    return AlphaBeta(alpha_s=alpha, beta_s_per_byte=beta, op="all_reduce", nranks=n)


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


def test_validation_format_says_met_or_not_per_cell():
    table = pd.DataFrame([
        {"model": "tiny", "parallel": "ddp", "ranks": 2, "oversub": 1.0, "pred_compute_ms": 80.0,
         "pred_comm_ms": 5.0, "pred_step_ms": 85.0, "meas_step_ms": 90.0, "meas_p10_ms": 88.0,
         "meas_p90_ms": 95.0, "meas_steps": 5, "error": 85 / 90 - 1, "met": True},
        {"model": "tiny", "parallel": "fsdp", "ranks": 4, "oversub": 2.0, "pred_compute_ms": 160.0,
         "pred_comm_ms": 10.0, "pred_step_ms": 170.0, "meas_step_ms": 300.0, "meas_p10_ms": 280.0,
         "meas_p90_ms": 320.0, "meas_steps": 5, "error": 170 / 300 - 1, "met": False}])
    v = pv.Validation(table=table, rates={"tiny": 20e9}, links={2: _link(2)}, cores=2, threads_per_rank=1,
                      target=0.15, assumptions=["an assumption"])
    text = v.format()
    assert "met" in text and "NOT met" in text and "x2" in text and "-43.3%" in text
    assert "20.0 GFLOP/s" in text and "alpha 100.0 us/step" in text and "1 of 2 cells" in text


@pytest.mark.slow   # three launches of real gloo ranks: ≈ 15 s idle, a minute on a busy 2-core machine
def test_validate_end_to_end_on_two_gloo_ranks():
    v = pv.validate(models=("tiny",), parallels=("ddp",), nranks=(2,), micro_batch={"tiny": 2}, steps=3,
                    warmup_steps=1, link_iters=2, timeout_s=300)
    assert list(v.table["ranks"]) == [2] and v.links[2].nranks == 2
    row = v.table.iloc[0]
    assert row["pred_step_ms"] > 0 and row["pred_comm_ms"] > 0 and row["meas_step_ms"] > 0
    assert row["meas_steps"] == 2 and v.rates["tiny"] > 0
    assert "within 15%" in v.format()

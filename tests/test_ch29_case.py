"""Chapter 29's library code: the 13B case reviewed (labkit.teaching.cases.review_thirteen_b) and the slow inter-"node"
link of the trainer (labkit.train.slow_link, TrainConfig(ranks_per_node=…, inter_node_gbit_s=…))."""
from __future__ import annotations

import math

import pytest

from labkit import comm, perf
from labkit.teaching import cases
from labkit.teaching.cases import review_thirteen_b as rv
from labkit.train import TrainConfig, slow_link


# ------------------------------------------------------------------------------ the 13B case reviewed
def test_nvml_reading_keeps_compute_per_token_and_the_other_does_not():
    rows = {r["reading"]: r for r in rv.util_readings(cases.thirteen_b())}
    nvml, compute_only = rows[rv.READINGS[0]], rows[rv.READINGS[1]]
    # 92 − 8 = 84 % compute on 64 GPUs at 1.8k; 71 − 27 = 44 % on 128 at 1.05k
    assert nvml["compute 64"] == pytest.approx(0.84) and nvml["compute 128"] == pytest.approx(0.44)
    assert nvml["compute ms/token 64"] == pytest.approx(0.84 / 1.8)
    assert nvml["compute per token 128/64"] == pytest.approx((0.44 / 1.05) / (0.84 / 1.8))
    assert abs(nvml["compute per token 128/64"] - 1) < 0.15 < abs(compute_only["compute per token 128/64"] - 1)
    assert rv.coherent_util_reading(cases.thirteen_b())["reading"] == rv.READINGS[0]
    for r in rows.values():   # the three shares of each reading add up to the step
        for g in (64, 128):
            assert r[f"compute {g}"] + r[f"NCCL wait {g}"] + r[f"no kernel {g}"] == pytest.approx(1)


def test_util_figures_follow_the_case_and_impossible_ones_are_refused():
    c = cases.thirteen_b(nccl_wait=(0.08, 0.5))
    nvml, compute_only = rv.util_readings(c)
    assert nvml["compute 128"] == pytest.approx(0.21) and nvml["possible"] and not compute_only["possible"]
    assert rv.coherent_util_reading(c)["reading"] == rv.READINGS[0]
    with pytest.raises(ValueError, match="negative share under both"):
        rv.coherent_util_reading(cases.thirteen_b(gpu_util=(0.92, 0.2), nccl_wait=(0.95, 0.9)))
    with pytest.raises(ValueError, match="gpu_util"):
        cases.thirteen_b(gpu_util=(0.9,))
    with pytest.raises(TypeError, match="ThirteenBCase"):
        rv.util_readings(cases.bert_large())


def test_fix_steps_start_at_58_percent_and_each_order_removes_the_same_time():
    rows = rv.fix_steps(cases.thirteen_b())
    first, second = rows[:3], rows[3:]
    for part in (first, second):
        assert part[0]["scaling efficiency"] == pytest.approx(1.05 / 1.8)
        assert part[0]["points gained"] == 0
        assert sum(r["points gained"] for r in part) == pytest.approx(part[-1]["scaling efficiency"] - 1.05 / 1.8)
        assert all(r["points gained"] > 0 for r in part[1:])
    # the end state is the same whichever fix comes first; the shares depend on the order
    assert first[-1]["per GPU (k tokens/s)"] == pytest.approx(second[-1]["per GPU (k tokens/s)"])
    assert first[1]["share of 58→92"] != pytest.approx(second[2]["share of 58→92"])
    # the loader step brings the no-kernel time back to the 64-GPU run's: 8 % of 1/1.8k ms
    assert first[-1]["no-kernel ms/token"] == pytest.approx(0.08 / 1.8)
    # the planner step scales the NCCL wait by the model's exposed communication per token, fix ÷ DP128
    preds = list(cases.thirteen_b().modelled().values())
    ratio = rv.exposed_comm_ms_per_token(preds[2]) / rv.exposed_comm_ms_per_token(preds[1])
    assert 0 < ratio < 1 and first[1]["comm ms/token"] == pytest.approx(0.27 / 1.05 * ratio)


def test_exposed_comm_per_token_counts_every_non_compute_term():
    p = cases.thirteen_b().modelled()["pure DP, 128 GPUs"]
    assert rv.exposed_comm_ms_per_token(p) == pytest.approx(1e3 * p.exposed_s["dp"] * 128 / p.tokens_per_step)


def test_synthetic_slow_link_parses_and_fits_back_to_its_bandwidth():
    t13 = cases.thirteen_b()
    fab = comm.synthetic.ethernet_fabric(t13.link_gbit_s, gpus_per_node=t13.gpus_per_node)
    assert fab.nranks == 16 and fab.inter_bw == pytest.approx(0.93 * 3.125e9)
    text = comm.synthetic.synthetic_nccl_tests(fab, min_bytes=1 << 20, max_bytes=1 << 30, seed=1, noise=0.02)
    assert text.startswith("# SYNTHETIC")
    fit = comm.parse_nccl_tests(text).fit()
    assert fit.nranks == 16 and 1 / fit.beta_s_per_byte == pytest.approx(fab.inter_bw, rel=0.05)
    c = perf.cluster("a100-25gbe", nodes=16).with_links(inter=fit)
    assert c.inter_bw == pytest.approx(1 / fit.beta_s_per_byte) and "inter-node link fitted" in c.description
    log = comm.parse_nccl_debug(comm.synthetic.synthetic_nccl_debug(fab))
    assert "Socket" in log.summary()
    with pytest.raises(ValueError, match="tcp_share"):
        comm.synthetic.ethernet_fabric(25.0, tcp_share=1.5)


# ------------------------------------------------------------------------------ the slow link
def test_delay_is_the_ring_bandwidth_term_and_nodes_are_consecutive_ranks():
    assert slow_link.delay_s(1e6, 4, 8.0) == pytest.approx(2 * 3 / 4 * 1e6 / 1e9)
    assert slow_link.delay_s(1e6, 1, 8.0) == 0.0
    assert [slow_link.node_of(r, 2) for r in range(4)] == [0, 0, 1, 1]
    assert slow_link.spans_nodes([0, 2], 2) and not slow_link.spans_nodes([2, 3], 2)
    with pytest.raises(ValueError, match="gbit_s"):
        slow_link.delay_s(1e6, 2, 0)


@pytest.mark.parametrize("kw, match", [
    ({"ranks_per_node": 2}, "inter_node_gbit_s"),
    ({"inter_node_gbit_s": 1.0}, "ranks_per_node"),
    ({"ranks_per_node": 2, "inter_node_gbit_s": 1.0, "parallel": "fsdp"}, "parallel"),
    ({"ranks_per_node": 2, "inter_node_gbit_s": 1.0, "parallel": "ddp", "comm_hook": "fp16"}, "comm_hook"),
    ({"ranks_per_node": 0, "inter_node_gbit_s": 1.0, "parallel": "ddp"}, "ranks_per_node"),
    ({"ranks_per_node": 2, "inter_node_gbit_s": -1.0, "parallel": "ddp"}, "inter_node_gbit_s"),
])
def test_bad_slow_link_configs_name_the_field(kw, match):
    kw.setdefault("parallel", "ddp")
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kw)


def test_layouts_whose_tp_or_pp_would_cross_nodes_are_refused():
    ok = TrainConfig(parallel="ddp", ranks_per_node=2, inter_node_gbit_s=1.0, tp=2)
    slow_link.check_layout(ok, 4)
    with pytest.raises(ValueError, match="TP group would span"):
        slow_link.check_layout(ok.replace(ranks_per_node=1), 4)
    with pytest.raises(ValueError, match="stages span"):
        slow_link.check_layout(ok.replace(tp=1, pp=2, accum=2), 4)
    with pytest.raises(ValueError, match="does not divide"):
        slow_link.check_layout(ok.replace(ranks_per_node=3, tp=1), 4)


@pytest.mark.timeout(240)
def test_a_link_between_two_nodes_delays_the_buckets_and_one_node_pays_nothing():
    from labkit.train import run_many

    base = TrainConfig(model="tiny", parallel="ddp", steps=3, warmup_steps=1, micro_batch=2, seq_len=32, seed=0,
                       device="cpu", peak_flops=1e12, inter_node_gbit_s=0.2, ranks_per_node=1)
    two, one, accum = run_many([base.replace(ranks_per_node=1), base.replace(ranks_per_node=2),
                                base.replace(ranks_per_node=1, accum=3)], nprocs=2)
    a, b, c = (r.extra["slow_link"] for r in (two, one, accum))
    assert a["spans"] and not b["spans"] and b["injected_s"] == 0
    per_bucket = a["bytes"] / a["buckets"]
    assert a["injected_s"] == pytest.approx(a["buckets"] * slow_link.delay_s(per_bucket, 2, 0.2), rel=1e-6)
    assert c["buckets"] == a["buckets"]          # no_sync: one all-reduce per step whatever the accumulation
    assert two.step_time.median > a["injected_s"] / base.steps     # the sleep is inside the timed step
    assert math.isclose(two.loss[0], one.loss[0], rel_tol=1e-6)  # the link delays, never changes, the numbers


# ----------------------------------------------------------------- the fix's placement: TP × PP inside a node
def test_the_fix_and_the_replanned_layout_keep_tp_x_pp_inside_a_node():
    t13 = cases.thirteen_b()
    fix = list(t13.modelled().values())[-1]
    g = fix.cluster.gpus_per_node
    block = fix.layout.group_ranks("tp", "pp")                    # one model replica's TP × PP ranks
    assert len(block) == 4 and max(block) // g == min(block) // g   # one node
    assert any("PP:" in a and "inside a node" in a for a in fix.assumptions)
    outer = perf.predict(_shape(), fix.layout.with_(order="tp-cp-dp-pp"), fix.cluster, global_batch=fix.global_batch)
    pp_out = outer.layout.group_ranks("pp")
    assert max(pp_out) // g != 0                                    # PP outermost: its sends cross the 25 GbE
    assert any("PP:" in a and "across nodes" in a for a in outer.assumptions)
    assert fix.step_s < outer.step_s and fix.comm_s["pp"] < outer.comm_s["pp"]
    pl = perf.plan(_shape(), fix.cluster, global_batch=fix.global_batch, strategies=("zero1", "zero2"),
                   recompute=("none",), virtual_stages=())
    best = pl.best_with(tp=2, pp=2)                                 # the planner places it inside a node too
    assert best.layout.order == "tp-cp-pp-dp"
    ranks = best.layout.group_ranks("tp", "pp")
    assert max(ranks) // g == min(ranks) // g and "ranks tp-cp-pp-dp" in best.layout.describe()


def test_rank_order_strides_and_bad_order():
    lay = perf.Layout(dp=4, tp=2, pp=2, order="tp-cp-pp-dp")
    assert (lay.stride("tp"), lay.stride("pp"), lay.stride("dp")) == (1, 2, 4)
    assert lay.group_ranks("dp") == [0, 4, 8, 12] and lay.group_ranks("tp", "pp") == [0, 1, 2, 3]
    default = perf.Layout(dp=4, tp=2, pp=2)
    assert default.group_ranks("pp") == [0, 8] and default.group_ranks("cp", "dp") == [0, 2, 4, 6]
    with pytest.raises(ValueError, match="order='pp-dp-tp'"):
        perf.Layout(order="pp-dp-tp")


def _shape():
    from labkit.teaching.cases.thirteen_b import LLAMA_13B_SHAPE
    return LLAMA_13B_SHAPE

"""Tensor and pipeline parallelism in the one loop, on real gloo ranks (chapter 24): every layout trains
the same global batch as the single process and follows its loss curve to float tolerance in fp32."""
from __future__ import annotations

import pytest
from _procs import torchrun_labkit

from labkit.train import TrainConfig, run_many, train

# fp32, fixed seed, user peak (no live peak measurement in the ranks); 8 sequences per step in every layout
BASE = TrainConfig(model="tiny", steps=3, warmup_steps=1, peak_flops=1e12, micro_batch=8)
SMALL = BASE.replace(model="small", micro_batch=4)       # 4 blocks: pp=2 × 2 virtual stages
TOL = 2e-5                                               # fp32: other reduction orders, not other maths


@pytest.fixture(scope="module")
def curves():
    return {"tiny": train(BASE).loss, "small": train(SMALL).loss}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One launch of 2 ranks runs every 2-rank layout in turn (starting ranks is the slow part)."""
    traces = tmp_path_factory.mktemp("pp_traces")
    cfgs = {
        "tp": BASE.replace(tp=2, profile_dir=str(traces / "tp"), profile_steps=1),
        "tp_sp": BASE.replace(tp=2, sequence_parallel=True),
        "gpipe": BASE.replace(pp=2, pp_schedule="gpipe", micro_batch=4, accum=2),
        "1f1b": BASE.replace(pp=2, pp_schedule="1f1b", micro_batch=2, accum=4, profile_dir=str(traces / "pp"),
                             profile_steps=2),
        "interleaved": SMALL.replace(pp=2, pp_schedule="interleaved1f1b", virtual_stages=2, micro_batch=2,
                                     accum=2),
    }
    recs = run_many(list(cfgs.values()), 2, timeout_s=240)
    return dict(zip(cfgs, recs, strict=True))


@pytest.mark.parametrize("name", ["tp", "tp_sp"])
def test_tensor_parallel_follows_the_single_curve(two_ranks, curves, name):
    rec = two_ranks[name]
    assert rec.loss == pytest.approx(curves["tiny"], rel=TOL)
    assert rec.n_devices == 2 and rec.tokens_per_step == 8 * 64       # 2 ranks, one replica: one batch of 8
    lay = rec.extra["layout"]
    assert lay["mesh"] == {"pp": 1, "dp": 1, "cp": 1, "tp": 2} and lay["sequence_parallel"] == (name == "tp_sp")


def test_tensor_parallel_step_has_four_all_reduces_per_block(two_ranks):
    """Megatron's count: 2 all-reduces in forward (after attention's and the MLP's row-split projection) and
    2 in backward (the input gradients of the column-split qkv and fc) per block — in the profiled step — plus
    the vocabulary-parallel ends' 5 per micro-batch (tests/test_tp_vocab_parallel.py)."""
    import json
    from pathlib import Path

    rec = two_ranks["tp"]
    trace = json.loads((Path(rec.config["profile_dir"]) / "rank0.json").read_text())
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert sum(n.startswith("ProfilerStep") for n in names) == 1
    assert names.count("gloo:all_reduce") == 4 * rec.extra["model"]["n_layers"] + 5  # tiny: 2 blocks → 8, + 5


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved"])
def test_pipeline_schedules_follow_the_single_curve(two_ranks, curves, name):
    rec = two_ranks[name]
    ref = curves["small" if name == "interleaved" else "tiny"]
    assert rec.loss == pytest.approx(ref, rel=TOL)
    assert {"data", "pipeline", "comm", "optimizer"} <= set(rec.phases)
    lay = rec.extra["layout"]
    v = lay["virtual_stages"]
    assert lay["mesh"]["pp"] == 2 and lay["micro_batches"] == rec.config["accum"]
    assert lay["bubble_predicted"] == pytest.approx(1 / (v * rec.config["accum"]))
    assert len(lay["stage_blocks"]) == 2 * v and lay["stages_here"] == [2 * k for k in range(v)]   # rank 0


def test_bubble_is_measured_from_the_pipeline_trace(two_ranks):
    from labkit.trace.pipeline import pipeline_bubble

    rec = two_ranks["1f1b"]
    folder = rec.config["profile_dir"]
    b = pipeline_bubble(folder, pp=2, micro_batches=4)
    assert b.predicted == pytest.approx(1 / 4) == rec.extra["layout"]["bubble_predicted"]
    assert [r.rank for r in b.ranks] == [0, 1] and all(r.steps == 2 for r in b.ranks)   # the 2 profiled steps
    for r in b.ranks:        # both stages computed and both waited for the other inside the pipeline range
        assert 0 < r.busy_s < r.window_s and r.wait_s > 0 and r.bubble == pytest.approx(r.wait_s / r.busy_s)


def test_bubble_arithmetic_on_a_hand_made_trace(tmp_path):
    """A 10 ms pipeline range holding 6 ms of stage ranges (two overlapping) idles 4 ms: bubble 4/6."""
    import json

    from labkit.trace.pipeline import pipeline_bubble

    def ev(name, ts, dur, cat="user_annotation"):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": 1}

    events = [ev("labkit:pipeline", 1000, 10_000), ev("labkit:stage0:forward", 1000, 2000),
              ev("labkit:stage0:forward", 2500, 1500),          # overlaps the first: counted once
              ev("labkit:stage0:backward", 6000, 3000), ev("aten::mm", 6000, 100, "cpu_op"),
              ev("labkit:stage0:backward", 20_000, 5000)]         # outside the range: ignored
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": events,
                                                     "distributedInfo": {"rank": 0, "world_size": 1}}))
    r = pipeline_bubble(tmp_path).ranks[0]
    assert (r.window_s, r.busy_s, r.wait_s) == pytest.approx((0.010, 0.006, 0.004))
    assert r.bubble == pytest.approx(4 / 6) and r.idle_share == pytest.approx(0.4)
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": events[1:]}))
    with pytest.raises(ValueError, match="not a trace of a pipelined labkit run"):
        pipeline_bubble(tmp_path)


def test_four_rank_layouts_follow_the_single_curve(curves):
    cfgs = [BASE.replace(tp=2, pp=2, micro_batch=4, accum=2),                     # TP × PP
            BASE.replace(tp=2, parallel="ddp", micro_batch=2, accum=2),           # DP × TP (DDP, no_sync)
            BASE.replace(tp=2, parallel="fsdp", micro_batch=4),                   # DP × TP (FSDP2, 2-D)
            BASE.replace(pp=2, parallel="ddp", pp_schedule="gpipe", micro_batch=2, accum=2),    # DP × PP (DDP)
            BASE.replace(pp=2, parallel="fsdp", micro_batch=2, accum=2)]                          # DP × PP (FSDP2)
    recs = run_many(cfgs, 4, timeout_s=240)
    for cfg, rec in zip(cfgs, recs, strict=True):
        assert rec.loss == pytest.approx(curves["tiny"], rel=TOL), (cfg.tp, cfg.pp, cfg.parallel)
        assert rec.tokens_per_step == 8 * 64 and rec.n_devices == 4
    assert recs[0].extra["layout"]["mesh"] == {"pp": 2, "dp": 1, "cp": 1, "tp": 2}
    assert recs[1].extra["layout"]["mesh"] == {"pp": 1, "dp": 2, "cp": 1, "tp": 2}


def test_layout_configs_are_checked():
    bad = [({"tp": 3}, "divisible by tp"),                        # tiny: 4 heads
           ({"pp": 3}, "n_layers=2"),                              # tiny: 2 blocks
           ({"pp": 2, "accum": 1}, "accum ≥ pp"),                  # 1F1B with fewer micro-batches than stages
           ({"pp": 2, "accum": 2, "pp_schedule": "zb"}, "pp_schedule='zb'"),
           ({"pp": 2, "accum": 2, "virtual_stages": 2}, "interleaved1f1b"),
           ({"model": "small", "pp": 2, "accum": 2, "pp_schedule": "interleaved1f1b"}, "virtual_stages ≥ 2"),
           ({"model": "small", "pp": 2, "accum": 5, "pp_schedule": "interleaved1f1b", "virtual_stages": 2},
            "multiple of 2"),
           ({"sequence_parallel": True}, "tp ≥ 2"),
           ({"tp": 2, "compile": True}, "compile"),
           ({"pp": 2, "accum": 2, "parallel": "fsdp1"}, "parallel='fsdp1'"),
           ({"tp": 2, "dtype": "fp16"}, "loss scaling")]
    for changes, message in bad:
        with pytest.raises(ValueError, match=message):
            BASE.replace(**changes)
    from labkit.train import run
    from labkit.train.parallel import coords, data_shard, mesh_shape

    with pytest.raises(ValueError, match="does not divide the 6 ranks"):
        run(BASE.replace(tp=2, pp=2, accum=2, parallel="ddp"), 6)
    with pytest.raises(ValueError, match="nprocs = tp·pp = 4"):
        run(BASE.replace(tp=2, pp=2, accum=2), 8)
    cfg = BASE.replace(tp=2, pp=2, accum=2, parallel="ddp")
    assert mesh_shape(cfg, 8) == {"pp": 2, "dp": 2, "cp": 1, "tp": 2}
    # tp innermost: ranks 0,1 are one TP group; rank 2 is the next dp replica; rank 4 the second stage
    assert coords(cfg, 8, 1) == {"pp": 0, "dp": 0, "cp": 0, "tp": 1}
    assert coords(cfg, 8, 6) == {"pp": 1, "dp": 1, "cp": 0, "tp": 0}
    assert [data_shard(cfg, 8, r) for r in (0, 1, 2, 5)] == [(2, 0), (2, 0), (2, 1), (2, 0)]


def test_pipeline_helpers():
    from labkit.train.pipeline import bubble_fraction, split_layers, stage_indices

    assert split_layers(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split_layers(5, 2) == [(0, 3), (3, 5)]
    assert stage_indices(1, 2, 2) == [1, 3]
    assert bubble_fraction(4, 8) == pytest.approx(3 / 8) and bubble_fraction(4, 8, 2) == pytest.approx(3 / 16)
    with pytest.raises(ValueError, match="cannot cut 2 blocks into 3"):
        split_layers(2, 3)


def test_interleaved_qkv_gives_each_rank_whole_heads():
    """The column shard of the reordered qkv weight is rank r's heads of q, k and v (Megatron's layout)."""
    import torch

    from labkit.train.tensor_parallel import interleave_qkv

    d, tp = 8, 2
    lin = torch.nn.Linear(d, 3 * d)
    with torch.no_grad():
        lin.weight.copy_(torch.arange(3 * d, dtype=torch.float).unsqueeze(1).expand(3 * d, d))
        lin.bias.copy_(torch.arange(3 * d, dtype=torch.float))
    interleave_qkv(lin, tp)
    shard0 = lin.bias[: 3 * d // tp].tolist()
    assert shard0 == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]      # q, k, v rows of heads 0-1 (d/tp = 4)
    assert lin.weight[:, 0].tolist() == lin.bias.tolist()


def test_cli_run_with_tp_and_pp(capsys, curves):
    from labkit.cli import main

    assert main(["run", "--tp", "2", "--pp", "2", "--micro-batch", "4", "--steps", "3", "--warmup-steps", "1",
                 "--peak-flops", "1e12", "--json"]) == 0
    import json

    rec = json.loads(capsys.readouterr().out)
    assert rec["config"]["tp"] == 2 and rec["config"]["pp"] == 2 and rec["config"]["accum"] == 2
    assert rec["extra"]["layout"]["mesh"] == {"pp": 2, "dp": 1, "cp": 1, "tp": 2}
    assert rec["loss"] == pytest.approx(curves["tiny"], rel=TOL)


@pytest.mark.slow
def test_tp_pp_under_plain_torchrun(tmp_path, curves):
    """`labkit run --tp 2 --pp 2` as the 4 ranks of a plain torchrun job (no labkit.launch)."""
    out = tmp_path / "rec.json"
    rc, text = torchrun_labkit(4, ["--tp", 2, "--pp", 2, "--steps", 3, "--warmup-steps", 1, "--micro-batch", 4,
                                   "--peak-flops", "1e12", "--save", out], timeout_s=240)
    assert rc == 0, text[-3000:]
    from labkit.record import RunRecord

    rec = RunRecord.load(out)
    assert rec.n_devices == 4 and rec.extra["layout"]["mesh"] == {"pp": 2, "dp": 1, "cp": 1, "tp": 2}
    assert rec.loss == pytest.approx(curves["tiny"], rel=TOL)

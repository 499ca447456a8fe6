"""Chapter 20's FSDP2 knobs on real gloo ranks: every knob trains the single-process loss curve (the maths
says sharding, resharding, prefetching, wrapping and offloading change where bytes live, not the update);
the counting hook and the registered-parameter bytes equal :mod:`labkit.memory.sharding`'s predictions;
bad knob values are refused with the value named."""
from __future__ import annotations

import pytest
import torch

from labkit import memory
from labkit.memory import sharding
from labkit.train import TrainConfig, run_many, train

BASE = TrainConfig(model="tiny", steps=3, warmup_steps=1, peak_flops=1e12, micro_batch=8, seq_len=32)
KNOBS = {"raf=None": dict(reshard_after_forward=None), "raf=False": dict(reshard_after_forward=False),
         "wrap=model": dict(fsdp_wrap="model"), "prefetch=1": dict(prefetch=1),
         "prefetch=1 backward": dict(prefetch=1, prefetch_mode="backward"), "cpu_offload": dict(cpu_offload=True)}


@pytest.fixture(scope="module")
def single_curve():
    return train(BASE).loss


def test_every_fsdp2_knob_follows_the_single_curve(single_curve):
    cfgs = [BASE.replace(parallel="fsdp", micro_batch=4, label=k, **v) for k, v in KNOBS.items()]
    cfgs.append(BASE.replace(parallel="fsdp1", micro_batch=4, fsdp_wrap="model", label="fsdp1 wrap=model"))
    for cfg, rec in zip(cfgs, run_many(cfgs, 2, timeout_s=240), strict=True):
        assert rec.loss == pytest.approx(single_curve, rel=1e-5), cfg.label
        assert rec.n_devices == 2 and rec.config["parallel"] == cfg.parallel


def test_int_reshard_on_four_ranks_follows_the_single_curve(single_curve):
    rec = run_many([BASE.replace(parallel="fsdp", micro_batch=2, reshard_after_forward=2)], 4, timeout_s=240)[0]
    assert rec.loss == pytest.approx(single_curve, rel=1e-5)


def test_counted_collectives_and_held_bytes_equal_the_predictions():
    """4 ranks: True / None / False / int 2 / one unit / bf16 policy / explicit forward prefetch."""
    base = BASE.replace(parallel="fsdp", micro_batch=2)
    cfgs = {"T": {}, "None": dict(reshard_after_forward=None), "F": dict(reshard_after_forward=False),
            "int2": dict(reshard_after_forward=2), "model": dict(fsdp_wrap="model"), "bf16": dict(mp_policy="bf16"),
            "pf": dict(prefetch=1, prefetch_mode="forward")}
    t = memory.measure_knobs([base.replace(label=k, **v) for k, v in cfgs.items()], 4, measured_steps=1,
                             timeout_s=240).set_index("label")
    assert (t["all_gather/step"] == t["predicted AG"]).all() and (t["reduce_scatter/step"] == t["predicted RS"]).all()
    assert t["params after fwd MB"].tolist() == pytest.approx(t["predicted after MB"].tolist(), rel=1e-9)
    assert t["params peak fwd MB"].tolist() == pytest.approx(t["predicted peak MB"].tolist(), rel=1e-9)
    assert t.loc[["T", "None", "F", "model"], "all_gather/step"].tolist() == [6, 5, 3, 2]   # 2 blocks + root
    assert t.loc["int2", "AG groups"] == "2/4"                   # backward gathers over the group of 2
    assert t.loc["bf16", "AG MB/step"] == pytest.approx(t.loc["T", "AG MB/step"] / 2)
    assert t.loc["pf", "fwd prefetch lead"] == 1 and t.loc["T", "fwd prefetch lead"] == 0
    full = t.loc["F", "params after fwd MB"]
    assert full == pytest.approx(4 * t.loc["T", "params after fwd MB"], rel=0.01)   # ≈ 1/4 sharded
    assert t.loc["T", "params after fwd MB"] < t.loc["int2", "params after fwd MB"] < full
    assert t["model states MB"].nunique() == 1                   # after the step every knob holds the same shards


def test_sharding_predictions_by_hand():
    assert sharding.collectives_per_step(4) == {"units": 5, "all_gather_forward": 5, "all_gather_backward": 5,
                                                "all_gather": 10, "reduce_scatter": 5}     # PLATFORM_NOTES: 10
    assert sharding.collectives_per_step(4, reshard_after_forward=False)["all_gather"] == 5
    assert sharding.collectives_per_step(4, reshard_after_forward=None)["all_gather"] == 9
    assert sharding.collectives_per_step(4, wrap="model", accum=3) == {
        "units": 1, "all_gather_forward": 3, "all_gather_backward": 3, "all_gather": 6, "reduce_scatter": 1}
    full = sharding.step_volume("fsdp_full", 8, 1e9)
    assert full["vs_ddp"] == pytest.approx(1.5) and full["sent_bytes"] == pytest.approx(3 * 7 / 8 * 1e9)
    assert sharding.step_volume("fsdp_grad_op", 8, 1e9)["vs_ddp"] == pytest.approx(1.0)
    assert sharding.step_volume("zero2", 64, 1e9)["vs_ddp"] == pytest.approx(1.0)
    grp = sharding.step_volume("fsdp_full", 8, 1e9, reshard_group=2)["sent_bytes"]
    assert grp == pytest.approx((7 / 8 + 1 / 2 + 7 / 8) * 1e9)
    # chapter 20: DDP under autocast all-reduces fp32 gradients (8Ψ·(N-1)/N); FSDP2 with a bf16 policy reducing in
    # bf16 sends 6Ψ·(N-1)/N (0.75x), reducing in fp32 8Ψ·(N-1)/N (1x); fp32 FULL_SHARD 12Ψ·(N-1)/N (1.5x)
    psi = 1e9
    assert sharding.step_volume("fsdp_full", 8, 2 * psi, 2 * psi, ddp_bytes=4 * psi)["vs_ddp"] == pytest.approx(0.75)
    assert sharding.step_volume("fsdp_full", 8, 2 * psi, 4 * psi, ddp_bytes=4 * psi)["vs_ddp"] == pytest.approx(1.0)
    assert sharding.step_volume("fsdp_full", 8, 4 * psi, ddp_bytes=4 * psi)["vs_ddp"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="ddp_bytes=0"):
        sharding.step_volume("ddp", 8, psi, ddp_bytes=0)


def test_bad_knob_values_are_refused():
    for bad, match in ((dict(reshard_after_forward=1), "reshard_after_forward=1"),
                       (dict(reshard_after_forward="yes"), "reshard_after_forward='yes'"),
                       (dict(fsdp_wrap="layer"), "fsdp_wrap='layer'"),
                       (dict(prefetch_mode="sideways"), "prefetch_mode='sideways'"),
                       (dict(prefetch_mode="forward"), "needs prefetch"),
                       (dict(prefetch=1, fsdp_wrap="model"), "needs fsdp_wrap='block'")):
        with pytest.raises(ValueError, match=match):
            TrainConfig(parallel="fsdp", **bad)
    with pytest.raises(ValueError, match="cpu_offload"):
        TrainConfig(parallel="ddp", cpu_offload=True)
    with pytest.raises(ValueError, match="fsdp_wrap"):
        TrainConfig(parallel="ddp", fsdp_wrap="model")
    with pytest.raises(ValueError, match=r"reshard_after_forward=3 is not valid on 2 ranks"):
        run_many([BASE.replace(parallel="fsdp", micro_batch=4, reshard_after_forward=3)], 2, timeout_s=120)
    with pytest.raises(ValueError, match="reshard_after_forward=3 must divide n_ranks=4"):
        sharding.params_held(torch.nn.Linear(2, 2), [], 4, reshard_after_forward=3)
    with pytest.raises(ValueError, match="parallel='ddp'"):
        memory.measure_knobs([TrainConfig(parallel="ddp")], 2)
    assert TrainConfig(parallel="fsdp", reshard_after_forward=None).memory_strategy == "fsdp_full"
    assert TrainConfig(parallel="fsdp", reshard_after_forward=False).memory_strategy == "fsdp_grad_op"

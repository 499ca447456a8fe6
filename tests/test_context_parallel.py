"""Context parallelism (chapter 26) on real gloo ranks: labkit's ring attention equals full causal attention,
forward and backward, with and without causal load balancing; ``TrainConfig(cp=…)`` — alone, with dp, with tp
and with pp — follows the single process's loss curve of the same global batch to float tolerance in fp32,
from the API, the CLI and plain torchrun; bad layouts fail clearly."""
from __future__ import annotations

import pytest
from _procs import torchrun_labkit

from labkit.train import TrainConfig, run_many, train
from labkit.train import ring_attention as ra

BASE = TrainConfig(model="tiny", steps=3, warmup_steps=1, peak_flops=1e12, micro_batch=8)
TOL = 2e-5                                               # fp32: other reduction orders, not other maths


@pytest.mark.parametrize("nprocs,balanced", [(2, True), (2, False), (4, True)])
def test_ring_attention_equals_full_causal_attention(nprocs, balanced):
    check = ra.run_check(nprocs, 128, balanced=balanced, heads=2, head_dim=8, batch=2, timeout_s=120)
    assert check.max_abs_diff < 1e-5                      # output and dq, dk, dv of every rank's tokens
    assert [r["rank"] for r in check.ranks] == list(range(nprocs))
    # the ring computed exactly the chunk pairs the causal model counts, and sent cp−1 K/V blocks
    assert [r["pairs"] for r in check.ranks] == ra.chunk_pairs(nprocs, balanced)
    kv = ra.kv_bytes_per_step(2, 2, 128, 8, nprocs)
    pos_bytes = 8 * 128 // nprocs                         # the int64 positions travel with each block
    assert all(c["bytes"] == (nprocs - 1) * (kv + pos_bytes) for r in check.ranks for c in r["comm"])


def test_causal_work_model():
    assert ra.chunk_pairs(2, balanced=False) == [3, 7]                   # 4r + 3
    assert ra.chunk_pairs(4, balanced=False) == [3, 7, 11, 15]
    assert ra.chunk_pairs(4) == [9] * 4                                  # 2·cp + 1 on every rank
    for cp in (1, 2, 3, 8):   # both layouts compute the same triangle of pairs in all: cp·(2cp+1)
        assert sum(ra.chunk_pairs(cp)) == sum(ra.chunk_pairs(cp, False)) == cp * (2 * cp + 1)
    assert ra.chunk_ids(1, 4) == (1, 6) and ra.chunk_ids(1, 4, balanced=False) == (2, 3)
    assert ra.positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert ra.positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    every = sorted(p for r in range(4) for p in ra.positions(32, 4, r).tolist())
    assert every == list(range(32))                       # the ranks' chunks tile the sequence once


def test_ring_inputs_are_checked():
    with pytest.raises(ValueError, match=r"seq_len=30 is not divisible by 2·cp=4"):
        ra.positions(30, 2, 0)
    with pytest.raises(ValueError, match="rank"):
        ra.chunk_ids(2, 2)
    with pytest.raises(ValueError, match="nprocs"):
        ra.run_check(1)
    with pytest.raises(ValueError, match=r"seq_len=100 is not divisible by 2·cp=8"):
        ra.run_check(4, 100)


@pytest.fixture(scope="module")
def single():
    return train(BASE).loss


def test_cp_training_follows_the_single_curve(single):
    cfgs = [BASE.replace(cp=2, parallel="ddp"), BASE.replace(cp=2, parallel="fsdp", cp_balanced=False)]
    for rec, balanced in zip(run_many(cfgs, 2, timeout_s=240), (True, False), strict=True):
        assert rec.loss == pytest.approx(single, rel=TOL)
        assert rec.tokens_per_step == 8 * 64               # the cp ranks share one batch of 8 sequences
        lay = rec.extra["layout"]
        assert lay["mesh"] == {"pp": 1, "dp": 1, "cp": 2, "tp": 1}
        assert lay["cp_chunks"] == ([0, 3] if balanced else [0, 1]) and lay["cp_balanced"] is balanced


def test_cp_with_dp_on_four_ranks(single):
    """dp=2 × cp=2: each dp index reads 4 of the 8 sequences, its two cp ranks split them along the sequence."""
    rec = run_many([BASE.replace(cp=2, parallel="ddp", micro_batch=4)], 4, timeout_s=300)[0]
    assert rec.loss == pytest.approx(single, rel=TOL)
    assert rec.extra["layout"]["mesh"] == {"pp": 1, "dp": 2, "cp": 2, "tp": 1} and rec.tokens_per_step == 8 * 64


def test_cp_configs_are_checked():
    with pytest.raises(ValueError, match=r"TrainConfig.cp=2 .*seq_len=62 must be divisible by 2·cp=4"):
        BASE.replace(cp=2, parallel="ddp", seq_len=62)
    with pytest.raises(ValueError, match=r"TrainConfig.parallel='single'.*use parallel='ddp' or 'fsdp'"):
        BASE.replace(cp=2)
    for bad in ({"checkpoint": True}, {"compile": True}, {"inject": "comm"}, {"moe_experts": 4}):
        with pytest.raises(ValueError, match="not supported with cp=2"):
            BASE.replace(cp=2, parallel="ddp", **bad)
    BASE.replace(cp=2, tp=2, parallel="ddp", sequence_parallel=True)               # composes with tp (+ sp) …
    BASE.replace(cp=2, pp=2, parallel="fsdp", accum=2)                              # … and with pp
    with pytest.raises(ValueError, match=r"sequence_parallel=True .*seq_len/cp=18 tokens must be divisible by tp=4"):
        BASE.replace(cp=2, tp=4, parallel="ddp", sequence_parallel=True, seq_len=36)
    with pytest.raises(ValueError, match="TrainConfig.cp"):
        BASE.replace(cp=0)
    with pytest.raises(ValueError, match="cp_balanced"):
        BASE.replace(cp_balanced="yes")
    from labkit.train.launch import _check

    with pytest.raises(ValueError, match=r"cp=2 = 2 ranks per model replica does not divide the 3 ranks"):
        _check([BASE.replace(cp=2, parallel="ddp")], 3)
    with pytest.raises(ValueError, match=r"tp=2 × pp=1 × cp=2 = 4 ranks per model replica does not divide the 2"):
        _check([BASE.replace(cp=2, tp=2, parallel="ddp")], 2)


def test_cli_run_with_cp(capsys, single):
    from labkit.cli import main

    assert main(["run", "--model", "tiny", "--cp", "2", "--steps", "3", "--warmup-steps", "1",
                 "--peak-flops", "1e12", "--micro-batch", "8"]) == 0
    out = capsys.readouterr().out
    assert "cp=2" in out and "rank 0 holds sequence chunks [0, 3] of 4" in out
    assert f"loss {single[0]:.3f} → {single[-1]:.3f}" in out


@pytest.mark.slow
def test_cp_with_tp_on_four_ranks(single):
    """cp=2 × tp=2 (tp innermost): the ring runs on each rank's n_heads/tp heads, so it passes half the K/V
    bytes of cp alone; DDP averages over the 2 cp ranks. Same curve as one process."""
    from labkit.train.context_parallel import ring_probe

    rec = run_many([BASE.replace(cp=2, tp=2, parallel="ddp")], 4, timeout_s=300, probe=ring_probe)[0]
    assert rec.loss == pytest.approx(single, rel=TOL)
    assert rec.n_devices == 4 and rec.tokens_per_step == 8 * 64    # one replica: 4 ranks share one batch of 8
    lay = rec.extra["layout"]
    assert lay["mesh"] == {"pp": 1, "dp": 1, "cp": 2, "tp": 2} and lay["coords"] == {"pp": 0, "dp": 0, "cp": 0, "tp": 0}
    m = BASE.model_config
    heads_here = m.n_heads // 2
    kv = ra.kv_bytes_per_step(1, heads_here, m.seq_len, m.d_model // m.n_heads, 2)   # the probe's batch of 1
    assert kv * 2 == ra.kv_bytes_per_step(1, m.n_heads, m.seq_len, m.d_model // m.n_heads, 2)
    log = rec.extra["probe"]["log"]
    assert [r["bytes_in"] for r in log] == [0, kv] * m.n_layers        # per layer: own block, then one received
    assert [r["pairs"] for r in log] == [3, 2] * m.n_layers     # rank 0 (chunks 0, 3): 5 = 2·cp + 1 pairs per layer
    assert sum(r["pairs"] for r in log) == ra.chunk_pairs(2)[0] * m.n_layers


@pytest.mark.slow
def test_cp_with_pp_on_four_ranks(single):
    """cp=2 × pp=2 (1F1B, 2 micro-batches of 4): the first stage cuts each micro-batch to the rank's tokens,
    the second attends over its own ring, the loss takes the targets at the rank's positions."""
    rec = run_many([BASE.replace(cp=2, pp=2, parallel="ddp", micro_batch=4, accum=2)], 4, timeout_s=300)[0]
    assert rec.loss == pytest.approx(single, rel=TOL)
    assert rec.n_devices == 4 and rec.tokens_per_step == 8 * 64
    lay = rec.extra["layout"]
    assert lay["mesh"] == {"pp": 2, "dp": 1, "cp": 2, "tp": 1} and lay["cp_chunks"] == [0, 3]
    assert lay["stages_here"] == [0] and lay["micro_batches"] == 2


@pytest.mark.slow
def test_cp_under_plain_torchrun(tmp_path, single):
    """`labkit run --cp 2` as the 2 ranks of a plain torchrun job (no labkit.launch)."""
    from labkit.record import RunRecord

    out = tmp_path / "rec.json"
    rc, text = torchrun_labkit(2, ["--cp", 2, "--steps", 3, "--warmup-steps", 1, "--micro-batch", 8,
                                   "--peak-flops", "1e12", "--save", out])
    assert rc == 0, text[-3000:]
    assert "cp=2" in text and "rank 0 holds sequence chunks [0, 3] of 4" in text
    rec = RunRecord.load(out)
    assert rec.n_devices == 2 and rec.device["backend"] == "gloo" and rec.config["cp"] == 2
    assert rec.config["parallel"] == "ddp" and rec.tokens_per_step == 8 * 64
    assert rec.extra["layout"]["mesh"] == {"pp": 1, "dp": 1, "cp": 2, "tp": 1}
    assert rec.loss == pytest.approx(single, rel=TOL)

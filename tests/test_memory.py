"""Memory model (labkit.memory) against the papers' numbers and against exact measured bytes."""
from __future__ import annotations

import pytest

from labkit import memory
from labkit.memory import GB, GiB


def test_zero_paper_figure_1():
    """Rajbhandari et al. 2020 (ZeRO), Figure 1: Psi = 7.5B, N_d = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB.

    These are decimal GB (1e9 bytes): 120 GB = 111.8 GiB.
    """
    got = {s: memory.model_state_bytes(7_500_000_000, strategy=s, n_ranks=64,
                                       precision="bf16_mixed").model_states / GB
           for s in ("ddp", "zero1", "zero2", "zero3")}
    assert round(got["ddp"], 1) == 120.0
    assert round(got["zero1"], 1) == 31.4
    assert round(got["zero2"], 1) == 16.6
    assert round(got["zero3"], 1) == 1.9
    assert memory.fmt_bytes(120e9, "GiB") == "111.76 GiB"
    assert memory.fmt_bytes(120e9, "GB") == "120.00 GB"
    assert memory.model_state_bytes(1, precision="bf16_mixed").detail["K"] == 12


def test_seed_004_bert_large_gradients():
    """Seed case 004: BERT-large, 330M params -> ~1.3 GB of fp32 gradients all-reduced each step."""
    b = memory.model_state_bytes(330_000_000, strategy="ddp", precision="fp32")
    assert b.grads / GB == pytest.approx(1.32, abs=0.01)
    assert memory.comm_buffer_bytes(330_000_000, strategy="ddp", precision="fp32")["bytes"] == b.grads


def test_fsdp_maps_to_zero_stages_and_hybrid():
    kw = dict(n_ranks=16, precision="bf16_mixed")
    assert memory.model_state_bytes(10**9, strategy="FULL_SHARD", **kw) == \
        memory.model_state_bytes(10**9, strategy="zero3", **kw).with_(strategy="fsdp_full")
    assert memory.model_state_bytes(10**9, strategy="fsdp_grad_op", **kw).model_states == \
        memory.model_state_bytes(10**9, strategy="zero2", **kw).model_states
    assert memory.model_state_bytes(10**9, strategy="no_shard", **kw).model_states == 16e9
    hyb = memory.model_state_bytes(10**9, strategy="fsdp_hybrid", shard_size=8, **kw)
    assert hyb.model_states == pytest.approx(16e9 / 8)
    with pytest.raises(ValueError, match="shard_size=5 must divide n_ranks=16"):
        memory.model_state_bytes(10**9, strategy="fsdp_hybrid", shard_size=5, **kw)
    with pytest.raises(ValueError, match="strategy='zero4' is not valid"):
        memory.model_state_bytes(10, strategy="zero4")
    with pytest.raises(ValueError, match="precision='fp16'"):
        memory.model_state_bytes(10, precision="fp16")
    with pytest.raises(ValueError, match="unit='gb'"):
        memory.fmt_bytes(1, "gb")


def test_activation_formula_korthikanti():
    """Korthikanti et al. 2022 eq. 1: sbh(34 + 5as/h) bytes per layer; selective 34sbh; full 2sbh."""
    from labkit.flops import ModelShape

    shape = ModelShape(n_layers=1, d_model=12288, n_heads=96, vocab_size=51200, seq_len=2048)  # GPT-3 175B
    s, b, h, a = 2048, 1, 12288, 96
    assert memory.activation_bytes(shape, 1) == round(s * b * h * (34 + 5 * a * s / h))
    assert memory.activation_bytes(shape, 1, recompute="selective") == 34 * s * b * h
    assert memory.activation_bytes(shape, 1, recompute="full") == 2 * s * b * h
    # tensor + sequence parallel divide everything by t (eq. 4)
    assert memory.activation_bytes(shape, 1, tp=8, sequence_parallel=True) == round(
        s * b * h / 8 * (34 + 5 * a * s / h))
    with pytest.raises(ValueError, match="recompute='some'"):
        memory.activation_bytes(shape, 1, recompute="some")


def test_full_checkpointing_activations_measured_exactly():
    """With full recomputation only each block's input (b·s·h) is saved: measured = 2sbh x (4/2) in fp32."""
    import torch

    from labkit.model.gpt import GPT, gpt_config

    per_layer = []
    for L in (2, 4):
        cfg = gpt_config("tiny", checkpoint=True, n_layers=L)
        m = GPT(cfg)
        idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
        per_layer.append(memory.measure_activation_bytes(m, idx, idx))
    assert (per_layer[1] - per_layer[0]) / 2 == memory.activation_bytes(cfg, 2, recompute="full", dtype_bytes=4) / 4


def test_comm_buffers():
    d = memory.comm_buffer_bytes(3_700_000, strategy="ddp", precision="fp32", bucket_cap_mb=1)
    assert d["n_buckets"] == -(-(3_700_000 * 4) // 2**20) and d["bytes"] == 3_700_000 * 4
    f = memory.comm_buffer_bytes(10**9, strategy="fsdp_full", precision="bf16_mixed", unit_params=10**7)
    assert f["all_gather"] == 2 * 10**7 * 2 and f["reduce_scatter"] == 2 * 10**7
    with pytest.raises(ValueError, match="unit_params"):
        memory.comm_buffer_bytes(10**9, strategy="fsdp_full")


def test_ddp_buckets_match_torch(tmp_path):
    """The bucket split predicted from parameter shapes equals DDP's own rebuilt buckets
    (``_get_ddp_logging_data()["rebuilt_bucket_sizes"]``) on a 1-rank gloo group."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit.model.gpt import GPT, gpt_config

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1)
    try:
        for cap in (0.25, 1.0):
            cfg = gpt_config("tiny")
            model = GPT(cfg)
            ddp = DDP(model, bucket_cap_mb=cap)
            for _ in range(3):   # DDP rebuilds its buckets in gradient-ready order after the first steps
                idx = torch.randint(0, cfg.vocab_size, (1, 8))
                ddp(idx, idx)[1].backward()
            got = [int(x) for x in ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(",")]
            assert memory.ddp_bucket_sizes(model, bucket_cap_mb=cap) == got
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("nprocs", [2, 4])
def test_predicted_matches_measured_per_rank(nprocs):
    """Exact bytes of params, grads and Adam state inside each gloo rank (FSDP2: DTensor.to_local())
    agree with the prediction within 2% (the difference is Adam's 4-byte `step` tensors)."""
    df = memory.predict_vs_measure(["ddp", "fsdp_full"], nprocs)
    assert sorted(df["rank"].unique()) == list(range(nprocs))
    assert set(df["strategy"]) == {"ddp", "fsdp_full"}
    assert (df["error"].abs() < 0.02).all(), df
    states = df[(df["category"] == "model_states") & (df["strategy"] == "fsdp_full")]
    full = memory.model_state_bytes(929_280, strategy="ddp", precision="fp32").model_states
    assert states["measured"].max() < full / nprocs * 1.02   # sharding really divides the bytes


def test_memory_cli(capsys):
    from labkit.cli import main

    assert main(["memory", "--params", "7.5e9", "--ranks", "64"]) == 0
    out = capsys.readouterr().out
    assert "120.00" in out and "111.76" in out and "GiB = 2^30" in out
    assert main(["memory", "--model", "gpt2-124m", "--ranks", "8", "--strategy", "zero3", "--micro-batch", "4",
                 "--json"]) == 0
    assert '"activations"' in capsys.readouterr().out
    assert main(["memory", "--params", "1e9", "--strategy", "bogus"]) == 2
    assert GiB == 2**30


# ------------------------------------------------------------- a pipeline stage's activations (chapters 24, 26)
@pytest.mark.parametrize("schedule,v,m", [("1f1b", 1, 32), ("1f1b", 1, 3), ("gpipe", 1, 8), ("interleaved", 2, 16)])
def test_stage_activations_equal_perf_predicts_in_flight_rule(schedule, v, m):
    """Per-stage activation memory is perf.predict's: one micro-batch of s/cp tokens × the stage's layers ÷ L ×
    the micro-batches in flight (min(p, m) under 1F1B) — not the whole model's ÷ p."""
    from labkit import flops
    from labkit.memory.estimate import activation_bytes, pipeline_in_flight, stage_activation_bytes
    from labkit.perf import Layout, cluster, predict
    shape, p, s = flops.preset("llama3-8b"), 4, 4096          # 32 layers over 4 stages
    lay = Layout(dp=2, tp=2, pp=p, cp=2, micro_batch=1, schedule=schedule, virtual_stages=v,
                 sequence_parallel=True)
    pr = predict(shape, lay, cluster("dgx-h100", nodes=4), global_batch=2 * m, seq_len=s)
    assert pr.micro_batches == m
    mine = stage_activation_bytes(shape, 1, pp=p, micro_batches=m, schedule=schedule, virtual_stages=v, cp=2,
                                  seq_len=s, tp=2, sequence_parallel=True, flash_attention=True)
    assert mine == pytest.approx(pr.memory["activations"], rel=1e-9)
    whole = activation_bytes(shape, 1, seq_len=s // 2, tp=2, sequence_parallel=True, flash_attention=True)
    assert mine == pytest.approx(whole / p * pipeline_in_flight(p, m, schedule, v))
    if schedule == "1f1b":
        assert mine == pytest.approx(whole * min(p, m) / p)   # m ≥ p: the whole model's activations once


def test_stage_activations_1f1b_do_not_shrink_with_pp_and_bad_input():
    from labkit import flops
    from labkit.memory.estimate import activation_bytes, pipeline_in_flight, stage_activation_bytes
    l405 = flops.preset("llama3-405b")                        # 126 layers: 8 on the first of 16 stages
    kw = dict(seq_len=131072, tp=8, sequence_parallel=True, flash_attention=True)
    whole = activation_bytes(l405, 1, **kw)
    stage = stage_activation_bytes(l405, 1, pp=16, micro_batches=16, **kw)
    assert stage == pytest.approx(whole * 8 / 126 * 16) and stage > whole          # not whole / 16
    assert stage_activation_bytes(l405, 1, pp=16, micro_batches=16, cp=16, **kw) == pytest.approx(stage / 16, rel=1e-3)
    assert pipeline_in_flight(1, 8) == 1 and pipeline_in_flight(4, 2) == 2 and pipeline_in_flight(4, 8, "gpipe") == 8
    with pytest.raises(ValueError, match="cp=3"):
        stage_activation_bytes(l405, 1, pp=16, micro_batches=16, cp=3, **kw)
    with pytest.raises(ValueError, match="pp=200"):
        stage_activation_bytes(l405, 1, pp=200, micro_batches=16, **kw)
    with pytest.raises(ValueError, match="schedule"):
        pipeline_in_flight(4, 8, "zigzag")

"""Chapter 21: activation-checkpointing policies (TrainConfig.checkpoint), their memory and FLOP models held
against live runs, and the CPU-offload model held against FSDP2's mechanism on real gloo ranks."""
from __future__ import annotations

import math

import pytest

from labkit import flops
from labkit.memory import activation_bytes
from labkit.memory import offload as off
from labkit.model.config import checkpoint_policy, checkpointed_blocks, gpt_config, recompute_mode
from labkit.train import TrainConfig


# ------------------------------------------------------------------------------------------ the option
@pytest.mark.parametrize("value, canonical", [(False, "none"), (True, "full"), ("none", "none"), ("full", "full"),
                                              ("every:1", "full"), ("every:2", "every:2"), (" Every:3 ", "every:3"),
                                              ("attention", "attention")])
def test_policies_are_canonical_and_old_bools_still_work(value, canonical):
    assert checkpoint_policy(value) == canonical
    cfg = TrainConfig(model="small", checkpoint=value)
    assert cfg.checkpoint_policy == canonical
    assert cfg.recompute == {"attention": "selective"}.get(canonical, canonical)


@pytest.mark.parametrize("bad, why", [("every:0", "whole number ≥ 1"), ("every:x", "whole number ≥ 1"),
                                      ("every:5", "between 1 and 4"), ("sometimes", "choose False"),
                                      (1, "must be True or False, or a policy"), (0.5, "'every:k'")])
def test_bad_policies_name_the_value_and_what_is_valid(bad, why):
    with pytest.raises(ValueError, match=r"TrainConfig\.checkpoint") as e:
        TrainConfig(model="small", checkpoint=bad)          # 4 blocks
    assert why in str(e.value) and repr(bad) in str(e.value)


def test_fsdp1_takes_full_only():
    assert TrainConfig(parallel="fsdp1", checkpoint=True).checkpoint_policy == "full"
    with pytest.raises(ValueError, match="FSDP1"):
        TrainConfig(parallel="fsdp1", checkpoint="every:2")


def test_blocks_each_policy_checkpoints():
    assert checkpointed_blocks("every:2", 5) == (0, 2, 4)
    assert checkpointed_blocks("every:4", 5) == (0, 4)
    assert checkpointed_blocks(True, 3) == (0, 1, 2)
    assert checkpointed_blocks("attention", 3) == () == checkpointed_blocks(False, 3)
    assert recompute_mode("attention") == "selective" and recompute_mode("every:3") == "every:3"


# ------------------------------------------------------------------------------------------ the models
def test_every_k_is_the_mixture_of_full_and_none():
    shape = gpt_config("1b")                                                   # 26 blocks
    kw = dict(attention="sdpa", dtype_bytes=2, include_head=True)
    none, full = (activation_bytes(shape, 2, recompute=r, **kw) for r in ("none", "full"))
    head = activation_bytes(shape, 2, recompute="none", **kw) - activation_bytes(shape, 2, recompute="none",
                                                                                 **{**kw, "include_head": False})
    every3 = activation_bytes(shape, 2, recompute="every:3", **kw)             # 9 of 26 blocks checkpointed
    layers_none, layers_full = none - head, full - head
    assert every3 == pytest.approx(head + 9 / 26 * layers_full + 17 / 26 * layers_none, abs=2)
    assert full < every3 < none
    assert activation_bytes(shape, 2, recompute="attention") == activation_bytes(shape, 2, recompute="selective")
    with pytest.raises(ValueError, match="recompute='every:27'"):
        activation_bytes(shape, 2, recompute="every:27")


def test_recomputed_flops_scale_with_the_blocks_checkpointed():
    s = flops.preset("gpt3-175b")                                               # 96 layers
    model = flops.model_flops_per_token(s)
    full = flops.hardware_flops_per_token(s, recompute="full") - model
    quarter = flops.hardware_flops_per_token(s, recompute="every:4") - model    # 24 of 96
    assert quarter == pytest.approx(full / 4, rel=1e-12)
    assert flops.hardware_flops_per_token(s, recompute="attention") == flops.hardware_flops_per_token(
        s, recompute="selective")
    with pytest.raises(ValueError, match="recompute='every:0'"):
        flops.hardware_flops_per_token(s, recompute="every:0")


# ------------------------------------------------------------------------------------------ live runs
@pytest.fixture(scope="module")
def policies():
    import torch

    from labkit.memory.recompute import policy_table

    torch.set_num_threads(1)
    base = TrainConfig(model="tiny", attention="naive", micro_batch=8, device="cpu", peak_flops=1e12)
    return policy_table(base, (False, "attention", "every:2", True)).set_index("policy")


def test_saved_activations_match_the_model_for_every_policy(policies):
    assert (policies["error"].abs() < 0.02).all(), policies[["saved_bytes", "predicted_bytes", "error"]]
    s = policies["saved_bytes"]
    assert s["full"] < s["every:2"] < s["attention"] < s["none"]
    assert s["none"] / s["full"] > 1.5      # a block's input only, against all it saves (the logits stay)


def test_recomputation_is_counted_in_the_executed_flops(policies):
    r = policies["executed_over_model"]
    assert r["none"] == 1.0 and 1.0 < r["attention"] < r["every:2"] < r["full"] <= 4 / 3
    # the forward pass itself is unchanged: the recomputed forwards run inside backward
    assert policies["forward_flops"].nunique() == 1
    # recomputing half the blocks executes half the extra of recomputing all of them
    extra = policies["executed_flops"] - policies.loc["none", "executed_flops"]
    assert extra["every:2"] == pytest.approx(extra["full"] / 2, rel=1e-9)


def test_full_recomputation_lowers_the_step_peak(policies):
    p = policies["peak_above_start"]
    assert p["full"] < 0.75 * p["none"], policies[["peak_above_start", "peak_phase"]]   # activations dominate here


def test_a_run_with_a_policy_reports_hfu_above_mfu_by_the_formula():
    import torch

    from labkit.train.loop import train

    torch.set_num_threads(1)
    cfg = TrainConfig(model="tiny", checkpoint="every:2", micro_batch=2, steps=3, warmup_steps=1, device="cpu",
                      peak_flops=1e12)
    rec = train(cfg)
    shape = cfg.model_config.shape()
    ratio = flops.hardware_flops_per_token(shape, recompute="every:2") / flops.model_flops_per_token(shape)
    assert rec.hfu / rec.mfu == pytest.approx(ratio, rel=1e-9) and ratio > 1
    assert rec.config["checkpoint"] == "every:2"


def test_diagnose_reads_a_policy_in_a_record():
    from labkit.diagnose.rules import _checkpointed

    assert _checkpointed("every:2") and _checkpointed(True) and not _checkpointed("none")
    assert not _checkpointed(False) and not _checkpointed(None)


# ------------------------------------------------------------------------------------------ offload
def test_offload_bytes_per_step_arithmetic():
    b = off.offload_bytes_per_step(7e9, n_ranks=8)
    assert b["h2d_bytes"] == 2 * 4 * 7e9 / 8 and b["d2h_bytes"] == 4 * 7e9 / 8
    assert b["gpu_bytes_freed"] == 16 * 7e9 / 8 and b["optimizer_moved_bytes"] == 0
    assert off.offload_bytes_per_step(7e9, n_ranks=8, reshard_after_forward=False, accum=4)["gathers_per_step"] == 4
    with pytest.raises(ValueError, match="n_ranks"):
        off.offload_bytes_per_step(7e9, n_ranks=0)


def test_offload_pays_at_its_break_even_and_not_below():
    kw = dict(n_ranks=8, dtype="bf16")
    be = off.offload_pays("H100-SXM", 8e9, tokens_per_rank=1000, **kw)["breakeven_tokens_per_rank"]
    assert off.offload_pays("H100-SXM", 8e9, tokens_per_rank=be, **kw)["pays"]
    assert not off.offload_pays("H100-SXM", 8e9, tokens_per_rank=0.9 * be, **kw)["pays"]
    # a faster GPU on a link only 2x faster needs more tokens per rank to hide the same bytes
    a100 = off.offload_pays("A100-SXM-80GB", 8e9, tokens_per_rank=1000, **kw)["breakeven_tokens_per_rank"]
    assert be > a100
    ov = off.offload_pays("H100-SXM", 8e9, tokens_per_rank=1000, overlap=True, **kw)
    assert ov["exposed_s"] <= off.offload_pays("H100-SXM", 8e9, tokens_per_rank=1000, **kw)["exposed_s"]
    with pytest.raises(ValueError, match="device="):
        off.offload_pays("TPUv5", 8e9, tokens_per_rank=1000)
    assert math.isfinite(ov["overhead"])


def test_offload_mechanism_on_gloo_ranks_matches_the_model():
    base = TrainConfig(model="tiny", seq_len=32, micro_batch=2, steps=2, warmup_steps=0, parallel="fsdp",
                       device="cpu", peak_flops=1e12)
    df = off.measure_offload([base.replace(label="device"), base.replace(cpu_offload=True, label="offload")], 2,
                             timeout_s=240).set_index("label")
    o, d = df.loc["offload"], df.loc["device"]
    assert o["H2D MB/step"] == pytest.approx(o["predicted H2D MB"], rel=1e-9) and o["H2D MB/step"] > 0
    assert o["D2H MB/step"] == pytest.approx(o["predicted D2H MB"], rel=1e-9)
    assert o["states on host MB"] == pytest.approx(o["predicted freed MB"], rel=1e-3)   # + Adam's step scalars
    assert d["H2D MB/step"] == 0 and o["shards fetched/step"] == d["shards fetched/step"] > 0
    assert o["Adam state on"] == "cpu"

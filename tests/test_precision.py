"""labkit.train.precision and the trainer's fp16 path (chapter 18): the formats read from torch.finfo, the
dynamic-loss-scaling rule on a constructed overflow (skip, halve, grow), a static scale that diverges,
loss parity where the maths says runs agree (a power-of-two scale is exact in fp32), the gradient
monitor, and fp16 + GradScaler on two real gloo ranks."""
from __future__ import annotations

import math

import pytest
import torch

from labkit.train import TrainConfig, precision, run, train

# fp16 matmuls can be emulated (≈ 1 GFLOP/s): a tiny model, short sequences, a user peak
FP16 = TrainConfig(model="tiny", seq_len=16, micro_batch=2, steps=12, warmup_steps=1, dtype="fp16",
                   peak_flops=1e11)


def test_formats_are_read_from_finfo():
    t = precision.formats().set_index("format")
    assert t.loc["fp16", "max"] == 65504 and t.loc["fp16", "smallest_normal"] == 2.0 ** -14
    assert t.loc["fp16", "smallest_subnormal"] == 2.0 ** -24 and t.loc["fp16", "eps"] == 2.0 ** -10
    assert (t.loc["fp16", "exponent_bits"], t.loc["fp16", "mantissa_bits"]) == (5, 10)
    assert (t.loc["bf16", "exponent_bits"], t.loc["bf16", "mantissa_bits"]) == (8, 7)
    assert t.loc["bf16", "smallest_normal"] == t.loc["fp32", "smallest_normal"]      # fp32's range
    assert (t.loc["tf32", "bits"], t.loc["tf32", "exponent_bits"], t.loc["tf32", "mantissa_bits"]) == (19, 8, 10)
    assert t.loc["tf32", "eps"] == t.loc["fp16", "eps"] and t.loc["tf32", "max"] > 3e38
    assert t.loc["fp8_e4m3", "max"] == 448 and t.loc["fp8_e5m2", "max"] == 57344
    assert "arXiv:2209.05433" in t.loc["fp8_e4m3", "source"]
    with pytest.raises(ValueError, match="not a floating-point format"):
        precision.format_info("int8")


def test_cast_overflows_underflows_and_rounds():
    c = precision.cast([70000.0, 1e-8, 1 + 2 ** -9]).set_index("value")
    assert math.isinf(c.loc[70000.0, "fp16"]) and c.loc[70000.0, "bf16"] == pytest.approx(70000, rel=1e-2)
    assert c.loc[1e-8, "fp16"] == 0 and c.loc[1e-8, "bf16"] == pytest.approx(1e-8, rel=1e-2)
    assert c.loc[1 + 2 ** -9, "bf16"] == 1.0 and c.loc[1 + 2 ** -9, "fp16"] == 1 + 2 ** -9
    assert c.loc[70000.0, "fp8_e4m3"] == 448          # e4m3fn has no inf: the cast saturates


def test_replay_is_torch_s_rule():
    s = precision.replay_dynamic_scale([True, True, False, False, False, True, False], init=1024, growth_interval=3)
    assert s == [1024, 512, 256, 256, 256, 512, 256]
    with pytest.raises(ValueError, match="growth_interval"):
        precision.replay_dynamic_scale([False], growth_interval=0)


def test_scaler_violations_catch_a_tampered_log():
    log = [{"scale": 8.0, "overflow": True, "applied": False, "next_scale": 4.0},
           {"scale": 4.0, "overflow": False, "applied": True, "next_scale": 8.0},
           {"scale": 8.0, "overflow": False, "applied": True, "next_scale": 8.0}]
    assert precision.scaler_violations(log, init=8, growth_interval=1) == []
    applied = [dict(r) for r in log]
    applied[0]["applied"] = True                   # an overflowing step that was not skipped
    assert "applied=True" in precision.scaler_violations(applied, init=8, growth_interval=1)[0]
    kept = [dict(r) for r in log]
    kept[1]["scale"] = 8.0                         # the scale did not halve
    assert any("the rule gives 4" in v for v in precision.scaler_violations(kept, init=8, growth_interval=1))
    assert precision.scaler_violations([], init=8, growth_interval=1) == ["the log is empty"]


def test_constructed_overflow_skips_halves_and_grows():
    """2^24 × the tiny GPT's gradients overflows fp16 (max 65 504): the scaler halves and skips until the
    scaled gradients fit, then grows after 3 clean steps — GradScaler's rule, logged by the loop."""
    rec = train(FP16.replace(scale_init=2.0 ** 24, scale_growth_interval=3, grad_stats=True))
    log = rec.extra["loss_scale_log"]
    assert len(log) == FP16.steps and rec.extra["loss_scale"]["scaling"] == "dynamic"
    assert log[0]["scale"] == 2.0 ** 24 and log[0]["overflow"] and not log[0]["applied"]
    assert log[0]["next_scale"] == 2.0 ** 23
    assert precision.scaler_violations(log, init=2.0 ** 24, growth_interval=3) == []
    assert any(r["applied"] for r in log) and all(math.isfinite(v) for v in rec.loss)
    # the monitor saw the overflow: inf/NaN gradients at step 0, and the layers they reached
    first = precision.first_nonfinite(rec.extra["grad_stats"])
    assert first is not None and first[0] == 0 and first[1]
    clean = [i for i, r in enumerate(log) if r["applied"]]
    assert all(row["nonfinite"] == 0 for row in rec.extra["grad_stats"][clean[0]])


def test_growth_and_parity_in_fp32():
    """In fp32 a power-of-two scale is exact: scaled and unscaled runs give the same losses; nothing
    overflows, so the scale doubles every `growth_interval` steps."""
    base = FP16.replace(dtype="fp32", steps=6)
    plain = train(base)
    scaled = train(base.replace(loss_scale="dynamic", scale_init=1024.0, scale_growth_interval=2))
    static = train(base.replace(loss_scale=2.0 ** 10))
    assert scaled.loss == plain.loss and static.loss == plain.loss
    assert [r["scale"] for r in scaled.extra["loss_scale_log"]] == [1024, 1024, 2048, 2048, 4096, 4096]
    assert "loss_scale_log" not in plain.extra


def test_a_static_scale_that_overflows_diverges_and_dynamic_recovers():
    static = train(FP16.replace(loss_scale=2.0 ** 20, steps=4))
    assert math.isfinite(static.loss[0]) and all(math.isnan(v) for v in static.loss[1:])
    assert static.extra["loss_scale_log"][0]["overflow"] and static.extra["loss_scale_log"][0]["applied"]
    dynamic = train(FP16.replace(scale_init=2.0 ** 20, steps=4))
    assert all(math.isfinite(v) for v in dynamic.loss)


def test_grad_stats_count_every_value():
    m = torch.nn.Linear(4, 3)
    m.weight.grad = torch.tensor([[1.0, 0.0, 2 ** -20, 3.0]] * 3)
    m.bias.grad = torch.tensor([float("inf"), 1.0, 0.5])
    [row] = precision.grad_stats(m, scale=8.0)
    assert row["layer"] == "(root)"
    assert row["numel"] == 15 and row["nonfinite"] == 1 and row["zeros"] == 3 / 15
    assert row["subnormal"] == 3 / 15 and row["max_abs"] == 3.0 and row["scale"] == 8.0
    assert sum(row["hist"]) == 15 - 3 - 1
    assert row["hist"][-20 - precision.HIST_LO] == 3            # 2^-20 lands in bin k = -20
    assert precision.layer_of("module._orig_mod.blocks.0._checkpoint_wrapped_module.attn.qkv.weight") == "blocks.0.attn.qkv"
    assert precision.first_nonfinite([[{"layer": "a", "nonfinite": 0}]]) is None


def test_config_allows_fp16_knowingly_and_refuses_bad_scales():
    assert FP16.scaling == "dynamic" and FP16.compute_dtype == "fp16"
    assert TrainConfig().scaling == "off" and TrainConfig(loss_scale=128.0).scaling == "static"
    for bad in ("sometimes", 0.0, -1.0, True):
        with pytest.raises(ValueError, match="loss_scale"):
            TrainConfig(dtype="fp16", loss_scale=bad)
    with pytest.raises(ValueError, match="scale_growth_interval"):
        TrainConfig(dtype="fp16", scale_growth_interval=0)
    with pytest.raises(ValueError, match="sharded scaler"):
        TrainConfig(dtype="fp16", parallel="fsdp")
    TrainConfig(dtype="fp16", parallel="fsdp", loss_scale="off")     # unscaled fp16 under FSDP is allowed


def test_fp16_with_gradscaler_trains_on_two_gloo_ranks():
    """DDP all-reduces the scaled gradients, so every rank sees the same overflow and takes the same
    decision; the log on rank 0 follows the rule and both ranks' curves agree."""
    cfg = FP16.replace(parallel="ddp", micro_batch=1, steps=10, scale_init=2.0 ** 22, scale_growth_interval=3)
    rec = run(cfg, 2, timeout_s=180)
    log = rec.extra["loss_scale_log"]
    assert rec.n_devices == 2 and rec.device["backend"] == "gloo"
    assert log[0]["overflow"] and precision.scaler_violations(log, init=2.0 ** 22, growth_interval=3) == []
    assert any(r["applied"] for r in log) and all(math.isfinite(v) for v in rec.loss)
    a, b = rec.extra["losses_per_rank"]
    assert a == b


def test_grad_histogram_draws_against_the_fp16_limits():
    import matplotlib

    matplotlib.use("Agg")
    from labkit.teaching import viz

    m = torch.nn.Linear(4, 3)
    m.weight.grad, m.bias.grad = torch.full((3, 4), 2.0 ** -30), torch.ones(3)
    rows = precision.grad_stats(m)
    ax = viz.grad_histogram({"unscaled": rows, "x 2^16": precision.grad_stats(m, scale=2.0 ** 16)})
    assert len(ax.patches) >= 2 and len(ax.lines) == 3 and "fp16" in ax.get_title()

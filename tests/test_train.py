"""labkit.train with real gloo ranks: DDP/FSDP2 follow the single-process loss curve; accumulation
equals a big batch; the record carries real measurements; CLI and torchrun forms."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _procs import torchrun_labkit

from labkit.train import TrainConfig, build_model, forward_backward, run, train

ROOT = Path(__file__).resolve().parents[1]
# fp32, fixed seed, user peak (no live peak measurement in each rank)
BASE = TrainConfig(model="tiny", steps=4, warmup_steps=1, peak_flops=1e12, micro_batch=8)


@pytest.fixture(scope="module")
def single_curve():
    return train(BASE).loss


def test_record_is_real(single_curve):
    rec = train(BASE.replace(steps=5))
    assert rec.loss[:4] == pytest.approx(single_curve, rel=1e-6)
    assert rec.loss[0] == pytest.approx(8.32, abs=0.15)          # ≈ ln(4096) at init
    assert rec.loss[-1] < rec.loss[0]
    assert rec.tokens_per_step == 8 * 64 and rec.tokens_per_s > 0 and rec.step_time.n == 4
    assert 0 < rec.mfu <= 1 and rec.peak_source == "user" and rec.n_devices == 1
    assert {"data", "forward", "backward", "optimizer"} <= set(rec.phases)
    assert rec.peak_memory_bytes > 50 * 2**20 and rec.extra["peak_memory_kind"].startswith("ru_maxrss")
    assert rec.config["model"] == "tiny" and rec.versions["torch"] == torch.__version__
    assert rec.extra["n_params"] == 929_280


def test_accumulation_equals_one_big_batch():
    """k micro-batches of b accumulate the gradient of one batch of k·b (chapter 15)."""
    dev = torch.device("cpu")
    grads = []
    for micro, accum in ((8, 1), (4, 2), (2, 4)):
        cfg = BASE.replace(micro_batch=micro, accum=accum)
        model = build_model(cfg, dev)
        from labkit import data

        ds = data.TokenDataset(data.load_tokens(), 64)
        loader = iter(data.make_loader(ds, micro, seed=0))
        loss = forward_backward(model, loader, cfg, dev)
        grads.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    (l0, g0) = grads[0]
    for loss, g in grads[1:]:
        assert loss == pytest.approx(l0, rel=1e-5)
        for a, b in zip(g0, g, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_accumulation_follows_the_single_curve(single_curve):
    rec = train(BASE.replace(micro_batch=4, accum=2))
    assert rec.loss == pytest.approx(single_curve, rel=1e-5)
    assert rec.tokens_per_step == 8 * 64


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_follow_the_single_curve(parallel, single_curve):
    rec = run(BASE.replace(micro_batch=4, parallel=parallel), 2, timeout_s=120)
    assert rec.loss == pytest.approx(single_curve, rel=1e-5)
    assert rec.n_devices == 2 and rec.tokens_per_step == 8 * 64
    assert rec.device["backend"] == "gloo"
    assert len(rec.extra["losses_per_rank"]) == 2 and all(r > 0 for r in rec.extra["rank_peak_rss_bytes"])


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_four_ranks_with_accumulation_follow_the_single_curve(parallel, single_curve):
    rec = run(BASE.replace(micro_batch=1, accum=2, parallel=parallel, reshard_after_forward=False), 4,
              timeout_s=120)
    assert rec.loss == pytest.approx(single_curve, rel=1e-5)
    assert rec.n_devices == 4


def test_bf16_checkpoint_naive_variants_train():
    rec = train(BASE.replace(dtype="bf16", checkpoint=True, attention="naive", steps=3))
    assert rec.dtype == "bf16" and rec.loss[-1] < rec.loss[0] + 0.05
    assert rec.hardware_flops_per_token > rec.model_flops_per_token     # recomputation counted in HFU
    assert rec.hfu > rec.mfu


def test_profiler_writes_one_chrome_trace_per_rank(tmp_path):
    rec = run(BASE.replace(parallel="ddp", micro_batch=4, steps=4, profile_dir=str(tmp_path)), 2, timeout_s=120)
    files = sorted(Path(f).name for f in rec.extra["trace_files"])
    assert files == ["rank0.json", "rank1.json"]
    trace = json.loads((tmp_path / "rank1.json").read_text())
    assert trace["distributedInfo"]["rank"] == 1
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("ProfilerStep") for n in names)


def test_bad_configs():
    with pytest.raises(ValueError, match="parallel='zero'"):
        TrainConfig(parallel="zero")
    with pytest.raises(ValueError, match="dtype='fp8'"):     # fp16 is allowed since chapter 18
        TrainConfig(dtype="fp8")
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(steps=3, warmup_steps=3)
    with pytest.raises(ValueError, match="seq_len"):
        TrainConfig(seq_len=10_000)
    with pytest.raises(ValueError, match="mp_policy"):
        TrainConfig(mp_policy="bf16")
    with pytest.raises(ValueError, match="model='huge'"):
        TrainConfig(model="huge")
    with pytest.raises(ValueError, match="TrainConfig.checkpoint must be True or False"):
        TrainConfig(checkpoint=1)
    with pytest.raises(ValueError, match="nprocs=2 with parallel='single'"):
        run(BASE, 2)
    with pytest.raises(ValueError, match="needs torch.distributed"):
        train(BASE.replace(parallel="ddp"))
    with pytest.raises(TypeError):
        train({"model": "tiny"})


def test_cli_run(capsys):
    from labkit.cli import main

    assert main(["run", "-n", "1", "--steps", "3", "--warmup-steps", "1", "--peak-flops", "1e12", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["config"]["parallel"] == "single" and len(rec["loss"]) == 3


@pytest.mark.slow
def test_under_plain_torchrun(tmp_path):
    """The same command runs as the ranks of a plain torchrun job (no labkit.launch involved)."""
    out = tmp_path / "rec.json"
    rc, text = torchrun_labkit(2, ["--parallel", "ddp", "--steps", 3, "--warmup-steps", 1, "--micro-batch", 4,
                                   "--peak-flops", "1e12", "--save", out])
    assert rc == 0, text[-3000:]
    from labkit.record import RunRecord

    rec = RunRecord.load(out)
    assert rec.n_devices == 2 and rec.device["backend"] == "gloo"
    assert rec.loss == pytest.approx(train(BASE.replace(steps=3)).loss, rel=1e-5)


def test_peak_memory_uses_the_cuda_allocator_on_gpu(monkeypatch):
    """The thin CUDA branch of the record's peak memory, with a fake device and allocator."""
    from labkit.train import peak_memory

    class FakeCuda:
        type = "cuda"

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev: 123_456)
    assert peak_memory(FakeCuda()) == (123_456, "cuda.max_memory_allocated")
    n, kind = peak_memory(torch.device("cpu"))
    assert n > 0 and kind.startswith("ru_maxrss")


@pytest.mark.slow
def test_compiled_model_follows_the_eager_curve(single_curve):
    """torch.compile on/off: same losses (≈ 20 s first compile on 2 cores)."""
    rec = train(BASE.replace(compile=True, steps=2))
    assert rec.loss == pytest.approx(single_curve[:2], rel=1e-5)


# ------------------------------------------------------------------ accumulation under DDP / FSDP2 (chapter 15)
def test_accumulation_sync_options_count_collectives_and_keep_the_curve(tmp_path, single_curve):
    """On 2 gloo ranks, accumulation 4 through the one loop: DDP all-reduces once per step under no_sync and on every
    micro-batch without it; FSDP2 all-gathers every unit twice per micro-batch by default, once per step without
    resharding (reshard_after_forward=False + reshard_after_backward=False), and reduce-scatters once per unit per
    step in every variant. Every variant trains the same curve as one process (same global batch, same maths)."""
    from labkit.tuning import sweep as tune

    base = BASE.replace(micro_batch=1, accum=4, steps=4)
    variants = {"ddp": {"parallel": "ddp"}, "ddp_sync": {"parallel": "ddp", "no_sync": False},
                "fsdp": {"parallel": "fsdp"}, "fsdp_sync": {"parallel": "fsdp", "no_sync": False},
                "fsdp_torch": {"parallel": "fsdp", "reshard_after_forward": None},   # torch's default: not the root
                "fsdp_keep": {"parallel": "fsdp", "reshard_after_backward": False},
                "fsdp_none": {"parallel": "fsdp", "reshard_after_forward": False, "reshard_after_backward": False}}
    table, recs = tune.accumulation_collectives(base, variants, nprocs=2, out_dir=tmp_path, timeout_s=300)
    c = table.set_index("variant")
    units = BASE.model_config.n_layers + 1
    assert c.loc["ddp", "all_reduce"] == 1 and c.loc["ddp_sync", "all_reduce"] == 4
    assert c.loc["ddp", "all_gather"] == c.loc["ddp_sync", "all_gather"] == 0
    assert c.loc["fsdp", "all_gather"] == 2 * units * 4
    # torch's fully_shard default (None) keeps the root gathered from its forward to its backward: 20, not 24
    from labkit.memory.sharding import collectives_per_step
    assert c.loc["fsdp_torch", "all_gather"] == (2 * units - 1) * 4 == 20 \
        == collectives_per_step(units - 1, reshard_after_forward=None, accum=4)["all_gather"]
    assert c.loc["fsdp_keep", "all_gather"] == 2 * units + (4 - 1) * units   # no re-gather before later forwards
    assert c.loc["fsdp_none", "all_gather"] == units
    assert (c.loc[["fsdp", "fsdp_torch", "fsdp_keep", "fsdp_none"], "all_reduce"] == units).all()   # gloo: reduce-scatter
    assert c.loc["fsdp_sync", "all_reduce"] == 4 * units
    for rec in recs:
        assert rec.loss == pytest.approx(single_curve, rel=1e-5), rec.label
        assert rec.tokens_per_step == 8 * 64 and rec.n_devices == 2


def test_accumulation_options_are_checked(capsys):
    with pytest.raises(ValueError, match="reshard_after_backward.*parallel='fsdp'"):
        TrainConfig(parallel="ddp", reshard_after_backward=False)
    with pytest.raises(ValueError, match="TrainConfig.no_sync must be True or False"):
        TrainConfig(no_sync="yes")
    assert TrainConfig(parallel="fsdp", reshard_after_backward=False).memory_strategy == "fsdp_full"
    from labkit.cli import main  # labkit run's flags reach the same checks

    assert main(["run", "--parallel", "single", "--steps", "2", "--warmup-steps", "1", "--keep-gathered"]) == 2
    assert "reshard_after_backward=False is not valid" in capsys.readouterr().err


def test_gradient_parity_and_where_it_breaks():
    """Equal token counts: allclose, same norm. Unequal counts averaged per micro-batch: a different gradient,
    and summing then dividing by the real tokens restores it. BatchNorm breaks it, LayerNorm does not."""
    from labkit.train import accum

    cfg = TrainConfig(model="tiny", seq_len=16)
    same = accum.gradient_parity(cfg, 8, 2)
    assert same.allclose and same.accum == 4 and same.rel_diff < 1e-5
    assert same.norm_accum == pytest.approx(same.norm_full, rel=1e-5)
    padded = accum.gradient_parity(cfg, 8, 2, pad_share=0.3)
    assert not padded.allclose and padded.rel_diff > 1e-2
    fixed = accum.gradient_parity(cfg, 8, 2, pad_share=0.3, reduction="tokens")
    assert fixed.allclose and fixed.norm_full == pytest.approx(padded.norm_full, rel=1e-6)
    x, y = accum.global_batch(cfg, 8, pad_share=0.3)
    assert (y[:4] != -100).all() and abs(float((y == -100).float().mean()) - 0.3) < 0.05
    assert not accum.batchnorm_parity(8, 2).allclose and accum.batchnorm_parity(8, 2, norm="layer").allclose
    with pytest.raises(ValueError, match="micro_batch=3 does not divide"):
        accum.accumulated_gradient(cfg, x, y, micro_batch=3)
    with pytest.raises(ValueError, match="reduction='sum'"):
        accum.gradient_parity(cfg, 8, 2, reduction="sum")
    with pytest.raises(ValueError, match="micro_batch=1 must be >= 2"):
        accum.batchnorm_parity(8, 1)

"""Chapter 17: labkit.kernels.fusion, the trainer's optimizer_impl and cuda_graphs options (the CUDA path with a fake)."""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

from labkit.kernels import fusion
from labkit.measure.ab import ABResult
from labkit.paths import remove_scratch
from labkit.train import TrainConfig, train
from labkit.train import graphs as graphs_mod
from labkit.train.optim import build_optimizer, implementation

TINY = dict(model="tiny", seq_len=16, micro_batch=2, steps=2, warmup_steps=1, device="cpu")


# ------------------------------------------------------------------------------------ TrainConfig
@pytest.mark.parametrize("bad, match", [
    (dict(optimizer_impl="apex"), r"optimizer_impl='apex'.*'for-loop', 'foreach', 'fused'"),
    (dict(cuda_graphs="yes"), r"cuda_graphs"),
    (dict(cuda_graphs=True, parallel="ddp"), r"cuda_graphs=True.*parallel='single'"),
    (dict(cuda_graphs=True, compile=True), r"cuda_graphs=True.*reduce-overhead"),
    (dict(cuda_graphs=True, checkpoint=True), r"cuda_graphs=True.*checkpoint"),
    (dict(cuda_graphs=True, inject="memory"), r"cuda_graphs=True.*inject='memory'"),
    (dict(cuda_graphs=True, device="cpu"), r"cuda_graphs=True.*device='cpu'"),
])
def test_config_refuses_bad_fusion_options(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**bad)


def test_config_defaults_keep_torchs_choice():
    cfg = TrainConfig()
    assert cfg.optimizer_impl == "auto" and cfg.cuda_graphs is False
    assert TrainConfig(cuda_graphs=True).cuda_graphs          # device "auto": checked when the run starts


# ------------------------------------------------------------------------------------ optimizers
def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in (7, 33, 128)]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    return ps


def test_the_three_adamw_implementations_agree():
    out = {}
    for impl in ("for-loop", "foreach", "fused"):
        ps = _params()
        opt = build_optimizer(ps, TrainConfig(optimizer_impl=impl, lr=1e-2))
        assert implementation(opt) == impl
        for _ in range(3):
            opt.step()
        out[impl] = torch.cat([p.detach() for p in ps])
    assert torch.allclose(out["for-loop"], out["foreach"], atol=1e-6)
    assert torch.allclose(out["for-loop"], out["fused"], atol=1e-5)
    assert not torch.allclose(out["fused"], torch.cat([p.detach() for p in _params()]))   # it did step


def test_auto_resolves_as_torch_does_and_bad_config_is_refused():
    opt = build_optimizer(_params(), TrainConfig())
    assert implementation(opt) == "for-loop"                  # CPU tensors: torch's default is the for-loop
    with pytest.raises(TypeError, match="TrainConfig"):
        build_optimizer(_params(), {"optimizer_impl": "fused"})


def test_the_loop_trains_with_each_optimizer_impl():
    recs = {impl: train(TrainConfig(**TINY, optimizer_impl=impl)) for impl in ("for-loop", "fused")}
    assert recs["fused"].config["optimizer_impl"] == "fused"
    a, b = recs["for-loop"].loss, recs["fused"].loss
    assert len(a) == len(b) == 2 and all(abs(x - y) < 1e-4 for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------ CUDA graphs (fake)
def test_cuda_graphs_refuse_a_cpu_run():
    with pytest.raises(ValueError, match=r"cuda_graphs=True needs a CUDA device; this run resolved to cpu"):
        train(TrainConfig(**{**TINY, "device": "auto"}, cuda_graphs=True))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cuda_graph_branch_with_a_fake_capture(monkeypatch, dtype):
    seen = []

    def fake(model, sample_args):
        x, y = sample_args
        seen.append({"shapes": [tuple(x.shape), tuple(y.shape)], "dtype": x.dtype,
                     "autocast": torch.is_autocast_enabled("cpu"), "cache": torch.is_autocast_cache_enabled()})
        return model
    monkeypatch.setattr(graphs_mod, "require_cuda", lambda device: None)
    monkeypatch.setattr(graphs_mod, "_make_graphed_callables", fake)
    rec = train(TrainConfig(**{**TINY, "device": "auto"}, dtype=dtype, cuda_graphs=True))
    assert len(seen) == 1 and seen[0]["shapes"] == [(2, 16), (2, 16)] and seen[0]["dtype"] == torch.long
    assert seen[0]["autocast"] is (dtype == "bf16")         # captured inside the run's autocast …
    if dtype == "bf16":
        assert seen[0]["cache"] is False                     # … with its weight-cast cache off
    assert rec.extra["cuda_graphs"] == {"sample_shape": [2, 16], "captured": True}
    assert len(rec.loss) == 2


# ------------------------------------------------------------------------------------ the chain
@pytest.mark.parametrize("n_ops", [1, 2, 7, 50])
def test_the_chain_is_one_affine_op(n_ops):
    x, s, t = fusion.chain_inputs(300, seed=1)
    a, b = fusion.fused_constants(s, t, n_ops)
    assert torch.allclose(fusion.elementwise_chain(x, s, t, n_ops), fusion.fused_chain(x, a, b), rtol=1e-5,
                          atol=1e-6)


def test_launch_crossover_and_its_errors():
    assert fusion.launch_crossover(5e-6, 2e12) == pytest.approx(5e-6 * 2e12 / 8)
    assert fusion.launch_crossover(1e-6, 1e10, bytes_per_element=4) == pytest.approx(2500)
    for kw in (dict(per_op_s=0.0, bandwidth=1e9), dict(per_op_s=1e-6, bandwidth=-1.0),
               dict(per_op_s=float("nan"), bandwidth=1e9)):
        with pytest.raises(ValueError, match=next(iter(k for k, v in kw.items() if not v > 0))):
            fusion.launch_crossover(**kw)


def test_traces_count_fifty_ops_eager_and_one_fused(tmp_path):
    x, s, t = fusion.chain_inputs(64)
    a, b = fusion.fused_constants(s, t, 50)
    eager = fusion.op_counts(fusion.profile_calls(fusion.elementwise_chain, (x, s, t, 50), tmp_path / "e.json"))
    fused = fusion.op_counts(fusion.profile_calls(fusion.fused_chain, (x, a, b), tmp_path / "f.json", calls=2))
    assert eager.kind == "cpu" and eager.calls == 3 and eager.aten_per_call == 50
    assert set(eager.table["name"]) == {"aten::mul", "aten::add"} and (eager.table["per_call"] == 25).all()
    assert fused.calls == 2 and fused.aten_per_call == 1 and fused.compiled_per_call == 0


def test_sweep_and_ab_run_and_report():
    df = fusion.sweep_sizes([64, 4096], n_ops=10, repeats=2, budget_s=0.002)
    assert list(df["numel"]) == [64, 4096] and (df["eager µs/op"] > 0).all() and (df["fused speed-up"] > 0).all()
    assert df["MB per op"].tolist() == pytest.approx([8 * 64 / 1e6, 8 * 4096 / 1e6])
    ab = fusion.ab_fusion(64, 10, rounds=3)
    assert isinstance(ab, ABResult) and ab.labels == ("eager: 10 ops", "one fused op") and len(ab.b) == 3
    with pytest.raises(ValueError, match="sizes"):
        fusion.sweep_sizes([])


def test_ab_optimizer_steps_each_arm_on_its_own_copy():
    ab = fusion.ab_optimizer(TrainConfig(**TINY), "foreach", "fused", rounds=3)
    assert ab.labels == ("AdamW foreach", "AdamW fused") and len(ab.a) == len(ab.b) == 3 and ab.clock == "cpu"
    with pytest.raises(ValueError, match="impl_b"):
        fusion.ab_optimizer(TrainConfig(**TINY), "foreach", "apex")


def test_compile_cost_mechanics_with_plain_callables(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/the/users/own")
    x, s, t = fusion.chain_inputs(64)

    def eager(*a):
        return fusion.elementwise_chain(*a, 20)

    def fast(*a):
        return fusion.fused_chain(a[0], *fusion.fused_constants(a[1], a[2], 20))
    cost = fusion.compile_cost(fast, eager, (x, s, t), cache_dir=tmp_path / "cold", repeats=2, inner=3)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/the/users/own"            # restored
    assert cost.first_s > 0 and cost.cached_call_s > 0 and cost.recompile_s > 0 and cost.first_cpu_s >= 0
    assert cost.cache_dir == str(tmp_path / "cold") and "pays for itself" in cost.report()
    (tmp_path / "cold" / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        fusion.compile_cost(fast, eager, (x, s, t), cache_dir=tmp_path / "cold")
    # no cache_dir: a scratch folder of this process's (labkit.paths.scratch_dir), gone at exit, not left in /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    own = fusion.compile_cost(fast, eager, (x, s, t), repeats=2, inner=3)
    folder = Path(own.cache_dir)
    assert folder.parent == tmp_path and folder.name.startswith("labkit-inductor-")
    assert (folder / ".labkit-scratch-owner").read_text().split()[0] == str(os.getpid())
    remove_scratch(folder)


# ------------------------------------------------------------------------------------ CUDA graphs (SYNTHETIC)
def test_graph_step_model():
    # launch-bound: the host's 8 µs per launch paces 3 µs kernels; graphed: one launch, then back to back
    assert fusion.graph_step_us(10, 3.0, 8.0, graphed=False) == pytest.approx(10 * 8 + 3)
    assert fusion.graph_step_us(10, 3.0, 8.0, graphed=True, graph_launch_us=10, gap_us=1) == pytest.approx(10 + 30 + 9)
    # kernel-bound: long kernels hide the launches, a graph saves nothing (its one launch costs about as much)
    eager = fusion.graph_step_us(10, 100.0, 8.0, graphed=False)
    assert eager == pytest.approx(8 + 10 * 100 + 9)
    assert fusion.graph_step_us(10, 100.0, 8.0, graphed=True) == pytest.approx(eager, rel=0.01)
    with pytest.raises(ValueError, match="kernel_us"):
        fusion.graph_step_us(10, 0.0, 8.0, graphed=True)


def test_graph_traces_are_synthetic_and_read_by_labkit_trace(tmp_path):
    from labkit.trace import analyze

    paths = fusion.graph_traces(tmp_path, n_kernels=40, kernel_us=3.0, launch_us=8.0, steps=3)
    for mode, p in paths.items():
        doc = json.loads(gzip.open(p, "rt").read())
        assert doc["labkit_synthetic"]["SYNTHETIC"] is True and "SYNTHETIC" in p.name
        an = analyze(p)
        model = fusion.graph_step_us(40, 3.0, 8.0, graphed=mode == "graphed")
        assert an.kind == "gpu" and len(an.steps) == 3
        assert an.step_times()[0] * 1e6 == pytest.approx(model, rel=0.02)
        assert fusion.op_counts(p).kernels_per_call == 40                 # graphs replay the same kernels
    eager, graphed = (analyze(paths[m]).shares()["compute"] for m in ("eager", "graphed"))
    assert graphed > 1.5 * eager


# ------------------------------------------------------------------------------------ the CLI
def test_labkit_run_takes_the_fusion_options(capsys):
    from labkit.cli import main

    assert main(["run", "-n", "1", "--parallel", "single", "--steps", "2", "--warmup-steps", "1", "--seq-len", "16",
                 "--micro-batch", "2", "--optimizer-impl", "fused", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["optimizer_impl"] == "fused"
    assert main(["run", "-n", "1", "--parallel", "single", "--steps", "2", "--warmup-steps", "1", "--cuda-graphs"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err

"""A mixture-of-experts GPT and expert parallelism in the one loop, on real gloo ranks (chapter 26): one MoE
layer split over 2 ranks equals the same layer on one process, and an ep=2 run follows the single-process
MoE run of the same global batch to float tolerance in fp32; tokens per expert and load imbalance recorded."""
from __future__ import annotations

import pytest

import labkit
from labkit import flops
from labkit.model.config import GPTConfig, gpt_config
from labkit.model.expert_load import balance_loss, load_imbalance
from labkit.train import TrainConfig, run_many, train

BASE = TrainConfig(model="tiny", steps=3, warmup_steps=1, peak_flops=1e12, micro_batch=8, moe_experts=4, moe_top_k=2)
TOL = 2e-5                                               # fp32: other reduction orders, not other maths


@pytest.fixture(scope="module")
def single():
    return train(BASE)


@pytest.fixture(scope="module")
def two_ranks():
    """One launch of 2 ranks runs each 2-rank layout in turn (starting ranks is the slow part)."""
    cfgs = {"ep": BASE.replace(ep=2, parallel="ddp", micro_batch=4),
            "ep_accum": BASE.replace(ep=2, parallel="ddp", micro_batch=2, accum=2),
            "ep_sync_each": BASE.replace(ep=2, parallel="ddp", micro_batch=2, accum=2, no_sync=False),
            "ep_aux": BASE.replace(ep=2, parallel="ddp", micro_batch=4, moe_aux_loss=0.1),
            "ddp_aux": BASE.replace(parallel="ddp", micro_batch=4, moe_aux_loss=0.1)}
    recs = run_many(list(cfgs.values()), 2, timeout_s=300)
    return dict(zip(cfgs, recs, strict=True))


def test_one_moe_layer_split_over_two_ranks_equals_one_process():
    res = labkit.launch("labkit.train.expert_parallel:layer_parity", 2, kwargs=dict(n_experts=4, top_k=2),
                        timeout_s=180, log_dir=False, stream=False, env={"OMP_NUM_THREADS": "1"})
    vals = [r.value for r in res.ranks]
    assert [v["experts_here"] for v in vals] == [[0, 1], [2, 3]]
    for v in vals:
        for key in ("out", "input_grad", "expert_grad", "router_grad"):
            assert v[key] < 1e-5, (key, v[key])
        assert v["counts"] == v["counts_whole"] and sum(v["counts"]) == 2 * 32 * 2    # 2 ranks × 32 tokens × top-2
        assert v["sent_rows"] > 0                                                       # rows did travel
        assert v["imbalance"] == pytest.approx(max(v["counts"]) / (sum(v["counts"]) / 4))


@pytest.mark.parametrize("name", ["ep", "ep_accum", "ep_sync_each"])
def test_expert_parallel_run_follows_the_single_moe_curve(two_ranks, single, name):
    rec = two_ranks[name]
    assert rec.loss == pytest.approx(single.loss, rel=TOL)
    moe, ref = rec.extra["moe"], single.extra["moe"]
    assert moe["tokens_per_expert"] == ref["tokens_per_expert"]      # the same routing, summed over ranks
    assert moe["ep"] == 2 and moe["experts_here"] == [0, 1] and all(s > 0 for s in moe["sent_rows"])
    assert "comm" in rec.phases                                      # the expert-gradient reduction


def test_balance_loss_under_ep_equals_the_replicated_moe(two_ranks):
    """With the balance loss on, EP gives the loss of the same MoE replicated under DDP (each rank's f and P
    from its own tokens in both) — and it differs from the run without it."""
    assert two_ranks["ep_aux"].loss == pytest.approx(two_ranks["ddp_aux"].loss, rel=TOL)
    assert two_ranks["ep_aux"].loss[0] != pytest.approx(two_ranks["ep"].loss[0], rel=1e-4)


def test_tokens_per_expert_and_load_imbalance_are_recorded(single):
    moe = single.extra["moe"]
    assert len(moe["tokens_per_expert"]) == BASE.steps
    for step, imb in zip(moe["tokens_per_expert"], moe["imbalance"], strict=True):
        assert len(step) == 2                                       # tiny: 2 blocks
        for layer, value in zip(step, imb, strict=True):
            assert len(layer) == 4 and sum(layer) == 8 * 64 * 2     # every token's 2 copies
            assert value == pytest.approx(load_imbalance(layer)) and 1.0 <= value <= 4.0
    assert moe["imbalance_max"] == max(v for s in moe["imbalance"] for v in s)


def test_moe_shape_counts_every_expert_and_top_k_active():
    import torch

    from labkit.model.gpt import GPT

    cfg = gpt_config("tiny", n_experts=4, top_k=2)
    model = GPT(cfg)
    assert flops.n_params(cfg.shape()) == model.n_params()
    dense = gpt_config("tiny")
    per_mlp = flops.n_params(dense.shape()) - flops.n_params(dense.shape(), embeddings=False)  # unused: sanity
    assert per_mlp > 0
    assert flops.n_active_params(cfg.shape()) < flops.n_params(cfg.shape())
    router = cfg.d_model * 4
    assert flops.n_active_params(cfg.shape()) == flops.n_params(dense.shape()) + cfg.n_layers * (
        sum(p.numel() for p in model.blocks[0].mlp.experts[0].parameters()) + router)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    model(x, x)[1].backward()
    assert all(p.grad is not None for p in model.parameters())      # every expert, even one given no token


def test_layer_balance_loss_is_switchs_formula():
    import torch

    from labkit.model.gpt import MLP
    from labkit.model.moe import MoE

    cfg = GPTConfig(n_layers=1, d_model=16, n_heads=1, vocab_size=8, seq_len=8, n_experts=4, top_k=2)
    torch.manual_seed(0)
    layer = MoE(cfg, lambda: MLP(cfg))
    x = torch.randn(2, 8, 16)
    layer(x)
    _, idx, probs = layer.route(x.reshape(-1, 16))
    counts = torch.bincount(idx.reshape(-1), minlength=4)
    f = (counts / counts.sum()).tolist()
    p = probs.mean(0).tolist()
    assert layer.aux.item() == pytest.approx(balance_loss(f, p), rel=1e-5)
    assert balance_loss([0.25] * 4, [0.25] * 4) == pytest.approx(1.0)
    assert balance_loss([1, 0, 0, 0], [1, 0, 0, 0]) == pytest.approx(4.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(moe_experts=3, ep=2, parallel="ddp"), "moe_experts=3 must be divisible by ep"),
    (dict(moe_experts=4, moe_top_k=5), "moe_top_k=5"),
    (dict(moe_experts=1), "moe_experts=1"),
    (dict(ep=2, parallel="ddp"), "set moe_experts"),
    (dict(moe_aux_loss=0.1), "set moe_experts"),
    (dict(moe_experts=4, ep=2), "parallel"),
    (dict(moe_experts=4, tp=2), "tp"),
    (dict(moe_experts=4, checkpoint=True), "checkpoint"),
    (dict(moe_experts=4, moe_aux_loss=-1.0), "moe_aux_loss"),
])
def test_bad_moe_configs_are_refused_with_the_field_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_bad_model_and_world_are_refused():
    from labkit.train.expert_parallel import ep_mesh

    with pytest.raises(ValueError, match="top_k=3 must be ≤ n_experts=2"):
        gpt_config("tiny", n_experts=2, top_k=3)
    with pytest.raises(ValueError, match="n_experts=1"):
        gpt_config("tiny", n_experts=1)
    with pytest.raises(ValueError, match="ep=2 must divide the 3 data-parallel ranks"):
        ep_mesh(BASE.replace(ep=2, parallel="ddp"), 3)
    with pytest.raises(ValueError, match="counts"):
        load_imbalance([0, 0])
    with pytest.raises(ValueError, match="fractions"):
        balance_loss([0.5, 0.6], [0.5, 0.5])


def test_cli_refuses_experts_not_divisible_by_ep_before_launching(capsys):
    from labkit.cli import main

    assert main(["run", "--moe-experts", "3", "--ep", "2", "-n", "2"]) == 2
    assert "moe_experts=3 must be divisible by ep" in capsys.readouterr().err

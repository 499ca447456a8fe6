"""DDP communication hooks: what they all-reduce (labkit.comm.compression, torch's own rule) and the trainer's
``comm_hook`` option on real gloo ranks (chapter 23)."""
from __future__ import annotations

import pytest

from labkit.comm import hook_bytes, hook_elements
from labkit.train import TrainConfig


def test_casts_halve_the_bytes_and_keep_the_elements():
    shapes = [(512, 256), (512,), (256, 512), (256,)]
    n = 512 * 256 * 2 + 512 + 256
    assert hook_elements(shapes, None) == (n, n) == hook_elements(shapes, "fp16")
    assert hook_bytes(shapes) == 4 * n and hook_bytes(shapes, "fp16") == hook_bytes(shapes, "bf16") == 2 * n


def test_powersgd_follows_torchs_should_compress_rule():
    # 4096 x 4096 at rank 4: (4096 + 4096) x 4 = 32,768 elements instead of 16.8 M
    assert hook_elements([(4096, 4096)], rank=4) == (4096 * 4096, 8192 * 4)
    # a vector and a matrix too small to pay (torch: (n + m) r x 2 must be < n m) stay uncompressed
    assert hook_elements([(4096,), (4, 4)], rank=4) == (4096 + 16, 4096 + 16)
    # conv-like shapes are viewed as shape[0] x rest; the rank is capped by the smaller side
    assert hook_elements([(64, 3, 3, 3)], rank=1) == (64 * 27, 64 + 27)
    assert hook_elements([(8, 1000)], rank=2) == (8000, (8 + 1000) * 2)
    assert hook_elements([(8, 1000)], rank=32) == (8000, 8000)      # capped at r = 8: (1008 x 8) x 2 > 8000


@pytest.mark.parametrize("name", ["gpt2-124m", "llama3-8b", "mixtral-8x7b", "palm-540b"])
def test_param_shapes_are_the_parameters_n_params_counts(name):
    import math

    from labkit import flops
    from labkit.comm import param_shapes

    s = flops.preset(name)
    for fused in (False, True):
        assert sum(math.prod(t) for t in param_shapes(s, fused_qkv=fused)) == flops.n_params(s)


def test_param_shapes_match_labkits_own_gpt():
    import torch

    from labkit.comm import param_shapes
    from labkit.model.config import gpt_config
    from labkit.model.gpt import GPT

    cfg = gpt_config("tiny")
    with torch.device("meta"):
        model = GPT(cfg)
    built = sorted(tuple(p.shape) for p in model.parameters())
    assert sorted(param_shapes(cfg.shape(), fused_qkv=True)) == built


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="hook"):
        hook_elements([(2, 2)], "int8")
    with pytest.raises(TypeError, match=r"shapes\[0\]"):
        hook_elements([7])
    with pytest.raises(ValueError, match="rank"):
        hook_elements([(2, 2)], rank=0)


def test_config_refuses_hooks_outside_ddp():
    with pytest.raises(ValueError, match="comm_hook"):
        TrainConfig(parallel="fsdp", comm_hook="fp16")
    with pytest.raises(ValueError, match="comm_hook"):
        TrainConfig(parallel="ddp", comm_hook="int8")
    with pytest.raises(ValueError, match="powersgd_start_iter"):
        TrainConfig(parallel="ddp", comm_hook="powersgd", powersgd_start_iter=1)


@pytest.mark.timeout(240)
def test_hooks_train_on_gloo_ranks_and_powersgd_counts_what_the_model_says():
    from labkit.model.gpt import GPT
    from labkit.train import run_many

    base = TrainConfig(model="tiny", parallel="ddp", steps=4, warmup_steps=1, micro_batch=2, seed=3)
    plain, fp16, psgd = run_many([base, base.replace(comm_hook="fp16"),
                                  base.replace(comm_hook="powersgd", powersgd_rank=2, powersgd_start_iter=2)], nprocs=2)
    for rec in (plain, fp16, psgd):
        assert len(rec.loss) == 4 and all(x == x for x in rec.loss)
    assert plain.loss[0] == fp16.loss[0] == psgd.loss[0]             # same model, same first batch
    assert abs(fp16.loss[-1] - plain.loss[-1]) < 0.05 * plain.loss[-1]   # fp16 rounding, not a new model
    counted = psgd.extra["powersgd_numel"]
    shapes = [tuple(p.shape) for p in GPT(base.model_config).parameters()]
    before, after = hook_elements(shapes, rank=2)
    # PowerSGD counts from its start iteration on (iterations 0, 1 all-reduce plain): 2 of the 4 steps
    steps_compressed = base.steps - 2
    assert counted == {"before": steps_compressed * before, "after": steps_compressed * after}

"""labkit.model.gpt: sizes, FLOP shape, attention variants, activation checkpointing, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from labkit import flops
from labkit.model.gpt import GPT, SIZES, GPTConfig, gpt_config


def test_shape_matches_the_real_parameter_count():
    for name in ("tiny", "small", "bench"):
        cfg = SIZES[name]
        assert flops.n_params(cfg.shape()) == GPT(cfg).n_params(), name


def test_named_sizes_span_tiny_to_1b():
    assert flops.n_params(SIZES["tiny"].shape()) < 2e6
    n1b = flops.n_params(SIZES["1b"].shape())
    assert 0.95e9 < n1b < 1.1e9
    sizes = [flops.n_params(SIZES[n].shape()) for n in ("tiny", "small", "medium", "1b")]
    assert sizes == sorted(sizes)


def test_forward_loss_at_init_is_log_vocab():
    torch.manual_seed(0)
    cfg = SIZES["tiny"]
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    targets = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, cfg.seq_len, cfg.vocab_size)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1   # near-uniform predictions at init
    assert model(idx)[1] is None


def test_naive_and_sdpa_attention_agree():
    torch.manual_seed(0)
    a = GPT(gpt_config("tiny", attention="sdpa"))
    b = GPT(gpt_config("tiny", attention="naive"))
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 4096, (2, 64))
    la, lb = a(idx, idx)[1], b(idx, idx)[1]
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)


def test_causality():
    """Changing a later token never changes an earlier position's logits."""
    torch.manual_seed(0)
    for attention in ("sdpa", "naive"):
        m = GPT(gpt_config("tiny", attention=attention)).eval()
        idx = torch.randint(0, 4096, (1, 16))
        idx2 = idx.clone()
        idx2[0, 10] = (idx2[0, 10] + 1) % 4096
        torch.testing.assert_close(m(idx)[0][:, :10], m(idx2)[0][:, :10])
        assert not torch.allclose(m(idx)[0][:, 10:], m(idx2)[0][:, 10:])


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    a = GPT(gpt_config("tiny"))
    b = GPT(gpt_config("tiny", checkpoint=True))
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 4096, (2, 64))
    a(idx, idx)[1].backward()
    b(idx, idx)[1].backward()
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_counted_flops_match_the_formula_for_naive_attention():
    """torch's FLOP counter on the real model vs the Megatron-style formula of labkit.flops (ch03)."""
    cfg = gpt_config("tiny", attention="naive")
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    counted = flops.count_flops(model, (idx, idx)).total / idx.numel()
    formula = flops.model_flops_per_token(cfg.shape(), method="megatron")
    assert counted == pytest.approx(formula, rel=0.02)


def test_bad_configs():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_layers=1, d_model=100, n_heads=3, vocab_size=10, seq_len=8)
    with pytest.raises(ValueError, match="attention='fast'"):
        gpt_config("tiny", attention="fast")
    with pytest.raises(ValueError, match="model size 'huge'"):
        gpt_config("huge")
    with pytest.raises(ValueError, match="unknown field"):
        gpt_config("tiny", layers=3)
    with pytest.raises(ValueError, match="n_layers=0"):
        GPTConfig(n_layers=0, d_model=8, n_heads=1, vocab_size=10, seq_len=8)
    with pytest.raises(TypeError, match="GPTConfig"):
        GPT({"n_layers": 1})
    with pytest.raises(ValueError, match="seq_len=64"):
        GPT(SIZES["tiny"])(torch.zeros(1, 65, dtype=torch.long))

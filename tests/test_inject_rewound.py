"""Issue #34 (item 3): an injected run's calibration trains two real steps to time them; they are undone
(labkit.train.inject.rewound), so the injected run starts from the clean run's weights and first batch and
their losses compare step by step (chapter 25 §3)."""
from __future__ import annotations

import pytest
import torch

from labkit.train import TrainConfig, run, train
from labkit.train.inject import rewound

BASE = TrainConfig(model="tiny", steps=4, warmup_steps=1, peak_flops=1e12, micro_batch=2, seed=3)


@pytest.mark.parametrize("changes", [dict(inject="host", host_stall_s=0.001),
                                     dict(inject="data", data_slowdown_s=0.0005)], ids=["host", "data"])
def test_an_injected_run_starts_where_the_clean_run_starts(changes):
    clean = train(BASE)
    injected = train(BASE.replace(**changes))
    assert injected.loss == pytest.approx(clean.loss, rel=1e-6, abs=1e-6)   # step 1 onward, not step 3


def test_an_injected_ddp_run_matches_the_clean_one_on_two_ranks():
    clean = run(BASE.replace(parallel="ddp"), nprocs=2)
    injected = run(BASE.replace(parallel="ddp", inject="comm", comm_pad_mb=0.1), nprocs=2)
    assert injected.loss == pytest.approx(clean.loss, rel=1e-6, abs=1e-6)


def test_rewound_restores_weights_optimizer_rng_and_logs():
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    before = [p.detach().clone() for p in net.parameters()]
    log = [1]
    rng = torch.get_rng_state()
    with rewound(net, opt, logs=(log,)):
        for _ in range(2):
            net(torch.randn(3, 4)).sum().backward()
            opt.step()
            log.append(2)
        assert not torch.equal(net.weight, before[0]) and opt.state
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before, strict=True))
    assert not opt.state and log == [1] and torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in net.parameters())

"""The host and straggler block of ``inject="host"``/``"straggler"`` (labkit.train.inject): on a CPU a count of work
units timed beside the clean steps (so a load that comes after the calibration slows the block as much as the step),
a wall-time block on a GPU or with a fixed ``host_stall_s``. Counts and calls are asserted, never timings."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from labkit.train import TrainConfig, inject, train

CPU, CUDA = SimpleNamespace(type="cpu"), SimpleNamespace(type="cuda")
TINY = TrainConfig(model="tiny", seq_len=16, micro_batch=2, steps=3, warmup_steps=1, device="cpu")


def test_work_units_are_counted_and_bad_counts_named():
    import torch

    assert inject.host_work(0) == 0 and inject.host_work(3) == inject.host_work(3)
    assert inject.compute_work(2, torch.device("cpu")) == 2
    with pytest.raises(ValueError, match="units=-1"):
        inject.host_work(-1)
    with pytest.raises(ValueError, match="n=-2"):
        inject.compute_work(-2, torch.device("cpu"))
    with pytest.raises(TypeError, match="units must be an int"):
        inject.host_work(1.5)


@pytest.mark.parametrize("cfg, device", [
    (TINY.replace(inject="host"), CUDA),                                   # a GPU: the host's load sets nothing
    (TINY.replace(inject="host", host_stall_s=0.01), CPU),                # a fixed size is a wall time
    (TINY.replace(inject="straggler", straggler_by="data"), CPU),         # its loader sleeps per sample
    (TINY.replace(inject="straggler", straggler_by="link", parallel="ddp"), CPU),   # its link
    (TINY.replace(inject="data"), CPU),
    (TINY, CPU),
])
def test_blocks_that_stay_a_wall_time(cfg, device):
    assert inject.stall_reps(cfg, 0.01, device) == 0


def test_cpu_blocks_become_work_units_sized_to_the_stall(monkeypatch):
    import torch

    cpu = torch.device("cpu")
    for cfg in (TINY.replace(inject="host"), TINY.replace(inject="straggler"),
                TINY.replace(inject="straggler", straggler_by="compute")):
        assert inject.stall_reps(cfg, 0.0, cpu) == 0
        small, large = inject.stall_reps(cfg, 0.002, cpu), inject.stall_reps(cfg, 0.5, cpu)
        assert 1 <= small < large, (cfg.inject, cfg.straggler_by, small, large)     # 250× the stall
    # the unit is timed, and the count is the stall over one unit's median time
    clock = iter(range(0, 1000, 2))                            # every timed block of 8 units takes 2 "s"
    monkeypatch.setattr(inject.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(inject, "host_work", lambda units: None)
    assert inject.stall_reps(TINY.replace(inject="host"), 10.0, CPU) == 40          # 10 s / (2 s / 8)


def test_block_runs_the_units_or_the_wall_time(monkeypatch):
    calls = []
    monkeypatch.setattr(inject, "host_work", lambda n: calls.append(("host", n)))
    monkeypatch.setattr(inject, "compute_work", lambda n, d: calls.append(("compute", n)))
    monkeypatch.setattr(inject, "busy_compute", lambda s, d: calls.append(("busy", s)))
    monkeypatch.setattr(inject.time, "sleep", lambda s: calls.append(("sleep", s)))
    host, comp = TINY.replace(inject="host"), TINY.replace(inject="straggler", straggler_by="compute")
    inject.block(host, 0.5, 7, CPU)
    inject.block(host, 0.5, 0, CUDA)
    inject.block(comp, 0.5, 9, CPU)
    inject.block(comp, 0.5, 0, CUDA)
    assert calls == [("host", 7), ("sleep", 0.5), ("compute", 9), ("busy", 0.5)]


def test_a_host_run_records_its_units_and_a_fixed_stall_none():
    sized = train(TINY.replace(inject="host", inject_share=0.2))
    assert sized.config["host_stall_reps_used"] >= 1 and sized.config["host_stall_s_used"] > 0
    fixed = train(TINY.replace(inject="host", host_stall_s=0.001))
    assert fixed.config["host_stall_reps_used"] == 0 and fixed.config["host_stall_s_used"] == 0.001

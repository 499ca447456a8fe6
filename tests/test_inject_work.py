"""The trainer's ``inject="work"`` (labkit.train.inject: a regression of known size, lab 11), the meter's CPU seconds
per step, and ``regress_series.train_series``: live runs of the tiny GPT on CPU.

The work is counted (multiplies, FLOPs), never asserted as a timing: a loaded 2-core machine moves any time."""
from __future__ import annotations

import datetime as dt
import os

import pytest

from labkit.measure.series import series_figures, train_series
from labkit.train import TrainConfig, train
from labkit.train.inject import do_work, work_flops

TINY = TrainConfig(model="tiny", seq_len=16, micro_batch=2, steps=3, warmup_steps=1, device="cpu")


def test_work_options_are_validated_by_name():
    with pytest.raises(ValueError, match="work_matmuls.*inject='work'"):
        TINY.replace(work_matmuls=5)
    with pytest.raises(ValueError, match="work_matmuls"):
        TINY.replace(inject="work", work_matmuls=-1)
    with pytest.raises(ValueError, match="inject_share"):
        TINY.replace(inject="work", inject_share=1.0)
    assert TINY.replace(inject="work", work_matmuls=3).work_matmuls == 3


def test_do_work_is_bounded_compute_of_known_flops():
    import torch

    out = do_work(50, torch.device("cpu"))
    assert torch.allclose(out, torch.ones_like(out)) and work_flops(50) == 50 * 2 * 128 ** 3


def test_a_work_run_records_its_size_and_every_step_its_cpu_seconds():
    fixed = train(TINY.replace(inject="work", work_matmuls=7))
    assert fixed.config["work_matmuls_used"] == 7 and fixed.config["work_flops_used"] == work_flops(7)
    sized = train(TINY.replace(inject="work", inject_share=0.2))
    assert sized.config["work_matmuls_used"] >= 1 and sized.config["inject_share"] == 0.2
    for rec in (fixed, sized):
        cpu = rec.extra["cpu_step_time"]
        assert cpu["n"] == rec.step_time.n == 2 and 0 < cpu["p10"] <= cpu["median"] <= cpu["p90"]


def test_train_series_stamps_each_run_with_this_process():
    before = dt.datetime.now(dt.timezone.utc)
    runs = train_series([TINY.replace(label=f"r{i}") for i in range(2)])
    assert [r["label"] for r in runs] == ["r0", "r1"]
    for r in runs:                      # clean runs: no work injected, CPU seconds for every timed step
        assert "work_matmuls_used" not in r["config"] and r["extra"]["cpu_step_time"]["n"] == 2
        st = r["launch"]
        assert st["pid"] == os.getpid()
        assert before <= dt.datetime.fromisoformat(st["started_at"]) <= dt.datetime.fromisoformat(st["ended_at"])
    assert runs[0]["launch"]["ended_at"] <= runs[1]["launch"]["started_at"]
    assert len(series_figures(runs, "cpu_time_median")) == 2 and len(series_figures(runs)) == 2
    runs[0]["extra"].pop("cpu_step_time")
    with pytest.raises(ValueError, match="no CPU seconds per step"):
        series_figures(runs, "cpu_time_median")


def test_train_series_refuses_what_it_cannot_run():
    with pytest.raises(TypeError, match="cfgs must be a list"):
        train_series(TINY)
    with pytest.raises(ValueError, match="parallel='ddp'"):
        train_series([TINY.replace(parallel="ddp")])
    with pytest.raises(ValueError, match="cfgs holds 0"):
        train_series([])

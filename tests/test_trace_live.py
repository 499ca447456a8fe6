"""labkit.trace on traces recorded live from 2 gloo ranks training a tiny GPT (chapter 9)."""
from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest

from labkit.diagnose import diagnose
from labkit.trace import analyze
from labkit.train import TrainConfig, run

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]   # one 2-rank training run (~10-25 s)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_traces")
    rec = run(TrainConfig(parallel="ddp", steps=4, warmup_steps=2, bucket_cap_mb=1.0, profile_dir=str(out)),
              nprocs=2)
    return rec, out


def test_live_gloo_trace_breakdown(ddp_run):
    rec, out = ddp_run
    a = analyze(out)
    assert a.kind == "cpu" and a.ranks == [0, 1]
    assert len(a.steps) >= 2
    b = a.breakdown
    parts = b["compute"] + b["comm_exposed"] + b["memcpy"] + b["idle_host_wait"] + b["idle_other"]
    assert np.allclose(parts, b["total"])
    assert (b["compute_share"] > 0.2).all()            # a training step is mostly ops on CPU
    assert (b["memcpy"] == 0).all()                      # no device copies on a CPU trace
    # DDP's gradient all-reduce shows up as gloo:all_reduce spans (several buckets at 1 MB caps)
    ar = a.comm_by_type.set_index("type").loc["all_reduce"]
    assert ar["count"] >= 2 * len(a.steps) * 2 and ar["total_s"] > 0
    assert set(a.stragglers["rank"]) == {0, 1}
    assert a.stragglers["n_collectives"].iloc[0] >= 2
    top = a.top_ops(5)
    assert len(top) == 5 and top["count"].min() >= 1


def test_live_trace_updates_record_and_diagnoses(ddp_run):
    rec, out = ddp_run
    a = analyze(out)
    a.update_record(rec)
    assert 0 < rec.utilisation <= 1 and rec.comm_wait_share is not None
    d = diagnose(rec, a)
    assert d.verdict and d.report().count("Verdict") == 1
    assert d.figures["comm_exposed_share"] == pytest.approx(a.comm_wait_share)


def test_live_trace_single_step_and_truncated_copy(ddp_run, tmp_path):
    _, out = ddp_run
    a = analyze(out)
    one = analyze(out, steps=[a.steps[0]])
    assert one.steps == [a.steps[0]]
    assert one.breakdown["total"].sum() < a.breakdown["total"].sum()
    src = sorted(out.glob("rank1*"))[0]
    bad = tmp_path / "rank1.json.gz"
    raw = src.read_bytes()
    if src.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    bad.write_bytes(gzip.compress(raw[: len(raw) // 2]))
    shutil.copy(sorted(out.glob("rank0*"))[0], tmp_path / sorted(out.glob("rank0*"))[0].name)
    with pytest.raises(ValueError, match="rank1.json.gz"):
        analyze(tmp_path)

"""Peer check: labkit's HTA-definition breakdown and overlap vs HTA 0.5.0 on real GPU traces (chapter 9).

The traces are HTA's own test data (../shared/peer-traces, or $LABKIT_PEER_TRACES); the reference
numbers were produced by HTA 0.5.0 once and committed in tests/data/hta_reference.json (see its
``_provenance``). The optional live test runs HTA itself when it is importable, or through the
separate venv build/hta-venv when that exists (HTA needs pandas < 3).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.trace import analyze, hta_comm_comp_overlap, hta_summary, hta_temporal_breakdown

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = json.loads((ROOT / "tests" / "data" / "hta_reference.json").read_text())
TOL_PP = 1.0      # percentage points


def _peer_dir() -> Path | None:
    env = os.environ.get("LABKIT_PEER_TRACES")
    for cand in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "peer-traces"]:
        if cand.is_dir() and any(cand.glob("*.json.gz")):
            return cand
    return None


PEER = _peer_dir()
needs_peer = pytest.mark.skipif(PEER is None, reason="peer traces not found (../shared/peer-traces or "
                                                      "LABKIT_PEER_TRACES)")


def test_reference_file_has_provenance():
    prov = REFERENCE["_provenance"]
    assert "0.5.0" in prov["tool"] and prov["made_with"]
    assert len(REFERENCE["files"]) == 4


@needs_peer
@pytest.mark.parametrize("name", sorted(REFERENCE["files"]))
def test_temporal_breakdown_and_overlap_within_1pp_of_hta(name):
    ref = REFERENCE["files"][name]
    path = PEER / name
    if not path.exists():
        pytest.skip(f"{name} not in {PEER}")
    tb = hta_summary(path).iloc[0]
    for col in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
        assert abs(tb[col] - ref[col]) <= TOL_PP, (name, col, tb[col], ref[col])
    ov = tb["comp_comm_overlap_pctg"]
    if ref["comp_comm_overlap_pctg"] is None:
        assert math.isnan(ov)
    else:
        assert abs(ov - ref["comp_comm_overlap_pctg"]) <= TOL_PP, (name, ov, ref["comp_comm_overlap_pctg"])


@needs_peer
def test_labkit_breakdown_on_real_gpu_traces_is_consistent():
    """labkit's own (step-windowed) breakdown on the same files: a partition, NCCL found, bytes read."""
    a = analyze(PEER / "nccl_parser_config_nccl_data.json.gz")
    assert a.kind == "gpu" and a.steps == [4, 5, 6]
    b = a.breakdown.iloc[0]
    parts = b["compute"] + b["comm_exposed"] + b["memcpy"] + b["idle_host_wait"] + b["idle_other"]
    assert parts == pytest.approx(b["total"])
    ar = a.comm_by_type.set_index("type").loc["all_reduce"]
    assert ar["count"] == 15 and ar["algbw_GBps"] > 0
    # HTA's overlap counts all three steps' kernels except the last; ours the 3 steps: same ballpark
    assert abs(100 * a.overlap[0] - REFERENCE["files"]["nccl_parser_config_nccl_data.json.gz"]
               ["comp_comm_overlap_pctg"]) < 5


def _hta_python() -> list[str] | None:
    try:
        import hta  # noqa: F401

        return [sys.executable]
    except ImportError:
        venv = ROOT / "build" / "hta-venv" / "bin" / "python"
        return [str(venv)] if venv.exists() else None


@needs_peer
@pytest.mark.skipif(_hta_python() is None, reason="HTA not importable and no build/hta-venv")
def test_live_hta_agrees_on_one_file(tmp_path):
    name = "trace_filter_sampled_rank-1.json.gz"
    (tmp_path / name).symlink_to(PEER / name)
    code = ("import json, logging; logging.disable(logging.WARNING)\n"
            "from hta.trace_analysis import TraceAnalysis\n"
            f"t = TraceAnalysis(trace_dir={str(tmp_path)!r})\n"
            "tb = t.get_temporal_breakdown(visualize=False).iloc[0]\n"
            "ov = t.get_comm_comp_overlap(visualize=False).iloc[0]\n"
            "print(json.dumps({'idle': float(tb['idle_time_pctg']), 'overlap': float(ov['comp_comm_overlap_pctg'])}))")
    out = subprocess.run(_hta_python() + ["-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    live = json.loads(out.stdout.strip().splitlines()[-1])
    ours = hta_temporal_breakdown(PEER / name).iloc[0]["idle_time_pctg"]
    assert abs(live["idle"] - ours) <= TOL_PP
    assert abs(live["overlap"] - hta_comm_comp_overlap(PEER / name).iloc[0]["comp_comm_overlap_pctg"]) <= TOL_PP

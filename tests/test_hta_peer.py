"""Real GPU traces shipped in datasets/traces/hta (chapters 8 and 9): the files are the ones their README
names (sha256, licence), labkit reads their known structure, and labkit's HTA-definition breakdown and
overlap agree with HTA 0.5.0's within 1 pp.

The traces are HTA's own test data (MIT), shipped unchanged. The reference numbers were produced by HTA
0.5.0 once and committed in tests/data/hta_reference.json (see its ``_provenance``); its keys are a file's
path below datasets/traces/hta with ``/`` as ``_``. The optional live test runs HTA itself when it is
importable, or through the separate venv build/hta-venv when that exists (HTA needs pandas < 3).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.cli import main as cli_main
from labkit.paths import dataset
from labkit.trace import analyze, hta_comm_comp_overlap, hta_summary, hta_temporal_breakdown, load

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = json.loads((ROOT / "tests" / "data" / "hta_reference.json").read_text())
TOL_PP = 1.0      # percentage points
HTA_DIR = dataset("traces", "hta")
SHIPPED = {"_".join(f.relative_to(HTA_DIR).parts): f for f in sorted(HTA_DIR.rglob("*.json.gz"))}


def test_reference_file_has_provenance_and_covers_the_shipped_files():
    prov = REFERENCE["_provenance"]
    assert "0.5.0" in prov["tool"] and prov["made_with"]
    assert set(REFERENCE["files"]) == set(SHIPPED)


def test_shipped_files_are_the_ones_their_readme_names():
    """Every shipped trace is listed in the README with its sha256 and matches it; the licence travels."""
    readme = (HTA_DIR / "README.md").read_text()
    listed = dict((path, sha) for sha, path in re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, flags=re.M))
    assert set(listed) == {f.relative_to(HTA_DIR).as_posix() for f in SHIPPED.values()}
    for rel, sha in listed.items():
        assert hashlib.sha256((HTA_DIR / rel).read_bytes()).hexdigest() == sha, rel
    assert "f4d0062c" in readme and "REAL" in readme.upper()
    lic = (HTA_DIR / "LICENSE").read_text()
    assert lic.startswith("MIT License") and "Copyright (c) Meta Platforms, Inc. and affiliates." in lic


def _nccl_kernels(path) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in load(path)["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
            out[e["name"].split("(")[0]] = out.get(e["name"].split("(")[0], 0) + 1
    return out


def test_two_ranks_of_the_128_rank_job():
    folder = dataset("traces", "hta", "trace_filter")
    for f in sorted(folder.glob("*.json.gz")):
        assert load(f)["distributedInfo"]["world_size"] == 128
        assert _nccl_kernels(f) == {"ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t": 10}
    a = analyze(folder)
    assert a.kind == "gpu" and a.ranks == [0, 1] and a.steps == [551, 552]
    by_type = a.comm_by_type.set_index("type")
    assert list(by_type.index) == ["send_recv"] and by_type.loc["send_recv", "count"] == 20
    assert (a.stragglers["n_collectives"] == 10).all()
    assert all(0 < v < 1 for v in a.overlap.values())
    b = a.breakdown
    parts = b["compute"] + b["comm_exposed"] + b["memcpy"] + b["idle_host_wait"] + b["idle_other"]
    assert parts.to_numpy() == pytest.approx(b["total"].to_numpy())


def test_rank0_of_the_2_rank_ddp_job_and_the_single_gpu_job():
    ddp = dataset("traces", "hta", "nccl_parser_config", "nccl_data.json.gz")
    doc = load(ddp)
    assert doc["distributedInfo"]["world_size"] == 2
    assert {d["name"] for d in doc["deviceProperties"]} == {"NVIDIA A100-PG509-200"}
    assert _nccl_kernels(ddp) == {"ncclKernel_AllReduce_RING_LL_Sum_float": 15,
                                  "ncclKernel_Broadcast_RING_LL_Sum_int8_t": 6}
    one = next(dataset("traces", "hta", "ns_resolution_trace").glob("*.json.gz"))
    doc = load(one)
    assert doc["distributedInfo"]["world_size"] == 1 and _nccl_kernels(one) == {}
    a = analyze(one)
    assert a.kind == "gpu" and a.steps == [101, 102, 103, 104, 105] and a.comm_by_type.empty
    assert math.isnan(a.overlap[0])


@pytest.mark.parametrize("name", sorted(REFERENCE["files"]))
def test_temporal_breakdown_and_overlap_within_1pp_of_hta(name):
    ref = REFERENCE["files"][name]
    tb = hta_summary(SHIPPED[name]).iloc[0]
    for col in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
        assert abs(tb[col] - ref[col]) <= TOL_PP, (name, col, tb[col], ref[col])
    ov = tb["comp_comm_overlap_pctg"]
    if ref["comp_comm_overlap_pctg"] is None:
        assert math.isnan(ov)
    else:
        assert abs(ov - ref["comp_comm_overlap_pctg"]) <= TOL_PP, (name, ov, ref["comp_comm_overlap_pctg"])


def test_labkit_breakdown_on_real_gpu_traces_is_consistent():
    """labkit's own (step-windowed) breakdown on the same files: a partition, NCCL found, bytes read."""
    a = analyze(SHIPPED["nccl_parser_config_nccl_data.json.gz"])
    assert a.kind == "gpu" and a.steps == [4, 5, 6]
    b = a.breakdown.iloc[0]
    parts = b["compute"] + b["comm_exposed"] + b["memcpy"] + b["idle_host_wait"] + b["idle_other"]
    assert parts == pytest.approx(b["total"])
    ar = a.comm_by_type.set_index("type").loc["all_reduce"]
    assert ar["count"] == 15 and ar["algbw_GBps"] > 0
    # HTA's overlap counts all three steps' kernels except the last; ours the 3 steps: same ballpark
    assert abs(100 * a.overlap[0] - REFERENCE["files"]["nccl_parser_config_nccl_data.json.gz"]
               ["comp_comm_overlap_pctg"]) < 5


def test_cli_example_runs_on_the_shipped_real_traces(capsys):
    assert cli_main(["trace", "analyze", "--example", "hta-2-of-128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "gpu" and out["ranks"] == [0, 1] and out["steps"] == [551, 552]
    assert cli_main(["trace", "hta", "--example", "hta-ddp-rank0-of-2", "--json"]) == 0
    hta = json.loads(capsys.readouterr().out)
    ref = REFERENCE["files"]["nccl_parser_config_nccl_data.json.gz"]
    assert abs(hta["temporal_breakdown"][0]["idle_time_pctg"] - ref["idle_time_pctg"]) <= TOL_PP
    assert cli_main(["trace", "analyze"]) == 2                                  # neither PATH nor --example
    assert "neither given" in capsys.readouterr().err
    assert cli_main(["trace", "analyze", str(SHIPPED["nccl_parser_config_nccl_data.json.gz"]),
                     "--example", "hta-single-gpu"]) == 2                      # both
    assert "both given" in capsys.readouterr().err


def test_every_cli_example_names_a_shipped_trace():
    from labkit.cli.trace import EXAMPLES

    for name, (parts, what) in EXAMPLES.items():
        path = dataset(*parts)
        assert any(path.glob("*.json*")), name
        real = "hta" in parts
        assert ("REAL" in what) == real and ("SYNTHETIC" in what) == ("synthetic" in name), name


def _hta_python() -> list[str] | None:
    try:
        import hta  # noqa: F401

        return [sys.executable]
    except ImportError:
        venv = ROOT / "build" / "hta-venv" / "bin" / "python"
        return [str(venv)] if venv.exists() else None


@pytest.mark.skipif(_hta_python() is None, reason="HTA not importable and no build/hta-venv")
def test_live_hta_agrees_on_one_file(tmp_path):
    src = SHIPPED["trace_filter_sampled_rank-1.json.gz"]
    (tmp_path / src.name).symlink_to(src)
    code = ("import json, logging; logging.disable(logging.WARNING)\n"
            "from hta.trace_analysis import TraceAnalysis\n"
            f"t = TraceAnalysis(trace_dir={str(tmp_path)!r})\n"
            "tb = t.get_temporal_breakdown(visualize=False).iloc[0]\n"
            "ov = t.get_comm_comp_overlap(visualize=False).iloc[0]\n"
            "print(json.dumps({'idle': float(tb['idle_time_pctg']), 'overlap': float(ov['comp_comm_overlap_pctg'])}))")
    out = subprocess.run(_hta_python() + ["-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    live = json.loads(out.stdout.strip().splitlines()[-1])
    ours = hta_temporal_breakdown(src).iloc[0]["idle_time_pctg"]
    assert abs(live["idle"] - ours) <= TOL_PP
    assert abs(live["overlap"] - hta_comm_comp_overlap(src).iloc[0]["comp_comm_overlap_pctg"]) <= TOL_PP

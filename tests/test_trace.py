"""labkit.trace on SYNTHETIC GPU traces with known answers, and on broken input (chapter 9)."""
from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest

import labkit.intervals as iv
from labkit.cli import main as cli_main
from labkit.record import RunRecord
from labkit.trace import analyze, load
from labkit.trace.breakdown import collective_type
from labkit.trace.synthetic import NCCL_NAMES, SyntheticSpec, expected, gpu_trace, write_traces

PARTS = ("compute", "comm_exposed", "comm_hidden", "memcpy", "idle_host_wait", "idle_other", "total", "data_wait")


# ---------------------------------------------------------------- intervals
def test_union_merges_overlaps_and_keeps_gaps():
    s, e = iv.union([5, 0, 2, 10], [7, 3, 4, 11])
    assert s.tolist() == [0, 5, 10] and e.tolist() == [4, 7, 11]
    assert iv.total((s, e)) == 4 + 2 + 1


def test_intersect_and_subtract_lengths():
    a = iv.union([0, 10], [5, 20])
    b = iv.union([3, 12], [11, 14])
    assert iv.intersect_total(a, b) == pytest.approx(2 + 1 + 2)   # [3,5] [10,11] [12,14]
    assert iv.total(iv.intersect(a, b)) == pytest.approx(5)
    assert iv.total(iv.subtract(a, b)) == pytest.approx(15 - 5)
    assert iv.total(iv.clip(a, 4, 12)) == pytest.approx(1 + 2)


def test_union_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        iv.union([0, 1], [2])


# ---------------------------------------------------------------- synthetic, known answers
@pytest.fixture
def straggler_dir(tmp_path):
    spec = SyntheticSpec(straggler_rank=1, straggler_us=700.0, data_wait=True, seed=3)
    write_traces(spec, tmp_path)
    return spec, tmp_path


def test_breakdown_matches_known_answers_per_step(straggler_dir):
    spec, d = straggler_dir
    a = analyze(d)
    assert a.kind == "gpu" and a.ranks == [0, 1] and a.steps == [10, 11, 12, 13]
    for rank in (0, 1):
        exp = expected(spec, rank)
        rows = a.step_breakdown[a.step_breakdown["rank"] == rank].sort_values("step")
        for i, row in enumerate(rows.itertuples()):
            want = exp["last"] if i == len(rows) - 1 else exp["steps"]
            for p in PARTS:
                assert getattr(row, p) == pytest.approx(want[p], abs=1e-9), (rank, row.step, p)


def test_partition_sums_to_total_and_overlap(straggler_dir):
    spec, d = straggler_dir
    a = analyze(d)
    b = a.breakdown
    parts = b["compute"] + b["comm_exposed"] + b["memcpy"] + b["idle_host_wait"] + b["idle_other"]
    assert np.allclose(parts, b["total"])
    # overlap = hidden / all comm: rank 0 waits 700 µs longer in the collective
    assert a.overlap[0] == pytest.approx(500 / 2700)
    assert a.overlap[1] == pytest.approx(500 / 2000)


def test_stragglers_name_the_late_rank(straggler_dir):
    spec, d = straggler_dir
    s = analyze(d).stragglers.set_index("rank")
    assert bool(s.loc[1, "straggler"]) and not bool(s.loc[0, "straggler"])
    assert s.loc[1, "times_last"] == spec.steps
    assert s.loc[1, "mean_late_s"] == pytest.approx(700e-6)
    # its compute before each collective is the straggler delay longer
    diff = s.loc[1, "median_compute_before_s"] - s.loc[0, "median_compute_before_s"]
    assert diff == pytest.approx(700e-6, abs=1e-9)


def test_comm_bytes_and_algbw(straggler_dir):
    spec, d = straggler_dir
    a = analyze(d)
    row = a.comm_by_type.iloc[0]
    assert row["type"] == "all_reduce" and row["count"] == 2 * spec.steps
    assert row["bytes"] == 2 * spec.steps * spec.comm_nelems * 4
    durs = [expected(spec, r)["comm_dur_s"] for r in (0, 1)]
    assert row["algbw_GBps"] == pytest.approx(row["bytes"] / (spec.steps * sum(durs)) / 1e9)


@pytest.mark.parametrize("names", sorted(NCCL_NAMES))
def test_nccl_kernels_recognised_under_every_name(tmp_path, names):
    spec = SyntheticSpec(world_size=1, steps=2, nccl_names=names, comm_args=False)
    write_traces(spec, tmp_path)
    a = analyze(tmp_path)
    exp = expected(spec, 0)["steps"]
    first = a.step_breakdown.iloc[0]
    assert first["comm_exposed"] == pytest.approx(exp["comm_exposed"])
    assert a.comm_by_type.iloc[0]["type"] == "all_reduce"
    assert np.isnan(a.comm_by_type.iloc[0]["bytes"])       # no args → bytes unknown, not invented


def test_collective_type_names():
    assert collective_type("ncclDevKernel_AllGather_RING_LL") == "all_gather"
    assert collective_type("ncclKernel_ReduceScatter_RING_LL_Sum_bf16") == "reduce_scatter"
    assert collective_type("gloo:all_reduce") == "all_reduce"
    assert collective_type("ncclKernel_SendRecv_RING_SIMPLE") == "send_recv"
    assert collective_type("allreduce") == "all_reduce"


def test_steps_selection_and_unknown_steps(straggler_dir):
    _, d = straggler_dir
    a = analyze(d, steps=[11, 12])
    assert a.steps == [11, 12]
    with pytest.raises(ValueError, match="steps in this trace"):
        analyze(d, steps=[99])


def test_trace_without_profiler_steps_uses_whole_window(tmp_path):
    doc = gpu_trace(SyntheticSpec(world_size=1, steps=3), 0)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e.get("name", "").startswith("ProfilerStep")]
    del doc["distributedInfo"]
    p = tmp_path / "plain.json"
    p.write_text(json.dumps(doc))
    a = analyze(p)
    assert a.steps == [-1] and a.ranks == [0]
    b = a.breakdown.iloc[0]
    exp = expected(SyntheticSpec(world_size=1, steps=3), 0)
    assert b["total"] == pytest.approx(2 * exp["steps"]["total"] + exp["last"]["total"])


def test_update_record_and_json(straggler_dir):
    _, d = straggler_dir
    a = analyze(d)
    rec = a.update_record(RunRecord())
    assert rec.utilisation == pytest.approx(a.utilisation)
    assert 0 < rec.comm_wait_share < 1 and rec.data_wait_share > 0
    json.dumps(a.to_dict())
    RunRecord.from_json(rec.to_json())
    assert "straggler" in a.summary()
    with pytest.raises(TypeError):
        a.update_record({"not": "a record"})


def test_top_ops_and_plot(straggler_dir):
    _, d = straggler_dir
    a = analyze(d)
    top = a.top_ops(3)
    assert len(top) == 3 and top["total_s"].is_monotonic_decreasing
    assert top.iloc[0]["name"].startswith("nccl")
    with pytest.raises(ValueError, match="kind"):
        a.top_ops(3, kind="gpu")
    import matplotlib

    matplotlib.use("Agg")
    ax = a.plot_breakdown()
    assert len(ax.patches) == 2 * 5


# ---------------------------------------------------------------- bad input
def test_truncated_gzip_names_the_file(tmp_path):
    good = tmp_path / "good.json.gz"
    with gzip.open(good, "wt") as f:
        json.dump(gpu_trace(SyntheticSpec(world_size=1, steps=2), 0), f)
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(good.read_bytes()[:2000])
    with pytest.raises(ValueError, match="rank0.json.gz.*(corrupt or truncated|not valid JSON)"):
        load(bad)


def test_truncated_json_and_wrong_shape(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(gpu_trace(SyntheticSpec(world_size=1, steps=2), 0))[:5000])
    with pytest.raises(ValueError, match="t.json is not valid JSON.*truncated"):
        analyze(p)
    q = tmp_path / "q.json"
    q.write_text("[1, 2, 3]")
    with pytest.raises(ValueError, match="no 'traceEvents'"):
        analyze(q)
    e = tmp_path / "e.json"
    e.write_text("")
    with pytest.raises(ValueError, match="empty"):
        load(e)
    with pytest.raises(FileNotFoundError):
        analyze(tmp_path / "missing")


def test_bad_events_and_duplicate_ranks(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "x", "dur": 1}]}))
    with pytest.raises(ValueError, match="non-numeric"):
        analyze(p)
    d = tmp_path / "dup"
    d.mkdir()
    for name in ("a.json", "b.json"):
        (d / name).write_text(json.dumps(gpu_trace(SyntheticSpec(world_size=1, steps=2), 0)))
    with pytest.raises(ValueError, match="both claim rank 0"):
        analyze(d)


def test_folder_skips_records_beside_traces(tmp_path):
    write_traces(SyntheticSpec(world_size=2, steps=2), tmp_path)
    RunRecord(label="x").save(tmp_path / "record.json")
    assert analyze(tmp_path).ranks == [0, 1]


def test_synthetic_spec_validation_and_label():
    with pytest.raises(ValueError, match="hidden_us"):
        SyntheticSpec(hidden_us=1e9)
    with pytest.raises(ValueError, match="nccl_names"):
        SyntheticSpec(nccl_names="nope")
    doc = gpu_trace(SyntheticSpec(), 0)
    assert doc["labkit_synthetic"]["SYNTHETIC"] is True
    assert doc["labkit_synthetic"]["generator"] == "labkit.trace.synthetic.synthesize_trace"
    assert gpu_trace(SyntheticSpec(seed=1), 0) == gpu_trace(SyntheticSpec(seed=1), 0)
    with pytest.raises(ValueError, match="world_size"):
        SyntheticSpec(world_size=0)


def test_generator_names_resolve():
    """The generator's old names are the same functions (the moved modules are walked by test_moved_paths)."""
    from labkit.trace import synthetic

    assert synthetic.gpu_trace is synthetic.synthesize_trace and synthetic.write_traces is synthetic.synthesize_traces


# ---------------------------------------------------------------- CLI
def test_cli_trace_analyze_hta_synth(tmp_path, capsys):
    assert cli_main(["trace", "synth", str(tmp_path), "--straggler-rank", "0", "--straggler-us", "300"]) == 0
    assert cli_main(["trace", "analyze", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.split("\n", 2)[-1])
    assert out["kind"] == "gpu" and out["stragglers"][0]["straggler"] is True
    assert cli_main(["trace", "analyze", str(tmp_path)]) == 0
    assert "utilisation" in capsys.readouterr().out
    assert cli_main(["trace", "hta", str(tmp_path), "--json"]) == 0
    assert "idle_time_pctg" in capsys.readouterr().out
    assert cli_main(["trace", "analyze", str(tmp_path / "nope")]) == 2


# ---------------------------------------------------------------- shipped datasets
def test_shipped_synthetic_dataset_matches_its_spec():
    from labkit.paths import dataset

    d = dataset("traces", "synthetic_gpu_ddp_straggler")
    doc = load(sorted(d.glob("*.gz"))[0])
    spec = SyntheticSpec(**doc["labkit_synthetic"]["spec"])
    a = analyze(d)
    row = a.step_breakdown.iloc[0]
    exp = expected(spec, int(row["rank"]))["steps"]
    assert row["comm_hidden"] == pytest.approx(exp["comm_hidden"])
    assert a.stragglers.set_index("rank").loc[spec.straggler_rank, "straggler"]


def test_shipped_recorded_cpu_trace_and_record():
    from labkit.diagnose import diagnose
    from labkit.paths import dataset

    a = analyze(dataset("traces", "cpu_gloo_ddp_tiny"))
    assert a.kind == "cpu" and a.ranks == [0, 1]
    assert a.comm_by_type.iloc[0]["type"] == "all_reduce"
    rec = RunRecord.load(dataset("traces", "cpu_gloo_ddp_tiny.record.json"))
    d = diagnose(a.update_record(rec), a)
    assert d.findings and d.primary in ("compute", "communication", "data", "memory", "scheduling")


def test_gpu_trace_without_launch_events_falls_back_to_whole_window(tmp_path):
    spec = SyntheticSpec(world_size=1, steps=3)
    doc = gpu_trace(spec, 0)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cuda_runtime"]
    p = tmp_path / "nolaunch.json"
    p.write_text(json.dumps(doc))
    a = analyze(p)
    assert a.steps == [-1]
    b = a.breakdown.iloc[0]
    exp = expected(spec, 0)
    assert b["compute"] == pytest.approx(3 * exp["steps"]["compute"])
    assert b["idle_host_wait"] == 0                      # no launch times: host wait cannot be claimed
    assert b["idle_other"] == pytest.approx(2 * (exp["steps"]["idle_host_wait"] + exp["steps"]["idle_other"]))


def test_three_collectives_on_two_ranks_cannot_convict_a_straggler(tmp_path):
    """With 2 ranks one of them is always last at >= 2 of 3 collectives: that alone is chance (p = 0.5
    for 2/3, 0.125 for 3/3); 5 of 5 (p = 0.03) is a straggler."""
    few, many = tmp_path / "few", tmp_path / "many"
    write_traces(SyntheticSpec(steps=3, straggler_rank=1, straggler_us=700.0, seed=3), few)
    write_traces(SyntheticSpec(steps=5, straggler_rank=1, straggler_us=700.0, seed=3), many)
    s_few, s_many = analyze(few).stragglers.set_index("rank"), analyze(many).stragglers.set_index("rank")
    assert int(s_few.loc[1, "times_last"]) == 3 and not s_few["straggler"].any()
    assert int(s_many.loc[1, "times_last"]) == 5 and list(s_many.index[s_many["straggler"]]) == [1]


# ---------------------------------------------------------------- garbage in: refused, naming file and event
def _one_rank(tmp_path, name="t.json", **edits):
    doc = gpu_trace(SyntheticSpec(world_size=1, steps=2), 0)
    for cat, (key, val) in edits.items():
        i = next(k for k, e in enumerate(doc["traceEvents"]) if e.get("cat") == cat)
        if key.startswith("args."):
            doc["traceEvents"][i]["args"][key[5:]] = val
        else:
            doc["traceEvents"][i][key] = val
    f = tmp_path / name
    f.write_text(json.dumps(doc))
    return f, i


def test_non_finite_times_are_refused_naming_file_and_event(tmp_path, capsys):
    f, i = _one_rank(tmp_path, kernel=("dur", float("inf")))          # JSON "Infinity"
    assert "Infinity" in f.read_text()
    with pytest.raises(ValueError, match=rf"t\.json: event {i} \('sm90.*'dur'=inf is not valid"):
        analyze(f)
    assert cli_main(["trace", "analyze", str(f)]) == 2                   # was: "inf s, nan %", exit 0
    assert "'dur'=inf" in capsys.readouterr().err
    for key, val, match in (("ts", float("nan"), "'ts'=nan"), ("ts", 10**400, "'ts'=<int of"),
                            ("dur", -1.0, "'dur'=-1.0"), ("ts", None, "'ts'=None is non-numeric"),
                            ("dur", "5", "'dur'='5' is non-numeric")):
        f, i = _one_rank(tmp_path, kernel=(key, val))
        with pytest.raises(ValueError, match=rf"t\.json: event {i} .*{re.escape(match)}"):
            analyze(f)


def test_bad_stream_correlation_and_field_types_are_refused(tmp_path):
    cases = {"kernel": [("args.stream", "7"), ("args.stream", None), ("args.correlation", 1.5),
                        ("args.correlation", True), ("args", [1]), ("name", 5), ("cat", ["kernel"]),
                        ("pid", [0])],
             "cuda_runtime": [("args.correlation", None), ("args.correlation", "12")]}
    for cat, edits in cases.items():
        for key, val in edits:
            f, i = _one_rank(tmp_path, **{cat: (key, val)})
            field = key.split(".")[-1] if key != "pid" else "pid"
            with pytest.raises(ValueError, match=rf"t\.json: event {i}.*{field}") as e:
                analyze(f)
            assert "int" in str(e.value) or "string" in str(e.value) or "object" in str(e.value), str(e.value)
    doc = gpu_trace(SyntheticSpec(world_size=1, steps=2), 0)
    for info, match in (([1], "'distributedInfo' must be an object"), ({"rank": "0"}, "distributedInfo.rank='0'"),
                        ({"rank": 3, "world_size": 2}, "rank=3 is not valid for world_size=2"),
                        ({"world_size": 0}, "world_size=0")):
        doc["distributedInfo"] = info
        (tmp_path / "d.json").write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=re.escape(match)):
            analyze(tmp_path / "d.json")
    doc = gpu_trace(SyntheticSpec(world_size=1, steps=2), 0)
    step = next(e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    step["name"] = "ProfilerStep#abc"
    (tmp_path / "s.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"s\.json: a ProfilerStep range is named 'ProfilerStep#abc'"):
        analyze(tmp_path / "s.json")
    (tmp_path / "e.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1}, 7]}))
    with pytest.raises(ValueError, match=r"e\.json: event 1 is int, not an object"):
        analyze(tmp_path / "e.json")


def test_empty_path_and_bad_steps_are_refused(tmp_path, monkeypatch, capsys):
    write_traces(SyntheticSpec(world_size=1, steps=2), tmp_path)
    monkeypatch.chdir(tmp_path)                  # "" would have analysed this folder
    with pytest.raises(ValueError, match="path='' is not valid"):
        analyze("")
    assert cli_main(["trace", "analyze", ""]) == 2
    assert "path=''" in capsys.readouterr().err
    with pytest.raises(TypeError, match="path must be a trace file or folder"):
        analyze(None)
    with pytest.raises(ValueError, match=r"steps\[0\] must be an int"):
        analyze(tmp_path, steps=["1"])
    with pytest.raises(ValueError, match=r"steps\[1\]=-2"):
        analyze(tmp_path, steps=[1, -2])
    with pytest.raises(TypeError, match="steps=3 must be None or an iterable"):
        analyze(tmp_path, steps=3)
    with pytest.raises(ValueError, match="allow_mixed must be True or False"):
        analyze(tmp_path, allow_mixed="no")


def test_folder_mixing_two_runs_is_refused_unless_asked(tmp_path, capsys):
    import shutil

    from labkit import paths

    # different world sizes
    a = tmp_path / "sizes"
    write_traces(SyntheticSpec(world_size=2, steps=2), a / "x")
    write_traces(SyntheticSpec(world_size=4, steps=2), a / "y")
    shutil.move(a / "x" / "rank0.SYNTHETIC.pt.trace.json.gz", a / "run1_rank0.json.gz")
    shutil.move(a / "y" / "rank1.SYNTHETIC.pt.trace.json.gz", a / "run2_rank1.json.gz")
    with pytest.raises(ValueError, match=r"world_size differ — 2: run1_rank0.json.gz; 4: run2_rank1.json.gz"):
        analyze(a)
    assert analyze(a, allow_mixed=True).ranks == [0, 1]
    assert cli_main(["trace", "analyze", str(a)]) == 2 and "--allow-mixed" in capsys.readouterr().err
    assert cli_main(["trace", "analyze", str(a), "--allow-mixed"]) == 0
    # same world size, different SYNTHETIC specs (another run of the generator)
    b = tmp_path / "specs"
    write_traces(SyntheticSpec(world_size=2, steps=2, seed=0), b / "x")
    write_traces(SyntheticSpec(world_size=2, steps=2, seed=1), b / "y")
    shutil.move(b / "x" / "rank0.SYNTHETIC.pt.trace.json.gz", b / "rank0.json.gz")
    shutil.move(b / "y" / "rank1.SYNTHETIC.pt.trace.json.gz", b / "rank1.json.gz")
    with pytest.raises(ValueError, match="SYNTHETIC specs differ"):
        analyze(b)
    # real recorded traces: the same run, then rank 1 taken from a run a day later (baseTimeNanoseconds)
    c = tmp_path / "times"
    c.mkdir()
    src = paths.dataset("traces", "cpu_gloo_ddp_tiny")
    for r in (0, 1):
        doc = json.loads(gzip.open(src / f"rank{r}.pt.trace.json.gz").read())
        if r == 1:
            doc["baseTimeNanoseconds"] += 86_400 * 10**9
        (c / f"rank{r}.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"rank1\.json starts 86,400\.0 s after rank0\.json"):
        analyze(c)
    assert analyze(c, allow_mixed=True).ranks == [0, 1]
    assert analyze(src).ranks == [0, 1]                    # the shipped run itself is one run
    # duplicate ranks stay an error even when mixing is allowed (the analysis is per rank)
    d = tmp_path / "dup"
    for name in ("a", "b"):
        write_traces(SyntheticSpec(world_size=1, steps=2), d / name)
        shutil.move(d / name / "rank0.SYNTHETIC.pt.trace.json.gz", d / f"{name}.json.gz")
    with pytest.raises(ValueError, match="both claim rank 0"):
        analyze(d, allow_mixed=True)

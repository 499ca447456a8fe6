"""Hang diagnosis from Flight Recorder dumps (chapter 27): live gloo hangs on 4 ranks, each launched with
``flight_recorder=DIR`` and a 3 s collective timeout, diagnosed from the dumps the ranks wrote; a clean job
not called hung; dumps in torch's format built here for the cases a live job cannot seed deterministically
(a lost dump, an order desync, a dtype mismatch, no majority); bad input, one clear error each."""
from __future__ import annotations

import json
import os
import pickle
import time

import pytest

from labkit.diagnose.hang import diagnose_hang
from labkit.launcher import LaunchError, launch
from labkit.trace.flight import read_dump, read_dumps

TARGET = "labkit.diagnose.seeded_hangs:hang_job"


# ----------------------------------------------------------------------------- live gloo hangs
def _live(tmp_path, kind: str, env: dict | None = None, *, collective_timeout_s=3.0, launch_timeout_s=150):
    """Launch the seeded job on 4 gloo ranks (rank 2 goes wrong at step 3); its dumps, diagnosed."""
    folder = tmp_path / "fr"
    t0 = time.monotonic()
    err = None
    try:
        launch(TARGET, 4, kwargs={"kind": kind, "rank": 2, "step": 3, "timeout_s": collective_timeout_s},
               backend="gloo", timeout_s=launch_timeout_s, stream=False, log_dir=False, flight_recorder=folder,
               env=env)
    except LaunchError as e:
        err = e
    print(f"{kind}: launch + dumps {time.monotonic() - t0:.1f} s")
    dg = diagnose_hang(folder)
    print(dg.explain())
    return dg, err, folder


def _not_reached_by_rank_2(dg):
    assert dg.hung and dg.kind == "not_reached"
    assert (dg.culprits, dg.seq, dg.op, dg.group_desc) == ([2], 3, "all_reduce", "hang_demo")
    assert dg.input_sizes == ((256,),) and dg.dtypes == ("Float",)
    assert dg.findings[0].waiting == [0, 1, 3] and dg.last_seq["hang_demo"][2] == 2
    assert "rank 2 did not reach collective #3" in dg.explain()


def test_live_rank_that_exits(tmp_path):
    # rank 2 leaves (sys.exit) before the 3rd all-reduce; the others issued it; the launcher sees rank 2
    # fail and asks the others for their records while they wait in #3
    dg, err, folder = _live(tmp_path, "exit")
    assert err is not None and err.rank == 2 and "Flight Recorder dumps of rank(s) [0, 1, 2, 3]" in str(err)
    assert sorted(os.listdir(folder)) == [f"nccl_trace_rank_{r}" for r in range(4)]
    _not_reached_by_rank_2(dg)


def test_live_loader_stall_dumped_on_the_watchdog_timeout(tmp_path):
    # rank 2's data loader sleeps before the 3rd all-reduce; the collective timeout is far away (120 s),
    # so only the launcher's watchdog (25 s) ends the job: every rank dumps from its dump thread — ranks
    # 0, 1, 3 while blocked inside the all-reduce — in torch's JSON format
    dg, err, folder = _live(tmp_path, "loader", {"LABKIT_FR_FORMAT": "json"}, collective_timeout_s=120,
                            launch_timeout_s=25)
    assert err is not None and err.timed_out and "Flight Recorder dumps of rank(s) [0, 1, 2, 3]" in str(err)
    assert sorted(os.listdir(folder)) == [f"nccl_trace_rank_{r}.json" for r in range(4)]
    assert {d.format for d in read_dumps(folder)[0]} == {"json"}
    _not_reached_by_rank_2(dg)


def test_live_rank_that_skips_an_all_reduce(tmp_path):
    # rank 2 skips step 3's all-reduce: it issues 3 where the others issue 4, then waits at the job's end
    # (a barrier on the world group) while the others wait in #4 for it — a wait cycle
    dg, err, _ = _live(tmp_path, "skip")
    assert err is not None and dg.hung
    assert (dg.kind, dg.culprits, dg.seq, dg.op, dg.group_desc) == ("not_reached", [2], 4, "all_reduce", "hang_demo")
    other = dg.findings[1]
    assert (other.group_desc, other.op, other.waiting, other.missing) == ("default_pg", "barrier", [2], [0, 1, 3])
    assert "desync" in dg.explain()


def test_live_size_mismatch(tmp_path):
    # rank 2 all-reduces 257 values where the others send 256: gloo aborts a receiving rank (SIGABRT,
    # no dump from it); the dumps that are left show the mismatch at #3
    dg, err, _ = _live(tmp_path, "size")
    assert err is not None and dg.hung
    assert (dg.kind, dg.culprits, dg.seq, dg.op) == ("size", [2], 3, "all_reduce")
    sizes = {tuple(v["ranks"]): v["input_sizes"] for v in dg.findings[0].variants}
    assert sizes[(2,)] == ((257,),) and all(s == ((256,),) for r, s in sizes.items() if r != (2,))
    assert "a size mismatch at collective #3" in dg.explain()


def test_live_clean_job_is_not_hung(tmp_path):
    dg, err, folder = _live(tmp_path, "none")
    assert err is None
    assert len(os.listdir(folder)) == 4
    assert not dg.hung and dg.culprits == [] and dg.findings == []
    assert dg.last_seq["hang_demo"] == {0: 4, 1: 4, 2: 4, 3: 4}
    assert dg.explain().startswith("Not hung")


# ----------------------------------------------------------------------------- dumps in torch's format
def _entry(seq, op="all_reduce", size=256, dtype="Float", pg=("0", "default_pg"), rid=None):
    return {"record_id": seq if rid is None else rid, "pg_id": int(pg[0]), "process_group": pg,
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"gloo:{op}",
            "time_created_ns": 10**18 + seq, "input_sizes": [[size]] if size else [], "input_dtypes": [dtype],
            "output_sizes": [[size]] if size else [], "output_dtypes": [dtype], "state": "scheduled",
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": True,
            "timeout_ms": 3000, "is_p2p": False}


def _write(folder, per_rank: dict, fmt="pickle"):
    folder.mkdir(exist_ok=True)
    for rank, entries in per_rank.items():
        doc = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}, "pg_status": {},
               "comm_lib_version": "", "entries": entries}
        if fmt == "json":
            (folder / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(doc))
        else:
            (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(doc, protocol=2))
    return folder


def test_a_lost_dump_is_named_and_the_others_are_not_called_hung(tmp_path):
    d = _write(tmp_path / "d", {r: [_entry(s) for s in (1, 2, 3)] for r in (0, 1, 3)})
    dg = diagnose_hang(d, world_size=4)
    assert not dg.hung and dg.missing_dumps == [2] and (dg.kind, dg.culprits) == ("no_dump", [2])
    assert "rank 2 left no dump" in dg.explain()
    assert diagnose_hang(d).missing_dumps == [2]          # a gap in the names is seen without world_size


def test_order_desync_dtype_mismatch_and_no_majority(tmp_path):
    # rank 1 skips #2 (all_reduce of 256) and issues the loss all-reduce (1 value) in its place
    full = [_entry(1), _entry(2), _entry(3, size=1)]
    d = _write(tmp_path / "order", {0: full, 1: [_entry(1), _entry(2, size=1)], 2: full, 3: full})
    dg = diagnose_hang(d)
    assert (dg.kind, dg.culprits, dg.seq) == ("order", [1], 2)
    assert "rank 1 skipped a collective" in dg.explain()
    d = _write(tmp_path / "dtype", {r: [_entry(1), _entry(2, dtype="BFloat16" if r == 3 else "Float")]
                                    for r in range(4)})
    dg = diagnose_hang(d)
    assert (dg.kind, dg.culprits, dg.seq) == ("dtype", [3], 2)
    d = _write(tmp_path / "tie", {r: [_entry(1, size=8 if r < 2 else 9)] for r in range(4)})
    dg = diagnose_hang(d)
    assert dg.kind == "size" and dg.culprits == [0, 1, 2, 3]     # 2 against 2: no side is blamed alone


def test_a_two_rank_desync_is_said_to_be_ambiguous(tmp_path):
    # rank 1 issues 3 all-reduces on 'hang_demo' then the world barrier; rank 0 issues a 4th all-reduce: each
    # waits for the other, and with one rank on each side nothing in the dumps says which left the order
    g = ("1", "hang_demo")
    d = _write(tmp_path / "two", {0: [_entry(s, pg=g) for s in (1, 2, 3, 4)],
                                  1: [_entry(s, pg=g) for s in (1, 2, 3)] + [_entry(1, op="barrier", size=0, rid=9)]})
    dg = diagnose_hang(d)
    assert dg.hung and dg.kind == "not_reached"
    text = dg.explain()
    assert "each side waits for the other" in text and "cannot say which side left the common order" in text
    assert "is the one that left the common order" not in text
    # with a majority (3 ranks, rank 2 the odd one) the side that left is named
    d3 = _write(tmp_path / "three", {0: [_entry(s, pg=g) for s in (1, 2, 3, 4)], 1: [_entry(s, pg=g) for s in (1, 2, 3, 4)],
                                     2: [_entry(s, pg=g) for s in (1, 2, 3)] + [_entry(1, op="barrier", size=0, rid=9)]})
    dg3 = diagnose_hang(d3)
    assert dg3.culprits == [2] and "rank 2 is the one that left the common order" in dg3.explain()


def test_a_rank_stalled_before_a_groups_first_collective_and_groups_sharing_a_description(tmp_path):
    # gloo's dumps list no group members: rank 3 recorded nothing on 'hang_demo' while the others sit in
    # its #1 — rank 3 is taken as a member that never reached it
    g = ("1", "hang_demo")
    d = _write(tmp_path / "first", {0: [_entry(1), _entry(1, pg=g, rid=5)], 1: [_entry(1), _entry(1, pg=g, rid=5)],
                                    2: [_entry(1), _entry(1, pg=g, rid=5)], 3: [_entry(1)]})
    dg = diagnose_hang(d)
    assert (dg.kind, dg.culprits, dg.seq, dg.group_desc) == ("not_reached", [3], 1, "hang_demo")
    assert "recorded nothing on this group" in dg.explain()
    # two TP-style groups without a description: ranks 0, 1 on group 1 and ranks 2, 3 on group 2 — clean
    und = {r: [_entry(1), _entry(1, pg=("1" if r < 2 else "2", "undefined"), rid=7)] for r in range(4)}
    dg = diagnose_hang(_write(tmp_path / "tp", und))
    assert not dg.hung and set(dg.last_seq) == {"default_pg", "undefined 1", "undefined 2"}


def test_ring_buffer_that_dropped_early_entries_and_json_agree(tmp_path):
    # rank 0 kept only #5..#9 (a small buffer), the others #1..#9; rank 3 stopped at #7
    per = {0: [_entry(s) for s in range(5, 10)], 1: [_entry(s) for s in range(1, 10)],
           2: [_entry(s) for s in range(1, 10)], 3: [_entry(s) for s in range(1, 8)]}
    a = diagnose_hang(_write(tmp_path / "p", per))
    b = diagnose_hang(_write(tmp_path / "j", per, fmt="json"))
    assert (a.kind, a.culprits, a.seq) == (b.kind, b.culprits, b.seq) == ("not_reached", [3], 8)


# ----------------------------------------------------------------------------- bad input
def test_bad_folders_and_files_each_one_clear_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="is empty"):
        diagnose_hang(empty)
    with pytest.raises(ValueError, match="does not exist"):
        diagnose_hang(tmp_path / "nowhere")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.txt").write_text("hello")
    with pytest.raises(ValueError, match="holds no dump"):
        diagnose_hang(notes)
    text = _write(tmp_path / "text", {})
    (text / "nccl_trace_rank_0").write_text("this is not a dump\n")
    with pytest.raises(ValueError, match="neither torch's pickle"):
        diagnose_hang(text)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "nccl_trace_rank_0")
    with pytest.raises(ValueError, match="is a FIFO, not a regular file"):
        diagnose_hang(fifo)
    trunc = _write(tmp_path / "trunc", {0: [_entry(1)], 1: [_entry(1)]})
    data = (trunc / "nccl_trace_rank_1").read_bytes()
    (trunc / "nccl_trace_rank_1").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="nccl_trace_rank_1: not a readable pickle"):
        diagnose_hang(trunc)
    twice = _write(tmp_path / "twice", {0: [_entry(1)]})
    _write(twice, {0: [_entry(1)]}, fmt="json")
    with pytest.raises(ValueError, match="two dumps of rank 0"):
        diagnose_hang(twice)
    other = _write(tmp_path / "other", {0: [_entry(1)]})
    (other / "nccl_trace_rank_1.json").write_text(json.dumps({"entries": [{"x": 1}], "version": "2.10"}))
    with pytest.raises(ValueError, match="entry 0 is not a Flight Recorder entry"):
        diagnose_hang(other)
    with pytest.raises(TypeError, match="needs a folder of Flight Recorder dumps"):
        diagnose_hang(42)
    with pytest.raises(ValueError, match="world_size=2 is not valid"):
        diagnose_hang(_write(tmp_path / "w", {0: [], 3: []}), world_size=2)


class _Boom:
    def __reduce__(self):
        return (os.mkdir, ("/tmp/labkit-hang-test-pwned",))


def test_a_pickle_with_code_is_refused_not_run(tmp_path):
    d = tmp_path / "evil"
    d.mkdir()
    (d / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Boom()]}, protocol=2))
    with pytest.raises(ValueError, match="refuses global posix.mkdir"):
        read_dump(d / "nccl_trace_rank_0")
    assert not os.path.exists("/tmp/labkit-hang-test-pwned")


def test_launch_refuses_a_folder_holding_earlier_dumps_before_starting(tmp_path):
    d = _write(tmp_path / "old", {0: [_entry(1)]})
    before = (d / "nccl_trace_rank_0").read_bytes()
    with pytest.raises(ValueError, match="already holds Flight Recorder dumps"):
        launch(TARGET, 2, flight_recorder=d, stream=False, log_dir=False)
    assert (d / "nccl_trace_rank_0").read_bytes() == before
    with pytest.raises(TypeError, match="flight_recorder must be a folder path"):
        launch(TARGET, 2, flight_recorder=3, stream=False, log_dir=False)


def test_cli_diagnose_hang(tmp_path, capsys):
    from labkit.cli import main

    framed = dict(_entry(2), frames=[{"name": "all_reduce", "filename": "/x/torch/distributed/c10d.py", "line": 9},
                                     {"name": "train_step", "filename": "/home/me/train.py", "line": 42}])
    d = _write(tmp_path / "d", {r: [_entry(1), framed] if r != 1 else [_entry(1)] for r in range(4)})
    assert main(["diagnose", "--hang", str(d)]) == 0
    out = capsys.readouterr().out
    assert "rank 1 did not reach collective #2 on process group 'default_pg'" in out
    assert "They issued it at /home/me/train.py:42 in train_step." in out     # the first frame outside torch
    assert main(["diagnose", "--hang", str(d), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hung"] and doc["culprits"] == [1] and doc["seq"] == 2
    assert main(["diagnose", "--hang", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["diagnose", "--hang", str(d), "--inject", "data"]) == 2
    assert main(["diagnose", "--world-size", "4"]) == 2


def test_hang_job_refuses_bad_arguments_before_touching_torch_distributed():
    from labkit.diagnose.seeded_hangs import hang_job

    with pytest.raises(ValueError, match="kind='stall' is not a hang kind"):
        hang_job(kind="stall")
    with pytest.raises(ValueError, match="timeout_s"):
        hang_job(kind="skip", timeout_s=0)

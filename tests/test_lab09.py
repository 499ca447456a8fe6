"""Lab 9's q5: a hung job drawn from the learner's ticket (``diagnose.hang_workloads.HangJob``), its rank, collective
and cause named from the ranks' Flight Recorder dumps and the launch's outcome, graded by re-reading the recorded dumps.

Live: practice seeds 0, 4, 2, 3 draw the four causes (size, skip, exit, loader); each job runs once on 4 gloo ranks and the
grader's reading of its dumps must name the seeded rank, collective and cause — then lab09's own hidden checks are
run on evidence recorded from those runs: the instructor's answer passes, a wrong cause, a typed-in answer with no
dumps, dumps copied from another ticket's job and dumps of an earlier execution fail."""
from __future__ import annotations

import os

import pytest

from labkit.diagnose import seeded_hangs as hw
from labkit.teaching import tickets
from labkit.teaching.grading import EvidenceBook, load_lab
from labkit.teaching.grading.checker import run_checks

KEY = "test-course-key-0123456789"
LIVE = (0, 4, 2, 3)            # practice seeds drawing size, skip, exit, loader


def test_the_ticket_draws_the_hang_and_the_job_shows_none():
    draws = {s: hw._draw(s) for s in range(400)}
    assert {d["kind"] for d in draws.values()} == set(hw.CAUSES)
    assert {d["rank"] for d in draws.values()} == set(range(hw.JOB_RANKS))
    assert {d["step"] for d in draws.values()} == {2, 3} and len({d["numel"] for d in draws.values()}) > 300
    # the live test's seeds: seed 4 skips at step 2 of 4, and the hang shows at #4 (collectives pair by order)
    assert [(draws[s]["kind"], draws[s]["step"]) for s in LIVE] == [("size", 2), ("skip", 2), ("exit", 3), ("loader", 2)]
    assert hw._graded_hang(4, None)["seq"] == hw.JOB_STEPS == 4 and hw._graded_hang(0, None)["seq"] == 2
    assert "lab09_collectives" in tickets.KEYED_LABS
    t = tickets.issue(KEY, "lab09_collectives", 5)
    assert hw._graded_hang(t, KEY)["kind"] in hw.CAUSES and hw._draw(t) != hw._draw(5)   # the tag draws, not the seed
    with pytest.raises(ValueError, match="practice seed"):
        hw._graded_hang(5, KEY)
    with pytest.raises(ValueError, match="not issued by this course's key"):
        hw._graded_hang(tickets.issue("another-course-key-987654", "lab09_collectives", 5), KEY)
    job = hw.HangJob(t)
    shown = repr(job) + " ".join(f"{k}={v!r}" for k, v in vars(job).items())
    assert not any(c in shown for c in hw.CAUSES) and set(vars(job)) == {"seed"}
    assert [n for n in dir(job) if not n.startswith("_")] == ["run", "seed"]
    with pytest.raises(ValueError, match="neither a practice seed"):
        hw.HangJob("17-nottheticket")
    with pytest.raises(ValueError, match="timeout_s"):
        hw.HangJob(3).run("/nonexistent-hang", timeout_s=1)
    with pytest.raises(TypeError, match="folder must be a folder path"):
        hw.HangJob(3).run(3)


def _checks():
    return [{"id": c.id, "question": c.question, "weight": c.weight, "source": c.source}
            for c in load_lab("lab09_collectives").checks if c.question == "q5"]


def _grade(root, params=None):
    res = run_checks({"lab": "lab09_collectives", "work_root": str(root), "checks": _checks(), "params": params or {}})
    return {r["id"]: r for r in res}


def _answer(run):
    """The instructor solution's reading (lab09's q5 cell) of a run's dumps and outcome."""
    from labkit.diagnose.hang import diagnose_hang

    dg = diagnose_hang(run.folder)
    culprit = dg.culprits[0]
    if dg.kind == "size":
        cause = "size"
    elif any(culprit in f.waiting for f in dg.findings[1:]):
        cause = "skip"
    else:
        cause = "exit" if run.failed_rank == culprit else "loader"
    return {"rank": culprit, "seq": dg.seq, "op": dg.op, "cause": cause}


@pytest.mark.slow
def test_each_cause_live_is_read_from_the_dumps_and_graded_on_them(tmp_path):
    import datetime as dt

    runs = {}
    for i, seed in enumerate(LIVE):
        job = hw.HangJob(seed)
        t0 = dt.datetime.now(dt.timezone.utc)
        run = job.run(tmp_path / "hang")                 # one parent: each run in a new subfolder (run-1, run-2, …)
        took = (dt.datetime.now(dt.timezone.utc) - t0).total_seconds()
        print(f"seed {seed}: {run} in {took:.1f} s")
        assert took < 90                                # seconds, not minutes: the waiting ranks' timeout ends it
        want = hw._graded_hang(seed, None)
        got = hw._graded_reading(run.files, run.outcome(), pid=os.getpid(),
                                 written_at=dt.datetime.now(dt.timezone.utc).isoformat(), seed=seed, key=None)
        dg = got["dg"]
        assert (dg.culprits, dg.seq, dg.op, got["cause"]) == ([want["rank"]], want["seq"], "all_reduce", want["kind"])
        assert _answer(run) == {"rank": want["rank"], "seq": want["seq"], "op": "all_reduce", "cause": want["kind"]}
        assert not any(c in repr(run) for c in ("loader", "skip", "size mismatch"))   # the run names no fault
        assert run.folder == tmp_path / "hang" / f"run-{i + 1}"
        runs[seed] = run

    def book(root, seed, answer, run=None, **over):
        b = EvidenceBook("lab09_collectives", root=root)
        launch = over.pop("launch", run.outcome() if run is not None else None)
        b.submit("q5", answer=answer, seed=seed, files=run.files if run is not None else [], launch=launch, **over)
        return root

    for seed, run in runs.items():                      # the instructor's answer on each cause: full marks
        res = _grade(book(tmp_path / f"ok{seed}", seed, _answer(run), run), {"SEED": seed})
        assert all(r["passed"] for r in res.values()), {k: r["message"] for k, r in res.items()}

    right = _answer(runs[2])                            # exit: the cause only the launch's outcome tells from loader
    res = _grade(book(tmp_path / "wrong", 2, dict(right, cause="loader"), runs[2]))
    assert res["q5-hidden"]["passed"] and not res["q5-hidden-cause"]["passed"]
    assert "is not what your dumps and the launch's outcome show" in res["q5-hidden-cause"]["message"]

    res = _grade(book(tmp_path / "typed", 2, right))    # typed in, no run: nothing to re-read
    assert not any(r["passed"] for r in res.values())
    assert "no launch recorded" in res["q5-hidden"]["message"]

    # ticket 3's learner hands in ticket 2's job (its dumps and outcome, with ticket 2's right answer)
    res = _grade(book(tmp_path / "copied", 3, right, runs[2]), {"SEED": 3})
    assert not any(r["passed"] for r in res.values())
    assert "not of this ticket's job" in res["q5-hidden"]["message"]

    # an earlier execution's run pasted in: another kernel launched it — or, with its pid rewritten, its
    # collectives were recorded before this launch
    stale = dict(runs[2].outcome(), pid=os.getpid() + 1)
    res = _grade(book(tmp_path / "other-pid", 2, right, runs[2], launch=stale))
    assert "not by the kernel that recorded" in res["q5-hidden"]["message"]
    later = dict(runs[2].outcome(), started_at=dt.datetime.now(dt.timezone.utc).isoformat())
    later["ended_at"] = later["started_at"]
    res = _grade(book(tmp_path / "earlier", 2, right, runs[2], launch=later))
    assert "recorded outside this notebook's launch" in res["q5-hidden"]["message"]

    # with the instructor's key, a practice seed is refused
    os.environ["LABKIT_GRADING_KEY"] = KEY
    try:
        res = _grade(tmp_path / "ok2")
    finally:
        os.environ.pop("LABKIT_GRADING_KEY", None)
    assert not res["q5-hidden"]["passed"] and "practice seed" in res["q5-hidden"]["message"]

"""lab11_regression: the released copy hides the solutions and the hidden checks; and the hidden checks, run by
the grader's checker on evidence made here (run records shaped like ``regress_series.train_series``'s, SYNTHETIC
figures), re-derive everything from the recorded runs: q1's two σ (a σ typed in fails, runs without this execution's
stamp fail), q2's rates at the recorded seed and the grader's own from the σ of the recorded runs (sized settings
pass; a monitor of more than 40 runs, a naive one and rates measured on a quieter noise typed in fail), q3's series
from the recorded clean and slowed runs (verdicts typed in with no runs fail, as do slowed runs without the work
injection).

Full marks for the instructor source, zero for the released copy, the forged q1 (σ halved before recording) and the
typed-in q3 are graded through ``labkit grade`` in tests/test_grading_labs.py."""
from __future__ import annotations

import datetime as dt
import json
import os

import numpy as np
import pytest

from labkit.measure.series import NoiseModel, SeriesMonitor, monitor_rates, series_figures, size_monitor
from labkit.record import RunRecord, Stat
from labkit.teaching.grading import EvidenceBook, load_lab
from labkit.teaching.grading.checker import run_checks

LAB = "lab11_regression"
CFG = {"model": "tiny", "seq_len": 32, "micro_batch": 4, "accum": 1, "dtype": "fp32", "steps": 12,
       "warmup_steps": 2, "parallel": "single", "inject": "none", "inject_share": 0.4}
SLOWDOWN = 0.5


def test_lab11_release_hides_solutions_and_checks():
    import ast

    from labkit.teaching.grading.labfmt import PROMPT, learner_notebook

    lab = load_lab(LAB)
    assert [q.id for q in lab.questions] == ["q1", "q2", "q3"] and lab.max_score == 7
    assert {c.id: c.weight for c in lab.checks if c.question == "q2"} == {"q2-hidden": 1, "q2-hidden-fresh": 1}
    assert {c.id: c.weight for c in lab.checks if c.question == "q3"} == {"q3-hidden": 2, "q3-hidden-ci": 1}
    nb = learner_notebook(lab)
    text = "\n".join(c.source for c in nb.cells)
    assert "BEGIN SOLUTION" not in text and "evidence(" not in text and text.count(PROMPT) == 3
    assert "size_monitor(noise.sigma" not in text and "918_273" not in text     # the fresh seed stays hidden
    assert "train_series([" not in text and 'inject="work", inject_share=SHARE)' not in text   # prompts, not code
    for c in nb.cells:
        if c.cell_type == "code":
            ast.parse(c.source)


def _stamp(offset_s: float) -> dict:
    """A launch stamp of this process, ``offset_s`` seconds ago, lasting 1 s."""
    now = dt.datetime.now(dt.timezone.utc)
    start = now - dt.timedelta(seconds=offset_s)
    return {"pid": os.getpid(), "started_at": start.isoformat(timespec="microseconds"),
            "ended_at": (start + dt.timedelta(seconds=1)).isoformat(timespec="microseconds")}


def _runs(sigma: float, n: int, seed: int, *, cpu=0.02, slow=1.0, age_s=300.0, label="run", **cfg) -> list[dict]:
    """``n`` SYNTHETIC run dicts (train_series' shape): wall and CPU medians spread by ``sigma``, the CPU figure
    × ``slow``, tokens/s from the mean step, each stamped by this process ``age_s`` seconds ago onwards."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        wall = 0.05 * np.exp(2 * sigma * rng.standard_normal()) * slow
        c = cpu * np.exp(sigma * rng.standard_normal()) * slow
        st = Stat.of(list(wall * (1 + 0.01 * rng.standard_normal(10)).clip(0.9, 1.1)))
        cs = Stat.of(list(c * (1 + 0.01 * rng.standard_normal(10)).clip(0.9, 1.1)))
        rec = RunRecord(label=f"{label} {i}", step_time=st, tokens_per_step=128, tokens_per_s=128 / st.mean,
                        config={**CFG, **cfg}, extra={"cpu_step_time": cs.__dict__})
        out.append({**rec.to_dict(), "launch": _stamp(age_s - 2 * i)})
    return out


@pytest.fixture
def q1_evidence(tmp_path):
    runs = _runs(0.03, 8, seed=3)
    sig = {k: NoiseModel.fit(series_figures(runs, m)).sigma
           for k, m in (("wall", "step_time_median"), ("cpu", "cpu_time_median"))}
    book = EvidenceBook(LAB, root=tmp_path)
    book.submit("q1", answer=sig, runs=runs, config=dict(CFG))
    return tmp_path, book, runs, sig


def _grade(root, question):
    checks = [{"id": c.id, "question": c.question, "weight": c.weight, "source": c.source}
              for c in load_lab(LAB).checks if c.question == question]
    res = run_checks({"lab": LAB, "work_root": str(root), "checks": checks, "params": {}})
    return {r["id"]: r["passed"] for r in res}, [r["message"] for r in res]


def test_q1_refits_both_sigmas_from_this_executions_runs(q1_evidence):
    root, book, runs, sig = q1_evidence
    ok, why = _grade(root, "q1")
    assert ok == {"q1-hidden": True}, why
    book.submit("q1", answer={k: v / 2 for k, v in sig.items()}, runs=runs, config=dict(CFG))   # typed in
    ok, why = _grade(root, "q1")
    assert ok == {"q1-hidden": False} and "is not the spread" in why[0], why
    pasted = [{k: v for k, v in r.items() if k != "launch"} for r in runs]        # runs of no execution
    book.submit("q1", answer=sig, runs=pasted, config=dict(CFG))
    ok, why = _grade(root, "q1")
    assert ok == {"q1-hidden": False} and "launch stamp" in why[0], why


def _submit_q2(book, runs, mon, *, metric="cpu_time_median", rates_noise=None, seed=0, n=2000):
    noise = rates_noise or NoiseModel.fit(series_figures(runs, metric))
    r = monitor_rates(mon, noise, slowdown=SLOWDOWN, n_series=n, seed=seed)
    book.submit("q2", answer={"metric": metric, "false_alarm": r.false_alarm, "detection": r.detection},
                monitor=mon.to_dict(), n_series=n, seed=seed, slowdown=SLOWDOWN)


def test_q2_rates_from_the_recorded_sigma_refuse_huge_naive_and_typed_in_monitors(q1_evidence):
    root, book, runs, sig = q1_evidence
    sized = size_monitor(sig["cpu"], slowdown=SLOWDOWN, power=0.99, z=3.0, min_effect=0.12)
    assert sized.window <= 40
    _submit_q2(book, runs, sized)
    ok, why = _grade(root, "q2")
    assert ok == {"q2-hidden": True, "q2-hidden-fresh": True}, why
    huge = SeriesMonitor(400, 100, min_effect=0.02, z=3.5)                      # "thousands of runs" instead
    _submit_q2(book, runs, huge, n=1000)
    ok, why = _grade(root, "q2")
    assert ok["q2-hidden"] is False and "bring the run-to-run spread down" in why[0], why
    _submit_q2(book, runs, SeriesMonitor(3, 1, min_effect=0.02, z=0.0))         # the naive monitor
    ok, why = _grade(root, "q2")
    assert ok == {"q2-hidden": False, "q2-hidden-fresh": False} and "false alarms" in why[1], why
    small = size_monitor(sig["cpu"] / 8, slowdown=SLOWDOWN, power=0.99, z=3.0)  # rates of a quieter noise, typed in
    _submit_q2(book, runs, small, rates_noise=NoiseModel(0.02, sig["cpu"] / 8))
    ok, why = _grade(root, "q2")
    assert ok["q2-hidden"] is False and "is not what your monitor gives" in why[0], why


WORK = {"inject": "work", "inject_share": 1 / 3, "work_matmuls_used": 40}


def _q3(root, book, runs, *, work=WORK, typed=None):
    """Submit q2 (the sized CPU monitor) and a q3 of live-shaped runs; the history files from them."""
    mon = size_monitor(NoiseModel.fit(series_figures(runs, "cpu_time_median")).sigma, slowdown=SLOWDOWN,
                       power=0.99, z=3.0, min_effect=0.12)
    _submit_q2(book, runs, mon)
    base = _runs(0.03, mon.baseline_runs, seed=5, age_s=200, label="baseline")
    clean = _runs(0.03, mon.candidate_runs, seed=6, age_s=100, label="clean")
    slowed = _runs(0.03, mon.candidate_runs, seed=7, slow=1.25, age_s=99, label="slowed", **work)
    if typed is not None:
        book.submit("q3", answer=typed, baseline=None, clean=None, slowed=None, files=[])
        return mon
    files, ans = [], {}
    for name, cand in (("unchanged", clean), ("injected", slowed)):
        series = series_figures(base + cand, "cpu_time_median")
        path = root / f"history_{name}.json"
        path.write_text(json.dumps(series))
        files.append(path)
        ans[name] = mon.check(series).verdict
    book.submit("q3", answer={**ans, "exit_codes": [0, 1]}, baseline=base, clean=clean, slowed=slowed, files=files)
    return mon


def test_q3_rederives_the_verdicts_from_the_live_runs(q1_evidence):
    root, book, runs, _ = q1_evidence
    _q3(root, book, runs)
    ok, why = _grade(root, "q3")
    assert ok == {"q3-hidden": True, "q3-hidden-ci": True}, why


def test_q3_verdicts_typed_in_with_no_runs_score_nothing(q1_evidence):
    root, book, runs, _ = q1_evidence
    _q3(root, book, runs, typed={"unchanged": "unchanged", "injected": "slower", "exit_codes": [0, 1]})
    ok, why = _grade(root, "q3")
    assert ok == {"q3-hidden": False, "q3-hidden-ci": False}, why
    assert "baseline runs" in why[0] and "no history_unchanged.json" in why[1], why


def test_q3_slowed_runs_must_carry_the_work_injection(q1_evidence):
    root, book, runs, _ = q1_evidence
    _q3(root, book, runs, work={})               # slower figures, but no injection in the runs' config
    ok, why = _grade(root, "q3")
    assert ok["q3-hidden"] is False and "inject=" in why[0], why

"""lab11_regression: the released copy hides the solutions and the hidden checks; and the hidden checks, run by
the grader's checker on evidence made here, measure the learner's monitor on fresh series of their own — sized
settings pass, a naive monitor (3 runs vs 1, a bare 2 % bar) fails on false alarms, an undersized one on detection —
and re-derive q2's rates from q1's runs, so rates measured on a quieter noise typed in fail.

Full marks for the instructor source, zero for the released copy and the forged q1 (σ halved before recording)
are graded through ``labkit grade`` in tests/test_grading_labs.py."""
from __future__ import annotations

import numpy as np
import pytest

from labkit.grading import EvidenceBook, load_lab
from labkit.grading.checker import run_checks
from labkit.record import RunRecord, Stat
from labkit.regress_series import NoiseModel, SeriesMonitor, monitor_rates, size_monitor

LAB = "lab11_regression"
CFG = {"model": "tiny", "seq_len": 64, "micro_batch": 2, "accum": 1, "dtype": "fp32", "steps": 10,
       "warmup_steps": 2, "parallel": "none"}


def test_lab11_release_hides_solutions_and_checks():
    import ast

    from labkit.grading.labfmt import PROMPT, learner_notebook

    lab = load_lab(LAB)
    assert [q.id for q in lab.questions] == ["q1", "q2", "q3"] and lab.max_score == 7
    assert {c.id: c.weight for c in lab.checks if c.question == "q2"} == {"q2-hidden": 1, "q2-hidden-fresh": 1}
    assert {c.id: c.weight for c in lab.checks if c.question == "q3"} == {"q3-hidden": 2, "q3-hidden-ci": 1}
    nb = learner_notebook(lab)
    text = "\n".join(c.source for c in nb.cells)
    assert "BEGIN SOLUTION" not in text and "evidence(" not in text and text.count(PROMPT) == 3
    assert "size_monitor(noise.sigma" not in text and "918_273" not in text     # the fresh seed stays hidden
    for c in nb.cells:
        if c.cell_type == "code":
            ast.parse(c.source)


def _runs(sigma: float, n: int = 8, seed: int = 3) -> list[dict]:
    """Run records of ``n`` runs whose medians spread by ``sigma`` (consistent: tokens/s from the mean)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, m in enumerate(0.08 * np.exp(sigma * rng.standard_normal(n))):
        st = Stat.of(list(m * (1 + 0.01 * rng.standard_normal(8)).clip(0.9, 1.1)))
        out.append(RunRecord(label=f"run {i}", step_time=st, tokens_per_step=128, tokens_per_s=128 / st.mean,
                             config=dict(CFG)).to_dict())
    return out


@pytest.fixture
def q1_evidence(tmp_path):
    runs = _runs(0.08)
    recs = [RunRecord.from_dict(r) for r in runs]
    noise = NoiseModel.fit([r.step_time.median for r in recs])
    book = EvidenceBook(LAB, root=tmp_path)
    book.submit("q1", answer=noise.sigma, runs=runs, config=dict(CFG))
    return tmp_path, book, noise


def _grade(root, question):
    checks = [{"id": c.id, "question": c.question, "weight": c.weight, "source": c.source}
              for c in load_lab(LAB).checks if c.question == question]
    res = run_checks({"lab": LAB, "work_root": str(root), "checks": checks, "params": {}})
    return {r["id"]: r["passed"] for r in res}, [r["message"] for r in res]


def test_q1_refits_sigma_from_the_recorded_runs(q1_evidence):
    root, book, noise = q1_evidence
    ok, why = _grade(root, "q1")
    assert ok == {"q1-hidden": True}, why
    runs = book.load("q1").value("runs")
    book.submit("q1", answer=noise.sigma / 2, runs=runs, config=dict(CFG))        # a quieter machine, typed in
    ok, why = _grade(root, "q1")
    assert ok == {"q1-hidden": False} and "is not the spread" in why[0], why


def _submit_q2(book, noise, mon, *, rates_noise=None, seed=0, n=600):
    r = monitor_rates(mon, rates_noise or noise, slowdown=0.05, n_series=n, seed=seed)
    book.submit("q2", answer={"false_alarm": r.false_alarm, "detection": r.detection}, monitor=mon.to_dict(),
                n_series=n, seed=seed, slowdown=0.05)


def test_q2_fresh_series_pass_sized_settings_and_catch_naive_and_undersized_ones(q1_evidence):
    root, book, noise = q1_evidence
    _submit_q2(book, noise, size_monitor(noise.sigma, slowdown=0.05, power=0.999, z=3.5))
    ok, why = _grade(root, "q2")
    assert ok == {"q2-hidden": True, "q2-hidden-fresh": True}, why
    _submit_q2(book, noise, SeriesMonitor(3, 1, min_effect=0.02, z=0.0))         # the naive monitor
    ok, why = _grade(root, "q2")
    assert ok == {"q2-hidden": True, "q2-hidden-fresh": False} and "false alarms" in why[1], why
    small = size_monitor(noise.sigma / 4, slowdown=0.05, power=0.999, z=3.5)      # sized for a quieter machine
    _submit_q2(book, noise, small)
    ok, why = _grade(root, "q2")
    assert ok == {"q2-hidden": True, "q2-hidden-fresh": False} and "catch the 5 % slowdown" in why[1], why


def test_q2_rates_measured_on_a_typed_in_quieter_noise_fail(q1_evidence):
    root, book, noise = q1_evidence
    small = size_monitor(noise.sigma / 4, slowdown=0.05, power=0.999, z=3.5)
    _submit_q2(book, noise, small, rates_noise=NoiseModel(noise.center, noise.sigma / 4))
    ok, why = _grade(root, "q2")
    assert ok == {"q2-hidden": False, "q2-hidden-fresh": False}, why
    assert "is not what your monitor gives" in why[0], why

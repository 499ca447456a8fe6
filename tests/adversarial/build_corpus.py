"""Build the adversarial corpus of the grader's tests from the mini lab (run from the repository root).

    .venv/bin/python tests/adversarial/build_corpus.py          # (re)write tests/adversarial/*.ipynb

Each submission starts from the learner version of ``mini_lab`` with some answers filled in from the
instructor source, then misbehaves in one way. ``expected.json`` says what each must be graded.
``tests/test_grading_adversarial.py`` checks that the committed files match this script's output.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_output

HERE = Path(__file__).resolve().parent
LAB = HERE / "mini_lab"


def _cell(source: str, cid: str):
    c = new_code_cell(source)
    c.id = cid
    return c


def base(answered=("q1",)):
    """The learner notebook with the answer cells of ``answered`` taken from the instructor source."""
    from labkit.teaching.grading import learner_notebook, load_lab

    lab = load_lab(LAB)
    inst = {c.get("metadata", {}).get("labkit", {}).get("id"): c for c in lab.notebook().cells}
    nb = learner_notebook(lab)
    for i, c in enumerate(nb.cells):
        cid = c.get("metadata", {}).get("labkit", {}).get("id")
        if cid in answered:
            nb.cells[i] = copy.deepcopy(inst[cid])
    return nb


def index(nb, cid):
    return next(i for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("labkit", {}).get("id") == cid)


def corpus() -> dict:
    out = {}
    nb = base(("q1", "q2"))
    nb.cells.insert(index(nb, "q2"), _cell("x_bad = 1 / 0  # a bug before q2", "adv-raise"))
    out["exception"] = nb

    nb = base(("q1", "q2"))
    nb.cells.insert(index(nb, "q2"), _cell("while True:\n    pass", "adv-loop"))
    out["infinite_loop"] = nb

    nb = base(("q1", "q2"))
    nb.cells.insert(index(nb, "q2"), _cell(
        "import time\nwhile True:  # swallows the interrupt the grader sends\n    try:\n        time.sleep(0.2)\n"
        "    except KeyboardInterrupt:\n        pass", "adv-unkillable"))
    out["unkillable_loop"] = nb

    nb = base(("q1", "q2"))
    nb.cells.insert(index(nb, "q2"), _cell("import sys\nsys.exit(3)", "adv-exit"))
    out["sys_exit"] = nb

    nb = base(("q1", "q2"))
    nb.cells.insert(index(nb, "q2"), _cell("import os\nos._exit(1)  # the kernel dies here", "adv-kill"))
    out["kernel_death"] = nb

    nb = base(("q1", "q2"))
    nb.cells.insert(index(nb, "q2"), _cell(
        "import sys\nfor i in range(60_000):\n    sys.stdout.write('flood ' * 30 + '\\n')", "adv-flood"))
    out["huge_output"] = nb

    nb = base(("q1",))
    for cid in ("q2", "q1-check", "q3-check"):
        del nb.cells[index(nb, cid)]
    out["deleted_cells"] = nb

    nb = base(("q1", "q2"))
    q1 = [nb.cells[index(nb, c)] for c in ("q1", "q1-check")]
    for c in q1:
        nb.cells.remove(c)
    at = index(nb, "q2-check") + 1
    nb.cells[at:at] = q1
    out["reordered_cells"] = nb

    nb = base(())
    forged = _cell('print("q1: plausible")\nprint("q2: 2N/N time ratio 2.10")\nprint("all checks passed: 5/5")',
                   "adv-forge")
    forged.outputs = [new_output("stream", name="stdout", text="all checks passed: 5/5\n")]
    forged.execution_count = 1
    nb.cells.append(forged)
    for c in nb.cells:  # stored outputs claiming success are ignored too
        if c.get("metadata", {}).get("labkit", {}).get("kind") == "check":
            c.outputs = [new_output("stream", name="stdout", text="q: passed\n")]
    out["forged_output"] = nb

    nb = base(())
    nb.cells.insert(index(nb, "q1"), _cell(
        "# monkey-patch labkit inside the kernel: checks never fail, evidence is typed in\n"
        "import json\n"
        "grading.expect = lambda *a, **k: None\n"
        "grading.EvidenceBook.submit = lambda self, q, **kw: None\n"
        "labkit.launch = lambda *a, **k: None\n"
        "d = book.dir\n"
        "d.mkdir(parents=True, exist_ok=True)\n"
        "for q, a in (('q1', 1.0), ('q2', 2.0), ('q3', 20000.0)):\n"
        "    (d / f'{q}.json').write_text(json.dumps({'lab': 'mini_lab', 'question': q, 'answer': a, 'files': [],\n"
        "        'values': {'seed': SEED, 'n': N, 'world_size': 2, 'ranks': [0, 1], 'exit_codes': [0, 0]}}))\n"
        "answer_q1, answer_q2, answer_q3 = 1.0, 2.0, 20000.0", "adv-patch"))
    out["monkeypatched_labkit"] = nb

    nb = base(("q1", "q3"))
    nb.cells.insert(index(nb, "q3"), _cell(
        "%%writefile hang_rank.py\n"
        "import time\n\n\n"
        "def main():\n"
        "    import torch\n"
        "    import torch.distributed as dist\n"
        "    if dist.get_rank() == 1:\n"
        "        while True:  # this rank never reaches the collective\n"
        "            time.sleep(1)\n"
        "    dist.all_reduce(torch.ones(1))", "adv-hang-src"))
    nb.cells.insert(index(nb, "q3"), _cell(
        "import importlib\nimportlib.invalidate_caches()\n"
        "labkit.launch('hang_rank:main', 2, timeout_s=10_000, stream=False)", "adv-hang"))
    out["hung_rank"] = nb
    return out


def real_lab_corpus() -> dict:
    """Submissions of real labs whose evidence was doctored before it was recorded.

    lab01 with its throughput inflated by 10 % before saving: q1's consistency check must catch it and q2
    must not trip over it (a 1.5x inflation pushed the record's MFU past 100 % — q2's sanity bound — whenever
    a loaded machine depressed the measured peak enough that the real MFU exceeded 2/3; at 1.1x that needs a
    real MFU above 91 %). lab03, lab04, lab06, lab08 and lab10: see :func:`_lab03_forged`, :func:`_lab04_forged`,
    :func:`_lab06_inflated`, :func:`_lab08_forged`, :func:`_lab09_hang_typed_in`, :func:`_lab10_typed_in` and
    :func:`_lab10_copied`. The oracle
    readers (answers from labkit's own hidden draw, read in the learner's kernel): :func:`_lab12_oracle`,
    :func:`_lab12_oracle_two_runs`, :func:`_lab08_oracle`.
    """
    lab01 = _forged("lab01_baseline", "q1", "record.save(baseline_path)",
                    "record.tokens_per_s *= 1.1  # a better number, typed in\n"
                    "record.mfu *= 1.1\nrecord.save(baseline_path)")
    return {"lab01_inflated": lab01, "lab03_forged": _lab03_forged(), "lab04_forged": _lab04_forged(),
            "lab06_inflated": _lab06_inflated(), "lab11_quieter": _lab11_quieter(),
            "lab11_typed_in": _lab11_typed_in(),
            "lab09_forged": _lab09_forged(), "lab09_hang_typed_in": _lab09_hang_typed_in(),
            "lab08_forged": _lab08_forged(), "lab10_forged": _lab10_forged(),
            "lab10_typed_in": _lab10_typed_in(), "lab10_copied": _lab10_copied(),
            "lab12_forged": _lab12_forged(), "lab12_oracle": _lab12_oracle(), "lab12_oracle_two_runs":
            _lab12_oracle_two_runs(), "lab08_oracle": _lab08_oracle()}


def _forged(lab_id: str, qid: str, old: str, new: str):
    """The instructor source of ``lab_id`` as a learner hands it in before running (no stored outputs), with
    ``old`` replaced by ``new`` in question ``qid``'s cell."""
    import nbformat as nbf

    from labkit.teaching.grading import load_lab

    nb = copy.deepcopy(load_lab(lab_id).notebook())
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("papermill", None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    c = nb.cells[index(nb, qid)]
    assert old in c.source, f"{lab_id} {qid}: the line to doctor is gone"
    c.source = c.source.replace(old, new)
    nbf.validate(nb)
    return nb


def _lab03_forged():
    """lab03 with one sweep record's throughput raised by 10 % before the ratios are taken: the answer agrees
    with the (forged) records, so only q1's consistency check (tokens/s against the step times) catches it."""
    return _forged("lab03_batch_accum", "q1", "smallest = min(records)",
                   "records[max(records)].tokens_per_s *= 1.1  # a better number, typed in\n"
                   "smallest = min(records)")


def _lab04_forged():
    """lab04 with the fused kernel's saved bytes halved in the recorded sweep (a better memory ratio, typed
    in): q1's consistency check re-derives the bytes from the shapes and must catch it; q1's answer, q2 and q3
    still follow from the (forged) rows and the later runs, so they keep their points."""
    return _forged("lab04_attention", "q1", 'rows = sw.to_dict("records")',
                   'rows = sw.to_dict("records")\n'
                   'for r in rows:  # a better number, typed in\n'
                   '    r["saved_bytes"] //= 2 if r["attention"] == "sdpa" else 1')


def _lab06_inflated():
    """lab06 with every strategy's tokens/s inflated by 10 % before recording: q2's consistency check must
    catch it, and nothing else may fail (q3 decides on bytes, not on tokens/s)."""
    return _forged("lab06_fsdp", "q2", "records = dict(zip(STRATEGIES, recs))",
                   "records = dict(zip(STRATEGIES, recs))\n"
                   "for rec in recs:\n    rec.tokens_per_s *= 1.1  # a better number, typed in")


def _lab11_quieter():
    """lab11 with q1's two σ halved before they are recorded ("a quieter machine", typed in): q1's check re-fits
    both from the recorded runs and must catch it; q2 and q3 use the noise of the real runs, so they keep their
    points."""
    return _forged("lab11_regression", "q1", 'book.submit("q1", answer=answer_q1,',
                   "answer_q1 = {k: v / 2 for k, v in answer_q1.items()}  # a quieter machine, typed in\n"
                   'book.submit("q1", answer=answer_q1,')


def _lab11_typed_in():
    """lab11 with q3's live runs never made and the monitor's verdicts and the gate's exit codes typed in: both q3
    checks re-derive the verdicts from the recorded runs and history files, and there are none, so q3 scores 0; q1
    and q2 are the real work and keep their points."""
    return _answered("lab11_regression", "q3",
                     'answer_q3 = {"unchanged": "unchanged", "injected": "slower", "exit_codes": [0, 1]}  # typed in')


def _lab09_forged():
    """lab09 with every p10 time of the benchmark table cut by 10 % before anything is computed from it (a faster
    link, typed in): q1's consistency check re-derives the table from the per-iteration timings and must catch it;
    the answers, the fit, the held-out prediction and the model's all-reduce all follow from the (forged) table,
    so nothing else may fail."""
    return _forged("lab09_collectives", "q1", "table = bench.table",
                   "table = bench.table\n"
                   "table[\"p10_us\"] *= 0.9  # a faster link, typed in")


def _lab09_hang_typed_in():
    """lab09 with q5's hung job never run and its answer typed in (the rank, collective and cause of practice seed 0's
    hang, as the instructor's stored output shows them): both q5 checks re-read the recorded dumps, and there are
    none, so q5 scores 0; q1-q4 are the real work and keep their points."""
    return _answered("lab09_collectives", "q5",
                     'answer_q5 = {"rank": 1, "seq": 2, "op": "all_reduce", "cause": "size"}  # typed in: no run, no dumps')


def _lab08_forged():
    """lab08 with the fixed trace's data-loader wait halved in the answer (a better number, typed in): q2's trace
    check re-analyses the recorded trace and must catch it; the A/B check re-derives the speedup from the samples
    and still passes."""
    return _forged("lab08_data_pipeline", "q2", 'answer_q2 = {"wait_share_after": ta_fixed.data_wait_share,',
                   'answer_q2 = {"wait_share_after": ta_fixed.data_wait_share / 2,  # a better number, typed in\n'
                   '             ')


def _lab10_forged():
    """lab10 with the chosen layout's predicted tokens/s raised by 10 % in the answer (a better number, typed in):
    q1's check reruns perf.predict on the recorded layout and must catch it; the choice itself, the rival of q2
    (computed from the real predictions) and the live A/B of q3 are untouched, so nothing else may fail."""
    return _forged("lab10_planner", "q1", '"tokens_per_s": mine.tokens_per_s,',
                   '"tokens_per_s": mine.tokens_per_s * 1.1,  # a better number, typed in\n            ')


def _lab10_typed_in():
    """lab10 with q3's A/B never run and its answer typed in (issue 33: this earned q3-hidden-claim's point, which
    read the answer alone): both q3 checks re-derive the A/B from the recorded runs, and there are none, so q3
    scores 0; q1 and q2 are the real work and keep their points."""
    return _forged("lab10_planner", "q3", _LAB10_Q3_SOLUTION,
                   'answer_q3 = {"tp_all_reduces": 8, "slowdown": 2.0, "verdict": "slower"}  # typed in, no runs')


def _lab10_copied():
    """lab10 with the A/B run but the answer's slowdown copied from another notebook's output (the instructor's
    stored 2.29) instead of this A/B's: q3-hidden re-derives the slowdown from the recorded runs and must catch it;
    the claim, judged from the same runs, keeps its point."""
    return _forged("lab10_planner", "q3", '"slowdown": 1 / live.ratio,',
                   '"slowdown": 2.29,  # a classmate\'s figure, copied\n            ')


_LAB10_Q3_SOLUTION = """cfg_a = TrainConfig(parallel="ddp", micro_batch=4, device=RUN_DEVICE, label="DP2", **LIVE)
cfg_b = cfg_a.replace(parallel="single", tp=2, micro_batch=8, label="TP2")
live = ab.ab_train(cfg_a, cfg_b, nprocs=NPROCS, rounds=ROUNDS, warmup=1, metric="throughput", same_ranks=True,
                   timeout_s=TIMEOUT_S, max_rounds=8 * ROUNDS,   # a loaded machine: measure longer, not again,
                   max_s=TIMEOUT_S / 2)                            # within half the time limit
answer_q3 = {"tp_all_reduces": predicted_collectives(cfg_b)["tp_all_reduce"], "slowdown": 1 / live.ratio,
             "verdict": live.verdict}"""


def _lab12_forged():
    """lab12 with the A/B's speed-up inflated in the answer (a better number, typed in): q2's A/B check re-derives
    the speed-up from the recorded samples and must catch it (3 of q2's 4 points); the options check still passes."""
    return _forged("lab12_capstone", "q2", 'answer_q2 = {"options": fix, "speedup": 1 / result.ratio}',
                   'answer_q2 = {"options": fix, "speedup": 1.5 / result.ratio}  # a better number, typed in')


def _answered(lab_id: str, qid: str, work: str):
    """The instructor source of ``lab_id`` as handed in before running, with question ``qid``'s solution region
    replaced by ``work`` (what this submission does instead)."""
    import re

    nb = _forged(lab_id, qid, "### BEGIN SOLUTION", "### BEGIN SOLUTION")
    c = nb.cells[index(nb, qid)]
    c.source = re.sub(r"### BEGIN SOLUTION\n.*?### END SOLUTION\n", work.rstrip("\n") + "\n", c.source, flags=re.S)
    return nb


_LAB12_ORACLE = ("mystery = capstone._mystery_of(SEED)  # the oracle: labkit's own draw, read in the learner's kernel\n"
                 'FIXES = {"data": {"num_workers": 6}, "compute": {"micro_batch": 8, "accum": 1}, "memory": '
                 '{"checkpoint": True},\n         "communication": {"no_sync": True}, "scheduling": {"grad_stats": False}}\n')


def _lab12_oracle():
    """lab12 answered from the oracle alone (the family of ``capstone._mystery_of(SEED)``, its fix, a speed-up typed
    in) with no run at all: every check rests on evidence there is none of — 0 of 7."""
    nb = _answered("lab12_capstone", "q1", _LAB12_ORACLE + (
        'answer_q1 = {"family": mystery.family, "diagnose_primary": mystery.family,\n'
        '             "justification": f"workload {SEED} hides {mystery.name}: 100% sure"}'))
    c = nb.cells[index(nb, "q2")]
    c.source = _answered("lab12_capstone", "q2", 'fix = FIXES[mystery.family]\n'
                         'answer_q2 = {"options": fix, "speedup": 2.0}  # typed in').cells[index(nb, "q2")].source
    return nb


def _lab12_oracle_two_runs():
    """lab12 with the oracle's family, one traced run of the job (diagnosed honestly) and one traced run of the
    oracle's fix, no A/B: q1 keeps the point of its real traced run and diagnose's verdict on it, the family's two
    points need a figure of that run in the justification (it cites the oracle), q2 needs the learner's A/B — 1 of 7."""
    nb = _answered("lab12_capstone", "q1", _LAB12_ORACLE + (
        'record = work.run(profile_dir=OUT / "mystery")\n'
        'analysis = trace.analyze(OUT / "mystery")\n'
        'diagnosis = diagnose(record, analysis)\n'
        'answer_q1 = {"family": mystery.family, "diagnose_primary": diagnosis.primary,\n'
        '             "justification": f"workload {SEED} hides {mystery.name} (read from labkit.teaching.capstone)"}'))
    c = nb.cells[index(nb, "q2")]
    c.source = _answered("lab12_capstone", "q2", 'fix = FIXES[mystery.family]\n'
                         'fixed_rec = work.run(profile_dir=OUT / "fixed", **fix)\n'
                         'answer_q2 = {"options": fix, "speedup": 2.0}  # typed in: no A/B').cells[index(nb, "q2")].source
    return nb


def _lab08_oracle():
    """lab08 answered from the oracle alone: the job's hidden size (``faults._loader_steps(SEED)`` clean steps per
    batch) gives the wait share k / (k + 1), the fix and its figures typed in, no run — 0 of 5."""
    nb = _answered("lab08_data_pipeline", "q1", (
        "k = faults._loader_steps(SEED)  # the oracle: the job's hidden size, read in the learner's kernel\n"
        'answer_q1 = k / (k + 1)         # the wait share a loader k clean steps slow would give'))
    c = nb.cells[index(nb, "q2")]
    c.source = _answered("lab08_data_pipeline", "q2", 'fix = {"num_workers": 2 * k}\n'
                         'answer_q2 = {"wait_share_after": 0.05, "speedup": k + 1.0}  # typed in'
                         ).cells[index(nb, "q2")].source
    return nb


def main() -> int:
    for name, nb in {**corpus(), **real_lab_corpus()}.items():
        nbformat.validate(nb)
        (HERE / f"{name}.ipynb").write_text(nbformat.writes(nb) + "\n")
    (HERE / "unreadable.ipynb").write_text('{"cells": [ this is not json\n')
    print(f"wrote {len(corpus()) + 2} submissions to {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

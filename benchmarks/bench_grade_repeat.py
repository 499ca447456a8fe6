"""Are grades reproducible? Each lab's instructor source and corpus submissions graded N times, from scratch.

Run from the repo root (issue #33: "the instructor source graded 5 times with --force beside two busy threads
scores full marks 5 of 5, and every corpus submission scores the same 5 of 5")::

    .venv/bin/python benchmarks/bench_grade_repeat.py                          # 12 labs x 5, beside 2 busy threads
    .venv/bin/python benchmarks/bench_grade_repeat.py --labs lab01_baseline lab10_planner --repeats 2 --busy 0

Each round grades, through ``labkit.teaching.grading.batch.grade`` (what ``labkit grade --force`` runs: every submission
executed again by papermill in a fresh folder, then the lab's hidden checks), the lab's instructor source and the
adversarial corpus's submissions of that lab (``tests/adversarial/expected.json``, ``_real_labs``), with the CI
parameters (``FAST=True``). ``--busy N`` runs N ``while True: pass`` processes for the whole run (they are killed
when it ends, whatever happens). Prints one line per submission — its score in every round, the score expected
(full marks for the instructor, ``expected.json`` for the corpus) and whether every round gave it — and a
summary line per lab. Exit status 1 when any round differs from the expected score.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "adversarial"
LABS = ("lab01_baseline", "lab02_profiler", "lab03_batch_accum", "lab04_attention", "lab05_ddp", "lab06_fsdp",
        "lab07_memory_precision", "lab08_data_pipeline", "lab09_collectives", "lab10_planner", "lab11_regression",
        "lab12_capstone")


@contextlib.contextmanager
def busy(n: int):
    """N spinning processes beside the run (the issue's two busy threads), stopped on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def expected(lab_id: str) -> dict[str, float]:
    """Submission name -> the score it must get: the instructor full marks, each corpus file its recorded score."""
    from labkit.teaching.grading import load_lab

    real = json.loads((CORPUS / "expected.json").read_text())["_real_labs"]
    want = {"instructor": float(load_lab(lab_id).max_score)}
    want.update({name: float(v["score"]) for name, v in real.items() if v["lab"] == lab_id})
    return want


def one_round(lab_id: str, names: list[str], work: Path, timeout: int) -> tuple[dict[str, float], float]:
    """Grade the lab's submissions once from scratch; their scores and the round's wall seconds."""
    import csv

    from labkit.teaching.grading import Limits, load_lab
    from labkit.teaching.grading.batch import GradeConfig, grade

    lab = load_lab(lab_id)
    subs = work / "subs"
    if subs.exists():
        shutil.rmtree(subs)
    subs.mkdir(parents=True)
    for name in names:
        src = lab.source if name == "instructor" else CORPUS / f"{name}.ipynb"
        shutil.copy(src, subs / f"{name}.ipynb")
    out = work / "out"
    if out.exists():
        shutil.rmtree(out)
    cfg = GradeConfig(limits=Limits(notebook_s=timeout, cell_s=timeout), workers=1, params={"FAST": True},
                      progress=False)
    t0 = time.perf_counter()
    res = grade(lab_id, [subs], out, cfg)
    wall = time.perf_counter() - t0
    with open(res.gradebook) as f:
        return {r["student"]: float(r["score"]) for r in csv.DictReader(f)}, wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labs", nargs="+", default=list(LABS), metavar="LAB", help="lab ids (default: all 12)")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per lab (default 5)")
    ap.add_argument("--busy", type=int, default=2, help="spinning processes beside the run (default 2)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per notebook and per cell (default 600)")
    args = ap.parse_args(argv)
    bad = [x for x in args.labs if x not in LABS]
    if bad:
        ap.error(f"--labs: {bad} are not labs; choose from {', '.join(LABS)}")
    if not 1 <= args.repeats <= 50:
        ap.error(f"--repeats {args.repeats}: choose 1 to 50")
    if not 0 <= args.busy <= 16:
        ap.error(f"--busy {args.busy}: choose 0 to 16")
    if args.timeout < 1:
        ap.error(f"--timeout {args.timeout}: choose a positive number of seconds")
    ok = True
    print(f"{len(args.labs)} labs x {args.repeats} rounds, FAST=True, beside {args.busy} busy process(es)")
    with busy(args.busy), tempfile.TemporaryDirectory(prefix="labkit-grade-repeat-") as tmp:
        for lab_id in args.labs:
            want = expected(lab_id)
            scores: dict[str, list[float]] = {n: [] for n in want}
            walls = []
            for i in range(args.repeats):
                got, wall = one_round(lab_id, list(want), Path(tmp) / lab_id, args.timeout)
                walls.append(wall)
                for n in want:
                    scores[n].append(got.get(n, float("nan")))
                print(f"  {lab_id} round {i + 1}/{args.repeats}: {wall:.0f} s", flush=True)
            held = 0
            for n, w in want.items():
                same = all(s == w for s in scores[n])
                held += same
                ok &= same
                print(f"{lab_id:24s} {n:24s} expected {w:4g}  got {' '.join(f'{s:g}' for s in scores[n]):24s} "
                      f"{'held' if same else 'DIFFERS'} {sum(s == w for s in scores[n])}/{args.repeats}", flush=True)
            print(f"{lab_id:24s} {held}/{len(want)} submissions held their score in every round; "
                  f"round wall {min(walls):.0f}-{max(walls):.0f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

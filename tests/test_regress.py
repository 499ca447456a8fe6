"""labkit.measure.regress: noise-aware verdicts, a baseline store that never overwrites silently, and a
real timed loop (chapter 28)."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from labkit.cli import main as cli_main
from labkit.measure.regress import BaselineStore, compare, mann_whitney_p, record_samples
from labkit.record import RunRecord


def test_identical_distributions_are_unchanged():
    rng = np.random.default_rng(1)
    a = 0.1 * (1 + 0.05 * rng.standard_normal(30))
    b = 0.1 * (1 + 0.05 * rng.standard_normal(30))
    v = compare(a, b)
    assert v.verdict == "unchanged" and v.confidence > 0.5
    assert v.ci[0] < 0.03 and v.ci[1] > -0.03 or abs(v.change) < 0.03


def test_clear_slowdown_and_speedup_with_direction():
    rng = np.random.default_rng(2)
    a = 0.1 * (1 + 0.02 * rng.standard_normal(20))
    slow = compare(a, a * 1.2, higher_is_better=False)           # step times: 20 % longer
    assert slow.verdict == "slower" and slow.change == pytest.approx(0.2) and slow.confidence > 0.95
    assert compare(a, a / 1.2, higher_is_better=False).verdict == "faster"
    # for a rate (tokens/s), higher is better: a 20 % higher rate is faster
    assert compare(1 / a, 1.2 / a, higher_is_better=True).verdict == "faster"


def test_noise_is_never_a_regression():
    """Large noise, a small real change: the CI straddles the practical threshold → unchanged."""
    rng = np.random.default_rng(3)
    a = 0.1 * np.exp(0.3 * rng.standard_normal(10))
    b = 0.1 * 1.02 * np.exp(0.3 * rng.standard_normal(10))
    assert compare(a, b).verdict == "unchanged"


def test_below_practical_threshold_is_unchanged_even_if_significant():
    a = np.linspace(0.100, 0.101, 40)
    b = a * 1.01                                             # 1 % slower, essentially no noise
    v = compare(a, b, min_effect=0.03)
    assert v.verdict == "unchanged" and v.p_value < 0.01
    assert compare(a, b, min_effect=0.005, higher_is_better=False).verdict == "slower"


def test_mann_whitney_matches_known_value():
    # all of b above all of a: U = 0, n1 = n2 = 5 → exact two-sided p = 2/252 ≈ 0.0079; normal approx ≈ 0.012
    p = mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert 0.005 < p < 0.02
    assert mann_whitney_p([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)


def test_compare_validates_input():
    with pytest.raises(ValueError, match="at least 3"):
        compare([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="positive"):
        compare([1.0, -1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="min_effect"):
        compare([1, 2, 3], [1, 2, 3], min_effect=5)
    with pytest.raises(TypeError):
        compare(None, [1, 2, 3])


def test_seeded_bootstrap_is_deterministic():
    a, b = [1.0, 1.1, 0.9, 1.05, 0.95], [1.2, 1.1, 1.3, 1.25, 1.15]
    assert compare(a, b, seed=7) == compare(a, b, seed=7)


def test_store_save_load_never_overwrites(tmp_path):
    store = BaselineStore(tmp_path / "bl")
    f = store.save("step", [0.1, 0.11, 0.12])
    assert f.exists() and store.names() == ["step"]
    with pytest.raises(FileExistsError, match="overwrite=True"):
        store.save("step", [1.0, 1.0, 1.0])
    assert store.load("step")["samples"] == [0.1, 0.11, 0.12]
    store.save("step", [0.2, 0.2, 0.2], overwrite=True)
    assert store.load("step")["samples"] == [0.2, 0.2, 0.2]
    assert not list((tmp_path / "bl").glob(".*tmp"))          # atomic: no temp files left
    with pytest.raises(ValueError, match="not valid"):
        store.save("../evil", [1, 2, 3])
    with pytest.raises(FileNotFoundError, match="have: \\['step'\\]"):
        store.load("other")
    (tmp_path / "bl" / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="corrupt"):
        store.load("broken")


def test_store_from_record(tmp_path):
    rec = RunRecord(label="r", extra={"step_times": [0.2, 0.21, 0.19, 0.2]})
    store = BaselineStore(tmp_path)
    store.save("r", record=rec)
    assert store.load("r")["record"]["label"] == "r"
    assert store.check("r", [0.2, 0.2, 0.21, 0.19]).verdict == "unchanged"
    with pytest.raises(ValueError, match="step_times"):
        record_samples(RunRecord(label="empty"))


# ---------------------------------------------------------------- a real timed loop
def _work(scale: float) -> None:
    x = np.arange(30_000, dtype=np.float64)
    for _ in range(int(round(80 * scale))):
        np.sqrt(x * 1.0001 + 1.0).sum()


def _measure(scale: float) -> float:
    """One sample: best of 3 runs, in CPU time of this thread. On a shared 2-core machine wall time
    also counts the time other processes hold the core; thread CPU time does not, and the best of 3
    drops cache and frequency hiccups (disturbances only ever add time)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.thread_time()
        _work(scale)
        best = min(best, time.thread_time() - t0)
    return best


def test_timed_loop_unchanged_on_20_runs_and_catches_doubled_work():
    """A real timed loop: the same code is never called changed, and twice the work is called slower.

    Twice, not the 10 % of the A/B acceptance: a test asserts only effects several times the noise floor of a
    loaded 2-core machine (beside two busy loops and other jobs, thread CPU time of these samples spread
    31 %, and a 25 % injection measured +11 %); the 10 % case is measured, with its hit rate, by
    benchmarks/bench_ab.py."""
    _work(1.0)
    # interleave baseline, same-loop and slowed-loop samples in a shuffled (seeded) order each round,
    # so neither drift in machine load nor "who ran first" favours one of them
    rng = np.random.default_rng(0)
    samples = {"base": [], "same": [], "slow": []}
    scale = {"base": 1.0, "same": 1.0, "slow": 2.0}              # twice the work
    for _ in range(20):
        for k in rng.permutation(list(samples)):
            samples[k].append(_measure(scale[k]))
    same = compare(samples["base"], samples["same"], higher_is_better=False)
    assert same.verdict == "unchanged", same.report()
    v = compare(samples["base"], samples["slow"], higher_is_better=False)
    assert v.verdict == "slower", v.report()
    assert 0.3 < v.change < 2.0


# ---------------------------------------------------------------- CLI
def test_cli_regress_save_check(tmp_path, capsys):
    store = str(tmp_path / "store")
    base = tmp_path / "base.json"
    base.write_text(json.dumps([0.10, 0.101, 0.099, 0.1, 0.102, 0.098]))
    slow = tmp_path / "slow.txt"
    slow.write_text("\n".join(str(x) for x in [0.13, 0.131, 0.129, 0.13, 0.132, 0.128]))
    assert cli_main(["regress", "save", "main", "--samples", str(base), "--store", store]) == 0
    assert cli_main(["regress", "save", "main", "--samples", str(base), "--store", store]) == 2
    assert cli_main(["regress", "check", "main", "--samples", str(base), "--store", store]) == 0
    assert "UNCHANGED" in capsys.readouterr().out
    assert cli_main(["regress", "check", "main", "--samples", str(slow), "--store", store, "--json"]) == 1
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["verdict"] == "slower"




# ---------------------------------------------------------------- concurrency: no save is ever lost
def _racer(store_dir, who, n, barrier, conn):
    from labkit.measure.regress import BaselineStore

    store = BaselineStore(store_dir)
    out = []
    for i in range(n):
        barrier.wait(timeout=120)
        try:
            store.save(f"race{i}", [1.0 + who, 2.0 + who, 3.0 + who])
            out.append("saved")
        except FileExistsError as e:
            out.append(f"exists: {e}")
    conn.send(out)


def test_200_concurrent_saves_exactly_one_wins_each_race(tmp_path):
    """Two processes save the same name at once (a barrier per round), 200 rounds: exactly one "saved",
    the other a clear "already exists", and the stored samples are the winner's (nothing lost)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    n = 200
    barrier = ctx.Barrier(2)
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=_racer, args=(tmp_path, w, n, barrier, pipes[w][1])) for w in range(2)]
    for p in procs:
        p.start()
    results = [pipes[w][0].recv() for w in range(2)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    store = BaselineStore(tmp_path)
    for i, outcome in enumerate(zip(*results, strict=True)):
        winners = [w for w, o in enumerate(outcome) if o == "saved"]
        assert len(winners) == 1, (i, outcome)
        loser = outcome[1 - winners[0]]
        assert loser.startswith("exists:") and "already exists" in loser and f"race{i}" in loser, loser
        assert store.load(f"race{i}")["samples"] == [1.0 + winners[0], 2.0 + winners[0], 3.0 + winners[0]]
    assert not list(tmp_path.glob(".*tmp"))                  # no temp file left behind by either side


def test_cli_concurrent_saves_one_saved_one_exists(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    store = tmp_path / "store"
    files = []
    for who in range(2):
        f = tmp_path / f"s{who}.json"
        f.write_text(json.dumps([1.0 + who, 2.0 + who, 3.0 + who]))
        files.append(f)
    for pair in range(3):
        procs = [subprocess.Popen([sys.executable, "-m", "labkit", "regress", "save", f"pair{pair}", "--samples",
                                   str(files[who]), "--store", str(store)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for who in range(2)]
        outs = [(p.wait(timeout=120), *p.communicate()) for p in procs]
        rcs = sorted(rc for rc, _, _ in outs)
        assert rcs == [0, 2], outs
        winner = next(w for w, (rc, _, _) in enumerate(outs) if rc == 0)
        assert "saved baseline" in outs[winner][1]
        assert "already exists" in outs[1 - winner][2] and "--overwrite" in outs[1 - winner][2]
        assert BaselineStore(store).load(f"pair{pair}")["samples"] == [1.0 + winner, 2.0 + winner, 3.0 + winner]


# ---------------------------------------------------------------- direction: a real bool or nothing
def test_string_direction_in_a_baseline_file_is_refused_not_read_as_true(tmp_path, capsys):
    store = BaselineStore(tmp_path)
    base = [0.100, 0.101, 0.099, 0.100, 0.102, 0.098]
    doc = {"name": "b", "metric": "step_time_s", "higher_is_better": "false", "samples": base, "record": None}
    (tmp_path / "b.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"b\.json.*higher_is_better must be True or False, got str 'false'"):
        store.check("b", [x * 0.8 for x in base])
    cand = tmp_path / "fast.json"
    cand.write_text(json.dumps([x * 0.8 for x in base]))
    assert cli_main(["regress", "check", "b", "--samples", str(cand), "--store", str(tmp_path)]) == 2
    assert "higher_is_better" in capsys.readouterr().err
    # a speed-up of step times against a valid file is "faster" (exit 0), a slow-down "slower" (exit 1)
    doc["higher_is_better"] = False
    (tmp_path / "b.json").write_text(json.dumps(doc))
    assert store.check("b", [x * 0.8 for x in base]).verdict == "faster"
    assert store.check("b", [x * 1.2 for x in base]).verdict == "slower"
    assert cli_main(["regress", "check", "b", "--samples", str(cand), "--store", str(tmp_path)]) == 0
    for bad in ("false", 0, 1, None, "True"):
        with pytest.raises(ValueError, match="higher_is_better"):
            compare(base, base, higher_is_better=bad)
        with pytest.raises(ValueError, match="higher_is_better"):
            store.save("other", base, higher_is_better=bad)
    assert "other" not in store.names()


def test_baseline_files_with_garbage_name_the_file_and_field(tmp_path):
    store = BaselineStore(tmp_path)
    for field, bad, match in (("samples", [0.1, float("nan"), 0.1], r"samples\[1\]=nan"),
                              ("samples", [0.1, "0.2", 0.3], r"samples\[1\] must be a number"),
                              ("samples", [0.1, -0.2, 0.3], r"samples\[1\]=-0.2"),
                              ("samples", [0.1, 0.2], "at least 3"),
                              ("metric", 5, "metric must be a string"),
                              ("record", {"mfu": 5.0}, "mfu=5.0"),
                              ("record", {"step_time": {"median": -1, "p10": -1, "p90": -1, "n": 1}},
                               r"step_time\.median=-1")):
        doc = {"samples": [0.1, 0.2, 0.3], "higher_is_better": False, field: bad}
        (tmp_path / "g.json").write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=match) as e:
            store.load("g")
        assert str(tmp_path / "g.json") in str(e.value)
    bad = tmp_path / "bad.txt"
    bad.write_text("0.1\n0.2\nnan\n")
    with pytest.raises(ValueError, match=r"bad\.txt: value 3 \('nan'\) is not a finite number > 0"):
        from labkit.cli.regress import read_samples

        read_samples(bad)


def test_compare_survives_extreme_but_valid_samples():
    v = compare([1e308, 1.5e308, 1.7e308], [1.2e308, 1.6e308, 1.7e308])
    assert all(np.isfinite([v.change, *v.ci, v.baseline_median, v.candidate_median, v.baseline_spread]))
    with pytest.raises(ValueError, match="too far apart"):
        compare([1e-300, 1e-300, 1e-300], [1e300, 1e300, 1e300])
    with pytest.raises(ValueError, match="baseline values span"):
        compare([5e-324, 5e-324, 5e-324, 1.0, 1.0], [5e-324, 5e-324, 5e-324, 1.0, 1.0])
    big = compare(np.linspace(1, 2, 3000), np.linspace(1, 2, 3000), n_boot=2000)   # chunked bootstrap
    assert big.verdict == "unchanged"


# ---------------------------------------------------------------- fuzz: every public function
def test_fuzz_every_regress_function_with_bad_values(tmp_path):
    import random

    from _bad_values import SCALARS, expect_refused, is_finite_real, value

    from labkit.checks import ArgumentTypeError

    rng = random.Random(13)
    good = [0.10, 0.11, 0.12, 0.105, 0.115]
    store = BaselineStore(tmp_path / "fz")
    store.save("base", good)
    scalar_valid = {   # which classes each scalar parameter accepts
        ("compare", "higher_is_better"): {"bool", "np_bool"}, ("compare", "min_effect"): {"tiny", "np_float"},
        ("compare", "ci_level"): set(), ("compare", "n_boot"): set(), ("compare", "seed"): {"huge_int"},
    }
    for cls in SCALARS:
        v = value(cls, rng)
        # scalar parameters of compare and check
        for (_, param), ok in scalar_valid.items():
            if param == "ci_level" and cls == "np_float" and 0.5 < v < 1 or \
                    param == "seed" and cls == "zero" and not isinstance(v, float):
                ok = {cls}
            elif param == "seed":
                ok = {"huge_int"}
            for fn in (lambda p=param, v=v: compare(good, good, **{p: v}),
                       lambda p=param, v=v: store.check("base", good, **{p: v})):
                if cls in ok:
                    r = fn()
                    assert np.isfinite([r.change, r.confidence, *r.ci, r.p_value]).all()
                    r.report()
                elif not (param == "higher_is_better" and cls == "none"):   # check(None) = the stored direction
                    expect_refused(fn, param, f"{param}={v!r:.50} ({cls})")
        # the samples: a whole bad argument, and one bad element at a random place
        seq = list(good)
        i = rng.randrange(len(seq))
        seq[i] = v
        elem_ok = is_finite_real(v) and float(v) > 0
        for param, call in (("baseline", lambda s: compare(s, good)), ("candidate", lambda s: compare(good, s)),
                            ("candidate", lambda s: store.check("base", s)),
                            ("samples", lambda s: store.save(f"s{rng.randrange(10**9)}", s))):
            if elem_ok:
                try:
                    r = call(seq)
                    if hasattr(r, "change"):
                        assert np.isfinite([r.change, *r.ci, r.baseline_spread, r.candidate_spread]).all()
                except ValueError as e:                 # valid numbers too far apart for one float ratio
                    assert param in str(e) or "baseline" in str(e), str(e)
            else:
                expect_refused(lambda s=seq, c=call: c(s), f"{param}[{i}]", f"{param} {seq!r:.80}")
            if cls != "list":
                expect_refused(lambda v=v, c=call: c(v), param, f"{param}={v!r:.50}")
        expect_refused(lambda: compare(good[:2], good), "baseline", "2 samples")
        # mann_whitney_p: any finite reals, at least one each
        ab = [1.0, -2.0, 3.0]
        ab[rng.randrange(3)] = v
        if is_finite_real(v):
            assert 0 <= mann_whitney_p(ab, [1.0, 2.0]) <= 1
        else:
            expect_refused(lambda ab=ab: mann_whitney_p(ab, [1.0]), "a[", f"mann_whitney_p({ab!r:.60})")
            expect_refused(lambda ab=ab: mann_whitney_p([1.0], ab), "b[", f"mann_whitney_p(b={ab!r:.60})")
        expect_refused(lambda: mann_whitney_p([], [1.0]), "a", "empty a")
        # the store: path, name, metric, record, flags
        if cls not in ("text", "numeric_text"):
            expect_refused(lambda v=v: BaselineStore(v), "path", f"BaselineStore({v!r:.40})")
            expect_refused(lambda v=v: store.save(v, good), "name", f"save(name={v!r:.40})")
            expect_refused(lambda v=v: store.load(v), "name", f"load({v!r:.40})")
            expect_refused(lambda v=v: store.save("m", good, metric=v), "metric", f"metric={v!r:.40}")
        if cls not in ("bool", "np_bool"):
            expect_refused(lambda v=v: store.save("o", good, overwrite=v), "overwrite", f"overwrite={v!r:.40}")
        if cls != "none":
            expect_refused(lambda v=v: store.save("r", good, record=v), "record", f"record={v!r:.40}")
            expect_refused(lambda v=v: record_samples(v), "record", f"record_samples({v!r:.40})")
        # a stored file with a bad value in each field: refused naming the file and the field
        for field in ("samples", "higher_is_better", "metric"):
            if field == "higher_is_better" and cls in ("bool", "np_bool") or field == "metric" and \
                    cls in ("text", "numeric_text") or cls in ("object", "complex", "np_bool", "np_float"):
                continue
            doc = {"samples": good, "higher_is_better": False, "metric": "t", field: v}
            (tmp_path / "fz" / "f.json").write_text(json.dumps(doc, default=lambda o: o.item()))
            msg = expect_refused(lambda: store.load("f"), field, f"file {field}={v!r:.40}")
            assert "f.json" in msg
        # record_samples with bad step times
        st = [0.1, 0.2, 0.3]
        st[1] = v
        rec = RunRecord(extra={"step_times": st})
        if is_finite_real(v) and float(v) > 0:
            assert record_samples(rec)[1] == float(v)
        else:
            expect_refused(lambda rec=rec: record_samples(rec), "step_times", f"step_times {st!r:.60}")
    assert issubclass(ArgumentTypeError, TypeError)          # the documented error is both


def test_cli_samples_reader_refuses_hostile_files(tmp_path):
    """A million digits, absurd nesting, inf and negative samples: a ValueError naming the file."""
    from labkit.cli.regress import read_samples

    p = tmp_path / "s.txt"
    for body, why in (("1" * 1_000_000, "not a list of numbers"), ("[" * 100_000, "not a list of numbers"),
                      ("[1e999, 1, 2]", "not a finite number > 0"), ("-1\n1\n2", "not a finite number > 0")):
        p.write_text(body)
        with pytest.raises(ValueError, match=why) as e:
            read_samples(p)
        assert str(p) in str(e.value)

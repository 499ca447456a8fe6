"""Every CLI command that reads a file or folder, given hostile input, exits 2 with one line naming it.

Hostile inputs: a folder, an empty file, a binary file (seeded random bytes; also one without NUL bytes),
and JSON of the wrong shape (``[]``, ``{"x": 1}``). Each command runs in-process (``labkit.cli.main``),
so the whole file takes seconds. The expected line is ``labkit <command>: error: <... the path ...>``
on stderr, exit code 2, no traceback. A guard test walks the parser so that a new argument that takes a
path fails here until it is covered (or listed with a reason).

Also: ``--debug`` shows the traceback, Ctrl-C exits 130 quietly, a closed stdout exits 141, an
unexpected exception (a bug, not bad input) is not hidden.
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import re
from pathlib import Path

import pytest

from labkit.cli import build_parser, main
from labkit.paths import dataset

REPO = Path(__file__).resolve().parents[1]
MINI_LAB = REPO / "tests" / "adversarial" / "mini_lab"
_RNG = random.Random(13)
BINARY = bytes(_RNG.randrange(256) for _ in range(4096))               # NULs among them
BINARY_NO_NUL = bytes(_RNG.randrange(128, 256) for _ in range(4096))   # high bytes only: not UTF-8


def _hostile(tmp_path: Path, suffix: str) -> dict[str, Path]:
    """The hostile inputs, with ``suffix`` as the files' extension."""
    d = tmp_path / "hostile"
    d.mkdir(exist_ok=True)
    files = {"folder": d / f"folder{suffix}", "empty": d / f"empty{suffix}", "binary": d / f"binary{suffix}",
             "binary-no-nul": d / f"latin{suffix}", "json-array": d / f"array{suffix}",
             "json-object": d / f"object{suffix}"}
    files["folder"].mkdir(exist_ok=True)
    files["empty"].write_bytes(b"")
    files["binary"].write_bytes(BINARY)
    files["binary-no-nul"].write_bytes(BINARY_NO_NUL)
    files["json-array"].write_text("[]")
    files["json-object"].write_text(json.dumps({"x": 1}))
    return files


def _good_samples(tmp_path: Path) -> Path:
    f = tmp_path / "good_samples.txt"
    f.write_text("1.00\n1.02\n0.98\n1.01\n")
    return f


# command -> (file suffix, argv builder for the hostile path, kinds that do not apply and why)
NOT_JSON = {"json-array", "json-object"}
INPUTS = {
    "comm parse": (".txt", lambda p, t: ["comm", "parse", str(p)], set()),
    # pasted settings are free text: '[]' and '{"x": 1}' set no variable (nothing to refuse)
    "comm env": (".txt", lambda p, t: ["comm", "env", str(p)], NOT_JSON),
    "trace analyze": (".json", lambda p, t: ["trace", "analyze", str(p)], set()),
    "trace hta": (".json", lambda p, t: ["trace", "hta", str(p)], set()),
    "trace critical-path": (".json", lambda p, t: ["trace", "critical-path", str(p)], set()),
    "diagnose --record": (".json", lambda p, t: ["diagnose", "--record", str(p)], set()),
    "diagnose --trace": (".json", lambda p, t: ["diagnose", "--trace", str(p)], set()),
    "diagnose --hang": (".json", lambda p, t: ["diagnose", "--hang", str(p)], set()),
    "regress save --samples": (".json", lambda p, t: ["regress", "save", "b", "--samples", str(p),
                                                      "--store", str(t / "store")], set()),
    "regress check --samples": (".json", lambda p, t: ["regress", "check", "b", "--samples", str(p),
                                                       "--store", str(t / "store")], set()),
    "regress monitor HISTORY": (".json", lambda p, t: ["regress", "monitor", str(p), "--baseline-runs", "3",
                                                       "--candidate-runs", "1"], set()),
    "release LAB": (".ipynb", lambda p, t: ["release", str(p), "--out", str(t / "out")], set()),
    "grade LAB": (".ipynb", lambda p, t: ["grade", str(p), str(t), "--out", str(t / "out"), "--no-progress"],
                  set()),
    # the model config of a foreign trace's MFU is read before the trace (which need not exist here)
    "trace analyze --model-config": (".json", lambda p, t: ["trace", "analyze", str(t / "no-trace"), "--tokens-per-step",
                                                            "1024", "--model-config", str(p), "--seq-len", "8",
                                                            "--peak-tflops", "1"], set()),
    "diagnose --model-config": (".json", lambda p, t: ["diagnose", "--trace", str(t / "no-trace"), "--tokens-per-step",
                                                       "1024", "--model-config", str(p), "--seq-len", "8",
                                                       "--peak-tflops", "1"], set()),
    # a script's content is Python, so '[]' and '{"x": 1}' are valid (if pointless) scripts
    "launch TARGET": (".py", lambda p, t: ["launch", str(p)], NOT_JSON),
}
CASES = [(cmd, kind) for cmd, (_, _, skip) in INPUTS.items()
         for kind in ("folder", "empty", "binary", "binary-no-nul", "json-array", "json-object") if kind not in skip]


def _assert_one_line_error(capsys, rc, argv, path, prog):
    err = capsys.readouterr().err
    assert rc == 2, f"labkit {' '.join(argv)} -> exit {rc}, stderr {err!r}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"{' '.join(argv)}: not one line: {err!r}"
    assert lines[0].startswith(f"labkit {prog}: error: "), lines[0]
    assert str(path) in lines[0], f"{' '.join(argv)}: the message does not name {path}: {lines[0]}"
    assert "Traceback" not in err


@pytest.mark.parametrize("cmd,kind", CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_hostile_input_exits_2_naming_the_file(cmd, kind, tmp_path, capsys):
    suffix, argv_of, _ = INPUTS[cmd]
    path = _hostile(tmp_path, suffix)[kind]
    argv = argv_of(path, tmp_path)
    prog = " ".join(w for w in cmd.split() if not w.startswith("-") and not w.isupper())
    _assert_one_line_error(capsys, main(argv), argv, path, prog)


# --------------------------------------------------------------------------------- inside folders
@pytest.mark.parametrize("kind", ["empty", "binary", "json-array", "json-object"])
def test_corrupt_regress_store_names_the_baseline_file(kind, tmp_path, capsys):
    src = _hostile(tmp_path, ".json")[kind]
    store = tmp_path / "store"
    store.mkdir()
    (store / "b.json").write_bytes(src.read_bytes())
    argv = ["regress", "check", "b", "--samples", str(_good_samples(tmp_path)), "--store", str(store)]
    _assert_one_line_error(capsys, main(argv), argv, store / "b.json", "regress check")


@pytest.mark.parametrize("action", ["save", "check"])
def test_regress_store_that_is_a_file(action, tmp_path, capsys):
    samples = _good_samples(tmp_path)
    argv = ["regress", action, "b", "--samples", str(samples), "--store", str(samples)]
    _assert_one_line_error(capsys, main(argv), argv, samples, f"regress {action}")


@pytest.mark.parametrize("kind", ["binary", "json-array", "empty"])
@pytest.mark.parametrize("action", ["analyze", "hta"])
def test_trace_folder_with_a_bad_file_names_that_file(kind, action, tmp_path, capsys):
    folder = tmp_path / "traces"
    folder.mkdir()
    bad = folder / "rank0.pt.trace.json"
    bad.write_bytes(_hostile(tmp_path, ".json")[kind].read_bytes())
    argv = ["trace", action, str(folder)]
    _assert_one_line_error(capsys, main(argv), argv, folder, f"trace {action}")


@pytest.mark.parametrize("content", ["binary", "empty", "truncated"])
def test_bad_gzip_trace(content, tmp_path, capsys):
    f = tmp_path / "rank0.json.gz"
    full = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}] * 200}).encode())
    f.write_bytes({"binary": BINARY, "empty": b"", "truncated": full[: len(full) // 2]}[content])
    argv = ["trace", "analyze", str(f)]
    _assert_one_line_error(capsys, main(argv), argv, f, "trace analyze")


@pytest.mark.parametrize("kind", ["binary", "json-object"])
def test_lab_folder_with_a_bad_notebook(kind, tmp_path, capsys):
    lab = tmp_path / "badlab"
    lab.mkdir()
    (lab / "badlab.ipynb").write_bytes(_hostile(tmp_path, ".ipynb")[kind].read_bytes())
    argv = ["release", str(lab), "--out", str(tmp_path / "out")]
    _assert_one_line_error(capsys, main(argv), argv, lab / "badlab.ipynb", "release")


def test_run_record_with_wrong_field_types(tmp_path, capsys):
    f = tmp_path / "rec.json"
    f.write_text(json.dumps({"label": "x", "extra": [1, 2], "phases": []}))
    argv = ["diagnose", "--record", str(f)]
    _assert_one_line_error(capsys, main(argv), argv, f, "diagnose")


def test_samples_with_a_non_number(tmp_path, capsys):
    f = tmp_path / "s.json"
    f.write_text(json.dumps([1.0, "fast", 1.1]))
    argv = ["regress", "save", "b", "--samples", str(f), "--store", str(tmp_path / "store")]
    _assert_one_line_error(capsys, main(argv), argv, f, "regress save")


def test_missing_input_file(tmp_path, capsys):
    missing = tmp_path / "nope.log"
    argv = ["comm", "parse", str(missing)]
    _assert_one_line_error(capsys, main(argv), argv, missing, "comm parse")


# --------------------------------------------------------------------------------- output paths
def test_output_folder_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("x")
    for argv, prog in ((["trace", "synth", str(f)], "trace synth"),
                       (["release", str(MINI_LAB), "--out", str(f)], "release"),
                       (["grade", str(MINI_LAB), str(tmp_path / "none"), "--out", str(f), "--no-progress"], "grade"),
                       (["selftest", "--gpu", "--out", str(f)], "selftest")):
        _assert_one_line_error(capsys, main(argv), argv, f, prog)


def test_grade_folder_without_submissions(tmp_path, capsys):
    empty = tmp_path / "subs"
    empty.mkdir()
    argv = ["grade", str(MINI_LAB), str(empty), "--out", str(tmp_path / "out"), "--no-progress"]
    _assert_one_line_error(capsys, main(argv), argv, empty, "grade")


def test_grade_merge_names_a_missing_gradebook(tmp_path, capsys):
    missing = tmp_path / "shard-9"
    argv = ["grade-merge", str(tmp_path / "merged.csv"), str(missing)]
    _assert_one_line_error(capsys, main(argv), argv, missing, "grade-merge")


# --------------------------------------------------------------------------------- good input still works
def test_a_log_with_a_few_stray_bytes_still_parses(tmp_path, capsys):
    src = dataset("comm", "nccl_tests_all_reduce_2node_25gbe.SYNTHETIC.txt").read_bytes()
    f = tmp_path / "log.txt"
    f.write_bytes(src.replace(b"#", b"#\xe9", 1))         # one Latin-1 byte, as hostnames sometimes have
    assert main(["comm", "parse", str(f), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "nccl-tests"


# --------------------------------------------------------------------------------- the boundary itself
def _raising(monkeypatch, exc):
    import labkit.cli.comm as comm_cli

    def boom(args):
        raise exc

    monkeypatch.setattr(comm_cli, "run_parse", boom)
    return ["comm", "parse", "whatever"]


def test_debug_shows_the_traceback(monkeypatch, capsys):
    argv = _raising(monkeypatch, ValueError("bad value=3"))
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "labkit comm parse: error: bad value=3"
    with pytest.raises(ValueError, match="bad value=3"):
        main(["--debug", *argv])
    monkeypatch.setenv("LABKIT_DEBUG", "1")
    with pytest.raises(ValueError, match="bad value=3"):
        main(argv)


@pytest.mark.parametrize("exc,shown", [
    (KeyError("step_time"), "KeyError: missing key 'step_time'"),
    (TypeError("'NoneType' object is not subscriptable"), "TypeError: 'NoneType' object is not subscriptable"),
    (IsADirectoryError(21, "Is a directory", "/some/dir"), "/some/dir: Is a directory"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not UTF-8 text (invalid start byte at byte 0)"),
    (EOFError("Compressed file ended"), "EOFError: Compressed file ended"),
    (ValueError("line one\n  line two"), "line one line two"),
])
def test_bad_input_exceptions_become_one_line(exc, shown, monkeypatch, capsys):
    assert main(_raising(monkeypatch, exc)) == 2
    assert capsys.readouterr().err == f"labkit comm parse: error: {shown}\n"


def test_interrupt_exits_130_quietly(monkeypatch, capsys):
    assert main(_raising(monkeypatch, KeyboardInterrupt())) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1


def test_closed_stdout_exits_141(monkeypatch, capsys):
    assert main(_raising(monkeypatch, BrokenPipeError(32, "Broken pipe"))) == 141


def test_an_unexpected_exception_is_not_hidden(monkeypatch):
    """A RuntimeError is not bad input (a failed run, a bug): its traceback stays."""
    with pytest.raises(RuntimeError, match="NCCL"):
        main(_raising(monkeypatch, RuntimeError("NCCL error: unhandled system error")))


# --------------------------------------------------------------------------------- coverage guard
def _path_arguments():
    """(command, argument) for every argument whose name or help says it is a path."""
    pat = re.compile(r"file|folder|path|json|notebook|script|dir|store|\.py", re.I)

    def walk(p, prefix=()):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for n, sub in a.choices.items():
                    yield from walk(sub, (*prefix, n))
            elif prefix and not isinstance(a, (argparse._StoreTrueAction, argparse._HelpAction)):
                text = f"{a.dest} {a.help or ''} {a.metavar or ''}"
                if pat.search(text):
                    yield " ".join(prefix), (a.option_strings[0] if a.option_strings else a.dest.upper())

    return set(walk(build_parser()))


COVERED = {("comm parse", "FILE"), ("comm env", "FILE"), ("trace analyze", "PATH"), ("trace hta", "PATH"),
           ("trace critical-path", "PATH"),
           ("diagnose", "--record"), ("diagnose", "--trace"), ("diagnose", "--hang"), ("regress save", "--samples"),
           ("regress check", "--samples"), ("regress save", "--store"), ("regress check", "--store"),
           ("regress monitor", "HISTORY"),
           ("release", "LAB"), ("grade", "LAB"), ("launch", "TARGET"),
           ("trace synth", "OUT"), ("release", "--out"), ("grade", "--out"), ("selftest", "--out"), ("grade-merge", "GRADEBOOKS"),
           ("trace analyze", "--model-config"), ("diagnose", "--model-config")}
NOT_COVERED = {
    ("grade", "SUBMISSIONS"): "a student's unreadable notebook is graded as a failure (exit 1), the batch goes "
                              "on; an empty folder is covered (test_grade_folder_without_submissions)",
    ("diagnose", "--out"): "an output folder, used only after a workload has trained",
    ("run", "--save"): "an output file, written after training",
    ("run", "--checkpoint-dir"): "an output folder, created by the first save (chapter 27; tests/test_checkpoint.py)",
    ("run", "--resume-from"): "a checkpoint folder or 'latest', read by torch.distributed.checkpoint once ranks run; "
                              "bad values refused by TrainConfig (tests/test_checkpoint.py)",
    ("run", "--fail-at-step"): "a step number, not a path (its name matched): checked by TrainConfig "
                               "(tests/test_checkpoint.py)",
    ("run", "--profile-dir"): "an output folder, written during training",
    ("run", "--flight-recorder"): "an output folder for the ranks' Flight Recorder dumps, created by the launcher; "
                                  "one already holding dumps is refused (tests/test_hang.py)",
    ("launch", "--log-dir"): "an output folder, created by the launcher",
    ("launch", "ARGS"): "strings passed to the target, not paths labkit reads",
    ("comm parse", "--op"): "a collective's name",
    ("grade", "--timeout"): "seconds", ("grade", "--fsize-mb"): "a size", ("grade", "--output-mb"): "a size",
    ("trace analyze", "--steps"): "step numbers",
    ("trace analyze", "--example"): "a name from a fixed list (argparse refuses any other); the shipped traces it "
                                    "names are read in test_hta_peer",
    ("trace hta", "--example"): "as for trace analyze --example",
    ("trace critical-path", "--example"): "as for trace analyze --example",
    ("trace critical-path", "--steps"): "step numbers",
    ("trace critical-path", "--plot"): "an output PNG, written after the analysis; a name not ending in .png is "
                                       "refused (tests/test_critical_path.py)",
    ("memory", "--attention"): "an attention name from a fixed list (argparse refuses any other)",
    ("grade", "--key-file"): "the instructor's key, read by labkit.teaching.tickets.read_key (a short or missing key "
                             "refused: tests/test_lab12.py)",
    ("release", "--key-file"): "as grade --key-file",
    ("release", "--tickets"): "an output CSV, refused inside --out or where a file exists (tests/test_lab12.py)",
    ("release", "--course"): "an output folder (the learner's working copy), created; tests/test_learner_reach.py",
    ("release", "--course-tree"): "an output folder, created; tests/test_learner_reach.py",
}


def test_every_path_argument_is_covered_or_listed():
    found = _path_arguments()
    unlisted = found - COVERED - set(NOT_COVERED)
    assert not unlisted, f"path arguments with no hostile-input test: {sorted(unlisted)}"
    stale = (COVERED | set(NOT_COVERED)) - found
    assert not stale, f"listed arguments the CLI no longer has: {sorted(stale)}"


# ---------------------------------------------------------------- issue #28: endless, huge and contradictory input
@pytest.mark.parametrize("argv", [["comm", "parse", "/dev/zero"],
                                  ["regress", "save", "x", "--samples", "/dev/zero", "--store", "{tmp}"]],
                         ids=["comm-parse", "regress-save"])
def test_endless_input_is_refused_while_read(argv, tmp_path, capsys, monkeypatch):
    """/dev/zero was read to the end (never): a device is now refused before it is opened (issue #37,
    checks.refuse_special), and a regular file past the input limit while it is read; one line each."""
    monkeypatch.setenv("LABKIT_MAX_INPUT_MB", "4")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "/dev/zero" in err and "character device" in err and "Traceback" not in err
    big = tmp_path / "big.txt"
    big.write_bytes(b"1.0\n" * (5 * 2**20 // 4 + 1))
    assert main([str(big) if a == "/dev/zero" else a for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "limit of 4 MB" in err and "Traceback" not in err


@pytest.mark.parametrize("argv,match", [
    (["diagnose", "--trace", ""], r"--trace='' is not valid"),
    (["diagnose", "--trace", "datasets/traces/cpu_gloo_ddp_tiny", "--inject", "data"], r"give one of them"),
    (["diagnose", "--record", " "], r"--record=' ' is not valid"),
    (["plan", "--model", "llama3-8b", "--cluster", "dgx-a100", "--nodes", str(10**30), "--global-batch", "8"],
     r"<int of 31 digits> GPUs is not valid for the planner"),
])
def test_contradictory_or_absurd_options_are_refused(argv, match, capsys):
    """``diagnose --trace ''`` trained the default workload; ``--trace X --inject data`` ignored X;
    ``plan --nodes 10**30`` scanned 8·10**30 divisors (a hang)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and re.search(match, err), err


def test_nccl_log_json_streams_its_records(tmp_path, capsys):
    log = dataset("comm", "nccl_debug_2node_25gbe.SYNTHETIC.log").read_text()
    p = tmp_path / "big.log"
    p.write_text(log * 20)
    assert main(["comm", "parse", str(p), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "nccl-debug" and len(doc["records"]) == 20 * log.count("NCCL INFO")
    assert set(doc["records"][0]) >= {"line", "host", "message", "rank", "nranks"}

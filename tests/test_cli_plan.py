"""``labkit predict`` and ``labkit plan``: text, JSON, and bad input as one error line with exit code 2."""
from __future__ import annotations

import json

import pytest

from labkit.cli import main

PREDICT = ["predict", "--model", "llama3-70b", "--cluster", "dgx-a100", "--global-batch", "512", "--seq-len", "4096",
           "--dp", "2", "--tp", "8", "--pp", "4", "--strategy", "zero1", "--recompute", "selective",
           "--sequence-parallel"]
PLAN = ["plan", "--model", "llama3-8b", "--cluster", "a100-25gbe", "--nodes", "2", "--global-batch", "64",
        "--seq-len", "2048", "--strategies", "zero1,zero2", "--top", "3"]


def test_predict_text_shows_breakdown_both_throughputs_and_assumptions(capsys):
    assert main(PREDICT) == 0
    out = capsys.readouterr().out
    for s in ("TP all-reduces", "pipeline bubble", "tokens/s aggregate", "tokens/s per GPU", "MFU", "assumptions:"):
        assert s in out


def test_predict_json(capsys):
    assert main([*PREDICT, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["n_gpus"] == 64 and d["step_s"] == pytest.approx(sum(d["terms_s"].values()))
    assert d["tokens_per_s_per_gpu"] == pytest.approx(d["tokens_per_s"] / 64)


def test_plan_text_and_json(capsys):
    assert main(PLAN) == 0
    out = capsys.readouterr().out
    assert "Best:" in out and "tokens_per_s_per_gpu" in out
    assert main([*PLAN, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["layouts"]) == 3 and d["layouts"][0]["rank"] == 1 and d["best"]["n_gpus"] == 16
    assert d["explain"].startswith("Best:")
    assert main([*PLAN, "--json", "--top", "500"]) == 0
    assert {row["cp"] for row in json.loads(capsys.readouterr().out)["layouts"]} == {1}     # CP only when asked
    assert main([*PLAN, "--json", "--cps", "1,2", "--top", "500"]) == 0
    assert {row["cp"] for row in json.loads(capsys.readouterr().out)["layouts"]} == {1, 2}


@pytest.mark.parametrize("argv, match", [
    (["predict", "--model", "llama9", "--cluster", "dgx-a100", "--global-batch", "8"], r"--model='llama9'.*llama3-8b"),
    (["predict", "--model", "llama3-8b", "--cluster", "dgx-q", "--global-batch", "8"], r"cluster='dgx-q'.*dgx-h100"),
    ([*PREDICT[:9], "--strategy", "zero7"], r"strategy='zero7'.*zero3"),
    ([*PREDICT[:9], "--dp", "128"], r"128 GPUs"),
    ([*PREDICT[:9], "--dtype", "fp9"], r"dtype='fp9'.*bf16"),
    ([*PREDICT[:9], "--sync-ms", "-1"], r"--sync-ms=-1"),
    ([*PLAN[:11], "--top", "0"], r"--top=0"),
    ([*PLAN[:11], "--strategies", ","], r"--strategies=',' is empty"),
    ([*PLAN[:11], "--gpus", "999"], r"n_gpus=999"),
    ([*PLAN[:11], "--cps", "1,two"], r"--cps='1,two' is not valid.*comma-separated positive integers"),
    ([*PLAN[:11], "--eps", "0"], r"--eps item=0"),
])
def test_bad_input_exits_2_with_one_line(argv, match, capsys):
    import re

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"labkit {argv[0]}: error:") and re.search(match, err[0]), err

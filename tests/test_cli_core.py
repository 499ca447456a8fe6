"""``labkit doctor`` and ``labkit mfu`` on CPU."""
from __future__ import annotations

import json

import pytest

from labkit.cli import build_parser, main


def _commands(parser, prefix=()):
    """Every command path of the CLI (``("comm",)``, ``("comm", "bench")``, ...), read off the parser."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _commands(sub, (*prefix, name))


COMMANDS = list(_commands(build_parser()))


def test_every_module_of_the_cli_package_adds_a_command():
    assert {"doctor", "mfu", "run", "launch", "comm", "memory", "tune", "trace", "diagnose", "regress",
            "grade", "release"} <= {c[0] for c in COMMANDS}


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_help_of_every_command(cmd, capsys):
    """Every command and subcommand starts and prints its help on CPU (ml-engineering's lesson: a
    program nobody starts in CI breaks unnoticed)."""
    with pytest.raises(SystemExit) as e:
        main([*cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: labkit " + " ".join(cmd))


def test_help_does_not_import_torch():
    """`labkit --help` and every command's parser stay torch-free (torch costs ~1.5 s to import)."""
    import subprocess
    import sys

    code = ("import sys\nfrom labkit.cli import build_parser\nbuild_parser().format_help()\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_doctor_quick_json_on_cpu(capsys):
    assert main(["doctor", "--quick", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["versions"]["torch"] and info["backends"]["gloo"] is True
    (m,) = info["measured"]
    assert m["device"] == "cpu" and m["matmul_flops"] > 1e6 and m["memory_bw"] > 1e6
    assert len(m["sweep"]) >= 1


def test_doctor_text_without_measurement(capsys):
    assert main(["doctor", "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert "versions" in out and "backends" in out and "gloo: yes" in out


def test_mfu_text_gpt2_on_a100(capsys):
    assert main(["mfu", "--model", "gpt2-124m", "--tokens-per-s", "120000", "--device", "A100-SXM-80GB"]) == 0
    out = capsys.readouterr().out
    # 120k tok/s x 855.17 MFLOP/token / 312 TF (nanoGPT's formula and A100 peak) = 32.9%
    assert "MFU              32.9%" in out and "6N + 12*L*H*Q*T" in out and "catalogue:A100-SXM-80GB" in out


def test_mfu_json_params_full_recompute(capsys):
    argv = ["mfu", "--params", "1e9", "--tokens-per-s", "4e4", "--devices", "2", "--peak-tflops", "312",
            "--recompute", "full", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["mfu"] == pytest.approx(4e4 * 6e9 / (2 * 312e12))
    assert r["hfu"] / r["mfu"] == pytest.approx(8 / 6)
    assert r["tokens_per_s_per_device"] == 2e4 and r["peak_source"] == "user"


def test_mfu_shape_megatron_causal(capsys):
    argv = ["mfu", "--layers", "2", "--d-model", "64", "--heads", "4", "--vocab", "100", "--seq-len", "32",
            "--tokens-per-s", "1e6", "--peak-tflops", "1", "--method", "megatron", "--causal", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert "causal" in r["formula"] and 0 < r["mfu"] < 1


def test_mfu_family_device_name_when_all_parts_agree(capsys):
    """issue #17: "--device A100" names four parts with one bf16 peak: it answers, and says which parts."""
    assert main(["mfu", "--model", "gpt2-124m", "--tokens-per-s", "1e5", "--device", "A100", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["peak_flops"] == 312e12 and r["peak_source"].startswith("catalogue:A100 = A100-SXM-40GB|")


@pytest.mark.parametrize(("argv", "match"), [
    (["--model", "gpt2-124m", "--tokens-per-s", "1.2e7", "--device", "A100-SXM-80GB"], "> 100%"),
    (["--model", "gpt2-124m", "--tokens-per-s", "1e3", "--device", "H100"], "H100-PCIe 756.5 TFLOP/s"),
    (["--model", "gpt2-124m", "--tokens-per-s", "1e3", "--device", "A100-SXM4-40GB-X"], "near candidates"),
    (["--model", "gpt2-124m", "--tokens-per-s", "1e3", "--device", "V100-SXM2-16GB"], "dtype='bf16'"),
    (["--params", "1e9", "--model", "gpt2-124m", "--tokens-per-s", "1", "--peak-tflops", "1"], "exactly one"),
    (["--params", "1e9", "--tokens-per-s", "1", "--peak-tflops", "1", "--recompute", "selective"], "selective"),
    (["--params", "-3", "--tokens-per-s", "1", "--peak-tflops", "1"], "--params"),
    (["--model", "gpt2-124m", "--tokens-per-s", "0", "--peak-tflops", "1"], "tokens_per_s=0"),
    (["--model", "gpt2-124m", "--tokens-per-s", "10", "--devices", "0", "--peak-tflops", "1"], "n_devices=0"),
])
def test_mfu_bad_inputs_exit_2_with_a_message(argv, match, capsys):
    assert main(["mfu", *argv]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("argv, match", [
    (["run", "--accum", "x"], "'x' is not valid: give a number of micro-batches"),
    (["run", "--accum", "2", "--accum-cap", "4"], "--accum-cap 4 needs --accum adaptive"),
])
def test_run_accum_adaptive_flags_are_checked_before_ranks_launch(argv, match, capsys):
    """`labkit run --accum adaptive` (chapter 25): a bad value or a cap without the controller is one line, exit 2."""
    try:
        code = main(argv)                      # a refused config: main returns 2
    except SystemExit as e:                    # an argparse type error: argparse exits 2
        code = e.code
    assert code == 2 and match in capsys.readouterr().err

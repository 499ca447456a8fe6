"""``labkit trace analyze`` / ``labkit diagnose --trace`` report the MFU of a foreign trace (issue #17)."""
from __future__ import annotations

import json

import pytest

from labkit.cli import main
from labkit.record import RunRecord
from labkit.trace import analyze
from labkit.trace.synthetic import SyntheticSpec, synthesize_traces


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    synthesize_traces(SyntheticSpec(world_size=2, steps=4, seed=0), out)
    return out


def _expected(traces, tokens, fpt, peak, n=2):
    res = analyze(traces)
    step = sum(res.step_times()) / len(res.step_times())
    return tokens / step * fpt / (n * peak)


def test_trace_analyze_reports_mfu_from_flops_per_token(traces, capsys):
    argv = ["trace", "analyze", str(traces), "--tokens-per-step", "4096", "--flops-per-token", "1e9",
            "--peak-tflops", "989", "--json"]
    assert main(argv) == 0
    rec = json.loads(capsys.readouterr().out)["record"]
    assert rec["mfu"] == pytest.approx(_expected(traces, 4096, 1e9, 989e12))
    assert rec["n_devices"] == 2 and rec["tokens_per_step"] == 4096 and rec["step_time"]["n"] == 4
    assert main(argv[:-1]) == 0
    assert "MFU " in capsys.readouterr().out


def test_trace_analyze_takes_the_flops_from_a_transformers_config(traces, tmp_path, capsys):
    cfg = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
           "vocab_size": 50257}                    # openai-community/gpt2 config.json
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    argv = ["trace", "analyze", str(traces), "--tokens-per-step", "2048", "--model-config", str(tmp_path),
            "--seq-len", "1024", "--peak-tflops", "989", "--devices", "8", "--json"]
    assert main(argv) == 0
    rec = json.loads(capsys.readouterr().out)["record"]
    from labkit import flops
    fpt = flops.model_flops_per_token(flops.preset("gpt2-124m"))        # PaLM's 6N + 12·L·H·Q·T, T = 1024
    assert rec["model_flops_per_token"] == fpt
    assert rec["mfu"] == pytest.approx(_expected(traces, 2048, fpt, 989e12, n=8))


def test_diagnose_trace_gets_the_mfu(traces, capsys):
    argv = ["diagnose", "--trace", str(traces), "--tokens-per-step", "4096", "--flops-per-token", "1e9",
            "--peak-tflops", "989", "--json"]
    assert main(argv) == 0
    figs = json.loads(capsys.readouterr().out)["figures"]
    assert figs["mfu"] == pytest.approx(_expected(traces, 4096, 1e9, 989e12))
    assert figs["tokens_per_s"] > 0 and "--peak-tflops" in figs["peak_source"]


def test_update_record_seam_from_python(traces):
    rec = analyze(traces).update_record(RunRecord(label="foreign"), tokens_per_step=4096.0, flops_per_token=1e9,
                                        peak_flops=989e12, n_devices=2)
    assert rec.mfu == pytest.approx(_expected(traces, 4096, 1e9, 989e12))
    with pytest.raises(ValueError, match="tokens_per_step"):
        analyze(traces).update_record(RunRecord(), flops_per_token=1e9, peak_flops=1e12)


@pytest.mark.parametrize("extra,msg", [
    (["--flops-per-token", "1e9", "--peak-tflops", "989"], "tokens-per-step"),
    (["--tokens-per-step", "4096", "--flops-per-token", "1e9"], "peak-tflops"),
    (["--tokens-per-step", "4096", "--model-config", "x.json", "--peak-tflops", "1"], "seq-len"),
    (["--tokens-per-step", "4096", "--flops-per-token", "1e9", "--peak-tflops", "-1"], "peak-tflops"),
    (["--tokens-per-step", "4096.5", "--flops-per-token", "1e9", "--peak-tflops", "1"], "tokens_per_step"),
    (["--tokens-per-step", "4096", "--flops-per-token", "1e12", "--peak-tflops", "1"], "MFU"),
])
def test_bad_mfu_options_exit_2_with_one_line(traces, extra, msg, capsys):
    assert main(["trace", "analyze", str(traces), *extra]) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1


def test_diagnose_mfu_options_need_a_trace(capsys):
    assert main(["diagnose", "--inject", "data", "--flops-per-token", "1e9"]) == 2
    assert "--trace" in capsys.readouterr().err

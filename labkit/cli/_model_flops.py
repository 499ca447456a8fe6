"""The options ``trace analyze`` and ``diagnose --trace`` share to report the MFU of a foreign trace.

A trace has a step time but no FLOP count: the user gives ``--tokens-per-step`` (global, unpadded) and
either ``--flops-per-token`` or ``--model-config config.json --seq-len T`` (a ``transformers`` config,
:func:`labkit.model.shapes.from_hf_config`, PaLM's 6N + 12·L·H·Q·T, causal masking not discounted), and
``--peak-tflops`` (dense, per device). ``--devices`` defaults to the ranks in the trace.

Taught in chapter 14 (diagnosis of a foreign run).
"""
from __future__ import annotations

from pathlib import Path


def add(p) -> None:
    g = p.add_argument_group("MFU of the traced run (a trace holds no FLOP count)")
    g.add_argument("--tokens-per-step", type=float, help="global (all ranks) tokens per optimizer step")
    g.add_argument("--flops-per-token", type=float, help="model FLOPs per token (training, e.g. 6N)")
    g.add_argument("--model-config", help="a transformers config.json file (or its folder) to take the FLOPs from")
    g.add_argument("--seq-len", type=int, help="training sequence length (with --model-config)")
    g.add_argument("--peak-tflops", type=float, help="dense peak TFLOP/s per device for the run's dtype")
    g.add_argument("--devices", type=int, help="devices in the run (default: the ranks in the trace)")


def given(args) -> bool:
    return any(getattr(args, k, None) is not None for k in
               ("tokens_per_step", "flops_per_token", "model_config", "peak_tflops", "seq_len", "devices"))


def resolve(args) -> dict:
    """Keyword arguments for :meth:`labkit.trace.TraceAnalysis.update_record` (empty when none given),
    with the config read first so a bad ``--model-config`` is named before any trace is read."""
    from labkit import checks

    if not given(args):
        return {}
    if args.flops_per_token is not None and args.model_config is not None:
        raise ValueError("give --flops-per-token or --model-config, not both")
    fpt, how = args.flops_per_token, "--flops-per-token"
    if args.model_config is not None:
        fpt, how = _config_flops(args.model_config, args.seq_len), f"--model-config {args.model_config}"
    elif args.seq_len is not None:
        raise ValueError("--seq-len is used with --model-config only")
    if args.tokens_per_step is None:
        raise ValueError("--tokens-per-step is needed: the trace gives the step time, not the tokens in it")
    if (fpt is None) != (args.peak_tflops is None):
        raise ValueError("MFU needs both the FLOPs (--flops-per-token or --model-config) and --peak-tflops")
    peak = None if args.peak_tflops is None else checks.positive("--peak-tflops", args.peak_tflops) * 1e12
    return {"tokens_per_step": args.tokens_per_step, "flops_per_token": fpt, "peak_flops": peak,
            "n_devices": args.devices, "peak_source": f"user (--peak-tflops; FLOPs from {how})"}


def _config_flops(path, seq_len) -> float:
    from labkit import flops
    from labkit.cli._io import naming, read_json
    from labkit.model import shapes

    if seq_len is None:
        raise ValueError(f"--model-config {path} needs --seq-len (the length you train at; the config's "
                         "max_position_embeddings is only the longest it allows)")
    p = Path(path)
    if p.is_dir() and (p / "config.json").is_file():
        p = p / "config.json"
    doc = read_json(p, "model config", hint="a transformers config.json is an object with a model_type")
    with naming(path, "model config"):
        return flops.model_flops_per_token(shapes.from_hf_config(doc, seq_len=seq_len), method="palm")


def lines(record) -> list[str]:
    """What the commands print about step time, tokens/s and MFU (nothing when not computed)."""
    out = []
    if record.step_time is not None and record.tokens_per_s is not None:
        out.append(f"step {record.step_time.mean * 1e3:.1f} ms (mean of {record.step_time.n}, slowest rank), "
                   f"{record.tokens_per_s:,.0f} tokens/s on {record.n_devices} device(s)")
    if record.mfu is not None:
        out.append(f"MFU {record.mfu:.1%} ({record.model_flops_per_token:.4g} FLOPs/token, peak "
                   f"{record.peak_flops / 1e12:,.1f} TFLOP/s per device; {record.peak_source})")
    return out

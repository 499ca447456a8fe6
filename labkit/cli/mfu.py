"""``labkit mfu``: MFU, HFU and tokens/s per device from the command line.

Examples::

    labkit mfu --model gpt2-124m --tokens-per-s 1.2e5 --device A100-SXM-80GB --dtype bf16
    labkit mfu --params 175e9 --tokens-per-s 2.5e6 --devices 1024 --peak-tflops 312 --recompute full
    labkit mfu --layers 24 --d-model 2048 --heads 16 --vocab 50257 --seq-len 2048 --tokens-per-s 4e4 \\
               --device H100-SXM --method megatron --causal --json

Taught in chapter 4 (MFU and HFU).
"""
from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "mfu", help="compute MFU / HFU / tokens per second per device",
        description="Model and hardware FLOPs utilisation (PaLM App. B) from a throughput. "
                    "tokens/s is GLOBAL (all devices).")
    src = p.add_argument_group("model (one of --model, --params, or the shape)")
    src.add_argument("--model", help="a labkit.flops preset, e.g. gpt2-124m, llama3-8b, palm-540b")
    src.add_argument("--params", type=float, help="parameter count N (uses 6N; no shape needed)")
    src.add_argument("--layers", type=int)
    src.add_argument("--d-model", type=int)
    src.add_argument("--heads", type=int)
    src.add_argument("--kv-heads", type=int)
    src.add_argument("--d-ff", type=int)
    src.add_argument("--ffn", choices=["gelu", "swiglu"], default="gelu")
    src.add_argument("--vocab", type=int)
    src.add_argument("--seq-len", type=int, help="sequence length (overrides a preset's)")
    p.add_argument("--tokens-per-s", type=float, required=True, help="GLOBAL tokens per second")
    p.add_argument("--devices", type=int, default=1, help="number of devices in the job (default 1)")
    peak = p.add_mutually_exclusive_group(required=True)
    peak.add_argument("--device", help="catalogued part, e.g. H100-SXM, A100-SXM-80GB (see labkit doctor)")
    peak.add_argument("--peak-tflops", type=float, help="dense peak TFLOP/s per device")
    p.add_argument("--dtype", default="bf16", help="dtype of the peak (default bf16)")
    p.add_argument("--method", choices=["palm", "6N", "megatron"], default=None,
                   help="FLOP formula (default palm with a shape, 6N with --params)")
    p.add_argument("--causal", action="store_true", help="halve the attention FLOPs (causal kernels)")
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none",
                   help="activation recomputation (changes HFU only)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def compute(args) -> dict:
    """The figures the command prints, as a dict (testable without parsing text)."""
    from labkit import checks, flops, hardware
    from labkit.flops import mfu as M

    shape_args = [args.layers, args.d_model, args.heads, args.vocab]
    given = sum(x is not None for x in (args.model, args.params)) + (any(a is not None for a in shape_args))
    if given != 1:
        raise ValueError("give exactly one of --model, --params, or the shape "
                         "(--layers --d-model --heads --vocab --seq-len)")
    if args.params is not None:
        checks.positive("--params", args.params)
        method = args.method or "6N"
        if method != "6N":
            raise ValueError(f"--method {method} needs a shape (--model or --layers ...); --params allows 6N")
        if args.recompute == "selective":
            raise ValueError("--recompute selective needs the attention shape (--model or --layers ...)")
        n = args.params
        fpt = 6.0 * n
        hpt = 8.0 * n if args.recompute == "full" else fpt
        formula = "6N" + (" ; HFU: 8N (full recompute = one extra forward)" if args.recompute == "full" else "")
        model_desc = f"N={n:.4g}"
    else:
        if args.model is not None:
            over = {"seq_len": args.seq_len} if args.seq_len else {}
            shape = flops.preset(args.model, **over)
        else:
            if any(a is None for a in shape_args) or args.seq_len is None:
                raise ValueError("a shape needs --layers, --d-model, --heads, --vocab and --seq-len")
            shape = flops.ModelShape(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
                                     vocab_size=args.vocab, seq_len=args.seq_len, d_ff=args.d_ff,
                                     n_kv_heads=args.kv_heads, ffn=args.ffn)
        method = args.method or "palm"
        fpt = flops.model_flops_per_token(shape, method=method, causal=args.causal)
        hpt = flops.hardware_flops_per_token(shape, method=method, causal=args.causal, recompute=args.recompute)
        formula = {"6N": "6N", "palm": "6N + 12*L*H*Q*T (PaLM App. B)",
                   "megatron": "3 x matmul forward FLOPs (Narayanan et al. SC21)"}[method]
        formula += " with attention halved (causal)" if args.causal else ""
        formula += f"; recompute={args.recompute}"
        model_desc = (f"{shape.name or 'custom'}: N={flops.n_matmul_params(shape):.4g} (matmul params), "
                      f"L={shape.n_layers}, d={shape.d_model}, T={shape.seq_len}")
    if args.peak_tflops is not None:
        peak, peak_source = hardware.resolve_peak(peak_flops=args.peak_tflops * 1e12)
    else:
        peak, peak_source = hardware.resolve_peak(args.device, args.dtype)
    return {
        "model": model_desc, "method": method, "formula": formula,
        "flops_per_token": fpt, "hardware_flops_per_token": hpt,
        "tokens_per_s": args.tokens_per_s, "n_devices": args.devices,
        "tokens_per_s_per_device": M.tokens_per_s_per_device(args.tokens_per_s, args.devices),
        "peak_flops": peak, "peak_source": peak_source, "dtype": args.dtype,
        "achieved_flops_per_device": M.achieved_flops(args.tokens_per_s, fpt) / args.devices,
        "mfu": M.mfu(tokens_per_s=args.tokens_per_s, flops_per_token=fpt, n_devices=args.devices, peak_flops=peak),
        "hfu": M.hfu(tokens_per_s=args.tokens_per_s, hardware_flops_per_token=hpt, n_devices=args.devices,
                     peak_flops=peak),
    }


def run(args) -> int:
    r = compute(args)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"model            {r['model']}")
    print(f"formula          {r['formula']}")
    print(f"FLOPs/token      model {r['flops_per_token']:.4g}, hardware {r['hardware_flops_per_token']:.4g}")
    print(f"tokens/s         {r['tokens_per_s']:,.0f} total, {r['tokens_per_s_per_device']:,.1f} per device "
          f"({r['n_devices']} devices)")
    print(f"peak             {r['peak_flops'] / 1e12:,.1f} TFLOP/s per device, {r['dtype']} ({r['peak_source']})")
    print(f"achieved         {r['achieved_flops_per_device'] / 1e12:,.2f} TFLOP/s per device (model)")
    print(f"MFU              {r['mfu']:.1%}")
    print(f"HFU              {r['hfu']:.1%}")
    return 0

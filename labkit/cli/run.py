"""``labkit run``: train the default workload on this machine and print its run record.

Default: the tiny GPT on the shipped corpus, on every local device — one rank per GPU with NCCL, or
2 gloo ranks on a CPU with ≥ 2 cores (DDP), else a single process. Under ``torchrun`` the command runs
as one rank of the job (``torchrun --standalone --nproc_per_node=4 -m labkit run --parallel ddp``), without
launching ranks itself.

Taught in chapter 4 (MFU of a real run) and chapter 14 (the baseline record).
"""
from __future__ import annotations

import argparse
import os


def _accum(text: str):
    """--accum: a count of micro-batches, or "adaptive" (chapter 25)."""
    if text == "adaptive":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: give a number of micro-batches (≥ 1) or 'adaptive'") \
            from None


def register(subparsers) -> None:
    from labkit.model.config import ATTENTIONS, SIZES
    from labkit.train import DTYPES, PARALLEL
    from labkit.train.config import OPTIMIZER_IMPLS, PP_SCHEDULES

    p = subparsers.add_parser(
        "run", help="train the reference workload and print its run record",
        description="Train a GPT on the shipped corpus with labkit.train and print the record "
                    "(tokens/s, MFU, phases, peak memory). Works under torchrun too.")
    p.add_argument("--model", default="tiny", choices=sorted(SIZES), help="model size (default tiny)")
    p.add_argument("--parallel", default=None, choices=PARALLEL,
                   help="default: ddp when more than one rank, else single")
    p.add_argument("-n", "--nprocs", type=int, default=None,
                   help="ranks (default: number of GPUs, else 2 on a CPU with ≥ 2 cores, else 1)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--accum", type=_accum, default=None,
                   help="micro-batches per step, or 'adaptive' (the chapter-25 controller: follows the measured "
                        "comm/compute ratio, capped by --accum-cap) (default 1; with --pp: pp, the pipeline's "
                        "micro-batches)")
    p.add_argument("--accum-cap", type=int, default=8, help="with --accum adaptive: the largest accumulation")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (chapter 24)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (chapter 24)")
    p.add_argument("--pp-schedule", default="1f1b", choices=PP_SCHEDULES)
    p.add_argument("--virtual-stages", type=int, default=1, help="model chunks per pipeline rank (interleaved)")
    p.add_argument("--moe-experts", type=int, default=0, help="experts per MoE layer (0 = dense MLPs; chapter 26)")
    p.add_argument("--moe-top-k", type=int, default=2, help="with --moe-experts: experts per token")
    p.add_argument("--moe-aux-loss", type=float, default=0.0, help="with --moe-experts: balance-loss weight")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel ranks, sharing the dp ranks (chapter 26)")
    p.add_argument("--sequence-parallel", action="store_true", help="with --tp: split activations along the sequence")
    p.add_argument("--head-whole", action="store_true",
                   help="with --tp: keep the tied embedding/head and the loss whole on every rank (not vocabulary-parallel)")
    p.add_argument("--cp", type=int, default=1, help="context-parallel ranks sharing each sequence: ring attention "
                   "(chapter 26; needs --parallel ddp or fsdp, the default with more ranks)")
    p.add_argument("--cp-contiguous", action="store_true",
                   help="with --cp: contiguous sequence chunks per rank (no causal load balancing)")
    p.add_argument("--sync-every-micro-batch", action="store_true",
                   help="gradient sync on every micro-batch, not only the last (no_sync=False; chapter 15)")
    p.add_argument("--keep-gathered", action="store_true",
                   help="FSDP2: keep parameters gathered between micro-batches (reshard_after_backward=False)")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--dtype", default="fp32", choices=DTYPES)
    p.add_argument("--checkpoint", nargs="?", const="full", default=False,
                   help="activation checkpointing: bare = every block; or a policy: every:k, attention (chapter 21)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--optimizer-impl", default="auto", choices=OPTIMIZER_IMPLS,
                   help="AdamW implementation: auto (torch's choice), for-loop, foreach, fused (chapter 17)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="capture forward + backward as CUDA graphs (one GPU, parallel single; chapter 17)")
    p.add_argument("--attention", default="sdpa", choices=ATTENTIONS,
                   help="naive, sdpa (PyTorch picks), or a forced SDPA backend (chapter 16; CPU: flash, math)")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--profile-dir", default=None, help="write torch.profiler chrome traces here")
    p.add_argument("--peak-flops", type=float, default=None, help="per-device peak FLOP/s (default: resolved)")
    p.add_argument("--seed", type=int, default=0)
    ck = p.add_argument_group("fault tolerance (chapter 27)")
    ck.add_argument("--checkpoint-every", type=int, default=0, help="save model + optimizer + step every N steps")
    ck.add_argument("--checkpoint-dir", default=None, help="where checkpoints, progress and fault markers go")
    ck.add_argument("--checkpoint-mode", default="sync", choices=("sync", "async"),
                    help="sync: dcp.save blocks the loop; async: dcp.async_save (stage, write in background)")
    ck.add_argument("--resume-from", default=None, help="a checkpoint directory, or 'latest' under --checkpoint-dir")
    ck.add_argument("--fail-at-step", type=int, default=None,
                    help="inject a failure: --fail-rank exits at the start of this step, once (marker file)")
    ck.add_argument("--fail-rank", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600, help="seconds before the ranks are stopped")
    ck.add_argument("--flight-recorder", metavar="DIR", default=None,
                    help="arm PyTorch's Flight Recorder: every rank's record of its collectives is dumped into DIR "
                         "when the run ends, fails or times out (read with labkit diagnose --hang DIR)")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("--save", default=None, help="also save the record (JSON) to this path; under torchrun a "
                   "path with {rank} saves every rank's record")
    p.set_defaults(func=handle)


def default_nprocs() -> int:
    import torch

    from labkit.launcher import cores_available

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.cuda.device_count()
    return 2 if cores_available() >= 2 else 1


def handle(args) -> int:
    from labkit.train import TrainConfig, run, train

    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or (
        "WORLD_SIZE" in os.environ and "LABKIT_RUN_DIR" not in os.environ and "RANK" in os.environ)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else None
    model_par = max(1, args.tp) * max(1, args.pp)           # ranks per model replica (tp · pp)
    if args.nprocs is not None and args.nprocs < 1:      # -n 0 is no rank count (it was read as "the default")
        raise ValueError(f"--nprocs {args.nprocs} is not valid; use ≥ 1")
    nprocs = world or args.nprocs or max(default_nprocs(), model_par * max(1, args.cp))
    if nprocs < 1:
        raise ValueError(f"--nprocs {nprocs} is not valid; use ≥ 1")
    parallel = args.parallel or ("ddp" if nprocs > model_par else "single")   # cp ranks reduce gradients as dp
    accum = args.accum if args.accum is not None else (args.pp if args.pp > 1 else 1)
    if accum != "adaptive" and args.accum_cap != 8:
        raise ValueError(f"--accum-cap {args.accum_cap} needs --accum adaptive (with a fixed --accum {accum} there is "
                         "nothing to cap)")
    layout = (f" tp{args.tp} pp{args.pp}" if model_par > 1 else "") + (f" cp{args.cp}" if args.cp > 1 else "")
    cfg = TrainConfig(model=args.model, seq_len=args.seq_len, micro_batch=args.micro_batch, accum=accum,
                      tp=args.tp, pp=args.pp, pp_schedule=args.pp_schedule, virtual_stages=args.virtual_stages,
                      sequence_parallel=args.sequence_parallel, vocab_parallel=not args.head_whole, cp=args.cp, cp_balanced=not args.cp_contiguous,
                      moe_experts=args.moe_experts,
                      moe_top_k=args.moe_top_k, moe_aux_loss=args.moe_aux_loss, ep=args.ep,
                      steps=args.steps, warmup_steps=args.warmup_steps, dtype=args.dtype, parallel=parallel,
                      checkpoint=args.checkpoint, compile=args.compile, attention=args.attention,
                      num_workers=args.num_workers, profile_dir=args.profile_dir, peak_flops=args.peak_flops,
                      seed=args.seed, label=f"labkit run {args.model} {parallel}×{nprocs}{layout}",
                      no_sync=not args.sync_every_micro_batch, reshard_after_backward=not args.keep_gathered,
                      optimizer_impl=args.optimizer_impl, cuda_graphs=args.cuda_graphs,
                      checkpoint_every=args.checkpoint_every, checkpoint_dir=args.checkpoint_dir,
                      checkpoint_mode=args.checkpoint_mode, resume_from=args.resume_from,
                      fail_at_step=args.fail_at_step, fail_rank=args.fail_rank,
                      **({"accum_cap": args.accum_cap} if accum == "adaptive" else {}))
    if args.flight_recorder is not None and under_torchrun:
        raise ValueError(f"--flight-recorder {args.flight_recorder} arms the ranks labkit run launches; under torchrun "
                         "set TORCH_FR_BUFFER_SIZE=2000 and TORCH_FR_DUMP_TEMP_FILE=<dir>/nccl_trace_rank_ in the job's "
                         "environment instead")
    if cfg.cuda_graphs:            # refuse before launching ranks (chapter 17)
        from labkit.hardware.measure import resolve_device
        from labkit.train.graphs import require_cuda

        require_cuda(resolve_device(cfg.device))
    from labkit.train.launch import check_world

    check_world(cfg, nprocs)       # ep, fail_rank, straggler_rank, ranks_per_node against the world: before any rank
    if under_torchrun:
        record = train(cfg)
        from labkit.launcher import shutdown_distributed

        shutdown_distributed()
        if args.save and "{rank}" in args.save:       # every rank's own record (chapter 27: two "nodes")
            record.save(args.save.format(rank=os.environ.get("RANK", "0")))
        if int(os.environ.get("RANK", "0")) != 0:
            return 0
    else:
        record = run(cfg, nprocs, timeout_s=args.timeout, flight_recorder=args.flight_recorder)
    if args.save and not (under_torchrun and "{rank}" in args.save):
        record.save(args.save.replace("{rank}", "0"))
    if args.json:
        print(record.to_json())
        return 0
    print(record.summary())
    phases = ", ".join(f"{k} {v.median * 1e3:.1f} ms" for k, v in record.phases.items())
    print(f"phases (median per step): {phases}")
    lay = record.extra.get("layout")
    if lay:
        mesh = " × ".join(f"{k}={v}" for k, v in lay["mesh"].items())
        extra = (f"; {lay['pp_schedule']}, {lay['micro_batches']} micro-batches, bubble model (p−1)/(v·m) = "
                 f"{lay['bubble_predicted']:.3f}" if "pp_schedule" in lay else "")
        if "cp_chunks" in lay:
            extra += f"; rank 0 holds sequence chunks {lay['cp_chunks']} of {2 * lay['mesh']['cp']}"
        print(f"layout: mesh {mesh} (dp strategy {lay['dp_strategy']}){extra}")
    moe = record.extra.get("moe")
    if moe:
        print(f"moe: {moe['experts']} experts, top-{moe['top_k']}, ep={moe['ep']}; load imbalance (max/mean tokens "
              f"per expert) mean {moe['imbalance_mean']:.2f}, max {moe['imbalance_max']:.2f}")
    ck = record.extra.get("checkpoint")
    if ck:
        print(f"checkpoints: {ck['n_saves']} {ck['mode']} saves, median stall {(ck['stall_s_median'] or 0) * 1e3:.0f} ms"
              f"; resumed from {ck['resumed_from']}, steps lost {ck['steps_lost']}")
    print(f"loss {record.loss[0]:.3f} → {record.loss[-1]:.3f} over {len(record.loss)} steps; "
          f"peak source: {record.peak_source}; memory: {record.extra.get('peak_memory_kind')}")
    return 0

"""A tiny data-parallel training loop that records real profiler traces, with injectable bottlenecks.

It exists so that chapters 9 and 14 (and their tests) can *make* each family of bottleneck on a
2-core CPU and check that :func:`labkit.diagnose.diagnose` names it:

========== ============================================================================
inject      what changes (everything else stays as in the baseline)
========== ============================================================================
``data``    the dataset sleeps per sample (a slow loader/augmentation)
``compute`` micro-batches of one sequence, accumulated to the same tokens per step: GEMMs of
            ``seq_len`` rows instead of ``micro_batch × seq_len``, per-op overhead dominates
``comm``    the gradient all-reduce carries padding (an oversized bucket)
``memory``  a memory budget too small for the requested micro-batch: the loop falls back to
            activation recomputation and micro-batch 1 with gradient accumulation
========== ============================================================================

The data and comm injections are sized against the machine's own clean step (two un-injected steps
are timed first) so that they take ``inject_share`` of the step whatever the load on a shared
machine; ``data_slowdown_s``/``comm_pad_mb`` fix them instead. The sizes used are in the record's
config.

The loop is *naive data parallel*: forward, backward, then one all-reduce of all gradients
(like DDP with a single bucket and no overlap), then the optimizer. Each rank runs under
``torch.profiler`` (CPU activity, ``ProfilerStep#N`` ranges) and writes
``rank{r}.pt.trace.json.gz``; rank 0 also returns a :class:`labkit.record.RunRecord`.

MFU uses the PaLM formula for model FLOPs per token, 6·N + 12·L·d·T (Chowdhery et al. 2022,
"PaLM", App. B), and a peak measured live with a square fp32 matmul in the same rank (same
threads, same contention) — so on this CPU the figure means "fraction of what a large GEMM gets".

Taught in chapter 9 (profiler traces) and chapter 14 (systematic diagnosis).
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

INJECTIONS = ("none", "data", "compute", "comm", "memory")


@dataclass(frozen=True)
class WorkloadConfig:
    """Sizes of the tiny GPT-style model and the loop; ``inject`` picks a bottleneck (see module doc).

    Taught in chapter 14.
    """

    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 256
    # 32 × 32 = 1024 tokens per GEMM in the baseline, 32 in the compute injection: a 32× gap. (At
    # 64 × 16 the 64-row GEMMs of micro-batch 1 still ran at ~60 % of the baseline's FLOP/s on a
    # CPU — measured 0.27–0.31 MFU vs 0.40–0.54, too close to the 0.30 threshold to diagnose.)
    seq_len: int = 32
    micro_batch: int = 32
    steps: int = 6                 # profiled steps (after `warmup_steps` unprofiled ones)
    warmup_steps: int = 2
    inject: str = "none"
    inject_share: float = 0.4       # target share of the step the injected data/comm wait takes
    data_slowdown_s: float | None = None  # sleep per sample (inject == "data"); None: from inject_share
    comm_pad_mb: float | None = None      # extra all-reduce payload (inject == "comm"); None: calibrated
    memory_budget_mb: float | None = None  # activation budget; inject == "memory" sets a tight one
    seed: int = 0

    def __post_init__(self):
        if self.inject not in INJECTIONS:
            raise ValueError(f"inject={self.inject!r} is not valid; choose one of {INJECTIONS}")
        for name in ("d_model", "n_layers", "n_heads", "vocab_size", "seq_len", "micro_batch", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        if not 0 < self.inject_share < 1:
            raise ValueError(f"inject_share={self.inject_share!r} must be in (0, 1)")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")


def _model(cfg: WorkloadConfig, checkpoint: bool):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(cfg.d_model)
            self.attn = nn.MultiheadAttention(cfg.d_model, cfg.n_heads, batch_first=True)
            self.ln2 = nn.LayerNorm(cfg.d_model)
            self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                     nn.Linear(4 * cfg.d_model, cfg.d_model))

        def forward(self, x, mask):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class TinyGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layers))
            self.ln = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

        def forward(self, idx, targets):
            t = idx.shape[1]
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
            x = self.emb(idx) + self.pos(torch.arange(t))
            for b in self.blocks:
                if checkpoint:
                    x = torch.utils.checkpoint.checkpoint(b, x, mask, use_reentrant=False)
                else:
                    x = b(x, mask)
            logits = self.head(self.ln(x))
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return TinyGPT()


class _Tokens:
    """Random-token dataset (seeded); sleeps per sample when asked (the injected slow loader)."""

    def __init__(self, n, seq_len, vocab, sleep_s, seed):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, seq_len + 1), generator=g)
        self.sleep_s = sleep_s

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        row = self.data[i]
        return row[:-1], row[1:]


def _activation_bytes(model, cfg, micro_batch, seq_len, checkpoint_blocks=False):
    """Bytes of tensors autograd saves for backward in one forward (measured with saved-tensor hooks)."""
    import torch

    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    idx = torch.randint(0, cfg.vocab_size, (micro_batch, seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(idx, idx)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return total[0]


def _matmul_peak(n=512, reps=20):
    """FLOP/s of an n×n fp32 matmul in this process: the best of ``reps`` after a warm-up (other
    processes on a shared machine only ever slow a run down, so the best is the least disturbed)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def rank_main(cfg_dict: dict, out_dir: str) -> dict | None:
    """Body of one rank (importable, so spawn/torchrun can run it). Returns rank 0's record dict.

    Taught in chapter 14.
    """
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from labkit.record import RunRecord, Stat, environment_versions

    cfg = WorkloadConfig(**cfg_dict)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    seq_len, requested_mb = cfg.seq_len, cfg.micro_batch
    micro_batch, accum, checkpoint = requested_mb, 1, False
    if cfg.inject == "compute":      # micro-batches of one sequence, accumulated to the same tokens
        micro_batch, accum = 1, requested_mb
    budget = cfg.memory_budget_mb
    probe = _model(dataclasses.replace(cfg, seq_len=seq_len), checkpoint=False)
    per_sample = _activation_bytes(probe, cfg, 1, seq_len)
    if cfg.inject == "memory" and budget is None:
        budget = 0.5 * per_sample / 2**20       # half of what even one sample needs
    if budget is not None:
        b = int(budget * 2**20)
        while micro_batch > 1 and micro_batch * per_sample > b:
            micro_batch //= 2
        if micro_batch * per_sample > b:
            checkpoint = True
        accum = max(1, requested_mb // micro_batch)
    model = _model(dataclasses.replace(cfg, seq_len=seq_len), checkpoint=checkpoint)
    for p in model.parameters():                 # identical replicas, as DDP would broadcast
        dist.broadcast(p.data, 0)
    act_bytes = _activation_bytes(model, cfg, micro_batch, seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    n_params = sum(p.numel() for p in model.parameters())
    state_bytes = 4 * n_params * 4                # fp32 params + grads + Adam m and v
    tokens_per_step = world * micro_batch * accum * seq_len
    ds = _Tokens(micro_batch * accum * (cfg.steps + cfg.warmup_steps + 4), seq_len, cfg.vocab_size,
                 0.0, cfg.seed + rank)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=micro_batch, shuffle=False))

    def one_step(pad):
        """One optimizer step; returns (data, compute, comm, optimizer) seconds and the loss."""
        t_data = t_comp = 0.0
        for _ in range(accum):
            a = time.perf_counter()
            x, y = next(it)
            b = time.perf_counter()
            loss = model(x, y) / accum
            loss.backward()
            t_data += b - a
            t_comp += time.perf_counter() - b
        t1 = time.perf_counter()
        with record_function("grad_all_reduce"):
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.flatten() for g in grads] + ([pad] if pad is not None else []))
            dist.all_reduce(flat)
            flat /= world
            off = 0
            for g in grads:
                g.copy_(flat[off:off + g.numel()].view_as(g))
                off += g.numel()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return (t_data, t_comp, t2 - t1, time.perf_counter() - t2), float(loss) * accum

    # calibrate the injected bottleneck against this machine's clean step (it is shared and noisy:
    # a fixed sleep would be 40 % of the step on an idle machine and 5 % on a busy one)
    clean = [one_step(None)[0] for _ in range(2)][-1]
    t_clean = sum(clean)
    # the all-reduce's bandwidth from the rank that arrived last (the others' time includes waiting
    # for it): the shortest all-reduce time over the ranks
    t_ar = torch.tensor([clean[2]], dtype=torch.float64)
    dist.all_reduce(t_ar, op=dist.ReduceOp.MIN)
    ar_bw = 4 * n_params / max(float(t_ar[0]), 1e-6)     # bytes/s of the gradient all-reduce
    extra = cfg.inject_share / (1 - cfg.inject_share) * t_clean
    knobs = torch.tensor([extra / (micro_batch * accum), extra * ar_bw / 2**20], dtype=torch.float64)
    dist.all_reduce(knobs, op=dist.ReduceOp.MAX)         # every rank must pad the same size
    slow = (cfg.data_slowdown_s if cfg.data_slowdown_s is not None else float(knobs[0])) \
        if cfg.inject == "data" else 0.0
    pad_mb = (cfg.comm_pad_mb if cfg.comm_pad_mb is not None else float(knobs[1])) \
        if cfg.inject == "comm" else 0.0
    pad = torch.zeros(int(pad_mb * 2**20 / 4)) if pad_mb else None
    ds.sleep_s = slow
    dist.barrier()                                # both ranks measure together (same contention)
    peak = _matmul_peak()
    out = Path(out_dir)
    phases = {k: [] for k in ("data", "compute", "comm", "optimizer")}
    step_times, losses = [], []
    sched = schedule(wait=0, warmup=cfg.warmup_steps, active=cfg.steps, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched) as prof:
        for step in range(cfg.warmup_steps + cfg.steps):
            times, loss = one_step(pad)
            prof.step()
            if step >= cfg.warmup_steps:
                step_times.append(sum(times))
                losses.append(loss)
                for k, v in zip(phases, times, strict=True):
                    phases[k].append(v)
    prof.export_chrome_trace(str(out / f"rank{rank}.pt.trace.json"))
    import gzip
    import shutil

    src = out / f"rank{rank}.pt.trace.json"
    with open(src, "rb") as f, gzip.open(str(src) + ".gz", "wb", compresslevel=5) as g:
        shutil.copyfileobj(f, g)
    src.unlink()
    dist.barrier()
    if rank != 0:
        return None
    st = Stat.of(step_times)
    tps = tokens_per_step / st.median
    d, L = cfg.d_model, cfg.n_layers
    n_nonemb = n_params - cfg.vocab_size * d - seq_len * d
    fpt = 6 * n_nonemb + 12 * L * d * seq_len          # PaLM App. B
    hw_fpt = fpt + (2 * n_nonemb + 4 * L * d * seq_len if checkpoint else 0)  # + one more forward
    share = lambda k: float(np.median(np.asarray(phases[k]) / np.asarray(step_times)))
    rec = RunRecord(
        label=f"workload:{cfg.inject}", step_time=st, tokens_per_step=tokens_per_step, tokens_per_s=tps,
        n_devices=world, model_flops_per_token=float(fpt), hardware_flops_per_token=float(hw_fpt),
        peak_flops=peak, peak_source="measured:matmul 512x512 fp32 (both ranks at once)", dtype="fp32",
        mfu=tps * fpt / (world * peak), hfu=tps * hw_fpt / (world * peak),
        phases={k: Stat.of(v) for k, v in phases.items()},
        comm_wait_share=share("comm"), data_wait_share=share("data"),
        peak_memory_bytes=int(state_bytes + act_bytes), loss=losses,
        config={**dataclasses.asdict(cfg), "seq_len_used": seq_len, "micro_batch_requested": requested_mb,
                "micro_batch": micro_batch, "accum": accum, "checkpoint": checkpoint,
                "memory_budget_bytes": None if budget is None else int(budget * 2**20) + state_bytes,
                "parallel": "naive-dp", "data_slowdown_s_used": slow, "comm_pad_mb_used": pad_mb},
        device={"name": "cpu", "kind": "cpu", "backend": "gloo", "count": world},
        versions=environment_versions(),
        extra={"trace_files": sorted(str(p) for p in out.glob("rank*.pt.trace.json.gz")),
               "activation_bytes_per_sample": per_sample, "n_params": n_params, "step_times": step_times},
    )
    return rec.to_dict()


def rank_many(cfg_dicts: list, out_dirs: list) -> list | None:
    """Run several workloads one after the other in the same ranks (one process start for all).

    Taught in chapter 14.
    """
    out = [rank_main(c, d) for c, d in zip(cfg_dicts, out_dirs, strict=True)]
    return out if out[0] is not None else None


def _spawn_entry(rank, world, port, cfg_dicts, out_dirs, threads):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), OMP_NUM_THREADS=str(threads))
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        value = rank_many(cfg_dicts, out_dirs)
        if value is not None:
            Path(out_dirs[0], "records.json").write_text(json.dumps(value, default=str))
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workload(cfg: WorkloadConfig, out_dir, nprocs: int = 2, *, timeout_s: float = 300):
    """Run the workload on ``nprocs`` gloo ranks (fresh spawned processes); return rank 0's RunRecord.

    Traces land in ``out_dir/rank{r}.pt.trace.json.gz``. Uses ``labkit.launch`` when it is
    available, else ``torch.multiprocessing.spawn`` of this module's importable entry point.

    Taught in chapter 14 (systematic diagnosis).
    """
    return run_workloads([cfg], [out_dir], nprocs, timeout_s=timeout_s)[0]


def run_workloads(cfgs, out_dirs, nprocs: int = 2, *, timeout_s: float = 600) -> list:
    """Several workloads in one launch (process start is the slow part on a loaded machine); one
    RunRecord per config, traces in the matching ``out_dirs``.

    Taught in chapter 14 (systematic diagnosis).
    """
    from labkit.record import RunRecord

    cfgs, out_dirs = list(cfgs), [Path(d) for d in out_dirs]
    for cfg in cfgs:
        if not isinstance(cfg, WorkloadConfig):
            raise TypeError(f"cfg must be a WorkloadConfig, got {type(cfg).__name__}")
    if not cfgs or len(cfgs) != len(out_dirs):
        raise ValueError(f"need one out_dir per config (got {len(cfgs)} configs, {len(out_dirs)} folders)")
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r} must be an int >= 1")
    for out in out_dirs:
        out.mkdir(parents=True, exist_ok=True)
        for old in list(out.glob("rank*.pt.trace.json.gz")) + [out / "records.json"]:
            old.unlink(missing_ok=True)
    threads = max(1, (os.cpu_count() or 2) // nprocs)
    dicts = [dataclasses.asdict(c) for c in cfgs]
    dirs = [str(d) for d in out_dirs]
    try:
        from labkit.launcher import launch
    except ImportError:
        launch = None
    if launch is not None:
        res = launch(rank_many, nprocs, args=(dicts, dirs), timeout_s=timeout_s, stream=False,
                     env={"OMP_NUM_THREADS": str(threads)})
        values = res.value
    else:
        import torch.multiprocessing as mp

        mp.spawn(_spawn_entry, args=(nprocs, _free_port(), dicts, dirs, threads), nprocs=nprocs, join=True)
        values = json.loads((out_dirs[0] / "records.json").read_text())
    return [RunRecord.from_dict(v) for v in values]

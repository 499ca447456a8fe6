"""Bottleneck injections: trainer options that make one family of bottleneck on purpose.

Chapters 2, 9 and 14 (and ``labkit diagnose --inject``) check that :func:`labkit.diagnose.diagnose`
names a bottleneck we *made*. Each injection changes one thing of the reference run:

============= ============================================================================
inject        what changes
============= ============================================================================
``data``      the loader sleeps per sample (a slow decode / remote read; ``data_slowdown_s``)
``comm``      one extra all-reduce of ``comm_pad_mb`` per step after backward (an oversized bucket)
``compute``   micro-batches of one sequence, accumulated to the same tokens per step: GEMMs of
              ``seq_len`` rows instead of ``micro_batch × seq_len``, so per-op overhead dominates
``memory``    an activation budget smaller than the micro-batch needs: the micro-batch halves until
              it fits (accumulation keeps the global batch); if even one sequence does not fit,
              activations are recomputed (checkpointing)
``host``      every rank's training thread blocks once per step outside any op and any meter
              phase — what a hidden host sync (``.item()``, a print of a tensor, a blocking log
              write) costs on a GPU, where the host then waits for the device. On a GPU the block is a
              sleep of ``host_stall_s``; on a CPU there is no device queue to wait for, so it is pure-Python
              host work (:func:`host_work`) of a size timed at the start, which then grows with the
              machine's load as the step's own work does (a sleep would not: on a shared machine that
              gets busier mid-run, a sleep shrinks to a sliver of the slowed step). SIMULATED cost, real time
``straggler`` the same block on one rank only (``straggler_rank``, default the last): a slow node or
              a busy host; the other ranks wait for it inside the next step's gradient all-reduce.
              ``straggler_by`` = ``"compute"`` (matrix multiplies: on a CPU a number of them timed at the
              start, on a GPU for the block's wall time), ``"data"`` (its loader sleeps) or
              ``"link"`` (its gradient buckets held back in its collectives by a link sized to add
              the same time, :func:`labkit.train.slow_link.slow_straggler_link`)
``work``      every rank does a fixed amount of extra compute each step: ``work_matmuls`` multiplies
              of two 128×128 fp32 matrices (2·128³ FLOPs each) at the end of the step — a regression
              of known size (lab 11's slowdown to catch). Real work, not a sleep: it costs the same
              CPU seconds on a busy machine as on an idle one, and its wall time grows with the load
              like the step's own
============= ============================================================================

:func:`plan` applies the compute and memory injections to the config before the model is built.
:func:`size_injection` sizes the data, comm, host and straggler injections against *this machine's own
clean step* (two un-injected steps are timed first, then undone by :func:`rewound`) so that they add ``inject_share`` of a step whatever
the load on a shared machine; ``data_slowdown_s`` / ``comm_pad_mb`` / ``host_stall_s`` fix them instead. On a CPU
:func:`calibrate` turns the host or compute block into a count of work units timed beside the clean steps
(:func:`stall_reps`), so a load that changes after the calibration slows the block as much as the step.
:func:`size_work` sizes the work injection the same way, in multiplies: three clean steps and a block of
multiplies are timed in this process's CPU seconds (on a GPU: wall time between synchronisations), and
``work_matmuls`` = share / (1 − share) × the clean step ÷ one multiply, so the injected work is
``inject_share`` of the slowed step (0.05: the step grows by 1/0.95 − 1 = 5.3 %); ``work_matmuls`` > 0 fixes
it. What was used is in the record's config (``data_slowdown_s_used``, ``comm_pad_mb_used``,
``host_stall_s_used``, ``host_stall_reps_used``, ``work_matmuls_used``, ``work_flops_used``, ``micro_batch_requested``,
``memory_budget_bytes``).

Taught in chapter 14 (systematic diagnosis) and chapter 2 (the five bottleneck families).
"""
from __future__ import annotations

import contextlib
import copy
import time

from labkit.units import MIB


def activation_bytes_per_sample(cfg, device, policy: str = "none") -> int:
    """Exact bytes autograd saves in one forward of one sequence of ``cfg``'s model, with the
    recomputation ``policy`` applied ("none": everything; chapter 21's policies save less)."""
    import torch

    from labkit.memory.tensors import measure_activation_bytes
    from labkit.model.gpt import GPT

    mcfg = cfg.model_config
    net = GPT(mcfg).to(device)
    if policy != "none":
        from labkit.train.parallel import _checkpoint_blocks

        _checkpoint_blocks(net, policy)
    idx = torch.zeros((1, mcfg.seq_len), dtype=torch.long, device=device)
    return measure_activation_bytes(net, idx, idx)


def plan(cfg, device) -> tuple:
    """(the config to run, facts for the record) after the compute and memory injections.

    A ``memory_budget_mb`` constrains any run; ``inject="memory"`` without one sets half of what a
    single sequence needs — so the run must recompute. A run that asks for recomputation itself
    (``checkpoint``) is fitted with what a sequence saves under its policy, so more sequences fit — the
    fix lab 12's activation budget asks for. Taught in chapter 14.
    """
    facts: dict = {}
    if cfg.inject == "compute":
        facts["micro_batch_requested"] = cfg.micro_batch
        cfg = cfg.replace(micro_batch=1, accum=cfg.accum * cfg.micro_batch)
    if cfg.inject == "memory" or cfg.memory_budget_mb is not None:
        per_sample = activation_bytes_per_sample(cfg, device)
        budget = cfg.memory_budget_mb * MIB if cfg.memory_budget_mb is not None else 0.5 * per_sample
        fit = per_sample if cfg.checkpoint_policy == "none" else activation_bytes_per_sample(
            cfg, device, cfg.checkpoint_policy)
        mb = cfg.micro_batch
        while mb > 1 and mb * fit > budget:
            mb //= 2
        states = 4 * 4 * _n_params(cfg)          # fp32 params + grads + Adam m and v
        facts.update(micro_batch_requested=cfg.micro_batch, activation_bytes_per_sample=per_sample,
                     memory_budget_bytes=int(budget) + states)
        cfg = cfg.replace(micro_batch=mb, accum=cfg.accum * (cfg.micro_batch // mb),
                          checkpoint=cfg.checkpoint if cfg.checkpoint_policy != "none" else mb * per_sample > budget)
        if fit != per_sample:
            facts["activation_bytes_per_sample_recomputed"] = fit
    return cfg, facts


def _n_params(cfg) -> int:
    from labkit.flops import n_params

    return n_params(cfg.model_config.shape())


def size_injection(cfg, clean_step_s: float, allreduce_bytes_per_s: float) -> tuple[float, float, float]:
    """(sleep per sample in s, all-reduce padding in MB, host stall per step in s) that make the data,
    comm, host or straggler injection add ``inject_share`` of a step: extra = share / (1 − share) ×
    clean step. Fixed sizes win. Chapter 14."""
    extra = cfg.inject_share / (1 - cfg.inject_share) * clean_step_s
    slow = pad = stall = 0.0
    if cfg.inject == "data":
        slow = cfg.data_slowdown_s or extra / (cfg.micro_batch * cfg.accum)
    if cfg.inject == "comm":
        pad = cfg.comm_pad_mb or extra * allreduce_bytes_per_s / MIB
    if cfg.inject in ("host", "straggler"):
        stall = cfg.host_stall_s or extra
    return slow, pad, stall


def stalls_here(cfg, rank: int, world_size: int) -> bool:
    """Whether this rank blocks in a host or straggler injection. Taught in chapter 14."""
    if cfg.inject == "host":
        return True
    if cfg.inject == "straggler":
        slow = world_size - 1 if cfg.straggler_rank is None else cfg.straggler_rank
        if slow >= world_size:
            raise ValueError(f"straggler_rank={slow} is not a rank of this run; use 0..{world_size - 1}")
        return rank == slow
    return False


def busy_compute(seconds: float, device) -> int:
    """Spend ``seconds`` of wall time in 256×256 matrix multiplies (operators a trace sees as compute): the
    ``straggler_by="compute"`` injection on a GPU. Returns how many ran. Taught in chapter 9 (the critical path)."""
    import torch

    a = torch.randn(256, 256, device=device)
    n, t_end = 0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        a = torch.tanh(a @ a)
        n += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n


def compute_work(n: int, device) -> int:
    """``n`` of :func:`busy_compute`'s 256×256 multiplies (ops a trace sees as compute), however long they take:
    the ``straggler_by="compute"`` injection on a CPU, where :func:`stall_reps` sizes ``n``. Returns ``n``.
    Taught in chapter 9."""
    import torch

    from labkit import checks

    n = checks.count("n", n, at_least=0)
    a = torch.randn(256, 256, device=device)
    for _ in range(n):
        a = torch.tanh(a @ a)
    return n


HOST_UNIT = 4096         # pure-Python iterations in one unit of host work (≈ 0.1–0.3 ms on the course's CPUs)


def host_work(units: int) -> int:
    """``units`` × :data:`HOST_UNIT` pure-Python iterations: work on the host thread in no torch op, which a
    trace shows as host time outside any op (the host stall on a CPU; :func:`stall_reps` sizes ``units``).
    Returns a checksum, so the loop is not skipped. Taught in chapter 14."""
    from labkit import checks

    x = 0
    for _ in range(checks.count("units", units, at_least=0)):
        for i in range(HOST_UNIT):
            x ^= i
    return x


def stall_reps(cfg, stall_s: float, device) -> int:
    """Work units that take the host or straggler block's ``stall_s`` seconds on this machine now: one
    unit's wall time (:func:`host_work`, or :func:`compute_work` for ``straggler_by="compute"``) is the median
    of three blocks of 8, timed beside the clean steps, so the units are sized under the same load. The block
    then grows with the machine's load as the step does, where a sleep or a deadline would shrink to a
    sliver of a step slowed after the calibration. 0 (keep the wall-time block) on a GPU, where the host's
    load does not set the step's time, with a fixed ``host_stall_s``, and for the data and link stragglers.
    Taught in chapter 14."""
    import statistics

    if (device.type == "cuda" or cfg.host_stall_s or stall_s <= 0 or cfg.inject not in ("host", "straggler")
            or (cfg.inject == "straggler" and cfg.straggler_by not in ("host", "compute"))):
        return 0
    if cfg.inject == "straggler" and cfg.straggler_by == "compute":
        def unit(k):
            return compute_work(k, device)
    else:
        unit = host_work
    unit(2)                                                     # warm the kernel / the loop
    per = []
    for _ in range(3):
        t0 = time.perf_counter()
        unit(8)
        per.append((time.perf_counter() - t0) / 8)
    return max(1, round(stall_s / max(statistics.median(per), 1e-9)))


def calibrate(cfg, clean_step, device) -> tuple[float, float, float, int]:
    """Time two clean steps (``clean_step()``) and one all-reduce on every rank, agree on the sizes
    (the largest over ranks, so every rank pads the same) and return :func:`size_injection`'s triple and
    :func:`stall_reps`' count of work units for the host or compute block (0: the block is a wall time)."""
    import time

    import torch
    import torch.distributed as dist

    def timed(fn):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    t_clean = [timed(clean_step) for _ in range(2)][-1]
    bw = float("inf")
    if dist.is_initialized() and dist.get_world_size() > 1:
        buf = torch.zeros(_n_params(cfg), device=device)     # the size of the fp32 gradients
        dist.barrier()
        t_ar = torch.tensor([timed(lambda: dist.all_reduce(buf))], dtype=torch.float64, device=device)
        # the bandwidth from the rank that arrived last (the others' time includes waiting for it)
        dist.all_reduce(t_ar, op=dist.ReduceOp.MIN)
        bw = buf.numel() * 4 / max(float(t_ar[0]), 1e-6)
    slow, pad, stall = size_injection(cfg, t_clean, bw if bw != float("inf") else 0.0)
    reps = stall_reps(cfg, stall, device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        knobs = torch.tensor([slow, pad, stall, reps], dtype=torch.float64, device=device)
        dist.all_reduce(knobs, op=dist.ReduceOp.MAX)
        slow, pad, stall, reps = float(knobs[0]), float(knobs[1]), float(knobs[2]), int(knobs[3])
    return slow, pad, stall, reps


def block(cfg, stall_s: float, reps: int, device) -> None:
    """The host or straggler block of one step (outside every meter phase): ``reps`` work units if
    :func:`stall_reps` sized them, else ``stall_s`` of wall time (a sleep; matrix multiplies for
    ``straggler_by="compute"``). Taught in chapter 14."""
    compute = cfg.inject == "straggler" and cfg.straggler_by == "compute"
    if reps:
        compute_work(reps, device) if compute else host_work(reps)
    elif compute:
        busy_compute(stall_s, device)
    else:
        time.sleep(stall_s)


WORK_SIDE = 128          # the work injection's matrices: 128×128 fp32, 2·128³ ≈ 4.2 MFLOP per multiply


def work_flops(n_matmuls: int) -> int:
    """FLOPs of the ``inject="work"`` injection's ``n_matmuls`` multiplies (2·n³ each, n = 128). Chapter 28."""
    return 2 * WORK_SIDE ** 3 * int(n_matmuls)


def do_work(n_matmuls: int, device):
    """The work injection's extra compute: ``n_matmuls`` multiplies of 128×128 fp32 matrices on ``device``
    (an averaging matrix, so the values stay bounded), one profiler op ``inject:work``. Returns the result
    (callers may ignore it). Taught in chapter 28 and lab 11 (a regression of known size)."""
    import torch
    from torch.profiler import record_function

    with record_function("inject:work"):
        a = torch.full((WORK_SIDE, WORK_SIDE), 1.0 / WORK_SIDE, device=device)
        b = torch.ones(WORK_SIDE, WORK_SIDE, device=device)
        for _ in range(int(n_matmuls)):
            b = a @ b
    return b


def size_work(cfg, clean_step, device) -> int:
    """Multiplies per step (:func:`do_work`) that make ``inject="work"`` add ``inject_share`` of a step:
    share / (1 − share) × the median of three clean steps ÷ the seconds of one multiply (timed over a block of
    64), both in this process's CPU seconds on a CPU (the neighbours' load cancels) and in wall seconds between
    synchronisations on a GPU; the largest over ranks, so every rank does the same work. ``cfg.work_matmuls`` > 0
    is used as given. Taught in chapter 28 and lab 11."""
    import statistics

    import torch
    import torch.distributed as dist

    if cfg.work_matmuls:
        return int(cfg.work_matmuls)
    cuda = device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time

    def timed(fn):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = clock()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        return clock() - t0

    clean = statistics.median(timed(clean_step) for _ in range(3))
    do_work(8, device)                                          # warm the kernel
    per = statistics.median(timed(lambda: do_work(64, device)) for _ in range(3)) / 64
    n = max(1, round(cfg.inject_share / (1 - cfg.inject_share) * clean / max(per, 1e-9)))
    if dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([n], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        n = int(t[0])
    return n


@contextlib.contextmanager
def rewound(model, opt, scaler=None, logs=()):
    """Run the block, then put the run back where it was before it: the model's parameters and buffers,
    the optimizer's state (Adam's moments and step count), the loss scaler, torch's random-number state,
    and the length of each list in ``logs``. :func:`calibrate` trains two real steps to time them; inside
    this block an injected run still starts from the same weights as its clean twin, so their losses can be
    compared step by step (chapter 25). The caller restarts its batch iterator. Taught in chapter 14."""
    import torch

    tensors = [t for t in (*model.parameters(), *model.buffers())]
    saved = [t.detach().clone() for t in tensors]
    opt_state = copy.deepcopy(opt.state_dict())
    scaler_state = copy.deepcopy(scaler.state_dict()) if scaler is not None else None
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    lengths = [len(log) for log in logs]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, v in zip(tensors, saved, strict=True):
                t.copy_(v)
        opt.load_state_dict(opt_state)
        for p in model.parameters():
            p.grad = None
        if scaler is not None:
            scaler.load_state_dict(scaler_state)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        for log, n in zip(logs, lengths, strict=True):
            del log[n:]

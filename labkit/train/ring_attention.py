"""Ring attention: causal self-attention of one long sequence split over the ranks of a context-parallel group.

Each of the ``cp`` ranks holds the queries, keys and values of its own tokens only. The keys and values travel
round the ring — at each of the cp steps every rank sends the K/V block it holds to its right neighbour and
receives its left neighbour's — and each rank folds the block it holds into its queries' output with the
*online softmax* (a running maximum m, a running denominator and an output accumulator, rescaled by
exp(m_old − m_new) when the maximum grows: Milakov & Gimelshein 2018, *Online normalizer calculation for
softmax*; the same recurrence as FlashAttention, Dao et al. 2022, Algorithm 1). After cp steps every query has
seen every key once, and ``acc / l`` is exactly softmax(QKᵀ/√d)·V (Liu, Zaharia & Abbeel 2023, *Ring Attention
with Blockwise Transformers for Near-Infinite Context*, §3). No rank ever holds the whole sequence's K/V or a
score matrix larger than (T/cp)².

The sequence is cut into 2·cp equal chunks. **Causal load balancing** (Megatron-LM's context parallelism;
Brandon et al. 2023, *Striped Attention*, discuss the same imbalance): with contiguous halves, rank r holds
chunks 2r and 2r+1, and under the causal mask the last rank's queries see every key while rank 0's see almost
none — rank cp−1 does (4cp−1)/3 times rank 0's work and the ring waits for it at each step. With balancing,
rank r holds chunks r and 2cp−1−r (one early, one late), and every rank computes the same 2cp+1 chunk pairs
(:func:`chunk_pairs`). Chunk pairs a query cannot see at all are skipped.

The ring shift is an autograd function (``RingShift``): its backward sends the gradients of K and V
back the other way round the ring, so autograd differentiates the loop as written. Autograd keeps each
step's probabilities for backward — this is the readable form, not the memory-lean one (FlashAttention
recomputes them).

Taught in chapter 26 (long sequences and MoE).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pandas as pd

from labkit import checks

__all__ = ["ring_attention", "chunk_ids", "positions", "chunk_pairs", "kv_bytes_per_step", "check_rank", "run_check",
           "run_checks", "RingCheck"]


_COMM_LOG = None   # a list while :func:`check_rank` measures the transfers


def _sendrecv(x, group, step: int):
    """Send ``x`` to the rank ``step`` places round the ring and receive from the rank ``step`` places back."""
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    n, r = dist.get_world_size(group), dist.get_rank(group)
    out = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x.contiguous(), dist.get_global_rank(group, (r + step) % n), group),
           dist.P2POp(dist.irecv, out, dist.get_global_rank(group, (r - step) % n), group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    if _COMM_LOG is not None:        # chapter 26's measurement: each transfer's wall time and bytes
        _COMM_LOG.append({"bytes": x.numel() * x.element_size(), "s": time.perf_counter() - t0})
    return out


def _shift_class():
    import torch

    class RingShift(torch.autograd.Function):
        """Forward: send to the right neighbour, receive from the left. Backward: the gradient goes the
        other way (sent left, received from the right). Taught in chapter 26."""

        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return _sendrecv(x, group, +1)

        @staticmethod
        def backward(ctx, grad):
            return _sendrecv(grad, ctx.group, -1), None

    return RingShift


_RING_SHIFT = []   # the autograd function, built on first use (torch is imported lazily)


def _shift(x, group):
    """K or V passed one place round the ring, differentiably (backward passes the gradient back)."""
    if not _RING_SHIFT:
        _RING_SHIFT.append(_shift_class())
    return _RING_SHIFT[0].apply(x, group)


def ring_attention(q, k, v, pos, group, *, chunks: int = 2, log: list | None = None):
    """Causal attention of this rank's ``q, k, v`` (batch, heads, T/cp, head_dim) over the whole sequence of
    the ``group``'s ranks; ``pos`` (T/cp,) are the global positions of this rank's tokens, ``chunks`` equal
    chunks of them (:func:`positions`). ``log`` gets one dict per ring step (chunk pairs computed, bytes
    received). Taught in chapter 26."""
    import torch

    c = q.shape[2] // chunks                                    # tokens per chunk
    qs, qpos = q.split(c, dim=2), pos.split(c)
    m = [torch.full_like(x[..., :1], float("-inf")) for x in qs]   # running max of each query row
    den = [torch.zeros_like(x[..., :1]) for x in qs]            # running softmax denominator
    acc = [torch.zeros_like(x) for x in qs]                     # running numerator · V
    kv, kpos, n = torch.stack((k, v)), pos, torch.distributed.get_world_size(group)
    for step in range(n):
        if step:                                                # pass K, V (and their positions) to the right
            kv, kpos = _shift(kv, group), _sendrecv(kpos, group, +1)
        pairs = 0
        for i, (qi, qp) in enumerate(zip(qs, qpos, strict=True)):
            for kj, vj, kp in zip(kv[0].split(c, dim=2), kv[1].split(c, dim=2), kpos.split(c), strict=True):
                if qp[-1] < kp[0]:
                    continue                                    # every key after every query: masked out
                s = (qi @ kj.transpose(-2, -1)) / math.sqrt(q.shape[-1])
                s = s.masked_fill(qp[:, None] < kp[None, :], float("-inf"))
                m_new = torch.maximum(m[i], s.amax(-1, keepdim=True))
                p = torch.exp(s - m_new)                        # this block's weights, on the new scale
                scale = torch.exp(m[i] - m_new)                 # the old sums, rescaled to the new max
                den[i] = scale * den[i] + p.sum(-1, keepdim=True)
                acc[i] = scale * acc[i] + p @ vj
                m[i] = m_new
                pairs += 1
        if log is not None:
            log.append({"step": step, "pairs": pairs, "bytes_in": step and kv.numel() * kv.element_size()})
    # each shift's backward is a send/recv every rank must join: tie the last block in with weight 0, so
    # autograd runs the whole chain of shifts backwards even where the causal mask skipped that block
    return torch.cat([a / d for a, d in zip(acc, den, strict=True)], dim=2) + 0.0 * kv.sum()


#: The largest context-parallel group these helpers take (chunk_pairs lists 2·cp chunks per rank: cp² work)
MAX_CP = 4096


def chunk_ids(rank: int, cp: int, balanced: bool = True) -> tuple[int, int]:
    """The two of the 2·cp sequence chunks rank ``rank`` holds: (r, 2cp−1−r) balanced, (2r, 2r+1) contiguous.
    Taught in chapter 26."""
    cp = checks.count("cp", cp, at_most=MAX_CP)
    rank = checks.count("rank", rank, at_least=0, at_most=cp - 1)
    return (rank, 2 * cp - 1 - rank) if checks.flag("balanced", balanced) else (2 * rank, 2 * rank + 1)


def positions(seq_len: int, cp: int, rank: int, balanced: bool = True):
    """The global positions (a LongTensor of seq_len/cp) of rank ``rank``'s tokens: its two chunks of
    seq_len/(2·cp). Taught in chapter 26."""
    import torch

    seq_len = checks.count("seq_len", seq_len)
    cp = checks.count("cp", cp)
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len={seq_len} is not divisible by 2·cp={2 * cp}: context parallelism cuts the "
                         f"sequence into 2·cp equal chunks (use a multiple of {2 * cp})")
    c = seq_len // (2 * cp)
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in chunk_ids(rank, cp, balanced)])


def chunk_pairs(cp: int, balanced: bool = True) -> list[int]:
    """Per rank, the (query chunk, key chunk) pairs the causal ring computes — pairs whose key chunk is not
    after the query chunk: (4r+3) contiguous, 2cp+1 balanced. Each pair is c² scores (c = seq_len/(2cp)),
    the diagonal ones half masked. Taught in chapter 26."""
    cp = checks.count("cp", cp)
    return [sum(kc <= qc for qc in chunk_ids(r, cp, balanced) for kc in range(2 * cp)) for r in range(cp)]


def kv_bytes_per_step(batch: int, heads: int, seq_len: int, head_dim: int, cp: int, bytes_per_el: int = 4) -> int:
    """Bytes of K and V one rank sends at each of the cp−1 ring steps of one attention forward:
    2 · batch · heads · (seq_len/cp) · head_dim · bytes. Taught in chapter 26."""
    for name, val in (("batch", batch), ("heads", heads), ("seq_len", seq_len), ("head_dim", head_dim),
                      ("cp", cp), ("bytes_per_el", bytes_per_el)):
        checks.count(name, val)
    return 2 * batch * heads * (seq_len // cp) * head_dim * bytes_per_el


def _full_causal(q, k, v):
    """Reference: causal softmax(QKᵀ/√d)·V of the whole sequence on one rank (labkit.kernels.attention's naive form)."""
    from labkit.kernels.attention import attend

    return attend(q, k, v, "naive", causal=True, dropout_p=0.0, training=False)


def check_rank(seq_len: int = 256, *, batch: int = 1, heads: int = 2, head_dim: int = 16, balanced: bool = True,
               repeats: int = 1, sweep_bytes: tuple = (), seed: int = 0) -> dict:
    """One rank of :func:`run_check`: ring attention of this rank's share of a seeded fp32 (q, k, v) against
    full causal attention of the whole sequence, forward and backward; then ``repeats`` timed forward passes
    (this thread's CPU seconds, and each transfer's wall time); then the ring's own send/recv alone at each
    size of ``sweep_bytes`` (the fastest of 7, for an α–β fit). Taught in chapter 26."""
    import torch
    import torch.distributed as dist

    global _COMM_LOG
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    q, k, v, g = (torch.randn(batch, heads, seq_len, head_dim, dtype=torch.float64).float() for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    ref = _full_causal(q, k, v)
    ref.backward(g)
    group, cp, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    pos = positions(seq_len, cp, rank, balanced)
    ql, kl, vl = (t.detach()[:, :, pos].clone().requires_grad_(True) for t in (q, k, v))
    log: list = []
    out = ring_attention(ql, kl, vl, pos, group, log=log)
    out.backward(g[:, :, pos])
    diffs = {"out": (out - ref[:, :, pos]).abs().max().item()}
    for name, local, full in (("dq", ql, q), ("dk", kl, k), ("dv", vl, v)):
        diffs[name] = (local.grad - full.grad[:, :, pos]).abs().max().item()
    cpu, comm = [], []
    with torch.no_grad():
        for _ in range(repeats):
            dist.barrier()
            _COMM_LOG = []
            t0 = time.thread_time()
            ring_attention(ql, kl, vl, pos, group)
            cpu.append(time.thread_time() - t0)
            comm.append(_COMM_LOG)
            _COMM_LOG = None
    sweep = []
    for nbytes in sweep_bytes:
        x, times = torch.zeros(max(1, nbytes // 4)), []
        for _ in range(9):
            t0 = time.perf_counter()
            _sendrecv(x, group, +1)
            times.append(time.perf_counter() - t0)
        sweep.append({"bytes": x.numel() * 4, "s": min(times[2:])})   # 2 warm-up, the least disturbed of 7
    return {"rank": rank, "cp": cp, "balanced": balanced, "sendrecv": sweep, "chunks": list(chunk_ids(rank, cp, balanced)),
            "pairs": sum(row["pairs"] for row in log), "max_abs_diff": diffs, "cpu_s": cpu,
            "comm": [{"bytes": sum(r["bytes"] for r in c), "s": sum(r["s"] for r in c), "transfers": len(c)}
                     for c in comm]}


@dataclass
class RingCheck:
    """What :func:`run_check` found on each rank. Taught in chapter 26."""

    cp: int
    balanced: bool
    ranks: list

    @property
    def max_abs_diff(self) -> float:
        """The largest |ring − full| over ranks, output and the three gradients."""
        return max(max(r["max_abs_diff"].values()) for r in self.ranks)

    def table(self) -> pd.DataFrame:
        """One row per rank: its chunks, chunk pairs computed (and the model's), the median forward CPU time."""
        import statistics

        model = chunk_pairs(self.cp, self.balanced)
        return pd.DataFrame([{"rank": r["rank"], "chunks": tuple(r["chunks"]), "pairs": r["pairs"],
                              "pairs (model)": model[r["rank"]], "fwd CPU ms": 1e3 * statistics.median(r["cpu_s"])}
                             for r in self.ranks]).set_index("rank")


def _check_layouts(seq_len: int, layouts: tuple, kw: dict) -> list:
    """What each rank of :func:`run_checks` runs: :func:`check_rank` once per layout (the send/recv sweep
    with the first only)."""
    return [check_rank(seq_len, balanced=b, **(kw if i == 0 else {**kw, "sweep_bytes": ()}))   # one sweep
            for i, b in enumerate(layouts)]


def run_checks(nprocs: int = 2, seq_len: int = 256, *, layouts=(True, False), timeout_s: float = 120,
               **kw) -> dict:
    """:func:`check_rank` on ``nprocs`` fresh gloo ranks (one thread each), once per layout of ``layouts``
    (True: causally balanced, False: contiguous) in the same ranks; {balanced: RingCheck}. Taught in chapter 26."""
    nprocs = checks.count("nprocs", nprocs, at_least=2)
    positions(seq_len, nprocs, 0)                       # a clear error before any rank starts
    layouts = tuple(layouts)
    for b in layouts:
        checks.flag("layouts[…]", b)
    from labkit.launcher.parent import launch

    res = launch(_check_layouts, nprocs, backend="gloo", args=(seq_len, layouts, kw),
                 env={"OMP_NUM_THREADS": "1"}, timeout_s=timeout_s, stream=False)
    per_rank = sorted(res.values, key=lambda rows: rows[0]["rank"])
    return {b: RingCheck(cp=nprocs, balanced=b, ranks=[rows[i] for rows in per_rank]) for i, b in enumerate(layouts)}


def run_check(nprocs: int = 2, seq_len: int = 256, *, balanced: bool = True, timeout_s: float = 120, **kw) -> RingCheck:
    """:func:`check_rank` on ``nprocs`` fresh gloo ranks for one layout. Taught in chapter 26."""
    checks.flag("balanced", balanced)
    return run_checks(nprocs, seq_len, layouts=(balanced,), timeout_s=timeout_s, **kw)[balanced]

"""A slow link between "nodes" of ranks on one machine: ``TrainConfig(ranks_per_node=…, inter_node_gbit_s=…)``.

On one CPU every gloo rank talks over loopback, so there is no slow network to scale out over. This
injects one: consecutive ranks ``ranks_per_node`` at a time form a "node", and every DDP gradient
bucket whose data-parallel group spans more than one node is held back, before its all-reduce, by the
time a flat ring all-reduce of the bucket's bytes takes when its slowest hop is an
``inter_node_gbit_s`` link (:func:`labkit.comm.ring_time` with α = 0, β = 8 / (Gb/s · 10⁹) s per byte: a
ring step waits for its slowest hop, as NCCL's flat rings do — Thakur, Rabenseifner & Gropp 2005).
Buckets inside one node pay nothing extra.

Where the delay sits: by default the bucket's hook sleeps on the training thread before launching the
all-reduce, so the link blocks the backward pass (no overlap; a profiler trace counts that sleep inside the
``AccumulateGrad`` op that fired the bucket, i.e. as compute). ``link_overlap=True`` sleeps instead on the
communication thread as the bucket's all-reduce completes (one bucket at a time: one link), so backward
keeps running while the link is busy and the trace shows the time as communication — what a real
network transfer looks like (lab 12's communication mystery).

It charges the **data-parallel gradient traffic** only (a DDP communication hook). Tensor- and
pipeline-parallel traffic is not charged, so a layout whose TP or PP group would span nodes is refused
(put TP and PP inside a node — the fix chapter 29 measures); under accumulation with ``no_sync`` the
buckets of the non-last micro-batches are not all-reduced and pay nothing, as on a real cluster.

The same hook on one rank only is chapter 9's slow-link straggler (``TrainConfig(inject="straggler",
straggler_by="link")``, :func:`install_straggler`): that rank's buckets cross its link in the overlap form, over a
bandwidth chosen (:func:`slow_straggler_link`) so that one step's gradient bytes add what the other straggler
kinds add — its collectives end after the others', which is what the cross-rank critical path reads.

``report()`` is what the rank's run record keeps under ``extra["slow_link"]``: buckets delayed and the
seconds injected. Taught in chapter 29 (case review: more GPUs, slower training).
"""
from __future__ import annotations

import threading
import time

from labkit import checks

__all__ = ["check_config", "node_of", "spans_nodes", "delay_s", "install", "report", "check_layout",
           "install_straggler", "slow_straggler_link"]

_STATE = {"buckets": 0, "bytes": 0, "injected_s": 0.0, "spans": False, "straggler": False}


def check_config(cfg, bad) -> None:
    """``ranks_per_node`` and ``inter_node_gbit_s`` come together, with ``parallel="ddp"`` and no other DDP
    communication hook (the link is one). Taught in chapter 29."""
    a, b = cfg.ranks_per_node, cfg.inter_node_gbit_s
    checks.flag("TrainConfig.link_overlap", cfg.link_overlap)
    if a is None and b is None:
        if cfg.link_overlap:
            bad("link_overlap", "it places the slow inter-node link's delay: set ranks_per_node and inter_node_gbit_s")
        return
    if a is None or b is None:
        bad("inter_node_gbit_s" if b is None else "ranks_per_node",
            "a slow inter-node link needs both ranks_per_node (ranks per 'node') and inter_node_gbit_s (the link)")
    checks.count("TrainConfig.ranks_per_node", a)
    checks.positive("TrainConfig.inter_node_gbit_s", b)
    if cfg.parallel != "ddp":
        bad("parallel", "the slow inter-node link delays DDP gradient buckets: use parallel='ddp' with it")
    if cfg.comm_hook is not None:
        bad("comm_hook", "the slow inter-node link is itself a DDP communication hook: use comm_hook=None with it")


def node_of(rank: int, ranks_per_node: int) -> int:
    """The "node" of a rank: consecutive ranks, ``ranks_per_node`` per node. Taught in chapter 29."""
    return checks.count("rank", rank, at_least=0) // checks.count("ranks_per_node", ranks_per_node)


def spans_nodes(ranks, ranks_per_node: int) -> bool:
    """Whether a group of global ranks sits on more than one "node". Taught in chapter 29."""
    return len({node_of(r, ranks_per_node) for r in ranks}) > 1


def delay_s(nbytes: float, group_size: int, gbit_s: float) -> float:
    """Seconds a flat ring all-reduce of ``nbytes`` over ``group_size`` ranks spends on an ``gbit_s`` link
    (bandwidth term only: 2(n−1)/n · S · β). Taught in chapter 29."""
    from labkit.comm.models import ring_time

    n = checks.count("group_size", group_size)
    if n == 1:
        return 0.0
    return ring_time("all_reduce", checks.nonneg("nbytes", nbytes), n, alpha=0.0,
                     beta=8.0 / (checks.positive("gbit_s", gbit_s) * 1e9))


def check_layout(cfg, n: int) -> None:
    """Refuse a layout whose TP or PP group spans "nodes" (that traffic is not charged) and a world that is
    not whole nodes. Taught in chapter 29."""
    g = cfg.ranks_per_node
    if n % g:
        raise ValueError(f"ranks_per_node={g} does not divide the {n} ranks: the 'nodes' must be whole")
    if g % cfg.tp:
        raise ValueError(f"tp={cfg.tp} does not divide ranks_per_node={g}: a TP group would span 'nodes', and the "
                         "slow link charges DP gradient traffic only; keep TP inside a node")
    if cfg.pp > 1 and g < n:
        raise ValueError(f"pp={cfg.pp} stages span 'nodes' of {g} ranks (pp is the outermost mesh dimension): the slow "
                         "link charges DP gradient traffic only; use pp with ranks_per_node equal to the world size")


def install(ddp, cfg, group=None) -> None:
    """Register the slow link on a DDP model whose data-parallel ``group`` (None = the world) is known: a
    bucket of a group spanning nodes sleeps :func:`delay_s` then all-reduces. Taught in chapter 29."""
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    check_layout(cfg, dist.get_world_size())
    span = spans_nodes(ranks, cfg.ranks_per_node)
    _STATE.update(buckets=0, bytes=0, injected_s=0.0, spans=span, group_size=len(ranks),
                  ranks_per_node=cfg.ranks_per_node, gbit_s=cfg.inter_node_gbit_s, straggler=False)
    ddp.register_comm_hook(group, _hook(len(ranks), lambda: cfg.inter_node_gbit_s if span else None,
                                        cfg.link_overlap))


def _hook(group_size: int, gbit_s, overlap: bool):
    """The slow link's DDP comm hook: each bucket of ``nbytes`` is held back :func:`delay_s` (a ring all-reduce
    of its bytes over ``gbit_s()`` Gb/s; None = no delay) — on the training thread before its all-reduce, or
    with ``overlap`` on the communication thread as the all-reduce completes (one bucket at a time)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    link = threading.Lock()     # overlap: one link, so delayed buckets cross it one after the other

    def hook(pg, bucket):
        buf = bucket.buffer()
        nbytes = buf.numel() * buf.element_size()
        g = gbit_s()
        d = delay_s(nbytes, group_size, g) if g else 0.0
        _STATE["buckets"] += 1
        _STATE["bytes"] += nbytes
        _STATE["injected_s"] += d
        if d and not overlap:
            time.sleep(d)
        fut = default_hooks.allreduce_hook(pg, bucket)
        if not (d and overlap):
            return fut

        def cross(done):        # on the communication thread, as the all-reduce completes: inside its span
            with link:
                time.sleep(d)
            return done.value()

        return fut.then(cross)

    return hook


def install_straggler(ddp) -> None:
    """``TrainConfig(inject="straggler", straggler_by="link")`` (chapter 9): every rank gets the slow link's
    hook with no delay until :func:`slow_straggler_link` gives this rank's link a bandwidth — then its buckets
    are held back on its communication thread, as they complete (the overlap form: the time is spent in its
    collectives, not in its backward). Taught in chapter 9 (the critical path of a job with one slow rank)."""
    import torch.distributed as dist

    n = dist.get_world_size()
    _STATE.update(buckets=0, bytes=0, injected_s=0.0, spans=False, group_size=n, gbit_s=None, straggler=True)
    ddp.register_comm_hook(None, _hook(n, lambda: _STATE["gbit_s"], overlap=True))


def slow_straggler_link(extra_s: float, grad_bytes: float, group_size: int) -> float:
    """Give this rank the link that makes a ring all-reduce of one step's gradients (``grad_bytes``) over
    ``group_size`` ranks take ``extra_s`` seconds: Gb/s = 2(n−1)/n · bytes · 8 / (extra_s · 10⁹) (the inverse of
    :func:`delay_s`). Returns that bandwidth. Taught in chapter 9."""
    checks.positive("extra_s", extra_s)
    n = checks.count("group_size", group_size, at_least=2)
    gbit = 2 * (n - 1) / n * checks.positive("grad_bytes", grad_bytes) * 8 / (extra_s * 1e9)
    _STATE.update(gbit_s=gbit, spans=True, buckets=0, bytes=0, injected_s=0.0)
    return gbit


def report() -> dict:
    """This rank's slow-link counters: buckets all-reduced, their bytes, whether its DP group spans nodes and
    the seconds injected over the whole run. Taught in chapter 29."""
    return dict(_STATE)

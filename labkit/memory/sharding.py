"""What an FSDP knob changes, predicted: the units, the collectives of a step, the bytes each rank sends,
and the parameter bytes a rank holds during and after forward.

**Units.** FSDP all-gathers and reduce-scatters one *unit* at a time: with ``wrap="block"`` each
transformer block is a unit and the root (embeddings tied with the head, the final norm) another —
L + 1 units; with ``wrap="model"`` the whole model is one unit, gathered whole (PyTorch FSDP, Zhao et al.
2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel", §3.2.1, https://arxiv.org/abs/2304.11277).

**Collectives per optimizer step** (U units, k micro-batches accumulated with the gradient sync of the
last only): forward all-gathers every unit of every micro-batch (k·U); backward all-gathers again each
unit that was resharded after forward; each unit reduce-scatters its gradients once (U). FSDP2's
``reshard_after_forward`` (https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html): True →
every unit re-gathered in backward; False → none (FSDP1's SHARD_GRAD_OP, ZeRO-2's communication);
None (torch's default since PR #155319) → True for every unit but the root, which backward needs first;
an int r → every unit, but over a group of r ranks (the parameters were resharded to r ranks after forward).

**Bytes sent per rank per step** (ring collectives, chapter 11's :func:`labkit.comm.models.bus_factor`
with S = the full parameter / gradient bytes): DDP all-reduces the gradients, 2(N−1)/N·S; FULL_SHARD
sends (N−1)/N·S for each of two all-gathers and one reduce-scatter, 3(N−1)/N·S = **1.5× DDP**;
SHARD_GRAD_OP and ZeRO-1/2 one all-gather and one reduce-scatter = DDP's volume (ZeRO §7.2,
https://arxiv.org/abs/1910.02054). An int r sends (r−1)/r·S for its backward all-gather.

**Parameter bytes held** (unsharded parameters registered on a rank): a unit is whole from its
pre-forward until it is resharded; after forward a rank holds the sharded units (1/N), the unsharded
units (reshard False, or the root under None) and the units resharded to r ranks (1/r). Shards follow
FSDP2's dim-0 chunking exactly (:func:`labkit.memory.estimate.model_state_bytes` with a module).

Taught in chapter 20 (FSDP and ZeRO) and lab 6.
"""
from __future__ import annotations

from labkit import checks
from labkit.comm.models import bus_factor
from labkit.memory.estimate import model_state_bytes

__all__ = ["WRAPS", "VOLUME_STRATEGIES", "n_units", "collectives_per_step", "step_volume", "params_held"]

WRAPS = ("block", "model")
#: the collectives of one step (no accumulation) per strategy, as ring ops on the full S bytes
VOLUME_STRATEGIES = {
    "ddp": ("all_reduce",),
    "zero1": ("reduce_scatter", "all_gather"),
    "zero2": ("reduce_scatter", "all_gather"),
    "fsdp_grad_op": ("all_gather", "reduce_scatter"),       # reshard_after_forward=False / SHARD_GRAD_OP
    "fsdp_full": ("all_gather", "all_gather", "reduce_scatter"),   # True / FULL_SHARD / ZeRO-3
}


def _reshard(value):
    """True / False / None / an int ≥ 2, checked (the same rule as TrainConfig.reshard_after_forward)."""
    if value is None or isinstance(value, bool) or (isinstance(value, int) and value >= 2):
        return value
    raise ValueError(f"reshard_after_forward={value!r} is not valid; choose True, False, None or an int >= 2 "
                     "(the group size parameters are resharded to after forward)")


def n_units(n_layers: int, wrap: str = "block") -> int:
    """FSDP units of a GPT of ``n_layers`` blocks: L + 1 per block (and the root), 1 for the whole model.
    Taught in chapter 20."""
    n_layers = checks.count("n_layers", n_layers)
    return n_layers + 1 if checks.one_of("wrap", wrap, WRAPS) == "block" else 1


def collectives_per_step(n_layers: int, *, wrap: str = "block", reshard_after_forward=True, accum: int = 1) -> dict:
    """FSDP2 collectives one rank issues per optimizer step (module docstring): ``all_gather`` (forward +
    backward), ``all_gather_backward``, ``reduce_scatter``; gradient sync on the last micro-batch only.
    Taught in chapter 20 (FSDP knobs counted from a live run)."""
    u = n_units(n_layers, wrap)
    raf = _reshard(reshard_after_forward)
    k = checks.count("accum", accum)
    if raf is False:
        bwd = 0
    elif raf is None:
        bwd = u - 1                     # the root keeps its parameters for backward
    else:
        bwd = u                         # True, or an int: re-gathered over the smaller group
    return {"units": u, "all_gather_forward": k * u, "all_gather_backward": k * bwd,
            "all_gather": k * (u + bwd), "reduce_scatter": u}


def step_volume(strategy: str, n_ranks: int, param_bytes: float, grad_bytes: float | None = None, *,
                reshard_group: int | None = None, ddp_bytes: float | None = None) -> dict:
    """Bytes one rank sends per step for ``strategy`` (a key of :data:`VOLUME_STRATEGIES`) on
    ``n_ranks``: ``param_bytes`` / ``grad_bytes`` = S of the all-gathers / of the gradient collective
    (default: the same). ``reshard_group`` r (FSDP2 int reshard): the backward all-gather runs over r
    ranks. ``vs_ddp`` divides by DDP's all-reduce of ``ddp_bytes`` (default ``grad_bytes``): DDP under
    autocast all-reduces fp32 gradients (4 bytes per parameter, chapter 19) while an FSDP2 bf16 policy
    gathers 2-byte parameters — pass each side's own bytes to compare what really moves.
    Returns {"ops", "sent_bytes", "vs_ddp"}. Taught in chapter 20 (and chapter 13's table)."""
    checks.one_of("strategy", strategy, VOLUME_STRATEGIES)
    n = checks.count("n_ranks", n_ranks)
    p = checks.positive("param_bytes", param_bytes)
    g = p if grad_bytes is None else checks.positive("grad_bytes", grad_bytes)
    d = g if ddp_bytes is None else checks.positive("ddp_bytes", ddp_bytes)
    ops = VOLUME_STRATEGIES[strategy]
    sent, gathers = 0.0, 0
    for op in ops:
        if op == "all_gather":
            gathers += 1
            r = n if (gathers == 1 or reshard_group is None) else checks.count("reshard_group", reshard_group,
                                                                              at_most=n)
            sent += bus_factor(op, r) * p
        else:
            sent += bus_factor(op, n) * g
    ddp = bus_factor("all_reduce", n) * d
    return {"ops": ops, "sent_bytes": sent, "vs_ddp": sent / ddp if ddp else float("nan")}


def _bytes(module, ranks: int, rank: int, unsharded: int = 4) -> float:
    """Parameter bytes of ``module`` a rank holds when sharded over ``ranks`` (exact dim-0 chunks, fp32
    shards); unsharded (``ranks`` = 1) at ``unsharded`` bytes per element (2 under a bf16 policy)."""
    if ranks == 1:
        return model_state_bytes(module, strategy="ddp", precision="fp32").params * unsharded / 4
    return model_state_bytes(module, strategy="zero3", n_ranks=ranks, precision="fp32", rank=rank).params


def params_held(root, blocks, n_ranks: int, *, reshard_after_forward=True, wrap: str = "block",
                rank: int = 0, param_dtype_bytes: int = 4) -> dict:
    """Predicted parameter bytes registered on ``rank``: ``after_forward`` (between forward and
    backward) and ``peak_forward`` (the most while a block runs). ``root``: the model (meta device is
    enough); ``blocks``: its transformer blocks, in order. Root bytes = the model minus its blocks.
    Shards are fp32; gathered parameters take ``param_dtype_bytes`` (2 under
    ``MixedPrecisionPolicy(param_dtype=bf16)``: FSDP2 casts the shard before the all-gather).
    Taught in chapter 20 (FSDP knobs measured live) and lab 6."""
    pb = checks.one_of("param_dtype_bytes", param_dtype_bytes, (2, 4))
    n = checks.count("n_ranks", n_ranks)
    rank = checks.count("rank", rank, at_least=0, at_most=n - 1)
    raf = _reshard(reshard_after_forward)
    checks.one_of("wrap", wrap, WRAPS)
    if isinstance(raf, int) and not isinstance(raf, bool) and (raf > n or n % raf):
        raise ValueError(f"reshard_after_forward={raf} must divide n_ranks={n}")
    blocks = list(blocks)
    full_all = _bytes(root, 1, 0, pb)
    if wrap == "model":             # one unit: whole in forward, then as reshard says
        after = {True: _bytes(root, n, rank), False: full_all, None: full_all}.get(raf)
        if after is None:
            after = _bytes(root, raf, rank % raf)
        return {"after_forward": float(after), "peak_forward": float(full_all)}
    full_b = [_bytes(b, 1, 0, pb) for b in blocks]
    shard_b = [_bytes(b, n, rank) for b in blocks]
    root_full = full_all - sum(full_b)
    root_shard = _bytes(root, n, rank) - sum(shard_b)

    def kept(i):                    # block i after its forward
        if raf is True or raf is None:
            return shard_b[i]
        if raf is False:
            return full_b[i]
        return _bytes(blocks[i], raf, rank % raf)

    peak = max(root_full + sum(kept(j) for j in range(i)) + full_b[i] + sum(shard_b[i + 1:])
               for i in range(len(blocks)))
    if raf is True:
        root_after = root_shard
    elif raf is False or raf is None:
        root_after = root_full
    else:
        root_after = _bytes(root, raf, rank % raf) - sum(_bytes(b, raf, rank % raf) for b in blocks)
    after = root_after + sum(kept(i) for i in range(len(blocks)))
    return {"after_forward": float(after), "peak_forward": float(peak)}

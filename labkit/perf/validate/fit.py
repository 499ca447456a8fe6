"""α–β of each gloo collective a data-parallel wrapper issues, fitted on this machine (issue #15).

DDP issues all-reduces; FSDP2 (torch ≥ 2.4 ``fully_shard``) issues, per unit, ``all_gather_single``
(= ``all_gather_into_tensor``) of the flat parameter shards and ``reduce_scatter_single``
(= ``reduce_scatter_tensor``) of the flat gradients (torch/distributed/fsdp/_fully_shard/
_fsdp_collectives.py). gloo implements these differently from its all-reduce, so one α–β fitted to
an all-reduce sweep misprices them: each collective type gets its own fit, from its own sweep at the
sizes the wrappers issue, never from a training run.

A bare collective is not all an FSDP2 unit costs on N ranks: each unit's cycle — unshard (copy-in of the
shard, all-gather, copy-out into the full parameters) in forward and again in backward, then the
reduce-scatter of the gradients with its own copies, each behind stream/event waits and a rendezvous with
the slowest rank — costs more than the collectives timed alone. :func:`fsdp_unit_cycle` measures that
whole cycle on a synthetic module (Linear layers of given unit sizes, batch 1, negligible compute):
forward + backward per unit on N ranks minus the same on 1 rank (where FSDP2 issues no collective and no
copy), fitted as cost(bytes) = a + b·bytes per unit (:class:`UnitCycle`); :func:`fsdp_cycle_s` prices a
GPT's units with it. The cycle *contains* the all-gathers and reduce-scatters: a prediction that uses it
does not add their α–β seconds too.

Layer 3 (ARCHITECTURE.md): it launches ranks (:func:`labkit.comm.benchmark`, :func:`labkit.launcher.launch`);
the ring model and the fit are :mod:`labkit.comm.models`'. Used by :mod:`labkit.perf.validate`. Taught in
chapter 11 (α–β fits), chapter 19 (DDP) and chapter 20 (FSDP's collectives and its per-unit costs).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["LINK_OPS", "fit_gloo_link", "fit_gloo_links", "CYCLE_UNIT_BYTES", "UnitCycle", "fit_unit_cycle",
           "fsdp_unit_cycle", "fsdp_unit_bytes", "fsdp_cycle_s", "medians_over_rounds"]

#: The collectives fitted by default: all_reduce (DDP's buckets), all_gather and reduce_scatter (FSDP2's units).
LINK_OPS = ("all_reduce", "all_gather", "reduce_scatter")
#: Every op a fit may be asked for: LINK_OPS and send_recv (pipeline stages' point-to-point transfers, issue #24).
_FIT_OPS = (*LINK_OPS, "send_recv")


def _fit_table(table, ops, n: int, stat: str) -> dict:
    """{op: AlphaBeta} from a :func:`labkit.comm.benchmark` table: one ring fit per op of its ``stat``."""
    from labkit import comm

    col = "time_us" if stat == "median" else "p10_us"
    out = {}
    for op in ops:
        t = table[table["op"] == op]
        if t.empty:
            raise ValueError(f"the benchmark table has no rows for op={op!r} (it has {sorted(set(table['op']))})")
        out[op] = comm.fit_alpha_beta(t["size"], t[col] * 1e-6, op, n)
    return out


def fit_gloo_links(nranks: int, ops=LINK_OPS, *, sizes=None, iters: int = 5, stat: str = "p10",
                   timeout_s: float = 300) -> dict:
    """{op: :class:`labkit.comm.AlphaBeta`} — one ring α–β per collective in ``ops`` (of :data:`LINK_OPS`, or
    ``"send_recv"``: a ring of simultaneous sends, for pipeline stages),
    each fitted to its own gloo sweep on ``nranks`` ranks, all ops timed in one launch.

    ``sizes`` in bytes, nccl-tests S (the total buffer: an all-gather's output, a reduce-scatter's input;
    default 64 KiB … 16 MiB ×4, which holds the tiny and small GPTs' DDP buckets and FSDP2 units); ``stat``:
    "p10" (the collective undisturbed; default) or "median". The reduce-scatter fit is of gloo's own
    ``reduce_scatter_tensor``, whatever it runs underneath. Taught in chapter 20 and chapter 11.
    """
    from labkit import comm

    n = checks.count("nranks", nranks, at_least=2)
    checks.one_of("stat", stat, ("median", "p10"))
    ops = [checks.one_of("ops", o, _FIT_OPS) for o in ((ops,) if isinstance(ops, str) else ops)]
    if not ops:
        raise ValueError(f"ops must name at least one of {LINK_OPS}")
    sizes = comm.default_sizes(64 * 1024, 16 * 2**20, 4) if sizes is None else list(sizes)
    t = comm.benchmark(ops, sizes, n, iters=iters, warmup=2, backend="gloo", timeout_s=timeout_s).table
    return _fit_table(t, ops, n, stat)


def fit_gloo_link(nranks: int, *, sizes=None, iters: int = 5, stat: str = "p10", timeout_s: float = 300):
    """α and β (:class:`labkit.comm.AlphaBeta`) of an all-reduce sweep on ``nranks`` gloo ranks
    (:func:`fit_gloo_links` with the all-reduce alone). Taught in chapter 19 (DDP) and chapter 11 (α–β fits).
    """
    return fit_gloo_links(nranks, ("all_reduce",), sizes=sizes, iters=iters, stat=stat,
                          timeout_s=timeout_s)["all_reduce"]


# ----------------------------------------------------------------------------- FSDP2's per-unit cycle
#: Default synthetic unit sizes (fp32 bytes of full parameters): they bracket the tiny GPT's units
#: (blocks ≈ 0.79 MB, root 2.13 MB) and the small GPT's (blocks 3.16 MB, root 4.33 MB).
CYCLE_UNIT_BYTES = (0.5e6, 2e6, 5e6)
_LAYERS_PER_UNIT = 2          # Linear layers per synthetic unit (a unit of several tensors, as a block)


@dataclass(frozen=True)
class UnitCycle:
    """FSDP2's cost per unit and micro-batch on ``nranks`` ranks beyond its 1-rank cost: ``alpha_s`` +
    ``beta_s_per_byte`` × full fp32 unit bytes, fitted to ``cost_s`` (n-rank − 1-rank seconds per unit) at
    ``unit_bytes``. Taught in chapter 20 (FSDP's per-unit costs) and chapter 24 (calibrating a model)."""

    nranks: int
    alpha_s: float
    beta_s_per_byte: float
    unit_bytes: tuple
    cost_s: tuple
    one_rank_s: tuple = ()
    n_rank_s: tuple = ()

    def __post_init__(self):
        _check_cycle(self)

    def cost(self, unit_bytes: float) -> float:
        """Seconds of one unit's cycle of ``unit_bytes`` (≥ 0: a negative fit at tiny sizes is clamped)."""
        return max(0.0, self.alpha_s + self.beta_s_per_byte * checks.positive("unit_bytes", unit_bytes))

    def format(self) -> str:
        pts = ", ".join(f"{b / 1e6:.2f} MB {c * 1e3:.2f} ms" for b, c in zip(self.unit_bytes, self.cost_s, strict=True))
        return (f"FSDP2 unit cycle on {self.nranks} ranks: {self.alpha_s * 1e3:.2f} ms + "
                f"{self.beta_s_per_byte * 1e9:.3f} ns/B per unit and micro-batch (measured: {pts})")


def _check_cycle(c) -> None:
    """A fitted cycle's own invariants (:class:`UnitCycle`, ``tp_cycle.TPCycle``): a count of ranks, α and β
    finite and ≥ 0 (:func:`line_fit` never fits below), a TP group that divides the ranks."""
    who = type(c).__name__
    object.__setattr__(c, "nranks", checks.count(f"{who}.nranks", c.nranks))
    for name in ("alpha_s", "beta_s_per_byte"):
        object.__setattr__(c, name, checks.nonneg(f"{who}.{name}", getattr(c, name)))
    tp = getattr(c, "tp", None)
    if tp is not None and tp != 0:
        checks.count(f"{who}.tp", tp, at_least=2)
        if tp > c.nranks or c.nranks % tp:
            raise ValueError(f"{who}.tp={tp} is not valid on nranks={c.nranks}: a TP group must divide the ranks "
                             f"(use one of {[d for d in range(2, c.nranks + 1) if c.nranks % d == 0]})")


def line_fit(who: str, name: str, sizes, cost_s) -> tuple:
    """(a, b, sizes, costs) of the least-squares line cost = a + b·size through measured costs, checked: one cost
    per size, at least two distinct sizes (the FSDP2 unit cycle and TP's block cycle fit the same way). a, b ≥ 0:
    where the unconstrained line has a negative intercept or slope (noise at small sizes), the non-negative
    least-squares line instead — a cost below 0, or one that falls with size, is no cost model. Taught in
    chapters 20 and 24."""
    import numpy as np

    for what, seq in ((name, sizes), ("cost_s", cost_s)):
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__") or isinstance(seq, dict):
            raise checks.ArgumentTypeError(f"{what} must be a sequence of numbers, got {type(seq).__name__} "
                                           f"{checks.short_repr(seq)}")
    sizes, cost_s = list(sizes), list(cost_s)
    x = [checks.positive(name, v) for v in sizes]
    y = [checks.number("cost_s", c) for c in cost_s]
    if len(x) != len(y) or len(set(x)) < 2:
        raise ValueError(f"{who} needs one cost per size and at least two distinct sizes, got "
                         f"{name}={list(sizes)} and cost_s={list(cost_s)}")
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    b, a = np.polyfit(xs, ys, 1)
    if a >= 0 and b >= 0:
        return float(a), float(b), x, y
    # A cost can neither be negative at size 0 nor fall as the size grows: the least-squares line under
    # α, β ≥ 0 (non-negative least squares; with two parameters its optimum lies on an edge: α = 0 or β = 0).
    # Refusing instead would fail every calibration whose smallest sizes cost ≈ 0 in noise (2 shared cores).
    edges = [(0.0, max(0.0, float(xs @ ys / (xs @ xs)))), (max(0.0, float(ys.mean())), 0.0)]
    a2, b2 = min(edges, key=lambda ab: float(((ab[0] + ab[1] * xs - ys) ** 2).sum()))
    checks.finite_result(f"{who}'s fit", a2 + b2, sizes=list(sizes)[:4], cost_s=list(cost_s)[:4])
    return a2, b2, x, y


def fit_unit_cycle(unit_bytes, cost_s, nranks: int, *, one_rank_s=(), n_rank_s=()) -> UnitCycle:
    """Least-squares line cost = a + b·bytes through the per-unit cycle costs measured at ``unit_bytes``
    (at least two distinct sizes). Taught in chapter 20."""
    a, b, x, y = line_fit("fit_unit_cycle", "unit_bytes", unit_bytes, cost_s)
    held = {}
    for name, seq in (("one_rank_s", one_rank_s), ("n_rank_s", n_rank_s)):
        if isinstance(seq, (str, bytes, dict)) or not hasattr(seq, "__iter__"):
            raise checks.ArgumentTypeError(f"{name} must be a sequence of seconds, got {type(seq).__name__} "
                                           f"{checks.short_repr(seq)}")
        held[name] = tuple(checks.nonneg(name, v) for v in seq)
    return UnitCycle(nranks=checks.count("nranks", nranks), alpha_s=float(a), beta_s_per_byte=float(b),
                     unit_bytes=tuple(x), cost_s=tuple(y), **held)


def _synthetic_units(unit_bytes: float, n_units: int, layers: int = _LAYERS_PER_UNIT):
    """A module of ``n_units`` units, each ``layers`` square bias-free Linear layers holding
    ``unit_bytes`` of fp32 parameters in all, and the width of its input."""
    import torch

    d = max(8, round((unit_bytes / 4 / layers) ** 0.5))
    unit = lambda: torch.nn.Sequential(*(torch.nn.Linear(d, d, bias=False) for _ in range(layers)))  # noqa: E731
    return torch.nn.Sequential(*(unit() for _ in range(n_units))), d


def _cycle_cells(unit_bytes: list, n_units: int, iters: int, warmup: int, batch: int = 1,
                 layers: int = _LAYERS_PER_UNIT) -> list:
    """What each rank runs for the cycle calibration: per size, fully_shard each synthetic unit and the
    root, then time forward + backward of ``batch`` rows (median over ``iters`` after ``warmup``, a barrier
    before each); seconds per unit."""
    import statistics
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out, mesh = [], init_device_mesh("cpu", (dist.get_world_size(),))
    for ub in unit_bytes:
        torch.manual_seed(0)
        model, d = _synthetic_units(ub, n_units, layers)
        for unit in model:
            fully_shard(unit, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        x, times = torch.randn(batch, d), []
        for _ in range(warmup + iters):
            dist.barrier()
            t0 = time.perf_counter()
            model(x).sum().backward()
            times.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        out.append(statistics.median(times[warmup:]) / n_units)
    return out


def fsdp_unit_cycle(nranks: int, unit_bytes=CYCLE_UNIT_BYTES, *, n_units: int = 4, iters: int = 7, warmup: int = 2,
                    batch: int = 1, layers_per_unit: int = _LAYERS_PER_UNIT, timeout_s: float = 300) -> UnitCycle:
    """Measure FSDP2's per-unit cycle on ``nranks`` gloo ranks (:class:`UnitCycle`): a synthetic module of
    ``n_units`` units of each size in ``unit_bytes`` (fp32 bytes; ``layers_per_unit`` square Linear layers each,
    input ``batch`` rows: 1 = negligible compute), every unit
    and the root ``fully_shard``-ed (reshard after forward), forward + backward timed on rank 0 (median of
    ``iters`` after ``warmup``, a barrier before each) on ``nranks`` ranks and on 1 rank (where FSDP2 runs no
    collective); cost = (n-rank − 1-rank) per unit, fitted as a + b·bytes. Two launches, neither of them a
    training run. Taught in chapter 20 (FSDP's per-unit costs) and chapter 24 (calibrating a model).
    """
    from labkit.launcher.parent import launch

    n = checks.count("nranks", nranks, at_least=2)
    sizes = [checks.positive("unit_bytes", b) for b in unit_bytes]
    k, it, wu = checks.count("n_units", n_units), checks.count("iters", iters), checks.count("warmup", warmup, at_least=0)
    shape = (checks.count("batch", batch), checks.count("layers_per_unit", layers_per_unit))
    if len(set(sizes)) < 2:
        raise ValueError(f"unit_bytes must hold at least two distinct sizes to fit a + b·bytes, got {sizes}")
    env = {"OMP_NUM_THREADS": "1"}
    alone = launch(_cycle_cells, 1, args=(sizes, k, it, wu, *shape), env=env, timeout_s=timeout_s, stream=False).value
    many = launch(_cycle_cells, n, args=(sizes, k, it, wu, *shape), env=env, timeout_s=timeout_s, stream=False).value
    cost = [m - a for m, a in zip(many, alone, strict=True)]
    return fit_unit_cycle(sizes, cost, n, one_rank_s=alone, n_rank_s=many)


def fsdp_unit_bytes(model) -> list:
    """Full fp32 bytes of each FSDP2 unit of a GPT as ``labkit.train`` wraps it: one per block, then the
    root (every parameter not in a block: embeddings tied with the head, final norm). Taught in chapter 20."""
    if not hasattr(model, "blocks") or not hasattr(model, "parameters"):
        raise checks.ArgumentTypeError(f"model must be a labkit GPT (with .blocks), got {type(model).__name__}")
    blocks = [sum(p.numel() for p in dict.fromkeys(b.parameters())) * 4 for b in model.blocks]
    total = sum(p.numel() for p in dict.fromkeys(model.parameters())) * 4
    return [*blocks, total - sum(blocks)]


def fsdp_cycle_s(unit_bytes, micro_batches: int, cycle: UnitCycle, *, nranks: int | None = None) -> float:
    """FSDP2's cycle seconds per optimizer step: micro-batches × Σ over units of ``cycle.cost(unit bytes)``.
    It holds the unit's all-gathers and reduce-scatter (do not add their α–β time as well); with
    accumulation the non-syncing micro-batches skip the reduce-scatter but are priced at the full cycle
    (an upper bound). ``nranks``: the rank count priced (checked against the cycle's). Taught in chapter 20."""
    if not isinstance(cycle, UnitCycle):
        raise checks.ArgumentTypeError(f"cycle must be a UnitCycle (fsdp_unit_cycle), got {type(cycle).__name__}")
    if nranks is not None and checks.count("nranks", nranks) != cycle.nranks:
        raise ValueError(f"the unit cycle was measured on {cycle.nranks} ranks, not nranks={nranks}: on shared cores "
                         "it depends on the rank count, measure one per count")
    t = checks.count("micro_batches", micro_batches) * sum(cycle.cost(b) for b in unit_bytes)
    return checks.finite_result("FSDP2 cycle seconds", t, cycle=cycle)


# ----------------------------------------------------------------------------- repeated rounds
def medians_over_rounds(rows, target: float):
    """One row per cell (model, parallel, ranks) of a table of rounds: medians over the rounds of each
    predicted part and of the measured median step, the error of the median prediction against the median
    measurement (``met``: within ``target``), ``meas_spread`` = largest / smallest measured median − 1, and
    ``round_errors``: each round's own error (its prediction against its measurement), in round order.
    Taught in chapter 24 (how far to trust a model: the machine's own noise)."""
    keys = ["model", "parallel", "ranks"]
    parts = ["pred_compute_ms", "pred_comm_ms", "pred_wrapper_ms", "pred_step_ms", "meas_step_ms", "meas_p10_ms",
             "meas_p90_ms", "meas_steps"]
    g = rows.groupby(keys, sort=False)
    t = g[parts].median().reset_index()
    spread = g["meas_step_ms"].agg(lambda x: x.max() / x.min() - 1).reset_index(drop=True)
    t["meas_spread"] = spread.to_numpy()
    t["round_errors"] = [tuple(x) for x in (rows["pred_step_ms"] / rows["meas_step_ms"] - 1).groupby(
        [rows[k] for k in keys], sort=False).agg(list)]
    t["error"] = t["pred_step_ms"] / t["meas_step_ms"] - 1
    t["met"] = t["error"].abs() <= target
    return t

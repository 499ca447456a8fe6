"""The layout planner: enumerate the layouts of a model on a cluster, keep those that fit, rank them.

For every dp × tp × pp × cp = GPUs (tp dividing the heads and, unless allowed, at most the GPUs of a node;
pp at most the layers, uneven stages included while the slowest stage holds at most ``MAX_IMBALANCE`` × the
mean — Llama 3 405B ran PP16 over 126 layers, Dubey et al. 2024 §3.3.2 — its imbalance priced by predict; cp, of ``context_parallel``, dividing the sequence), every ep of ``expert_parallel``
that divides dp and the experts of a MoE model (dense models: ep = 1), every pipeline schedule (``schedule``, and with pp > 1 the interleaved one with
each of ``virtual_stages`` model chunks per stage that divides the layers: a smaller bubble, (p−1)/(v·m),
for v times the pipeline sends), every micro-batch that divides the global batch, every DP strategy and every
recompute policy, and with pp > 1 both rank orders of :data:`labkit.perf.layout.ORDERS` where a TP × CP × PP
block fits a node (PP outermost, or TP × PP inside a node with DP across), :func:`labkit.perf.predict.predict`
gives the step; layouts whose predicted memory
exceeds ``memory_fraction`` of a GPU's memory are set aside with the reason. The rest are ranked by
predicted tokens/s (ties: less memory first). :meth:`Plan.explain` says which term of the step decides
between the winner and the runner-up, and whether keeping TP inside a node mattered.

CP and EP are searched with :func:`labkit.perf.predict.predict`'s simpler models of them (its
assumptions say so): EP by default on a MoE model (it splits the experts for all-to-alls); CP only when
asked (``context_parallel``), since its model leaves out costs that matter at ordinary sequence lengths
(see :func:`plan`); it is for long sequences, where activations ÷ cp decide (chapter 26).

Taught in chapter 24 (choosing a parallel layout) and lab10 (planner).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from labkit import checks
from labkit.perf.layout import ORDERS, RECOMPUTE, SCHEDULES, STRATEGIES, Cluster, Layout
from labkit.perf.predict import TERM_LABELS, TERMS, Prediction, predict, resolve_model

__all__ = ["Plan", "plan"]


MAX_GPUS = 2**24                # 16.7 M GPUs: two orders of magnitude past the largest published job
MAX_IMBALANCE = 1.25            # uneven pipeline stages tried while the slowest stage has at most 25 % more layers


def _divisors(n: int) -> list[int]:
    """Divisors of ``n``, sorted, from its prime factorisation (trial division up to √n, then products
    of prime powers): O(√n) for the factorisation, not O(n) (a scan to n hung on 10**30 GPUs)."""
    factors: dict[int, int] = {}
    m, p = n, 2
    while p * p <= m:
        while m % p == 0:
            factors[p] = factors.get(p, 0) + 1
            m //= p
        p += 1 if p == 2 else 2
    if m > 1:
        factors[m] = factors.get(m, 0) + 1
    divs = [1]
    for prime, k in factors.items():
        divs = [d * prime**e for d in divs for e in range(k + 1)]
    return sorted(divs)


def _stage_imbalance(n_layers: int, chunks: int) -> float:
    """Slowest stage's layers over the mean when ``n_layers`` are split over ``chunks`` model chunks
    (⌈L/c⌉·c/L, as :func:`labkit.perf.predict.predict` prices it)."""
    return -(-n_layers // chunks) * chunks / n_layers


@dataclass(frozen=True)
class Plan:
    """Ranked feasible predictions (best first) and the layouts set aside, with why.

    Taught in chapter 24 (choosing a parallel layout).
    """

    model: str
    cluster: Cluster
    global_batch: int
    seq_len: int
    predictions: tuple
    rejected: tuple                  # (Layout, reason) pairs
    memory_limit: float
    n_layers: int = 0

    @property
    def _layers(self) -> int:
        return self.n_layers or 1

    def best_with(self, **degrees) -> Prediction:
        """The best feasible prediction whose layout has the given degrees (``best_with(pp=16)``); ValueError
        when none has. Taught in chapter 24."""
        for p in self.predictions:
            if all(getattr(p.layout, k) == v for k, v in degrees.items()):
                return p
        raise ValueError(f"no feasible layout of {self.model} with {degrees}: of {len(self.predictions)} feasible "
                         f"layouts none has it ({len(self.rejected)} set aside for memory)")

    @property
    def best(self) -> Prediction:
        if not self.predictions:
            raise ValueError(f"no layout of {self.model} fits {self.cluster.name}: {self._why_none()}")
        return self.predictions[0]

    def _why_none(self) -> str:
        if not self.rejected:
            return "no layout satisfies the divisibility rules (tp | heads, pp <= layers with stages within 25 % of even, micro-batch | batch)"
        return (f"all {len(self.rejected)} candidates were set aside; e.g. {self.rejected[0][0].describe()}: "
                f"{self.rejected[0][1]}")

    def table(self, top: int | None = None):
        """A pandas DataFrame, one row per feasible layout, best first (``top`` rows when given)."""
        import pandas as pd

        rows = []
        for i, p in enumerate(self.predictions[:top] if top else self.predictions, 1):
            lay, t = p.layout, p.terms()
            rows.append({"rank": i, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep,
                         "strategy": lay.strategy,
                         "micro_batch": lay.micro_batch, "micro_batches": p.micro_batches,
                         "recompute": lay.recompute, "tokens_per_s": p.tokens_per_s,
                         "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu, "mfu": p.mfu, "step_s": p.step_s,
                         **{f"{k}_s": t[k] for k in TERMS}, "memory_gib": p.memory["total"] / 2**30})
        return pd.DataFrame(rows)

    def explain(self) -> str:
        """Why the winner beats the runner-up: the term of the step that differs most, the memory, and
        whether TP stays inside a node. Taught in chapter 24."""
        if not self.predictions:
            return f"No feasible layout: {self._why_none()}."
        best, c = self.predictions[0], self.cluster
        out = [f"Best: {best.layout.describe()} — {best.tokens_per_s:,.0f} tokens/s aggregate "
               f"({best.tokens_per_s_per_gpu:,.0f} per GPU), MFU {best.mfu:.1%}, step {best.step_s * 1e3:,.1f} ms, "
               f"{best.memory['total'] / 2**30:.1f} GiB per GPU."]
        if len(self.predictions) > 1:
            run = self.predictions[1]
            tb, tr = best.terms(), run.terms()
            diffs = {k: tr[k] - tb[k] for k in TERMS}
            key = max(diffs, key=diffs.get)
            gap = run.step_s / best.step_s - 1
            out.append(f"Runner-up: {run.layout.describe()} — {run.tokens_per_s:,.0f} tokens/s aggregate "
                       f"({run.tokens_per_s_per_gpu:,.0f} per GPU), {gap:.1%} slower per step.")
            mem_b, mem_r = best.memory["total"] / 2**30, run.memory["total"] / 2**30
            if gap <= 1e-9 and mem_r - mem_b > 0.05:
                out.append(f"A tie in time: the winner ranks first on memory ({mem_b:.1f} vs {mem_r:.1f} GiB per GPU).")
            elif gap <= 1e-9:
                from dataclasses import asdict

                la, lb = asdict(best.layout), asdict(run.layout)
                differ = ", ".join(f"{k} {la[k]} vs {lb[k]}" for k in la if la[k] != lb[k])
                out.append(f"A tie in time and memory ({mem_b:.1f} GiB per GPU each): the model cannot choose between "
                           f"them — they differ only in {differ}, which its terms price the same; choose by what "
                           "the model leaves out (the implementation you trust, its overlap in practice).")
            else:
                out.append(f"Decided by {TERM_LABELS[key]}: {tb[key] * 1e3:,.1f} ms in the winner vs {tr[key] * 1e3:,.1f} "
                           f"ms in the runner-up (step {best.step_s * 1e3:,.1f} vs {run.step_s * 1e3:,.1f} ms)."
                           + _others(diffs, key))
        g = c.gpus_per_node
        cross = [p for p in self.predictions if p.layout.tp > g]
        if best.layout.tp <= g and best.layout.tp > 1:
            out.append(f"TP{best.layout.tp} is kept inside a node: its all-reduces run on the intra-node link "
                       f"({c.intra_bw / 1e9:g} GB/s per GPU) instead of the network ({c.inter_bw / g / 1e9:.3g} GB/s "
                       "per GPU).")
        if cross:
            x = cross[0]
            out.append(f"Best layout with TP across nodes: {x.layout.describe()} — {x.tokens_per_s:,.0f} tokens/s aggregate "
                       f"({x.tokens_per_s_per_gpu:,.0f} per GPU), "
                       f"its TP all-reduces {x.exposed_s.get('tp', 0) / x.step_s:.0%} of the step "
                       f"({best.tokens_per_s / x.tokens_per_s:.2f}× slower than the best).")
        uneven = [p for p in self.predictions if p.layout.pp > 1 and self._layers % (p.layout.pp * p.layout.virtual_stages)]
        if uneven:
            u = uneven[0]
            c = u.layout.pp * u.layout.virtual_stages
            out.append(f"Best with uneven pipeline stages: {u.layout.describe()} — {self._layers} layers over {c} "
                       f"model chunk(s), the slowest holding {-(-self._layers // c)} (compute ×"
                       f"{_stage_imbalance(self._layers, c):.3f}): {u.tokens_per_s:,.0f} tokens/s aggregate, "
                       f"MFU {u.mfu:.1%}.")
        if self.rejected:
            out.append(f"{len(self.rejected)} layout(s) set aside for memory (limit {self.memory_limit / 2**30:.1f} GiB "
                       "per GPU).")
        return "\n".join(out)


def _others(diffs: dict, key: str) -> str:
    rest = [f"{TERM_LABELS[k]} {v * 1e3:+,.1f} ms" for k, v in sorted(diffs.items(), key=lambda kv: -abs(kv[1]))
            if k != key and abs(v) > 1e-6][:3]
    return (" Other differences (runner-up − winner): " + ", ".join(rest) + ".") if rest else ""


def plan(model, cluster: Cluster, *, global_batch: int, seq_len: int | None = None, achievable=0.5,
         method: str = "palm", dtype: str = "bf16", strategies=STRATEGIES, recompute=RECOMPUTE,
         micro_batches=(1, 2, 4, 8), schedule: str = "1f1b", virtual_stages=(2, 4), allow_cross_node_tp: bool = False,
         sequence_parallel: bool = True, flash_attention: bool = True, memory_fraction: float = 0.9,
         n_gpus: int | None = None, context_parallel=(1,), expert_parallel=(1, 2, 4, 8),
         pipeline_parallel=None) -> Plan:
    """Enumerate, predict and rank the layouts of ``model`` on ``cluster`` (module docstring).

    ``n_gpus``: GPUs to use (default all of the cluster). ``strategies``, ``recompute``,
    ``micro_batches``: the choices searched. ``virtual_stages``: model chunks per stage tried with the
    interleaved schedule when pp > 1 (``()``: only ``schedule``). ``allow_cross_node_tp``: also try tp > GPUs per node.
    ``context_parallel`` / ``expert_parallel``: the CP and EP degrees tried where they divide (``(1,)``: none).
    ``pipeline_parallel``: the PP degrees tried (default None: every one that divides the GPUs and splits
    the layers within ``MAX_IMBALANCE``, uneven stages included).
    CP is not searched by default: predict's CP term prices the K/V all-gathers only, not the lower
    achievable fraction of matmuls over s/cp tokens nor causal attention's load imbalance, so on ordinary
    sequence lengths it over-rates CP against TP (on Llama 3 70B over 25 GbE it would pick CP8 over TP8 inside
    a node, where Llama 3 itself used TP8 and CP only for long context: Dubey et al. 2024, Table 4). Give
    ``context_parallel=(1, 2, 4, 8)`` when long sequences make activations the limit.
    ``memory_fraction``: share of a GPU's memory a layout may use (the rest for buffers, fragmentation,
    the CUDA context). Other arguments as :func:`labkit.perf.predict.predict`.

    Taught in chapter 24 (choosing a parallel layout) and lab10.
    """
    if not isinstance(cluster, Cluster):
        raise checks.ArgumentTypeError(f"cluster must be a labkit.perf.Cluster (see labkit.perf.cluster()), got "
                                       f"{type(cluster).__name__} {cluster!r:.60}")
    shape = resolve_model(model, seq_len)
    B = checks.count("global_batch", global_batch)
    world = cluster.n_gpus if n_gpus is None else checks.count("n_gpus", n_gpus, at_most=cluster.n_gpus)
    strategies, recompute = _choices("strategies", strategies, STRATEGIES), _choices("recompute", recompute, RECOMPUTE)
    mbs = tuple(checks.count("micro_batches item", m) for m in _seq("micro_batches", micro_batches))
    checks.one_of("schedule", schedule, SCHEDULES[:2])
    if isinstance(virtual_stages, str) or not isinstance(virtual_stages, (list, tuple)):
        raise checks.ArgumentTypeError(f"virtual_stages must be a list or tuple (may be empty), got "
                                       f"{type(virtual_stages).__name__} {virtual_stages!r:.60}")
    vs = tuple(checks.count("virtual_stages item", v, at_least=2) for v in virtual_stages)
    cps = tuple(checks.count("context_parallel item", c) for c in _seq("context_parallel", context_parallel))
    eps = tuple(checks.count("expert_parallel item", e) for e in _seq("expert_parallel", expert_parallel))
    pps = None if pipeline_parallel is None else \
        {checks.count("pipeline_parallel item", q) for q in _seq("pipeline_parallel", pipeline_parallel)}
    allow = checks.flag("allow_cross_node_tp", allow_cross_node_tp)
    sp = checks.flag("sequence_parallel", sequence_parallel)
    fa = checks.flag("flash_attention", flash_attention)
    if world > MAX_GPUS:
        raise ValueError(f"{world:,} GPUs is not valid for the planner: use at most {MAX_GPUS:,} (n_gpus, or fewer "
                         "nodes in the cluster)" if world < 10**30 else
                         f"a cluster of {checks.short_repr(world)} GPUs is not valid for the planner: use at most "
                         f"{MAX_GPUS:,} (n_gpus, or fewer nodes in the cluster)")
    frac = checks.fraction("memory_fraction", memory_fraction, open_low=True)
    limit = frac * cluster.memory_bytes
    g = cluster.gpus_per_node
    preds, rejected = [], []
    for tp in _divisors(world):
        if shape.n_heads % tp or shape.d_model % tp or (tp > g and not allow):
            continue
        for pp in _divisors(world // tp):
            if pp > shape.n_layers or _stage_imbalance(shape.n_layers, pp) > MAX_IMBALANCE or \
                    (pps is not None and pp not in pps):
                continue
            for cp in sorted({c for c in cps if (world // (tp * pp)) % c == 0 and shape.seq_len % c == 0}):
                dp = world // (tp * pp * cp)
                moe = [e for e in eps if e > 1 and dp % e == 0 and shape.n_experts > 1 and shape.n_experts % e == 0]
                scheds = [(schedule, 1)] + [("interleaved", v) for v in vs if pp > 1 and pp * v <= shape.n_layers
                                            and _stage_imbalance(shape.n_layers, pp * v) <= MAX_IMBALANCE]
                orders = ORDERS if pp > 1 and dp > 1 and tp * cp * pp <= g else ORDERS[:1]
                for mb, ep, order in product(mbs, sorted({1, *moe}), orders):
                    if B % (mb * dp):
                        continue
                    for (sched, v), strat, rc in product(scheds, strategies if dp * cp > 1 else strategies[:1], recompute):
                        lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, strategy=strat, micro_batch=mb, schedule=sched,
                                     virtual_stages=v, recompute=rc, dtype=dtype,
                                     sequence_parallel=sp and tp > 1, flash_attention=fa, order=order)
                        p = predict(shape, lay, cluster, global_batch=B, achievable=achievable, method=method)
                        if p.memory["total"] > limit:
                            rejected.append((lay, f"needs {p.memory['total'] / 2**30:.1f} GiB per GPU > "
                                                  f"{limit / 2**30:.1f} GiB"))
                        else:
                            preds.append(p)
    preds.sort(key=lambda p: (p.step_s, p.memory["total"]))
    return Plan(model=shape.name or "model", cluster=cluster, global_batch=B, seq_len=shape.seq_len,
                predictions=tuple(preds), rejected=tuple(rejected), memory_limit=limit, n_layers=shape.n_layers)


def _seq(name: str, value) -> tuple:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise checks.ArgumentTypeError(f"{name} must be a non-empty list or tuple, got {type(value).__name__} "
                                       f"{value!r:.60}")
    return tuple(value)


def _choices(name: str, value, valid) -> tuple:
    return tuple(checks.one_of(f"{name} item", v, valid) for v in _seq(name, value))

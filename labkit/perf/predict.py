"""Predict a training step of a parallel layout on a cluster: time by term, memory, tokens/s, MFU.

The step of one GPU, for a global batch of B sequences of s tokens, is modelled as::

    step = compute + bubble + exposed(DP) + TP + PP + CP + EP + sync

- **compute**: hardware FLOPs of the step (:func:`labkit.flops.hardware_flops_per_token`: model FLOPs
  plus recomputation) over dp·tp·pp·cp GPUs at an *achievable fraction* of the dense peak
  (:func:`labkit.perf.steptime.compute_time`; PaLM App. B's MFU definition solved for time), times the
  stage imbalance ⌈L/(p·v)⌉·p·v/L when the layers do not split evenly over the pipeline.
- **bubble**: (p−1)/m of the compute for GPipe and 1F1B, (p−1)/(v·m) with the interleaved schedule
  of v virtual stages (Narayanan et al. 2021, SC21, §2.2.1–2.2.2), m micro-batches per step.
- **TP**: Megatron's 2 all-reduces in forward and 2 in backward per layer and micro-batch, each of
  b·s·h activations (Shoeybi et al. 2019 §3; with sequence parallelism a reduce-scatter + all-gather
  pair of the same volume, Korthikanti et al. 2022 §4.2.2), +2 per layer when full recomputation reruns
  the forward. On the link the TP group spans; not overlapped with compute.
- **PP**: per micro-batch and virtual stage one send of activations forward and one of gradients
  backward, b·s·h/t bytes each (the scatter/gather optimisation, Narayanan et al. 2021 §4.1); not overlapped.
- **DP**: DDP all-reduces the gradients once per step; ZeRO-1/2 reduce-scatter gradients and all-gather
  parameters (same volume; Rajbhandari et al. 2020 §7); ZeRO-3/FSDP all-gather parameters in forward
  and again in backward and reduce-scatter gradients, every micro-batch (1.5× DDP's volume per
  micro-batch; Zhao et al. 2023 §3.2.1). Over the dp·cp group (TP innermost): a ring inside a node, the
  two-level model of :func:`labkit.comm.models.hierarchical_time` across nodes. DDP/ZeRO-1/2 hide under
  the backward pass of the last micro-batch (Li et al. 2020 §3.2.3), ZeRO-3/FSDP under all the compute
  (prefetch); :func:`labkit.perf.steptime.step_time` says how much stays exposed.
- **CP**, **EP**: simpler models, said so in the assumptions: CP all-gathers K and V in forward and
  reduce-scatters their gradients in backward per layer (Llama 3's CP, Dubey et al. 2024 §3.3.2); EP
  sends each token's top-k copies in two all-to-alls forward and two backward per MoE layer.

Memory per GPU: model states (:func:`labkit.memory.estimate.model_state_bytes`, ZeRO over dp·cp) of
the parameters one GPU holds (÷ tp·pp, experts ÷ ep), plus activations
(:func:`labkit.memory.estimate.activation_bytes`, Korthikanti et al. 2022) of the micro-batches in flight:
one for no pipeline, p for 1F1B (p stages × L/p layers ≈ the whole model once), m for GPipe, ×(1 + (p−1)/(pv))
interleaved (Narayanan et al. 2021 §2.2.2).

Taught in chapter 24 (choosing a parallel layout), chapter 5 (scaling), chapter 29 (case: 13B over
25 Gb/s Ethernet) and chapter 30 (case: BERT-large).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace

from labkit import checks, flops
from labkit.comm.models import hierarchical_time, ring_time
from labkit.flops import attention_core_flops_per_token
from labkit.memory.estimate import activation_bytes, model_state_bytes, pipeline_in_flight
from labkit.perf.layout import Cluster, Layout
from labkit.perf.steptime import StepParts, compute_time

__all__ = ["Prediction", "predict", "resolve_model", "TERMS", "TERM_LABELS"]

#: The step's terms, in the order :meth:`Prediction.terms` gives them.
TERMS = ("compute", "bubble", "dp", "tp", "pp", "cp", "ep", "sync")
TERM_LABELS = {"compute": "compute", "bubble": "pipeline bubble", "dp": "DP gradients (exposed)",
           "tp": "TP all-reduces", "pp": "PP sends", "cp": "CP all-gathers", "ep": "EP all-to-alls", "sync": "sync"}
_STATE_STRATEGY = {"ddp": "ddp", "zero1": "zero1", "zero2": "zero2", "zero3": "zero3", "fsdp": "fsdp_full"}


@dataclass(frozen=True)
class Prediction:
    """A predicted step: each term's seconds, each collective's full and exposed time, memory per GPU,
    throughput (aggregate and per GPU) and MFU, with the assumptions that produced them.

    ``comm_s``: a collective's total time per step; ``exposed_s``: the part not hidden under compute.
    Taught in chapter 24 (choosing a parallel layout).
    """

    model: str
    layout: Layout
    cluster: Cluster
    global_batch: int
    seq_len: int
    micro_batches: int
    achievable: float
    peak_flops: float
    model_flops_per_token: float
    hardware_flops_per_token: float
    compute_s: float
    bubble_s: float
    comm_s: dict
    exposed_s: dict
    sync_s: float
    memory: dict
    assumptions: tuple = field(default=())
    ideal_compute_s: float | None = None    # compute with even stages (fp8: GEMMs and attention at their peaks)

    def terms(self) -> dict:
        """Seconds of each term of the step (:data:`TERMS`); they add up to :attr:`step_s`."""
        return {"compute": self.compute_s, "bubble": self.bubble_s,
                **{k: self.exposed_s.get(k, 0.0) for k in ("dp", "tp", "pp", "cp", "ep")}, "sync": self.sync_s}

    @property
    def step_s(self) -> float:
        return sum(self.terms().values())

    @property
    def n_gpus(self) -> int:
        return self.layout.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def tokens_per_s(self) -> float:
        """Aggregate tokens/s of the whole job (all GPUs)."""
        return self.tokens_per_step / self.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Tokens/s of the job divided by its GPUs."""
        return self.tokens_per_s / self.n_gpus

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs per second per GPU over the dense peak."""
        return self.tokens_per_s_per_gpu * self.model_flops_per_token / self.peak_flops

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: as :attr:`mfu` with recomputation counted."""
        return self.tokens_per_s_per_gpu * self.hardware_flops_per_token / self.peak_flops

    @property
    def efficiency(self) -> float:
        """Tokens/s per GPU as a fraction of what the compute alone allows at this achievable fraction
        (1 = every second is evenly split useful compute): ideal compute time / step time."""
        if self.ideal_compute_s is not None:
            return self.ideal_compute_s / self.step_s
        ideal = self.tokens_per_step * self.hardware_flops_per_token / (self.n_gpus * self.peak_flops * self.achievable)
        return ideal / self.step_s

    @property
    def fits(self) -> bool:
        """Whether the predicted memory per GPU fits in the cluster's memory per GPU."""
        return self.memory["total"] <= self.cluster.memory_bytes

    def as_dict(self) -> dict:
        return {"model": self.model, "layout": self.layout.describe(), "cluster": self.cluster.name,
                "n_gpus": self.n_gpus, "global_batch": self.global_batch, "seq_len": self.seq_len,
                "micro_batches": self.micro_batches, "achievable": self.achievable,
                "peak_flops": self.peak_flops, "step_s": self.step_s, "terms_s": self.terms(),
                "comm_s": dict(self.comm_s), "exposed_s": dict(self.exposed_s),
                "tokens_per_s": self.tokens_per_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "mfu": self.mfu, "hfu": self.hfu, "efficiency": self.efficiency, "memory_bytes": dict(self.memory),
                "memory_limit_bytes": self.cluster.memory_bytes, "fits": self.fits,
                "assumptions": list(self.assumptions)}

    def table(self) -> str:
        """The breakdown as text: each term in ms and % of the step, throughput, MFU, memory, assumptions."""
        step = self.step_s
        out = [f"{self.model} on {self.cluster.name} ({self.n_gpus} GPUs): {self.layout.describe()}",
               f"global batch {self.global_batch} × {self.seq_len} tokens, {self.micro_batches} micro-batch(es) "
               f"per DP rank; compute at {self.achievable:.0%} of {self.peak_flops / 1e12:g} TFLOP/s "
               f"({self.layout.dtype} dense peak)",
               f"  {'term':<26}{'ms':>12}{'% step':>8}{'full ms':>12}"]
        for k, v in self.terms().items():
            if k in ("tp", "pp", "cp", "ep") and k not in self.comm_s:
                continue
            full = f"{self.comm_s[k] * 1e3:>12.2f}" if k in self.comm_s else ""
            out.append(f"  {TERM_LABELS[k]:<26}{v * 1e3:>12.2f}{v / step:>8.1%}{full}")
        out += [f"  {'step':<26}{step * 1e3:>12.2f}{1:>8.0%}",
                f"throughput {self.tokens_per_s:,.0f} tokens/s aggregate = {self.tokens_per_s_per_gpu:,.0f} "
                f"tokens/s per GPU; MFU {self.mfu:.1%}, HFU {self.hfu:.1%}; efficiency {self.efficiency:.1%} of "
                "compute-bound",
                f"memory per GPU {self.memory['total'] / 2**30:.1f} GiB (model states "
                f"{self.memory['model_states'] / 2**30:.1f}, activations {self.memory['activations'] / 2**30:.1f})"
                f" of {self.cluster.memory_bytes / 2**30:.0f} GiB: {'fits' if self.fits else 'DOES NOT FIT'}",
                "assumptions:", *(f"  - {a}" for a in self.assumptions)]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


def resolve_model(model, seq_len: int | None = None):
    """A :class:`labkit.flops.ModelShape` from a ModelShape, a :func:`labkit.flops.preset` name or a
    ``transformers`` config (object, dict or config.json path, via :func:`labkit.model.shapes.from_hf_config`),
    with ``seq_len`` when given. Taught in chapter 24 (choosing a parallel layout)."""
    if seq_len is not None:
        seq_len = checks.count("seq_len", seq_len)
    if isinstance(model, flops.ModelShape):
        shape = model
    elif isinstance(model, str) and model in flops.presets():
        shape = flops.preset(model)
    elif isinstance(model, dict) or hasattr(model, "to_dict") or (isinstance(model, str) and
                                                                   model.endswith(".json")):
        from labkit.model.shapes import from_hf_config

        shape = from_hf_config(model, seq_len=seq_len)
    else:
        raise ValueError(f"model={model!r:.80} is not valid: give a labkit.flops.ModelShape, a preset name "
                         f"({', '.join(flops.presets())}) or a transformers config")
    return shape if seq_len is None else replace(shape, seq_len=seq_len)


def _achievable(achievable, dtype: str) -> float:
    if isinstance(achievable, dict):
        if dtype not in achievable:
            raise ValueError(f"achievable={achievable!r} has no fraction for dtype={dtype!r}; give one per dtype "
                             f"used (keys {sorted(achievable)}) or one number")
        achievable = achievable[dtype]
    if isinstance(achievable, bool) or not isinstance(achievable, numbers.Real):
        raise checks.ArgumentTypeError(f"achievable must be a fraction in (0, 1] or a dict {{dtype: fraction}}, "
                                       f"got {type(achievable).__name__} {achievable!r:.60}")
    return checks.fraction("achievable", achievable, open_low=True)


class _Links:
    """Times of collectives on a cluster for a group given by its global ranks (:meth:`Layout.group_ranks`)."""

    def __init__(self, c: Cluster):
        self.c = c

    def group(self, op: str, size: float, ranks: list) -> float:
        c, g, n = self.c, self.c.gpus_per_node, len(ranks)
        if n == 1 or size == 0:
            return 0.0
        if not self.spans_nodes(ranks):                    # the whole group inside one node
            return ring_time(op, size, n, alpha=c.intra_alpha_s, beta=c.intra_beta)
        per_node = math.gcd(sum(r < g for r in ranks), n)  # members per node (the first node's)
        return hierarchical_time(op, size, n, alpha=c.intra_alpha_s, beta=c.intra_beta, ranks_per_node=per_node,
                                 alpha_inter=c.inter_alpha_s, beta_inter=c.inter_beta)

    def spans_nodes(self, ranks: list) -> bool:
        return max(ranks) // self.c.gpus_per_node != min(ranks) // self.c.gpus_per_node

    def send(self, size: float, inter: bool) -> float:
        c = self.c
        a, b = (c.inter_alpha_s, c.inter_beta) if inter else (c.intra_alpha_s, c.intra_beta)
        return ring_time("send_recv", size, 2, alpha=a, beta=b)


def _check_fit(shape, lay: Layout, cl: Cluster, seq: int) -> None:
    if lay.world_size > cl.n_gpus:
        raise ValueError(f"layout needs dp·tp·pp·cp = {lay.world_size} GPUs but cluster {cl.name!r} has "
                         f"{cl.n_gpus} ({cl.nodes} nodes × {cl.gpus_per_node}); use fewer ranks or more nodes")
    if shape.n_heads % lay.tp or shape.d_model % lay.tp:
        raise ValueError(f"tp={lay.tp} is not valid for this model: it must divide n_heads={shape.n_heads} "
                         f"and d_model={shape.d_model}")
    if seq % lay.cp:
        raise ValueError(f"cp={lay.cp} is not valid: it must divide seq_len={seq}")
    if lay.pp * lay.virtual_stages > shape.n_layers:
        raise ValueError(f"pp={lay.pp} × virtual_stages={lay.virtual_stages} is not valid: at most "
                         f"n_layers={shape.n_layers} model chunks")
    if lay.ep > 1 and (shape.n_experts == 1 or shape.n_experts % lay.ep):
        raise ValueError(f"ep={lay.ep} is not valid: it must divide n_experts={shape.n_experts} (a MoE model)")


def _params_per_gpu(shape, lay: Layout) -> float:
    """Parameters one GPU holds: experts ÷ ep, everything ÷ tp·pp (embeddings assumed split evenly)."""
    total = flops.n_params(shape)
    if shape.n_experts > 1 and lay.ep > 1:
        dense = flops.n_params(replace(shape, n_experts=1, top_k=1))
        experts = (total - dense) * shape.n_experts / (shape.n_experts - 1)   # all experts' MLPs (router ~0)
        total = total - experts + experts / lay.ep
    return total / (lay.tp * lay.pp)


def predict(model, layout: Layout, cluster: Cluster, *, global_batch: int, seq_len: int | None = None,
            achievable=0.5, method: str = "palm", dp_overlap: bool | float = True,
            overlap_window: str = "backward", sync_s: float = 0.0, gemm_shape: bool = False) -> Prediction:
    """Predict one optimizer step of ``layout`` on ``cluster`` (see the module docstring for each term).

    ``model``: a ModelShape, a preset name or a transformers config (:func:`resolve_model`);
    ``global_batch`` in sequences of ``seq_len`` tokens (default: the model's). ``achievable``: the
    fraction of the dense peak that the matmuls reach (one number or ``{dtype: fraction}``) — an
    assumption, printed with the result. ``method``: the FLOP convention (:data:`labkit.flops.METHODS`).
    ``dp_overlap``: how much of the DP communication may hide (True, False or a fraction);
    ``overlap_window``: "backward" (the last micro-batch's backward; all the compute for ZeRO-3/FSDP) or
    "step" (all the compute: chapter 5's step = max(compute, comm) + sync). ``sync_s``: serial seconds
    per step (the optimizer step, the last bucket, barriers). ``gemm_shape``: divide the compute by the
    GEMMs' roofline efficiency at this micro-batch and tp split (:func:`labkit.perf.gemm.shape_efficiency`);
    ``achievable`` is then the math rate of a large GEMM, not the run's average.

    Taught in chapter 24 (choosing a parallel layout), chapter 5 (scaling) and chapters 29–30 (cases).
    """
    if not isinstance(layout, Layout):
        raise checks.ArgumentTypeError(f"layout must be a labkit.perf.Layout, got {type(layout).__name__} "
                                       f"{layout!r:.60}")
    if not isinstance(cluster, Cluster):
        raise checks.ArgumentTypeError(f"cluster must be a labkit.perf.Cluster (see labkit.perf.cluster()), got "
                                       f"{type(cluster).__name__} {cluster!r:.60}")
    shape = resolve_model(model, seq_len)
    lay, cl, s = layout, cluster, shape.seq_len
    B = checks.count("global_batch", global_batch)
    frac = _achievable(achievable, lay.dtype)
    frac16 = _achievable(achievable, "bf16") if lay.dtype == "fp8" else frac
    checks.one_of("method", method, flops.METHODS)
    checks.one_of("overlap_window", overlap_window, ("backward", "step"))
    sync = checks.nonneg("sync_s", sync_s)
    StepParts(0.0, 0.0).step(dp_overlap)                    # checks dp_overlap (True, False or a fraction)
    _check_fit(shape, lay, cl, s)
    per_rank = lay.micro_batch * lay.dp
    if lay.accum is None:
        if B % per_rank:
            raise ValueError(f"global_batch={B} is not a multiple of micro_batch × dp = {lay.micro_batch} × "
                             f"{lay.dp} = {per_rank}: choose a global batch or micro-batch that divides")
        m = B // per_rank
    elif per_rank * lay.accum != B:
        raise ValueError(f"global_batch={B} is not micro_batch × accum × dp = {lay.micro_batch} × {lay.accum} × "
                         f"{lay.dp} = {per_rank * lay.accum}: fix one of them (or leave accum=None)")
    else:
        m = lay.accum
    peak = cl.peak("bf16" if lay.dtype == "fp8" else lay.dtype)     # what MFU divides by (fp8: the bf16 peak)
    world, L, v, p = lay.world_size, shape.n_layers, lay.virtual_stages, lay.pp
    model_fpt = flops.model_flops_per_token(shape, method=method)
    hw_fpt = flops.hardware_flops_per_token(shape, recompute=lay.recompute, method=method)
    layers_gpu = math.ceil(L / (p * v)) * v                 # the slowest stage's layers
    imbalance = layers_gpu * p / L
    if lay.dtype == "fp8":        # the linear layers' GEMMs at the fp8 peak, the attention core at the bf16 one
        attn = attention_core_flops_per_token(shape) * (3 + (lay.recompute != "none"))
        ideal = (compute_time(B * s, flops_per_token=hw_fpt - attn, peak_flops=cl.peak("fp8"), n_devices=world,
                              mfu=frac)
                 + compute_time(B * s, flops_per_token=attn, peak_flops=peak, n_devices=world, mfu=frac16))
    else:
        ideal = compute_time(B * s, flops_per_token=hw_fpt, peak_flops=peak, n_devices=world, mfu=frac)
    eta = 1.0
    if checks.flag("gemm_shape", gemm_shape):
        from labkit.perf.gemm import shape_efficiency

        eta = shape_efficiency(shape, micro_batch=lay.micro_batch, tp=lay.tp, cluster=cl, dtype=lay.dtype,
                               achievable=frac, flash_attention=lay.flash_attention, seq_len=s // lay.cp,
                               recompute=lay.recompute, sequence_parallel=lay.sequence_parallel)
        ideal = ideal / eta
    compute = ideal * imbalance
    t_mb = compute / m                                      # one micro-batch, forward and backward, one stage
    bubble = (p - 1) / v * t_mb
    links = _Links(cl)
    act_b = 4 if lay.dtype in ("fp32", "tf32") else 2                  # fp8: activations and gradients travel in bf16
    s_loc = s // lay.cp
    act = lay.micro_batch * s_loc * shape.d_model * act_b   # b·s·h bytes of one micro-batch's activations
    comm, exposed, notes = {}, {}, []
    if lay.tp > 1:
        n_tp = 4 + (2 if lay.recompute == "full" else 0)
        tpg = lay.group_ranks("tp")
        one = (links.group("reduce_scatter", act, tpg) + links.group("all_gather", act, tpg)
               if lay.sequence_parallel else links.group("all_reduce", act, tpg))
        comm["tp"] = exposed["tp"] = layers_gpu * m * n_tp * one
        where = "across nodes" if links.spans_nodes(tpg) else "inside a node (NVLink)"
        notes.append(f"TP: {n_tp} collectives of b·s·h = {act / 1e6:.3g} MB per layer and micro-batch, "
                     f"{where}, not overlapped with compute")
    if p > 1:
        inter = links.spans_nodes(lay.group_ranks("pp"))   # order "tp-cp-pp-dp": inside a node when it fits
        comm["pp"] = exposed["pp"] = 2 * v * m * links.send(act / lay.tp, inter)
        notes.append(f"PP: 2 sends of b·s·h/t = {act / lay.tp / 1e6:.3g} MB per micro-batch and virtual stage "
                     f"{'across nodes' if inter else 'inside a node'}, not overlapped; bubble (p−1)/(v·m) = "
                     f"{(p - 1) / (v * m):.3f} of compute ({lay.schedule})")
        if imbalance > 1:
            notes.append(f"PP: {L} layers over {p * v} model chunks: the slowest stage holds {layers_gpu}, "
                         f"compute ×{imbalance:.3f}")
    if lay.cp > 1:
        kv = 2 * lay.micro_batch * s * shape.kv_heads * shape.hd * act_b / lay.tp
        n_ag = 2 if lay.recompute == "full" else 1
        cpg = lay.group_ranks("cp")
        t = links.group("all_gather", kv, cpg) * n_ag + links.group("reduce_scatter", kv, cpg)
        comm["cp"] = exposed["cp"] = layers_gpu * m * t
        notes.append("CP (simple model): all-gather of K,V per layer forward, reduce-scatter backward "
                     "(Llama 3), not overlapped with attention")
    if lay.ep > 1:
        n_a2a = 4 + (2 if lay.recompute == "full" else 0)
        t = links.group("all_to_all", act * shape.top_k, lay.group_ranks("ep"))
        comm["ep"] = exposed["ep"] = layers_gpu * m * n_a2a * t
        notes.append(f"EP (simple model): {n_a2a} all-to-alls of b·s·h·top_k per MoE layer, not overlapped; "
                     "no load imbalance")
    n_gpu_params = _params_per_gpu(shape, lay)
    dpg, dranks = lay.dp * lay.cp, lay.group_ranks("cp", "dp")
    if dpg > 1:
        grads = n_gpu_params * act_b
        if lay.strategy in ("zero3", "fsdp"):
            t = m * (2 * links.group("all_gather", grads, dranks) + links.group("reduce_scatter", grads, dranks))
            window, how = compute, "all the compute (prefetch)"
        else:
            t = (links.group("all_reduce", grads, dranks) if lay.strategy == "ddp" else
                 links.group("reduce_scatter", grads, dranks) + links.group("all_gather", grads, dranks))
            bwd_share = (hw_fpt - model_fpt / 3) / hw_fpt   # everything after the first forward
            window, how = t_mb * bwd_share, "the last micro-batch's backward"
        if overlap_window == "step":
            window, how = compute, "all the compute (chapter 5's max(compute, comm))"
        comm["dp"] = t
        exposed["dp"] = max(0.0, StepParts(window, t).exposed_comm(dp_overlap))
        where = "across nodes (two-level)" if links.spans_nodes(dranks) else "inside a node"
        notes.append(f"DP ({lay.strategy}) over {dpg} ranks {where}: {grads / 1e9:.3g} GB of {lay.dtype} "
                     f"gradients per GPU, hiding under {how} (overlap {dp_overlap})")
    states = model_state_bytes(int(round(n_gpu_params)), strategy=_STATE_STRATEGY[lay.strategy], n_ranks=dpg,
                               precision="fp32" if lay.dtype in ("fp32", "tf32") else "bf16_mixed")
    one_mb = activation_bytes(shape, lay.micro_batch, recompute=lay.recompute, tp=lay.tp,
                              sequence_parallel=lay.sequence_parallel, seq_len=s_loc, dtype_bytes=act_b,
                              flash_attention=lay.flash_attention)
    in_flight = pipeline_in_flight(p, m, lay.schedule, v)   # the first stage's peak (memory.estimate)
    acts = one_mb * layers_gpu / L * in_flight
    memory = {"model_states": states.model_states, "activations": float(acts),
              "total": states.model_states + float(acts)}
    compute_note = (f"compute at {frac:.0%} of the {lay.dtype} dense peak ({peak / 1e12:g} TFLOP/s)" if lay.dtype != "fp8"
                    else f"linear-layer GEMMs at {frac:.0%} of the fp8 dense peak ({cl.peak('fp8') / 1e12:g} TFLOP/s), "
                         f"the attention core at {frac16:.0%} of the bf16 one; MFU and HFU against the bf16 peak "
                         f"({peak / 1e12:g} TFLOP/s; against the fp8 peak they are half)")
    if gemm_shape:
        compute_note += (f"; GEMM shapes (micro-batch {lay.micro_batch}, tp {lay.tp}) reach {eta:.1%} of that "
                         "(roofline against the HBM bandwidth, labkit.perf.gemm)")
    assumptions = (f"{compute_note}; {method} FLOPs + recompute={lay.recompute}",
                   f"links: {cl.describe()}", *notes,
                   f"memory: {lay.strategy} over {dpg} DP rank(s), parameters ÷ tp·pp (embeddings split evenly), "
                   f"Korthikanti activations ({'flash attention' if lay.flash_attention else 'scores stored'}) of "
                   f"{in_flight:g} micro-batch(es) in flight; no buffers or fragmentation",
                   f"sync (serial remainder) {sync * 1e3:g} ms")
    return Prediction(model=shape.name or "model", layout=lay, cluster=cl, global_batch=B, seq_len=s,
                      micro_batches=m, achievable=frac, peak_flops=peak, model_flops_per_token=model_fpt,
                      hardware_flops_per_token=hw_fpt, compute_s=compute, bubble_s=bubble, comm_s=comm,
                      exposed_s=exposed, sync_s=sync, memory=memory, assumptions=assumptions, ideal_compute_s=ideal)

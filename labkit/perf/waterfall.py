"""The tuning chapters as one waterfall: each optimisation of Parts III–IV applied on top of the previous
ones, every bar a :func:`labkit.perf.predict` of the changed layout, with the assumption it rests on.

The source draws "cumulative optimisations on a 7B model on A100" as a waterfall of percentages it does not
derive. This module draws the same kind of figure from labkit's own performance model, so each bar can be
recomputed, questioned and changed:

- the model is Llama 2 7B (Touvron et al. 2023, arXiv:2307.09288, Table 2: 32 layers, d_model 4096,
  32 heads, SwiGLU 11008, vocabulary 32000, 4096 tokens);
- the cluster is one DGX A100 node (8 × A100-SXM-80GB, NVLink; :data:`labkit.perf.layout.CLUSTERS`);
- the baseline is a realistic first attempt: fp32 tensors with TF32 matmuls allowed
  (``torch.set_float32_matmul_precision("high")`` — PyTorch's default keeps fp32 matmuls off the tensor
  cores, ``torch.backends.cuda.matmul.allow_tf32 = False`` since 1.12, so a first attempt on an A100 turns
  it on or uses autocast), FSDP (DDP's 16 bytes/parameter of fp32 Adam states do not fit in 80 GB),
  micro-batch 1, full recomputation, the s × s attention scores stored, no overlap, and a synchronous
  checkpoint every 100 steps (the source's interval).

Each step of :data:`STEPS` changes one thing, names the chapter that teaches it and says what the model
assumes about it. The order matters — a gain is measured against everything before it — and is stated.

Taught in chapter 30 (the case review and the checklist).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from labkit import checks, flops
from labkit.perf.layout import Cluster, Layout, cluster
from labkit.perf.predict import Prediction, predict, resolve_model

__all__ = ["LLAMA2_7B", "STEPS", "Bar", "optimisation_waterfall", "CHECKPOINT_BYTES_PER_PARAM"]

#: Llama 2 7B (Touvron et al. 2023, arXiv:2307.09288, Table 2 and the released config.json).
LLAMA2_7B = flops.ModelShape(n_layers=32, d_model=4096, n_heads=32, vocab_size=32000, seq_len=4096, d_ff=11008,
                             ffn="swiglu", tied_embeddings=False, norm="rmsnorm", pos_emb="rope", name="llama2-7b")

#: (chapter id, bar name, layout changes, predict() changes, the assumption the bar rests on), applied in order.
STEPS = (
    ("ch18", "mixed precision (bf16 autocast)", {"dtype": "bf16"}, {},
     "the matmuls move from the TF32 tensor-core peak ({peak_tf32:g} TFLOP/s) to the bf16 one ({peak_bf16:g}) at the same achievable "
     "share; activations and gradients take 2 bytes instead of 4"),
    ("ch16+ch21", "fused attention → no recomputation", {"flash_attention": True, "recompute": "none"}, {},
     "fused attention never stores the s×s scores; the model counts FLOPs, not HBM bytes, so its own speed-up is "
     "not in this bar (a lower bound) — its memory is: it lets full recomputation go (6·P·D instead of 8·P·D "
     "FLOPs per step)"),
    ("ch15", "micro-batch 1 → 4", {"micro_batch": 4}, {},
     "FSDP gathers the parameters and reduce-scatters the gradients once per micro-batch: 4× fewer "
     "micro-batches, 4× fewer collectives for the same global batch"),
    ("ch19", "overlap the gradient collectives", {}, {"dp_overlap": True},
     "prefetch and bucketing hide the collectives under the compute (Li et al. 2020 §3.2.3; Zhao et al. 2023 §3)"),
    ("ch17", "fusion and torch.compile", {}, {"achievable": "fused"},
     "fused kernels raise the matmuls' achievable share of the peak (an assumption: chapter 17 measures it on "
     "your machine)"),
    ("ch27", "asynchronous checkpoint", {}, {"checkpoint": "async"},
     "the save is staged to host memory and written in the background: the step stalls only for the copy "
     "(assumed negligible here)"),
)


@dataclass(frozen=True)
class Bar:
    """One bar of the waterfall: the configuration after ``name`` was applied, its prediction, the
    synchronous-checkpoint stall per step added to the predicted step, and its gain in tokens/s over the
    previous bar (``gain``) and over the baseline (``cumulative``). Taught in chapter 30."""

    chapter: str
    name: str
    assumption: str
    prediction: Prediction
    checkpoint_s: float
    gain: float = 1.0
    cumulative: float = 1.0

    @property
    def step_s(self) -> float:
        """The predicted step plus the checkpoint stall per step."""
        return self.prediction.step_s + self.checkpoint_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        p = self.prediction
        return p.tokens_per_step / self.step_s / p.n_gpus

    @property
    def mfu_bf16(self) -> float:
        """Model FLOPs per second per GPU over the bf16 dense peak (one yardstick for every bar, fp32 included)."""
        p = self.prediction
        return self.tokens_per_s_per_gpu * p.model_flops_per_token / p.cluster.peak("bf16")

    def row(self) -> dict:
        """The bar as a table row."""
        p = self.prediction
        return {"chapter": self.chapter, "optimisation": self.name, "step (s)": self.step_s,
                "tokens/s per GPU": self.tokens_per_s_per_gpu, "MFU (bf16 peak)": self.mfu_bf16,
                "memory (GiB)": p.memory["total"] / 2**30, "checkpoint stall (ms/step)": self.checkpoint_s * 1e3,
                "gain": self.gain, "cumulative": self.cumulative, "assumption": self.assumption}


#: Bytes per parameter a checkpoint writes: fp32 weights and Adam's two fp32 moments (Kingma & Ba 2015).
CHECKPOINT_BYTES_PER_PARAM = 12


def optimisation_waterfall(model=LLAMA2_7B, cluster_: Cluster | None = None, *, global_batch: int = 64,
                           achievable: float = 0.45, fused_achievable: float = 0.55,
                           checkpoint_every: int = 100, write_bytes_per_s: float = 2e9,
                           steps=STEPS) -> list[Bar]:
    """The baseline and one :class:`Bar` per step of ``steps`` (default :data:`STEPS`), each applied on top of
    the previous ones.

    ``model``: a ModelShape or a preset name (:func:`labkit.perf.predict.resolve_model`). ``achievable`` /
    ``fused_achievable``: the matmuls' share of the dense peak before and after the ``"fused"`` step
    (assumptions, printed on the bars). The baseline's synchronous checkpoint writes each GPU's shard of the
    weights and Adam moments (:data:`CHECKPOINT_BYTES_PER_PARAM` × parameters ÷ data-parallel ranks) at
    ``write_bytes_per_s`` per GPU every ``checkpoint_every`` steps — a stall of bytes ÷ rate ÷ interval per
    step — until a step sets ``checkpoint="async"``. A step is ``(chapter, name, layout changes, changes of
    {dp_overlap, achievable: "plain"|"fused", checkpoint: "sync"|"async"}, assumption)``. Every bar must fit in
    the GPU's memory, else ``ValueError`` naming the bar.

    Taught in chapter 30 (the source's waterfall, redrawn from labkit's model).
    """
    cl = cluster("dgx-a100", nodes=1) if cluster_ is None else cluster_
    if not isinstance(cl, Cluster):
        raise checks.ArgumentTypeError(f"cluster_ must be a labkit.perf.Cluster, got {type(cl).__name__}")
    lo = checks.fraction("achievable", achievable, open_low=True)
    hi = checks.fraction("fused_achievable", fused_achievable, open_low=True)
    if hi < lo:
        raise ValueError(f"fused_achievable={hi:g} is not valid: fusion does not lower the achievable share "
                         f"(achievable={lo:g}); use a value in [{lo:g}, 1]")
    every = checks.count("checkpoint_every", checkpoint_every)
    rate = checks.positive("write_bytes_per_s", write_bytes_per_s)
    B = checks.count("global_batch", global_batch)
    shape = resolve_model(model)
    steps = tuple(steps)
    for s in steps:
        if not (isinstance(s, tuple) and len(s) == 5 and isinstance(s[2], dict) and isinstance(s[3], dict)
                and set(s[3]) <= {"dp_overlap", "achievable", "checkpoint"}):
            raise ValueError(f"steps entry {s!r:.100} is not valid: give (chapter, name, layout changes, "
                             "{dp_overlap|achievable|checkpoint: …}, assumption) tuples, as "
                             "labkit.perf.waterfall.STEPS")
    layout = dict(dp=cl.n_gpus, strategy="fsdp", micro_batch=1, recompute="full", dtype="tf32",
                  flash_attention=False)
    kw = {"dp_overlap": False, "achievable": "plain", "checkpoint": "sync"}
    base = ("baseline", "baseline", {}, {},
            f"fp32 with TF32 matmuls allowed (PyTorch's default is off: allow_tf32=False since 1.12), FSDP over "
            f"{cl.n_gpus} GPUs, micro-batch 1, full recomputation, attention scores stored, no "
            f"overlap, matmuls at {lo:.0%} of the peak, a synchronous checkpoint every {every} steps at "
            f"{rate / 1e9:g} GB/s per GPU")
    shard_bytes = CHECKPOINT_BYTES_PER_PARAM * flops.n_params(shape)
    bars: list[Bar] = []
    for chapter, name, lay_ch, kw_ch, why in (base, *steps):
        layout.update(lay_ch)
        kw.update(kw_ch)
        checks.one_of("achievable", kw["achievable"], ("plain", "fused"))
        checks.one_of("checkpoint", kw["checkpoint"], ("sync", "async"))
        lay = Layout(**layout)
        p = predict(shape, lay, cl, global_batch=B, achievable=hi if kw["achievable"] == "fused" else lo,
                    dp_overlap=kw["dp_overlap"])
        if not p.fits:
            raise ValueError(f"the bar {name!r} ({lay.describe()}) does not fit: {p.memory['total'] / 2**30:.1f} "
                             f"GiB of {cl.memory_bytes / 2**30:.0f} GiB per GPU; change the step or the global batch")
        if "{peak_" in why:                                           # the cluster's datasheet peaks
            why = why.format(**{f"peak_{d}": cl.peak(d) / 1e12 for d in ("tf32", "bf16")})
        if lay_ch.get("flash_attention") and len(lay_ch) > 1:       # what the fused attention's memory enables
            alone = predict(shape, replace(lay, flash_attention=False), cl, global_batch=B,
                            achievable=hi if kw["achievable"] == "fused" else lo, dp_overlap=kw["dp_overlap"])
            why = (f"{why}; without fused attention this layout needs {alone.memory['total'] / 2**30:.1f} GiB of "
                   f"{cl.memory_bytes / 2**30:.0f} GiB per GPU ({'fits' if alone.fits else 'does not fit'}), with "
                   f"it {p.memory['total'] / 2**30:.1f} GiB")
        ckpt = shard_bytes / lay.dp / rate / every if kw["checkpoint"] == "sync" else 0.0
        bar = Bar(chapter, name, why, p, ckpt)
        if bars:
            bar = replace(bar, gain=bar.tokens_per_s_per_gpu / bars[-1].tokens_per_s_per_gpu,
                          cumulative=bar.tokens_per_s_per_gpu / bars[0].tokens_per_s_per_gpu)
        bars.append(bar)
    return bars

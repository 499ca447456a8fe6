"""The course's two seed cases, told once: the source's numbers (cited), what follows from them, and where
the source contradicts itself (⚠).

Chapters quote these objects, never their own copies of the numbers (issue #14: the cases had drifted
apart between chapters). Each case stores **only the source's inputs**; every speedup, efficiency, step
time and link speed is computed here, by the formula beside it. What a model adds (``labkit.perf``) is
labelled *modelled* and kept apart from what the source reported.

- :func:`bert_large` — BERT-large on 4 GPUs (syllabus ch. 5 and 30). Taught in chapters 5, 11, 14 and 30.
- :func:`thirteen_b` — a 13B model on 64 → 128 A100 over 25 Gb/s Ethernet (syllabus ch. 29). Taught in
  chapters 14, 24 and 29 (its bandwidth figures in chapter 11).
- :func:`warnings_markdown` — a case's ⚠ records as Markdown boxes for a chapter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from labkit import checks
from labkit.comm.models import bus_factor, ring_steps, ring_time
from labkit.perf.layout import CLUSTERS
from labkit.perf.steptime import StepParts

__all__ = ["CaseWarning", "BertLargeCase", "ThirteenBCase", "bert_large", "thirteen_b", "warnings_markdown",
           "LINKS", "LLAMA_13B_SHAPE"]

SYLLABUS = "the course syllabus, shared/course/SYLLABUS.md"
ISSUE_14 = "issue #14, quoting the source document"


@dataclass(frozen=True)
class CaseWarning:
    """One ⚠ point: what the source claims, the arithmetic that tests it, what is right, and why."""

    key: str
    title: str
    claim: str
    arithmetic: str
    right: str
    why: str
    source: str

    def __post_init__(self):
        for k in ("key", "title", "claim", "arithmetic", "right", "why", "source"):
            v = getattr(self, k)
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"CaseWarning.{k} must be a non-empty str, got {v!r}")

    def markdown(self) -> str:
        """The record as a Markdown quote box. Taught in chapter 5 (the first ⚠ box of a case)."""
        return "\n".join([f"> **⚠ ({self.key}) {self.title}**", ">",
                          f"> *The source says:* {self.claim} ({self.source})", ">",
                          f"> *Arithmetic:* {self.arithmetic}", ">",
                          f"> *What is right:* {self.right}", ">", f"> *Why:* {self.why}"])


def warnings_markdown(case, keys: str | None = None) -> str:
    """A case's ⚠ records as Markdown, one box each, for ``display(Markdown(...))`` in a chapter;
    ``keys`` (e.g. ``"ae"``) picks records by their letters, in that order (default: all).

    Taught in chapter 5 (BERT-large), chapter 11 and chapter 14 (both cases).
    """
    ws = getattr(case, "warnings", None)
    if not isinstance(ws, tuple) or not all(isinstance(w, CaseWarning) for w in ws):
        raise checks.ArgumentTypeError(f"case must be a labkit.cases case (bert_large(), thirteen_b()), got "
                                       f"{type(case).__name__} {case!r:.60}")
    by_key = {w.key: w for w in ws}
    if keys is not None:
        if not isinstance(keys, str) or not keys or any(k not in by_key for k in keys):
            raise ValueError(f"keys={keys!r} is not valid: use letters of {''.join(by_key)}")
        ws = tuple(by_key[k] for k in keys)
    return "\n\n".join(w.markdown() for w in ws)


# Links a 4-GPU node may have, bytes/s per GPU per direction (what a ring's busbw can reach):
# - PCIe 3.0 x16: 8 GT/s × 16 lanes × 128/130 (encoding) / 8 bits (PCI-SIG PCIe 3.0 base spec, §4.2);
# - PCIe 4.0 x16: 16 GT/s, same encoding (PCI-SIG PCIe 4.0 base spec);
# - NVLink: the cited presets of labkit.perf.layout (V100-SXM2 150 GB/s, A100-SXM 300 GB/s per direction).
LINKS = {"PCIe 3.0 x16": 8e9 * 16 * (128 / 130) / 8, "PCIe 4.0 x16": 16e9 * 16 * (128 / 130) / 8,
         "NVLink V100-SXM2": CLUSTERS["v100-nvlink-4"].intra_bw, "NVLink A100-SXM": CLUSTERS["dgx-a100"].intra_bw}
_ALPHA_S = CLUSTERS["v100-nvlink-4"].intra_alpha_s   # α per ring step inside a node (an assumption, layout.py)


# ============================================================================ BERT-large on 4 GPUs
@dataclass(frozen=True)
class BertLargeCase:
    """BERT-large data-parallel on 4 GPUs, the source's numbers (ms, counts, ratios as it reports them).

    Derived figures are properties; ``warnings`` holds the ⚠ records (:func:`bert_large` builds them).
    Taught in chapter 5 (the step model), chapter 11 (the all-reduce), chapter 14 and chapter 30.
    """

    t1_ms: float = 360.0             # one-GPU step
    n: int = 4
    compute_ms: float = 90.0         # per GPU on 4 GPUs
    comm_ms: float = 120.0           # gradient all-reduce
    sync_ms: float = 15.0            # serial remainder
    measured_speedup: float = 1.8    # over one GPU
    n_large: int = 8
    speedup_large: float = 1.6       # the source's 8-GPU figure, divided by the 4-GPU run (⚠ b)
    forward_ms: float = 50.0         # the source's split of the 90 ms (⚠ c)
    backward_ms: float = 40.0
    overheads: tuple = ("data loading", "checkpointing", "logging")   # the source's explanation of 1.8×
    hardware: tuple = ("4×A100", "a 4×V100 instance with NVLink")      # the source's two descriptions (⚠ d)
    n_params: float = 340e6          # BERT-large (Devlin et al. 2019, §3: 340M)
    grad_bytes_per_param: int = 4    # fp32 gradients
    sources: tuple = (f"{SYLLABUS}, chapters 5 and 30", ISSUE_14,
                      "Devlin et al. 2019, 'BERT', NAACL, §3 (BERT-large: 340M parameters)",
                      "Li et al. 2020, 'PyTorch Distributed', VLDB, §3.2.3 (overlap of all-reduce and backward)")
    warnings: tuple = field(default=(), compare=False)

    def __post_init__(self):
        for k in ("t1_ms", "compute_ms", "comm_ms", "measured_speedup", "speedup_large", "forward_ms",
                  "backward_ms", "n_params"):
            object.__setattr__(self, k, checks.positive(k, getattr(self, k)))
        object.__setattr__(self, "sync_ms", checks.nonneg("sync_ms", self.sync_ms))
        object.__setattr__(self, "n", checks.count("n", self.n, at_least=2))
        object.__setattr__(self, "n_large", checks.count("n_large", self.n_large, at_least=2))
        object.__setattr__(self, "grad_bytes_per_param", checks.count("grad_bytes_per_param",
                                                                      self.grad_bytes_per_param))

    # ------------------------------------------------------------------------------ the step model
    @property
    def parts(self) -> StepParts:
        """The source's 4-GPU parts in seconds (``labkit.perf.StepParts``)."""
        return StepParts(self.compute_ms / 1e3, self.comm_ms / 1e3, self.sync_ms / 1e3)

    def step_ms(self, overlap: bool | float = True) -> float:
        """max(compute, comm) + sync with overlap (the source's 135 ms); compute + comm + sync without."""
        return self.parts.step(overlap) * 1e3

    def speedup(self, overlap: bool | float = True) -> float:
        """t₁ / t_step of the modelled 4-GPU step."""
        return self.t1_ms / self.step_ms(overlap)

    @property
    def ideal_ms(self) -> float:
        """t₁ / N: the step if the work split perfectly and nothing else cost time (speedup N)."""
        return self.t1_ms / self.n

    @property
    def measured_step_ms(self) -> float:
        """The step the measured speedup implies: t₁ / 1.8."""
        return self.t1_ms / self.measured_speedup

    @property
    def overhead_ms(self) -> float:
        """Serial time per step the 1.8× needs beyond the source's overlapped step: measured − 135 ms."""
        return self.measured_step_ms - self.step_ms(True)

    @property
    def large_step_ms(self) -> float:
        """The 8-GPU step if its 1.6× divides the 4-GPU measured step (the source's baseline)."""
        return self.measured_step_ms / self.speedup_large

    @property
    def large_modelled_ms(self) -> float:
        """MODELLED 8-GPU step on the 4-GPU link (:meth:`implied_link_bw`): t₁/8 compute, the ring
        all-reduce of the gradients on 8 ranks, the same sync, overlapped — a lower bound (no overheads)."""
        comm = ring_time("all_reduce", self.grad_bytes, self.n_large, alpha=_ALPHA_S, beta=1 / self.implied_link_bw())
        return StepParts(self.t1_ms / self.n_large, comm * 1e3, self.sync_ms).step(True)

    # --------------------------------------------------------------------------------- the split
    def split_ms(self, backward_over_forward: float = 2.0) -> tuple[float, float]:
        """(forward, backward) of the 4-GPU compute when backward ≈ ratio × forward (chapter 3: 4P vs 2P)."""
        r = checks.positive("backward_over_forward", backward_over_forward)
        fwd = self.compute_ms / (1 + r)
        return fwd, self.compute_ms - fwd

    # ---------------------------------------------------------------------------------- the link
    @property
    def grad_bytes(self) -> float:
        return self.n_params * self.grad_bytes_per_param

    def implied_link_bw(self, alpha_s: float = _ALPHA_S) -> float:
        """Bytes/s per direction a ring needs to all-reduce the gradients in ``comm_ms`` on N GPUs:
        t = 2(N−1)·α + 2(N−1)/N·S/bw solved for bw (Thakur et al. 2005 §4, ``labkit.comm.models``)."""
        a = checks.nonneg("alpha_s", alpha_s)
        t = self.comm_ms / 1e3 - ring_steps("all_reduce", self.n) * a
        if t <= 0:
            raise ValueError(f"alpha_s={alpha_s!r}: the latency terms alone exceed comm_ms={self.comm_ms}")
        return bus_factor("all_reduce", self.n) * self.grad_bytes / t

    def link_table(self, alpha_s: float = _ALPHA_S) -> list[dict]:
        """Each candidate link (:data:`LINKS`): its line rate, the modelled ring all-reduce of the gradients
        on it, and the implied bandwidth as a fraction of its line rate (> 1: faster than the wire)."""
        need = self.implied_link_bw(alpha_s)
        return [{"link": name, "line rate GB/s": bw / 1e9,
                 "modelled all-reduce ms": ring_time("all_reduce", self.grad_bytes, self.n, alpha=alpha_s,
                                                     beta=1 / bw) * 1e3,
                 "implied / line rate": need / bw} for name, bw in LINKS.items()]

    def consistent_link(self, alpha_s: float = _ALPHA_S) -> str:
        """The link whose line rate is nearest the implied bandwidth (nearest on a log scale)."""
        return min(self.link_table(alpha_s), key=lambda r: abs(math.log(r["implied / line rate"])))["link"]

    def summary(self) -> str:
        """The case in a few printed lines, every figure from this object. Taught in chapter 5."""
        return "\n".join([
            f"BERT-large (source's numbers): 1 GPU {self.t1_ms:.0f} ms; {self.n} GPUs compute {self.compute_ms:.0f} "
            f"ms, all-reduce {self.comm_ms:.0f} ms, sync {self.sync_ms:.0f} ms",
            f"  overlapped step max({self.compute_ms:.0f}, {self.comm_ms:.0f}) + {self.sync_ms:.0f} = "
            f"{self.step_ms(True):.0f} ms → {self.speedup(True):.2f}× (communication-bound, not an ideal; "
            f"ideal {self.ideal_ms:.0f} ms = {self.n}×)",
            f"  without overlap {self.step_ms(False):.0f} ms → {self.speedup(False):.2f}×",
            f"  measured {self.measured_speedup}× → {self.measured_step_ms:.0f} ms: {self.overhead_ms:.0f} ms per step "
            f"of serial overhead ({', '.join(self.overheads)}, per the source)"])


def bert_large() -> BertLargeCase:
    """The BERT-large seed case with its ⚠ records. Taught in chapter 5 (rebuilt from its parts),
    chapter 11 (the all-reduce and the link), chapter 14 (diagnosis) and chapter 30 (the case review)."""
    c = BertLargeCase()
    fwd, bwd = c.split_ms()
    links = {r["link"]: r for r in c.link_table()}
    nv = links["NVLink V100-SXM2"]["modelled all-reduce ms"]
    ws = (
        CaseWarning("e", "135 ms is the overlapped, communication-bound step — not an ideal",
                    f"{c.n} GPUs: {c.t1_ms:.0f} ms → {c.step_ms(True):.0f} ms 'ideal'", f"max({c.compute_ms:.0f}, "
                    f"{c.comm_ms:.0f}) + {c.sync_ms:.0f} = {c.step_ms(True):.0f} ms → {c.speedup(True):.2f}×; the "
                    f"ideal is {c.t1_ms:.0f}/{c.n} = {c.ideal_ms:.0f} ms ({c.n}×)",
                    f"{c.step_ms(True):.0f} ms is what full overlap reaches with a {c.comm_ms:.0f} ms all-reduce: "
                    "communication still exceeds compute",
                    "overlap hides communication only up to the compute time", f"{SYLLABUS}, chapter 5"),
        CaseWarning("a", f"the {c.measured_speedup}× needs {c.overhead_ms:.0f} ms of serial time per step",
                    f"{c.n} GPUs measured {c.measured_speedup}×, blamed on {', '.join(c.overheads)}",
                    f"{c.t1_ms:.0f}/{c.measured_speedup} = {c.measured_step_ms:.0f} ms; {c.measured_step_ms:.0f} − "
                    f"{c.step_ms(True):.0f} = {c.overhead_ms:.0f} ms per step "
                    f"({c.overhead_ms / c.measured_step_ms:.0%} of the step)",
                    f"the named overheads must add up to {c.overhead_ms:.0f} ms in every step; until their per-step "
                    "figures do, the 1.8× is measured but not explained",
                    "an explanation is only checked when its parts add up to the gap", ISSUE_14),
        CaseWarning("b", f"the {c.n_large}-GPU {c.speedup_large}× is divided by the {c.n}-GPU run",
                    f"{c.n_large} GPUs: {c.speedup_large}×, next to {c.n} GPUs: {c.measured_speedup}×",
                    f"over {c.n} GPUs: {c.measured_step_ms:.0f}/{c.speedup_large} = {c.large_step_ms:.0f} ms → "
                    f"{c.t1_ms / c.large_step_ms:.2f}× over one GPU (efficiency "
                    f"{c.t1_ms / c.large_step_ms / c.n_large:.0%}); read over one GPU it would be "
                    f"{c.t1_ms / c.speedup_large:.0f} ms, slower than {c.n} GPUs. The {c.n}-GPU link gives "
                    f"{c.large_modelled_ms:.0f} ms (modelled) before any overhead",
                    f"a speedup divides the one-GPU time: quote {c.n}→{c.n_large} GPUs as "
                    f"{c.speedup_large}× over {c.n} ({c.speedup_large / (c.n_large / c.n):.0%} incremental "
                    f"efficiency); {c.large_step_ms:.0f} ms is below the modelled {c.large_modelled_ms:.0f} ms, so "
                    f"the {c.n_large}-GPU run did not use the same link or the same work",
                    "two speedups with different baselines cannot be compared", ISSUE_14),
        CaseWarning("c", "forward 50 ms / backward 40 ms contradicts backward ≈ 2× forward",
                    f"the {c.compute_ms:.0f} ms splits into forward {c.forward_ms:.0f} ms and backward "
                    f"{c.backward_ms:.0f} ms", f"backward/forward = {c.backward_ms / c.forward_ms:.2f}; "
                    f"with backward ≈ 2× forward: {c.compute_ms:.0f}/3 = {fwd:.0f} ms forward, {bwd:.0f} ms backward",
                    f"forward ≈ {fwd:.0f} ms, backward ≈ {bwd:.0f} ms (chapter 3 measures the ratio)",
                    "backward computes gradients of activations and of weights: 4P FLOPs per token against "
                    "forward's 2P", ISSUE_14),
        CaseWarning("d", "the 120 ms all-reduce is a PCIe figure, not an NVLink one",
                    f"hardware '{c.hardware[0]}' in one place, '{c.hardware[1]}' in another",
                    f"{c.n_params / 1e6:.0f} M fp32 gradients = {c.grad_bytes / 1e9:.2f} GB; a ring on {c.n} GPUs "
                    f"moves 2({c.n}−1)/{c.n} of it per link: in {c.comm_ms:.0f} ms that needs "
                    f"{c.implied_link_bw() / 1e9:.1f} GB/s; "
                    + "; ".join(f"{k} {r['line rate GB/s']:.1f} GB/s → {r['modelled all-reduce ms']:.0f} ms"
                                for k, r in links.items()),
                    f"{c.comm_ms:.0f} ms fits {c.consistent_link()} (PCIe-class); NVLink would finish it in "
                    f"≈ {nv:.0f} ms. Chapters 5 and 11 model it over PCIe",
                    "a link speed follows from bytes, ranks and time (α–β ring model); the hardware label must "
                    "agree with it", ISSUE_14),
    )
    return replace(c, warnings=tuple(sorted(ws, key=lambda w: w.key)))


# ====================================================== 13B on 64 → 128 A100 over 25 Gb/s Ethernet
def _llama_13b():
    """LLaMA-13B (Touvron et al. 2023, Table 2: 40 layers, d 5120, 40 heads; d_ff 13824 of the released
    config), sequence 2048 — the shape the modelled view uses."""
    from labkit.flops import ModelShape

    return ModelShape(n_layers=40, d_model=5120, n_heads=40, d_ff=13824, vocab_size=32000, seq_len=2048,
                      ffn="swiglu", tied_embeddings=False, norm="rmsnorm", pos_emb="rope", name="llama-13b")


LLAMA_13B_SHAPE = _llama_13b()


@dataclass(frozen=True)
class ThirteenBCase:
    """A 13B model scaled from 64 to 128 A100 over 25 Gb/s Ethernet: the source's numbers.

    Tokens/s are per GPU as the source labels them (⚠ a tests that reading). Taught in chapter 14, chapter
    24 (choosing a layout), chapter 29 (the case review) and chapter 11 (its bandwidth figures).
    """

    n_params: float = 13e9
    gpus_before: int = 64
    gpus_after: int = 128
    device: str = "A100-SXM-80GB"
    link_gbit_s: float = 25.0
    expected_k: float = 3.6          # k tokens/s per GPU expected on 128 GPUs
    measured_k: float = 2.1          # k tokens/s per GPU measured on 128 GPUs
    fixed_k: float = 3.3             # after TP+PP, accumulation, prefetch + mmap
    stated_efficiency: tuple = (0.58, 0.92)   # the source's own percentages (measured, fixed)
    busbw_across_gb_s: float = 3.2   # "across nodes"
    busbw_inside_gb_s: float = 22.0  # "inside a node"
    nodes_claimed: int = 2           # "128 ranks on 2 nodes"
    gpus_per_node: int = CLUSTERS["a100-25gbe"].gpus_per_node   # an A100 HGX/DGX baseboard: 8 SXM GPUs
    fix: tuple = ("tensor + pipeline parallelism", "gradient accumulation", "loader prefetch + mmap")
    sources: tuple = (f"{SYLLABUS}, chapter 29", ISSUE_14,
                      "IEEE 802.3by (25 Gb/s Ethernet: 25e9/8 = 3.125 GB/s line rate)",
                      "NVIDIA DGX A100 User Guide (8 A100-SXM per node)",
                      "nccl-tests doc/PERFORMANCE.md (busbw = algbw × 2(n−1)/n for all-reduce)")
    warnings: tuple = field(default=(), compare=False)

    def __post_init__(self):
        for k in ("n_params", "link_gbit_s", "expected_k", "measured_k", "fixed_k", "busbw_across_gb_s",
                  "busbw_inside_gb_s"):
            object.__setattr__(self, k, checks.positive(k, getattr(self, k)))
        for k in ("gpus_before", "gpus_after", "nodes_claimed", "gpus_per_node"):
            object.__setattr__(self, k, checks.count(k, getattr(self, k)))
        for i, e in enumerate(self.stated_efficiency):
            checks.fraction(f"stated_efficiency[{i}]", e)

    def efficiency(self, per_gpu_k: float) -> float:
        """Scaling efficiency of a per-GPU rate: rate / the expected (flat) per-GPU rate — linear scaling
        keeps tokens/s per GPU constant while the aggregate grows with the GPUs."""
        return checks.positive("per_gpu_k", per_gpu_k) / self.expected_k

    @property
    def line_rate_gb_s(self) -> float:
        """One Ethernet port's line rate in GB/s: Gb/s ÷ 8 bits per byte."""
        return self.link_gbit_s / 8

    @property
    def nodes_needed(self) -> int:
        return math.ceil(self.gpus_after / self.gpus_per_node)

    def mfu(self, per_gpu_k: float) -> float:
        """MFU of a per-GPU rate at 6·N FLOPs per token on the catalogued bf16 dense peak (chapter 4)."""
        from labkit.hardware.catalogue import lookup
        from labkit.mfu import mfu

        return mfu(tokens_per_s=per_gpu_k * 1e3, flops_per_token=6 * self.n_params, n_devices=1,
                   peak_flops=lookup(self.device).peak("bf16"))

    def readings(self) -> list[dict]:
        """The three ways to read 'expected 3.6k → measured 2.1k (→ fixed 3.3k)', with aggregate (k tokens/s
        of the job) and per-GPU figures, the efficiencies each gives, and whether they match the source's."""
        g0, g1, e, m, f = self.gpus_before, self.gpus_after, self.expected_k, self.measured_k, self.fixed_k
        rows = [("per GPU; expected = the 64-GPU per-GPU rate, held flat", g0 * e, g1 * m, g1 * f, m, m / e, f / e),
                ("aggregate; 3.6k on 64 GPUs, 2.1k on 128", e, m, f, m / g1, m / (2 * e), f / (2 * e)),
                ("aggregate; 3.6k = the expected 128-GPU total", e / 2, m, f, m / g1, m / e, f / e)]
        out = []
        for name, agg0, agg1, aggf, per_gpu, eff_m, eff_f in rows:
            match = all(abs(a - b) < 0.005 for a, b in zip((eff_m, eff_f), self.stated_efficiency, strict=True))
            out.append({"reading": name, "aggregate 64 (k tok/s)": agg0, "aggregate 128 (k tok/s)": agg1,
                        "aggregate fixed (k tok/s)": aggf, "per GPU 128 (k tok/s)": per_gpu,
                        "efficiency measured": eff_m, "efficiency fixed": eff_f, "matches the source's %": match,
                        "MFU of the per-GPU rate": self.mfu(per_gpu)})
        return out

    def coherent_reading(self) -> str:
        """The reading whose efficiencies match the source's and whose per-GPU rate is a possible MFU."""
        ok = [r for r in self.readings() if r["matches the source's %"] and 0.05 < r["MFU of the per-GPU rate"] <= 1]
        if len(ok) != 1:
            raise ValueError(f"{len(ok)} readings of the 13B figures are coherent; expected exactly one")
        return ok[0]["reading"]

    def modelled(self, *, achievable: float = 0.5) -> dict:
        """MODELLED view (``labkit.perf.predict``, not the source's numbers): LLaMA-13B with 2048 × 2048-token
        batches on the "a100-25gbe" preset — pure data parallel (ZeRO-2) on 64 and 128 GPUs, and the fix
        (TP 2 inside a node × PP 2, 4× accumulation) on 128. Returns {name: Prediction}."""
        from labkit.perf.layout import Layout, cluster
        from labkit.perf.predict import predict

        c = cluster("a100-25gbe")
        kw = dict(achievable=checks.fraction("achievable", achievable, open_low=True))
        per_node = c.gpus_per_node
        dp = dict(strategy="zero2", micro_batch=4)
        return {f"pure DP, {self.gpus_before} GPUs": predict(
                    LLAMA_13B_SHAPE, Layout(dp=self.gpus_before, **dp), c.with_nodes(self.gpus_before // per_node),
                    global_batch=2048, **kw),
                f"pure DP, {self.gpus_after} GPUs": predict(
                    LLAMA_13B_SHAPE, Layout(dp=self.gpus_after, **dp), c.with_nodes(self.gpus_after // per_node),
                    global_batch=2048, **kw),
                f"TP2 × PP2 + accumulation, {self.gpus_after} GPUs": predict(
                    LLAMA_13B_SHAPE, Layout(dp=self.gpus_after // 4, tp=2, pp=2, strategy="zero1",
                                            sequence_parallel=True), c.with_nodes(self.gpus_after // per_node),
                    global_batch=8192, **kw)}

    def modelled_gap(self, *, achievable: float = 0.5) -> dict:
        """MODELLED (⚠ f): per-GPU rates of :meth:`modelled` ÷ the 64-GPU rate (the case's reading) and ÷
        compute alone (``Prediction.efficiency``); the 128-GPU step the 58% needs; the time the 92% allows the
        fix beyond its compute against its seconds on the 25 Gb/s ports. Taught in chapter 29."""
        d64, d128, fix = self.modelled(achievable=achievable).values()
        base, (e_m, e_f) = d64.tokens_per_s_per_gpu, self.stated_efficiency
        need = d128.tokens_per_step / (self.gpus_after * e_m * base)           # the step that gives 58% of base
        link = fix.comm_s["pp"] + fix.comm_s["dp"]
        return {"per_gpu": [p.tokens_per_s_per_gpu for p in (d64, d128, fix)],
                "vs_64": [p.tokens_per_s_per_gpu / base for p in (d128, fix)],
                "vs_compute": [p.efficiency for p in (d128, fix)], "step_128": (need, d128.step_s),
                "fix": (fix.compute_s, fix.compute_s * (1 / e_f - 1), link, link * self.line_rate_gb_s)}

    def summary(self) -> str:
        """The case in a few printed lines, every figure from this object. Taught in chapter 14."""
        g0, g1 = self.gpus_before, self.gpus_after
        return "\n".join([
            f"13B on {g0} → {g1} {self.device} over {self.link_gbit_s:g} Gb/s Ethernet (source's numbers, per GPU):",
            f"  expected {self.expected_k}k, measured {self.measured_k}k, fixed {self.fixed_k}k tokens/s per GPU → "
            f"scaling efficiency {self.efficiency(self.measured_k):.0%} → {self.efficiency(self.fixed_k):.0%}",
            f"  aggregate: {g0 * self.expected_k:.1f}k on {g0} GPUs → {g1 * self.measured_k:.1f}k on {g1} measured "
            f"(linear: {g1 * self.expected_k:.1f}k) → {g1 * self.fixed_k:.1f}k fixed",
            f"  busbw {self.busbw_across_gb_s} GB/s across nodes vs {self.busbw_inside_gb_s:g} GB/s inside; "
            f"one port's line rate {self.line_rate_gb_s:.3f} GB/s"])


def thirteen_b() -> ThirteenBCase:
    """The 13B-over-Ethernet seed case with its ⚠ records. Taught in chapter 14 (diagnosis), chapter 24
    (choosing a layout), chapter 29 (the case review) and chapter 11 (its bandwidth figures)."""
    c = ThirteenBCase()
    r, g, (e_m, e_f) = c.readings(), c.modelled_gap(), c.stated_efficiency
    pg, v64, vc, (need, have), (comp, allow, link, gb) = (g[k] for k in ("per_gpu", "vs_64", "vs_compute",
                                                                          "step_128", "fix"))
    agg0, agg1 = r[0]["aggregate 64 (k tok/s)"], r[0]["aggregate 128 (k tok/s)"]
    ws = (
        CaseWarning("a", "per GPU and aggregate: the tokens/s 'fell' only per GPU",
                    f"throughput fell from an expected {c.expected_k}k to {c.measured_k}k tokens/s per GPU "
                    "(more GPUs, slower training)",
                    f"per GPU: {c.measured_k}/{c.expected_k} = {c.efficiency(c.measured_k):.0%}, "
                    f"{c.fixed_k}/{c.expected_k} = {c.efficiency(c.fixed_k):.0%} — the source's "
                    f"{c.stated_efficiency[0]:.0%} and {c.stated_efficiency[1]:.0%}; aggregate {agg0:.1f}k → "
                    f"{agg1:.1f}k tokens/s ({agg1 / agg0:.2f}×). Read as aggregates, 3.6k→2.1k gives "
                    f"{r[1]['efficiency measured']:.0%}, or {r[2]['per GPU 128 (k tok/s)'] * 1e3:.0f} tokens/s per "
                    f"GPU (MFU {r[2]['MFU of the per-GPU rate']:.1%})",
                    "3.6k, 2.1k and 3.3k are per-GPU rates; 3.6k is the per-GPU rate of 64 GPUs, which linear "
                    f"scaling keeps flat at {c.gpus_after}. The job got {agg1 / agg0:.2f}× faster, not slower",
                    "linear scaling holds tokens/s per GPU constant and doubles the aggregate; a per-GPU drop is "
                    "lost efficiency, not a slower job", f"{SYLLABUS}, chapter 29; chapter 14"),
        CaseWarning("b", f"{c.gpus_after} ranks cannot sit on {c.nodes_claimed} A100 nodes",
                    f"{c.gpus_after} ranks on {c.nodes_claimed} nodes",
                    f"{c.gpus_after}/{c.gpus_per_node} GPUs per node = {c.nodes_needed} nodes; {c.nodes_claimed} nodes "
                    f"would need {c.gpus_after // c.nodes_claimed} GPUs each",
                    f"{c.nodes_needed} nodes of {c.gpus_per_node} A100", "an A100 HGX/DGX board holds 8 SXM GPUs",
                    ISSUE_14),
        CaseWarning("c", "3.2 GB/s across nodes is above one 25 Gb/s port's line rate",
                    f"nccl busbw {c.busbw_across_gb_s} GB/s across nodes vs {c.busbw_inside_gb_s:g} GB/s inside",
                    f"{c.link_gbit_s:g}e9 / 8 = {c.line_rate_gb_s:.3f} GB/s; {c.busbw_across_gb_s} / "
                    f"{c.line_rate_gb_s:.3f} = {c.busbw_across_gb_s / c.line_rate_gb_s:.3f}",
                    "with one port per node a cross-node ring reaches at most 3.125 GB/s (TCP sockets ~90% of it): "
                    "either nodes had more than one port, or 3.2 is not a cross-node ring's busbw",
                    "busbw is normalised so that a bandwidth-bound ring reaches the link's rate, never more",
                    ISSUE_14),
        CaseWarning("d", "the bandwidth figures come with an NCCL log fragment, not nccl-tests output",
                    "busbw 3.2 vs 22 GB/s, shown with an NCCL_DEBUG log fragment",
                    f"busbw = (S / t) × 2(n−1)/n (= {bus_factor('all_reduce', c.gpus_after):.3f} at n = "
                    f"{c.gpus_after}); an INFO log names transports and channels, with no size S or time t",
                    "quote busbw from nccl-tests (all_reduce_perf) at a stated size and rank count; use the log "
                    "for which transport (NET/Socket, NET/IB) NCCL chose",
                    "a bandwidth needs bytes and seconds; the log has neither", ISSUE_14),
        CaseWarning("e", f"{c.expected_k}k tokens/s per GPU of a 13B model is near the A100's peak",
                    f"expected {c.expected_k}k, fixed {c.fixed_k}k tokens/s per GPU",
                    f"MFU = tokens/s × 6N / peak: {c.expected_k}k → {c.mfu(c.expected_k):.0%}, {c.measured_k}k → "
                    f"{c.mfu(c.measured_k):.0%}, {c.fixed_k}k → {c.mfu(c.fixed_k):.0%} of the bf16 dense peak",
                    "quote a per-GPU rate with its MFU: ~50–60% is excellent (chapter 4), so the 3.6k baseline — and "
                    "the 92% measured against it — need re-measuring before they are trusted",
                    "6N FLOPs per token (chapter 3) tie tokens/s to the peak", f"{SYLLABUS}, chapter 29"),
        CaseWarning("f", f"{e_m:.0%} → {e_f:.0%} does not come from a step model alone",
                    f"pure DP falls to {e_m:.0%} per GPU on {c.gpus_after} GPUs; {', '.join(c.fix)} bring it to "
                    f"{e_f:.0%}", f"labkit.perf (MODELLED, 50% of peak): {' → '.join(f'{x:,.0f}' for x in pg)} "
                    f"tokens/s per GPU (64 DP, 128 DP, 128 fixed) = {v64[0]:.0%} → {v64[1]:.0%} of the 64-GPU rate, "
                    f"{vc[0]:.0%} → {vc[1]:.0%} of compute alone. {e_m:.0%} of the 64-GPU rate needs a {need:.1f} s "
                    f"step on {c.gpus_after} GPUs; compute + all-reduce give {have:.1f} s ({need - have:.1f} s short). "
                    f"{e_f:.0%} of compute alone allows the fix {allow:.1f} s beyond its {comp:.1f} s of compute; its "
                    f"PP sends and DP traffic take {link:.1f} s of the 25 Gb/s ports (≈ {gb:.0f} GB per node per step)",
                    f"the direction holds (per GPU falls 64 → 128 under DP; the fix recovers it), not both magnitudes "
                    f"under one reading: per 64-GPU rate the fix passes {e_f:.0%} but the collapse lacks "
                    f"{need - have:.1f} s per step outside compute and communication (the data loading that prefetch "
                    f"+ mmap removed); per compute alone, {e_f:.0%} needs ≥ {link - allow:.0f} s of Ethernet traffic "
                    "hidden under compute, an overlap the source does not document",
                    "a step model prices compute and communication; a loader stall is neither, and the fix changed "
                    "the loader too: 58% → 92% mixes the two (no knob is tuned to hide it)",
                    f"{SYLLABUS}, chapter 29; issue #15"),
    )
    return replace(c, warnings=ws)

"""A 13B model on 64 → 128 A100 over 25 Gb/s Ethernet: the source's numbers, what follows from them, and
its ⚠ records (see :mod:`labkit.teaching.cases`). Taught in chapters 14, 24 and 29 (its bandwidth figures in chapter 11)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from labkit import checks
from labkit.comm.models import bus_factor
from labkit.perf.layout import CLUSTERS
from labkit.teaching.cases._common import SOURCE, CaseWarning, _case
from labkit.teaching.cases.bert import LINKS

__all__ = ["ThirteenBCase", "thirteen_b", "LLAMA_13B_SHAPE"]


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

    The source measured ``base_k`` = 1.8k tokens/s per GPU on 64 GPUs, and labels its 128-GPU figures (3.6k
    expected, 2.1k measured, 3.3k fixed) "per GPU" too; :meth:`readings` shows that only one reading of those
    three makes every number coherent (⚠ a). Taught in chapter 14, chapter 24 (choosing a layout), chapter 29
    (the case review) and chapter 11 (its bandwidth figures).
    """

    n_params: float = 13e9
    gpus_before: int = 64
    gpus_after: int = 128
    device: str = "A100-SXM-80GB"
    link_gbit_s: float = 25.0
    base_k: float = 1.8              # k tokens/s per GPU measured on 64 GPUs (the source's input)
    expected_k: float = 3.6          # on 128 GPUs, "expected close to", labelled per GPU
    measured_k: float = 2.1          # on 128 GPUs, measured, labelled per GPU
    fixed_k: float = 3.3             # after TP+PP, accumulation, prefetch + mmap, labelled per GPU
    stated_efficiency: tuple = (0.58, 0.92)   # the source's own percentages (measured, fixed)
    busbw_across_gb_s: float = 3.2   # "across nodes"
    gpu_util: tuple = (0.92, 0.71)   # nvidia-smi GPU-Util on 64 → 128 GPUs (the source's)
    nccl_wait: tuple = (0.08, 0.27)  # share of the step in NCCL all-reduce wait on 64 → 128 GPUs (the source's)
    busbw_inside_gb_s: float = 22.0  # "inside a node"
    nodes_claimed: int = 2           # "128 ranks on 2 nodes"
    gpus_per_node: int = CLUSTERS["a100-25gbe"].gpus_per_node   # an A100 HGX/DGX baseboard: 8 SXM GPUs
    fix: tuple = ("tensor + pipeline parallelism", "gradient accumulation", "loader prefetch + mmap")
    sources: tuple = (f"{SOURCE} (the 13B case; the course reviews it in chapter 29)",
                      "IEEE 802.3by (25 Gb/s Ethernet: 25e9/8 = 3.125 GB/s line rate)",
                      "NVIDIA DGX A100 User Guide (8 A100-SXM per node)",
                      "NVIDIA A100 datasheet (312 TFLOP/s dense bf16 per SXM GPU; labkit.hardware.catalogue)",
                      "nccl-tests doc/PERFORMANCE.md (busbw = algbw × 2(n−1)/n for all-reduce)")
    warnings: tuple = field(default=(), compare=False)

    label = "13B"                    # the case's name on its ⚠ boxes (a class attribute, not a field)

    def __post_init__(self):
        for k in ("n_params", "link_gbit_s", "base_k", "expected_k", "measured_k", "fixed_k", "busbw_across_gb_s",
                  "busbw_inside_gb_s"):
            object.__setattr__(self, k, checks.positive(k, getattr(self, k)))
        for k in ("gpus_before", "gpus_after", "nodes_claimed", "gpus_per_node"):
            object.__setattr__(self, k, checks.count(k, getattr(self, k)))
        if self.gpus_after <= self.gpus_before:
            raise ValueError(f"gpus_after={self.gpus_after!r} is not valid: the case scales up, so use more than "
                             f"gpus_before={self.gpus_before!r}")
        if not isinstance(self.stated_efficiency, tuple) or len(self.stated_efficiency) != 2:
            raise ValueError(f"stated_efficiency={self.stated_efficiency!r} is not valid: use a (measured, fixed) "
                             "pair of fractions")
        for i, e in enumerate(self.stated_efficiency):
            checks.fraction(f"stated_efficiency[{i}]", e)
        for k in ("gpu_util", "nccl_wait"):
            v = getattr(self, k)
            if not isinstance(v, tuple) or len(v) != 2:
                raise ValueError(f"{k}={v!r} is not valid: use a (64 GPUs, 128 GPUs) pair of fractions")
            for i, e in enumerate(v):
                checks.fraction(f"{k}[{i}]", e)

    # ------------------------------------------------------------------------------ per GPU
    def efficiency(self, per_gpu_k: float) -> float:
        """Scaling efficiency of a per-GPU rate on the larger job: rate / the measured 64-GPU per-GPU rate
        (linear scaling keeps tokens/s per GPU at ``base_k`` while the aggregate grows with the GPUs)."""
        return checks.positive("per_gpu_k", per_gpu_k) / self.base_k

    def per_gpu_k(self, figure_k: float) -> float:
        """The coherent reading of a 128-GPU figure: the job's aggregate divided by the OLD GPU count, so one
        GPU's share is figure × gpus_before / gpus_after (3.6k → 1.8k, 2.1k → 1.05k, 3.3k → 1.65k)."""
        return checks.positive("figure_k", figure_k) * self.gpus_before / self.gpus_after

    @property
    def line_rate_gb_s(self) -> float:
        """One Ethernet port's line rate in GB/s: Gb/s ÷ 8 bits per byte."""
        return self.link_gbit_s / 8

    @property
    def nodes_needed(self) -> int:
        return math.ceil(self.gpus_after / self.gpus_per_node)

    @property
    def peak_flops(self) -> float:
        """The catalogued bf16 dense peak of one GPU (312 TFLOP/s for an A100-SXM)."""
        from labkit.hardware.catalogue import lookup

        return lookup(self.device).peak("bf16")

    def mfu(self, per_gpu_k: float) -> float:
        """MFU of a per-GPU rate at 6·N FLOPs per token on the catalogued bf16 dense peak (chapter 4)."""
        from labkit.flops.mfu import mfu

        return mfu(tokens_per_s=per_gpu_k * 1e3, flops_per_token=6 * self.n_params, n_devices=1,
                   peak_flops=self.peak_flops)

    def readings(self) -> list[dict]:
        """Three ways to read the source's 128-GPU figures (3.6k expected, 2.1k measured, 3.3k fixed) next to
        its measured 1.8k per GPU on 64 GPUs: each row's arithmetic, the per-GPU rates it gives on 128 GPUs,
        their efficiency against 1.8k, whether its "expected" is linear scaling (1.8k per GPU kept), whether it
        reproduces the source's 58% and 92%, and the MFU of its measured per-GPU rate."""
        g0, g1, b = self.gpus_before, self.gpus_after, self.base_k
        figs = (self.expected_k, self.measured_k, self.fixed_k)
        rows = [("as labelled: per-GPU rates", 1.0, "as labelled"),
                (f"the {g1}-GPU job's aggregate", 1 / g1, f"÷ {g1}"),
                (f"the {g1}-GPU aggregate ÷ {g0} (the old GPU count)", g0 / g1, f"× {g0}/{g1}")]
        out = []
        for name, f, op in rows:
            e, m, x = (v * f for v in figs)
            eff = (m / b, x / b)
            match = all(abs(a - s) < 0.005 for a, s in zip(eff, self.stated_efficiency, strict=True))
            arith = ("; ".join(f"{v:g}k {op} = {v * f * 1e3:,.0f}" for v in figs) + " tokens/s per GPU; "
                     f"{m * 1e3:,.0f}/{b * 1e3:,.0f} = {eff[0]:.0%}, {x * 1e3:,.0f}/{b * 1e3:,.0f} = {eff[1]:.0%}")
            out.append({"reading": name, "arithmetic": arith, "expected per GPU (k)": e, "measured per GPU (k)": m,
                        "fixed per GPU (k)": x, "efficiency measured": eff[0], "efficiency fixed": eff[1],
                        "expected = linear (1.8k kept)": math.isclose(e, b, rel_tol=0.005),
                        "reproduces 58% / 92%": match, "MFU measured": self.mfu(m)})
        return out

    def coherent_reading(self) -> dict:
        """The one row of :meth:`readings` whose "expected" is linear scaling, whose efficiencies are the
        source's, and whose MFU is possible; raises if not exactly one is."""
        ok = [r for r in self.readings() if r["reproduces 58% / 92%"] and r["expected = linear (1.8k kept)"]
              and 0.05 < r["MFU measured"] <= 1]
        if len(ok) != 1:
            raise ValueError(f"{len(ok)} readings of the 13B figures are coherent; expected exactly one")
        return ok[0]

    def modelled(self, *, achievable: float = 0.5) -> dict:
        """MODELLED view (``labkit.perf.predict``, not the source's numbers): LLaMA-13B with 2048 × 2048-token
        batches on the "a100-25gbe" preset — pure data parallel (ZeRO-2) on 64 and 128 GPUs, and the fix
        (TP 2 × PP 2 inside a node — ranks numbered "tp-cp-pp-dp", so only the DP reduction crosses the 25 GbE
        ports — 4× accumulation) on 128. Returns {name: Prediction}."""
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
                                            sequence_parallel=True, order="tp-cp-pp-dp"),
                    c.with_nodes(self.gpus_after // per_node),
                    global_batch=8192, **kw)}

    @property
    def source_per_gpu_k(self) -> tuple[float, float, float]:
        """The source's per-GPU rates under the coherent reading: 1.8k on 64, 1.05k on 128, 1.65k fixed."""
        return self.base_k, self.per_gpu_k(self.measured_k), self.per_gpu_k(self.fixed_k)

    def modelled_gap(self, *, achievable: float = 0.5) -> dict:
        """MODELLED (⚠ f): per-GPU rates of :meth:`modelled` against the source's (:attr:`source_per_gpu_k`),
        ÷ the model's 64-GPU rate and ÷ compute alone (``Prediction.efficiency``); the 128-GPU step the 58% needs;
        the time the 92% allows the fix beyond its compute against its seconds on the 25 Gb/s ports. Taught in
        chapter 14 and chapter 29."""
        d64, d128, fix = self.modelled(achievable=achievable).values()
        base, (e_m, e_f) = d64.tokens_per_s_per_gpu, self.stated_efficiency
        need = d128.tokens_per_step / (self.gpus_after * e_m * base)           # the step that gives 58% of base
        g = fix.cluster.gpus_per_node                                          # what crosses the 25 Gb/s ports:
        link = sum(fix.comm_s.get(k, 0.0) for k, dims in (("pp", ("pp",)), ("dp", ("cp", "dp")))
                   if len({r // g for r in fix.layout.group_ranks(*dims)}) > 1)   # TP × PP inside a node: DP only
        per_gpu = [p.tokens_per_s_per_gpu for p in (d64, d128, fix)]
        vs_source = [m / (s * 1e3) for m, s in zip(per_gpu, self.source_per_gpu_k, strict=True)]
        return {"per_gpu": per_gpu, "vs_source": vs_source,
                "vs_64": [p.tokens_per_s_per_gpu / base for p in (d128, fix)],
                "vs_compute": [p.efficiency for p in (d128, fix)], "step_128": (need, d128.step_s),
                "fix": (fix.compute_s, fix.compute_s * (1 / e_f - 1), link, link * self.line_rate_gb_s)}

    def summary(self) -> str:
        """The case in a few printed lines, every figure from this object. Taught in chapter 14."""
        g0, g1, b = self.gpus_before, self.gpus_after, self.base_k
        _, m, x = self.source_per_gpu_k
        return "\n".join([
            f"13B on {g0} → {g1} {self.device} over {self.link_gbit_s:g} Gb/s Ethernet (the source's numbers):",
            f"  measured {b}k tokens/s per GPU on {g0} GPUs (MFU {self.mfu(b):.0%} of {self.peak_flops / 1e12:.0f} "
            f"TFLOP/s, 6N per token)",
            f"  on {g1}, labelled per GPU: expected {self.expected_k}k, measured {self.measured_k}k, fixed "
            f"{self.fixed_k}k; '{self.stated_efficiency[0]:.0%} → {self.stated_efficiency[1]:.0%}'",
            f"  coherent reading (the {g1}-GPU aggregate ÷ {g0}): {m:.2f}k → {x:.2f}k per GPU = "
            f"{self.efficiency(m):.0%} → {self.efficiency(x):.0%} of {b}k; MFU {self.mfu(b):.0%} → {self.mfu(m):.0%} "
            f"→ {self.mfu(x):.0%}",
            f"  aggregate: {g0 * b:.1f}k on {g0} GPUs → {g1 * m:.1f}k on {g1} measured (linear: {g1 * b:.1f}k) → "
            f"{g1 * x:.1f}k fixed",
            f"  busbw {self.busbw_across_gb_s} GB/s across nodes vs {self.busbw_inside_gb_s:g} GB/s inside; "
            f"one port's line rate {self.line_rate_gb_s:.3f} GB/s"])


def thirteen_b(**changes) -> ThirteenBCase:
    """The 13B-over-Ethernet seed case with its ⚠ records. Taught in chapter 14 (diagnosis), chapter 24
    (choosing a layout), chapter 29 (the case review) and chapter 11 (its bandwidth figures).

    ``changes`` override the source's inputs (a what-if: every derived figure and ⚠ box follows them).
    """
    c = _case(ThirteenBCase, changes)
    nvl, pcie4 = CLUSTERS["a100-25gbe"].intra_bw, LINKS["PCIe 4.0 x16"]      # bytes/s per direction (⚠ g)
    g, (e_m, e_f) = c.modelled_gap(), c.stated_efficiency
    pg, vs, v64, vc, (need, have), (comp, allow, link, gb) = (g[k] for k in (
        "per_gpu", "vs_source", "vs_64", "vs_compute", "step_128", "fix"))
    g0, g1, b = c.gpus_before, c.gpus_after, c.base_k
    e1, m1, x1 = c.per_gpu_k(c.expected_k), c.per_gpu_k(c.measured_k), c.per_gpu_k(c.fixed_k)
    src = c.source_per_gpu_k
    ws = (
        CaseWarning("a", "'per GPU' cannot be right: 3.6k would double a per-GPU rate, and 2.1k would beat 1.8k",
                    f"{b}k tokens/s per GPU on {g0} GPUs; on {g1} 'expected close to {c.expected_k}k', measured "
                    f"{c.measured_k}k, fixed to {c.fixed_k}k, every figure labelled per GPU; '{e_m:.0%} → {e_f:.0%} "
                    "scaling efficiency'",
                    f"linear scaling keeps a per-GPU rate at {b}k on {g1} GPUs while the aggregate doubles "
                    f"({g0} × {b}k = {g0 * b:.1f}k → {g1 * b:.1f}k), so '{c.expected_k}k per GPU expected' is "
                    f"{c.expected_k / b:g} × {b}k, a doubled per-GPU rate, and {c.measured_k}k per GPU would be "
                    f"faster per GPU than {b}k ({c.efficiency(c.measured_k):.0%}). Read as the {g1}-GPU aggregate "
                    f"÷ {g0}: {c.expected_k}k × {g0}/{g1} = {e1:g}k (linear), {c.measured_k}k × {g0}/{g1} = "
                    f"{m1:g}k and {c.fixed_k}k × {g0}/{g1} = {x1:g}k per GPU = {c.efficiency(m1):.0%} and "
                    f"{c.efficiency(x1):.0%} of {b}k",
                    f"the one reading under which every number is coherent: {c.expected_k}k, {c.measured_k}k and "
                    f"{c.fixed_k}k are the {g1}-GPU aggregate divided by {g0} (the old GPU count) — {m1:g}k and "
                    f"{x1:g}k per GPU, {c.efficiency(m1):.0%} and {c.efficiency(x1):.0%} of {b}k; MFU ≈ "
                    f"{c.mfu(b):.0%} → {c.mfu(m1):.0%} → {c.mfu(x1):.0%} of {c.peak_flops / 1e12:.0f} TF (6N per "
                    f"token). The job went {g0 * b:.1f}k → {g1 * m1:.1f}k tokens/s ({m1 * g1 / (b * g0):.2f}×) with "
                    f"twice the GPUs, then {g1 * x1:.1f}k fixed",
                    "linear scaling holds tokens/s per GPU constant and doubles the aggregate: a figure that doubles "
                    "with the GPU count is an aggregate, whatever its label", SOURCE),
        CaseWarning("b", f"{g1} ranks cannot sit on {c.nodes_claimed} A100 nodes",
                    f"{g1} ranks on {c.nodes_claimed} nodes",
                    f"{g1}/{c.gpus_per_node} GPUs per node = {c.nodes_needed} nodes; {c.nodes_claimed} nodes "
                    f"would need {g1 // c.nodes_claimed} GPUs each",
                    f"{c.nodes_needed} nodes of {c.gpus_per_node} A100", "an A100 HGX/DGX board holds 8 SXM GPUs",
                    SOURCE),
        CaseWarning("c", "3.2 GB/s across nodes is above one 25 Gb/s port's line rate",
                    f"nccl busbw {c.busbw_across_gb_s} GB/s across nodes vs {c.busbw_inside_gb_s:g} GB/s inside",
                    f"{c.link_gbit_s:g}e9 / 8 = {c.line_rate_gb_s:.3f} GB/s; {c.busbw_across_gb_s} / "
                    f"{c.line_rate_gb_s:.3f} = {c.busbw_across_gb_s / c.line_rate_gb_s:.3f}",
                    "with one port per node a cross-node ring reaches at most 3.125 GB/s (TCP sockets ~90% of it): "
                    "either nodes had more than one port, or 3.2 is not a cross-node ring's busbw",
                    "busbw is normalised so that a bandwidth-bound ring reaches the link's rate, never more",
                    SOURCE),
        CaseWarning("d", "the bandwidth figures come with an NCCL log fragment, not nccl-tests output",
                    "busbw 3.2 vs 22 GB/s, shown with an NCCL_DEBUG log fragment",
                    f"busbw = (S / t) × 2(n−1)/n (= {bus_factor('all_reduce', g1):.3f} at n = "
                    f"{g1}); an INFO log names transports and channels, with no size S or time t",
                    "quote busbw from nccl-tests (all_reduce_perf) at a stated size and rank count; use the log "
                    "for which transport (NET/Socket, NET/IB) NCCL chose",
                    "a bandwidth needs bytes and seconds; the log has neither", SOURCE),
        CaseWarning("f", f"{e_m:.0%} → {e_f:.0%} does not come from a step model alone",
                    f"pure DP falls to {e_m:.0%} per GPU on {g1} GPUs; {', '.join(c.fix)} bring it to "
                    f"{e_f:.0%}", f"labkit.perf (MODELLED, 50% of peak): {' → '.join(f'{x:,.0f}' for x in pg)} "
                    f"tokens/s per GPU (64 DP, 128 DP, 128 fixed) against the source's "
                    f"{' → '.join(f'{s * 1e3:,.0f}' for s in src)} (⚠ a) = {', '.join(f'{v:.0%}' for v in vs)} of "
                    f"them; {v64[0]:.0%} → {v64[1]:.0%} of the model's 64-GPU rate, "
                    f"{vc[0]:.0%} → {vc[1]:.0%} of compute alone. {e_m:.0%} of the model's 64-GPU rate needs a "
                    f"{need:.1f} s step on {g1} GPUs; compute + all-reduce give {have:.1f} s ({need - have:.1f} s "
                    f"short). {e_f:.0%} of compute alone allows the fix {allow:.1f} s beyond its {comp:.1f} s of "
                    f"compute; its traffic across nodes (the DP reduction; TP and PP stay inside a node) takes {link:.1f} s of the 25 Gb/s ports (≈ {gb:.0f} GB per "
                    f"node per step)",
                    f"the direction holds (per GPU falls 64 → 128 under DP; the fix recovers it), not the source's "
                    f"magnitudes: the model reaches the source's {src[1] * 1e3:,.0f} per GPU on 128 GPUs "
                    f"({vs[1]:.0%}) but not its {src[0] * 1e3:,.0f} on 64 ({vs[0]:.0%}) — a pure-DP step over one "
                    f"25 Gb/s port per node exposes more all-reduce than the source's 64-GPU run did, so the model's "
                    f"collapse is smaller. Per the model's own 64-GPU rate the fix passes {e_f:.0%} but the "
                    f"collapse lacks {need - have:.1f} s per step outside compute and communication (the data "
                    f"loading that prefetch + mmap removed); per compute alone, {e_f:.0%} needs ≥ "
                    f"{link - allow:.0f} s of Ethernet traffic hidden under compute, an overlap the source does not "
                    "document",
                    "a step model prices compute and communication; a loader stall is neither, and the fix changed "
                    "the loader too: 58% → 92% mixes the two (no knob is tuned to hide it)",
                    f"{SOURCE}; labkit.perf.predict"),
        CaseWarning("g", f"{c.busbw_inside_gb_s:g} GB/s 'inside a node' is a PCIe figure, not an {c.device} "
                         "node's NVLink",
                    f"nccl busbw {c.busbw_inside_gb_s:g} GB/s inside a node of {c.gpus_per_node} {c.device}",
                    f"an A100-SXM GPU has {nvl / 25e9:.0f} NVLink links of 25 GB/s per direction = {nvl / 1e9:.0f} GB/s (the "
                    f"'a100-25gbe' preset of labkit.perf); {c.busbw_inside_gb_s:g} GB/s is "
                    f"{c.busbw_inside_gb_s * 1e9 / nvl:.0%} of it — and {c.busbw_inside_gb_s * 1e9 / pcie4:.0%} of "
                    f"PCIe 4.0 x16's {pcie4 / 1e9:.1f} GB/s, the reading of chapter 11's 8-GPU PCIe node",
                    f"on an NVSwitch board a large all-reduce's busbw is a large share of the NVLink rate (hundreds of "
                    f"GB/s); {c.busbw_inside_gb_s:g} GB/s means the ranks talked over PCIe (no NVLink path, or P2P "
                    "disabled) — check the transport in NCCL's log before using it; the model here prices NVLink "
                    "inside a node",
                    "busbw is normalised so that a bandwidth-bound ring approaches the per-direction rate of the link "
                    "it runs over: a figure near PCIe's and far below NVLink's says which link carried it",
                    f"{SOURCE}; NVIDIA A100 datasheet (third-generation NVLink, 600 GB/s per GPU, both directions); "
                    "PCI-SIG PCI Express Base Specification 4.0 (16 GT/s, 128b/130b); nccl-tests doc/PERFORMANCE.md"),
    )
    return replace(c, warnings=ws)

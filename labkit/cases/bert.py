"""BERT-large on 4 GPUs: the source's numbers, what follows from them, and its ⚠ records (see
:mod:`labkit.cases`). Taught in chapters 5, 11, 14 and 30."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from labkit import checks
from labkit.cases._common import ISSUE_14, SYLLABUS, CaseWarning
from labkit.comm.models import bus_factor, ring_steps, ring_time
from labkit.perf.layout import CLUSTERS
from labkit.perf.steptime import StepParts

__all__ = ["BertLargeCase", "bert_large", "LINKS"]

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

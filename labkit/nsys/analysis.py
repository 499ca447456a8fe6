"""What an nsys timeline says about a run: GPU busy share, idle gaps and their CPU cause, launch
latency, NCCL overlap with compute, NVTX ranges projected onto the GPU.

From the timeline (:mod:`labkit.nsys.sqlite`), :func:`analyze` computes what a learner reads off the
nsys GUI: GPU busy share, the idle gaps and the CPU call that was running during each (a
``cudaStreamSynchronize`` from ``.item()``, a pageable ``cudaMemcpy``), the launch latency (API call
to kernel start), how much of the NCCL stream overlaps the compute stream, and each NVTX range
projected onto the GPU. Interval unions and overlaps are :mod:`labkit.intervals`.

Taught in chapter 10 (``chapters/part2_diagnosis/ch10_nsight_nvtx.ipynb``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

import labkit.intervals as iv
from labkit import checks
from labkit.nsys.sqlite import NsysTimeline

__all__ = ["NsysAnalysis", "analyze", "kernel_class"]


def kernel_class(name: str) -> str:
    """Family of a kernel from its name: ``nccl``, ``gemm``, ``attention``, ``optimizer`` or
    ``elementwise/other`` (the words cuBLAS/CUTLASS, FlashAttention, NCCL and PyTorch put in kernel
    names). Taught in chapter 10."""
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if any(w in n for w in ("flash", "fmha", "attention", "sdpa")):   # before gemm: they name cutlass types
        return "attention"
    if any(w in n for w in ("gemm", "xmma", "cutlass", "cublas", "matmul")):
        return "gemm"
    if any(w in n for w in ("adam", "multi_tensor_apply", "optimizer")):
        return "optimizer"
    return "elementwise/other"


@dataclass
class NsysAnalysis:
    """What the nsys timeline says about a run (times in ms unless named). Taught in chapter 10.

    ``gpu_busy_share``: fraction of the window with a kernel or copy running (what nvidia-smi calls
    utilisation); ``by_class``: GPU time per kernel family; ``gaps``: GPU idle gaps ≥ ``min_gap_us``
    with the CUDA API call and NVTX range on the CPU at that moment; ``launch_to_start_us``: median of
    kernel start − launch call start (a few µs: the GPU waits on the CPU, launch-bound; milliseconds:
    the CPU runs ahead and the GPU has a queue of work, as it should); ``nccl_overlap``: share of NCCL kernel time with a compute kernel
    running on another stream; ``nvtx_gpu``: per NVTX range, CPU time vs the GPU time of the kernels
    it launched (the GPU projection nsys draws under each range); ``step_ms``: the steady step — the
    median time between the GPU ends of consecutive NVTX ``step N`` ranges (their last kernel), NaN with
    fewer than two. ``window_ms`` / steps is not the step: it also holds the time before the first
    kernel (the first batch's load, which nothing can hide) and the last step's tail.
    """

    window_ms: float
    gpu_busy_ms: float
    gpu_busy_share: float
    by_class: pd.DataFrame
    gaps: pd.DataFrame
    launch_to_start_us: float
    nccl_overlap: float
    nvtx_gpu: pd.DataFrame
    streams: list[int]
    step_ms: float = float("nan")

    def summary(self) -> str:
        idle = self.gaps["gap_ms"].sum() if len(self.gaps) else 0.0
        cause = (self.gaps.groupby("cpu_call")["gap_ms"].sum().sort_values(ascending=False)
                 if len(self.gaps) else pd.Series(dtype=float))
        lines = [f"window {self.window_ms:.2f} ms, GPU busy {self.gpu_busy_ms:.2f} ms "
                 f"({100 * self.gpu_busy_share:.1f}%), streams {self.streams}"
                 + (f", steady step {self.step_ms:.2f} ms" if self.step_ms == self.step_ms else ""),
                 f"idle gaps >= threshold: {len(self.gaps)} totalling {idle:.2f} ms"]
        for call, ms in cause.head(3).items():
            lines.append(f"  during {call}: {ms:.2f} ms")
        lines.append(f"median launch-to-start {self.launch_to_start_us:.1f} us; "
                     f"NCCL time hidden under compute {100 * self.nccl_overlap:.1f}%")
        return "\n".join(lines)


def analyze(tl: NsysTimeline, *, min_gap_us: float = 50.0) -> NsysAnalysis:
    """Analyse a timeline (see :class:`NsysAnalysis`). Taught in chapter 10."""
    checks.nonneg("min_gap_us", min_gap_us)
    t0, t1 = tl.window_ns
    k = tl.kernels.assign(cls=tl.kernels["name"].map(kernel_class))
    busy = _union(k, tl.memcpy)                                   # kernels and copies
    busy_ns = iv.total(busy)
    by = (k.assign(ms=(k["end"] - k["start"]) / 1e6).groupby("cls")["ms"].agg(["count", "sum"])
          .rename(columns={"sum": "gpu_ms"}).sort_values("gpu_ms", ascending=False))
    if len(tl.memcpy):
        m = tl.memcpy
        by.loc["memcpy"] = [len(m), float((m["end"] - m["start"]).sum() / 1e6)]
    by["share"] = by["gpu_ms"] / by["gpu_ms"].sum()
    # idle gaps and what the CPU was doing meanwhile
    rows = []
    edges = list(zip(busy[1][:-1], busy[0][1:], strict=True))     # (end of busy i, start of busy i+1)
    rt = tl.runtime
    for s, e in edges:
        if (e - s) < min_gap_us * 1e3:
            continue
        ov = (np.minimum(rt["end"], e) - np.maximum(rt["start"], s)).clip(lower=0)
        call = rt.loc[ov.idxmax(), "name"] if len(rt) and ov.max() > 0.2 * (e - s) else "(no CUDA call: host work)"
        nv = tl.nvtx.assign(ov=(np.minimum(tl.nvtx["end"], e) - np.maximum(tl.nvtx["start"], s)).clip(lower=0))
        nv = nv[nv["ov"] > 0.5 * (e - s)]            # the deepest range covering most of the gap
        rng = nv.sort_values(["depth", "ov"])["text"].iloc[-1] if len(nv) else ""
        rows.append({"start_ms": (s - t0) / 1e6, "gap_ms": (e - s) / 1e6, "cpu_call": call, "nvtx": rng})
    gaps = pd.DataFrame(rows, columns=["start_ms", "gap_ms", "cpu_call", "nvtx"])
    # launch latency via correlation ids
    j = k.merge(rt[["correlation", "start", "tid"]], on="correlation", suffixes=("", "_api"))
    lat = float(np.median(j["start"] - j["start_api"]) / 1e3) if len(j) else float("nan")
    # NCCL overlap with compute on other streams
    is_nccl = k["cls"] == "nccl"
    nccl_iv = _union(k.loc[is_nccl])
    comp_iv = _union(k.loc[~is_nccl])
    nccl_ns = iv.total(nccl_iv)
    hidden = iv.intersect_total(nccl_iv, comp_iv) / nccl_ns if nccl_ns else 0.0
    # NVTX ranges projected onto the GPU: kernels whose launch call lies inside the range
    proj, step_ends = [], []
    for r in tl.nvtx[tl.nvtx["text"].str.fullmatch(r"step \d+")].sort_values("start").itertuples():
        inside = j[(j["tid"] == r.tid) & (j["start_api"] >= r.start) & (j["start_api"] < r.end)]
        if len(inside):
            step_ends.append(float(inside["end"].max()))
    step_ms = float(np.median(np.diff(step_ends)) / 1e6) if len(step_ends) >= 2 else float("nan")
    for text, grp in tl.nvtx.groupby("text", sort=False):
        cpu_ms, gpu_ms, lag = 0.0, 0.0, []
        for r in grp.itertuples():
            inside = j[(j["tid"] == r.tid) & (j["start_api"] >= r.start) & (j["start_api"] < r.end)]
            cpu_ms += (r.end - r.start) / 1e6
            if len(inside):
                gpu_ms += (inside["end"].max() - inside["start"].min()) / 1e6
                lag.append((inside["end"].max() - r.end) / 1e6)
        proj.append({"range": text, "instances": len(grp), "cpu_ms": cpu_ms, "gpu_span_ms": gpu_ms,
                     "gpu_end_after_cpu_ms": float(np.median(lag)) if lag else float("nan")})
    return NsysAnalysis(window_ms=(t1 - t0) / 1e6, gpu_busy_ms=busy_ns / 1e6, gpu_busy_share=busy_ns / (t1 - t0),
                        by_class=by, gaps=gaps, launch_to_start_us=lat, nccl_overlap=hidden,
                        nvtx_gpu=pd.DataFrame(proj), streams=sorted(int(s) for s in k["stream"].unique()),
                        step_ms=step_ms)


def _union(*frames: pd.DataFrame) -> iv.Intervals:
    """The merged set of the tables' [start, end) rows (:func:`labkit.intervals.union`)."""
    return iv.union(np.concatenate([f["start"].to_numpy(float) for f in frames]),
                    np.concatenate([f["end"].to_numpy(float) for f in frames]))

"""Draw an nsys timeline the way the Nsight Systems GUI does (matplotlib).

Taught in chapter 10 (``chapters/part2_diagnosis/ch10_nsight_nvtx.ipynb``).
"""
from __future__ import annotations

from labkit.nsys.analysis import kernel_class
from labkit.nsys.sqlite import NsysTimeline

__all__ = ["plot_timeline"]


def plot_timeline(tl: NsysTimeline, *, start_ms: float = 0.0, span_ms: float | None = None, ax=None):
    """Draw the nsys-style timeline: NVTX rows and CUDA API row per CPU thread, one row per GPU stream
    (kernels coloured by family, copies in grey). Taught in chapter 10."""
    import matplotlib.pyplot as plt

    t0, t1 = tl.window_ns
    lo = t0 + start_ms * 1e6
    hi = t1 if span_ms is None else lo + span_ms * 1e6
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.6))
    colours = {"gemm": "tab:blue", "attention": "tab:purple", "nccl": "tab:red", "optimizer": "tab:orange",
               "elementwise/other": "tab:cyan", "memcpy": "0.55", "api": "tab:olive", "sync": "black"}
    rows = []

    def bars(df, y, colour_of):
        df = df[(df["end"] > lo) & (df["start"] < hi)]
        segs = [((s - t0) / 1e6, (e - s) / 1e6) for s, e in zip(df["start"], df["end"], strict=True)]
        ax.broken_barh(segs, (y - 0.4, 0.8), facecolors=[colour_of(r) for r in df.itertuples()], linewidth=0)

    y = 0
    for stream in sorted(tl.kernels["stream"].unique(), reverse=True):
        ks = tl.kernels[tl.kernels["stream"] == stream]
        bars(ks, y, lambda r: colours[kernel_class(r.name)])
        ms = tl.memcpy[tl.memcpy["stream"] == stream]
        bars(ms, y, lambda r: colours["memcpy"])
        rows.append(f"GPU stream {stream}")
        y += 1
    for tid in sorted(tl.runtime["tid"].unique()):
        rt = tl.runtime[tl.runtime["tid"] == tid]
        bars(rt, y, lambda r: colours["sync"] if "Synchronize" in r.name or "Memcpy" in r.name else colours["api"])
        rows.append(f"CUDA API tid {tid}")
        y += 1
        nv = tl.nvtx[tl.nvtx["tid"] == tid]
        palette = {t: plt.cm.Pastel1(i % 9) for i, t in enumerate(sorted(tl.nvtx["text"].unique()))}
        for d in sorted(nv["depth"].unique()):
            lev = nv[nv["depth"] == d]
            bars(lev, y, lambda r, pal=palette: pal[r.text])
            for r in lev[(lev["end"] > lo) & (lev["start"] < hi)].itertuples():   # label ranges wide enough
                a, b = max(r.start, lo), min(r.end, hi)
                if b - a > 0.06 * (hi - lo):
                    ax.text(((a + b) / 2 - t0) / 1e6, y, r.text, ha="center", va="center", fontsize=7)
            rows.append(f"NVTX depth {d}")
            y += 1
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlim((lo - t0) / 1e6, (hi - t0) / 1e6)
    ax.set_xlabel("time (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax

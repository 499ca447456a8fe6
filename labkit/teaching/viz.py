"""Shared matplotlib helpers for the course's figures (one look across all chapters).

Every function takes an optional ``ax`` and returns the Axes it drew on, so a notebook can combine
them in one figure. Numbers are drawn from labkit results (DataFrames, dicts); nothing here computes
a result. Units use SI prefixes (:func:`si`), e.g. ``si(1.2e12, "FLOP/s")`` → "1.2 TFLOP/s".

Written for Part I (chapters 1–6); used by all chapters.
"""
from __future__ import annotations

import math

from labkit.units import si

__all__ = ["si", "new_axes", "legend_outside", "roofline", "stacked_parts", "scaling", "bars", "ring_allreduce", "memory_timeline", "ddp_timeline"]
__all__ += ["grad_histogram"]     # chapter 18
__all__ += ["zero_stages", "recompute_tradeoff", "scaling_case"]     # chapters 20, 21, 29

PALETTE = {"compute": "#4C72B0", "communication": "#DD8452", "comm": "#DD8452", "memory": "#55A868",
           "data": "#C44E52", "scheduling": "#8172B3", "sync": "#937860", "forward": "#4C72B0",
           "backward": "#64B5CD", "optimizer": "#8172B3", "idle": "#BBBBBB",
           # the named overheads of chapter 5's BERT-large step, and what they leave unexplained
           "data loading": "#C44E52", "checkpointing": "#CCB974", "logging": "#6B6B6B", "unexplained": "#A9A9A9"}


def new_axes(ncols: int = 1, *, width: float = 5.5, height: float = 3.6):
    """A figure with ``ncols`` side-by-side Axes (returns fig, list of axes). Used from chapter 1 on."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def _ax(ax):
    if ax is None:
        return new_axes()[1][0]
    return ax


def legend_outside(ax, *, fontsize: int = 7):
    """The legend to the right of the axes, never over the data (bars reach the top of a share plot; a
    legend inside covers them). Jupyter's inline figures are cropped with ``bbox_inches="tight"``, so
    the legend is kept in the picture. Taught in chapter 2 (reading a step's parts)."""
    return ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def roofline(peak_flops: float, bandwidth: float, points=None, *, ax=None, label_points: bool = True,
             title: str | None = None, extra_roofs: dict | None = None):
    """Draw a log-log roofline (Williams et al. 2009) and optional measured points.

    ``points``: a DataFrame with columns "intensity" and "FLOP/s" (``labkit.kernels.roofline.sweep_matmul``).
    ``extra_roofs``: {label: peak FLOP/s} for more compute ceilings (e.g. another dtype). Chapter 6.
    """
    import numpy as np

    ax = _ax(ax)
    ridge = peak_flops / bandwidth
    lo = ridge / 1e3
    hi = ridge * 1e2
    if points is not None and len(points):
        lo = min(lo, float(points["intensity"].min()) / 2)
        hi = max(hi, float(points["intensity"].max()) * 2)
    xs = np.logspace(math.log10(lo), math.log10(hi), 200)
    ax.loglog(xs, np.minimum(peak_flops, xs * bandwidth), color="black", lw=2,
              label=f"roof: {si(peak_flops, 'FLOP/s')}, {si(bandwidth, 'B/s')}")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, peak_flops), textcoords="offset points", xytext=(4, -14),
                fontsize=8, color="grey")
    for name, p in (extra_roofs or {}).items():
        ax.loglog(xs, np.minimum(p, xs * bandwidth), ls="--", lw=1, label=f"{name}: {si(p, 'FLOP/s')}")
    if points is not None and len(points):
        colors = ["#C44E52" if b == "memory" else "#4C72B0" for b in points.get("bound", ["compute"] * len(points))]
        ax.scatter(points["intensity"], points["FLOP/s"], c=colors, zorder=3, s=28, label="measured matmuls")
        if label_points and {"m", "n", "k"} <= set(points.columns):
            for _, r in points.iterrows():
                ax.annotate(f"{r['m']}×{r['n']}×{r['k']}", (r["intensity"], r["FLOP/s"]), fontsize=6,
                            textcoords="offset points", xytext=(3, 3))
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title or "Roofline")
    ax.legend(fontsize=7, loc="lower right")
    return ax


def stacked_parts(rows: dict[str, dict[str, float]], *, ax=None, unit: str = "ms", scale: float = 1e3,
                  title: str | None = None):
    """Horizontal stacked bars: {row label: {part: seconds}} (e.g. step = compute + comm + sync).

    Taught in chapter 2 (phases of a step) and chapter 5 (where the speedup goes)."""
    ax = _ax(ax)
    labels = list(rows)
    seen, widest = set(), 0.0
    for i, lab in enumerate(labels):
        left = 0.0
        for part, v in rows[lab].items():
            w = v * scale
            ax.barh(i, w, left=left, color=PALETTE.get(part), edgecolor="white",
                    label=part if part not in seen else None)
            if w > 0:
                ax.text(left + w / 2, i, f"{w:.0f}", ha="center", va="center", fontsize=7, color="white")
            seen.add(part)
            left += w
        ax.text(left, i, f" {left:.0f} {unit}", va="center", fontsize=8)
        widest = max(widest, left)
    ax.set_xlim(0, widest * 1.18 or 1.0)      # room for the totals inside the axes, clear of the legend
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    legend_outside(ax)
    if title:
        ax.set_title(title)
    return ax


def scaling(table, *, ax=None, title: str | None = None, label: str = "measured"):
    """Speedup vs devices with the ideal line; ``table`` from ``labkit.measure.scaling.scaling_table``. Chapter 5."""
    ax = _ax(ax)
    n = table["devices"]
    ax.plot(n, n, "k--", lw=1, label="ideal (linear)")
    ax.plot(n, table["speedup"], "o-", label=label)
    for x, s, e in zip(n, table["speedup"], table["efficiency"], strict=True):
        ax.annotate(f"{s:.2f}× ({e:.0%})", (x, s), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set_xlabel("devices")
    ax.set_ylabel("speedup")
    ax.set_title(title or "Scaling")
    ax.legend(fontsize=8)
    return ax


def bars(values: dict[str, float], *, ax=None, unit: str = "", title: str | None = None, fmt="{:.3g}"):
    """Simple labelled bars: {label: value}. Used in chapter 3 (formulas vs exact FLOP count)."""
    ax = _ax(ax)
    labels = list(values)
    ax.bar(labels, [values[k] for k in labels], color=[PALETTE.get(k, "#4C72B0") for k in labels])
    for i, k in enumerate(labels):
        ax.annotate(fmt.format(values[k]), (i, values[k]), ha="center", textcoords="offset points",
                    xytext=(0, 2), fontsize=8)
    ax.set_ylabel(unit)
    if title:
        ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    return ax


def ring_allreduce(log, *, ax=None, title: str | None = None):
    """The ring all-reduce step by step, drawn from its log (``labkit.comm.run_ring(...).log``).

    One row per step, one column per rank; each cell is the chunk that rank received that step (the
    colour is the chunk, so a chunk's trip round the ring reads as a diagonal), with where it came from
    and which ranks' inputs it now holds (Σ over ``holds``). Reduce-scatter rows add, all-gather rows
    copy. Taught in chapter 11 (communication diagnostics, §1)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    need = {"step", "rank", "phase", "send_chunk", "to", "recv_chunk", "from"}
    missing = need - set(log.columns)
    if missing:
        raise ValueError(f"log lacks columns {sorted(missing)}; pass labkit.comm.run_ring(...).log")
    n_ranks, n_steps = int(log["rank"].max()) + 1, int(log["step"].max()) + 1
    if ax is None:
        _, (ax,) = new_axes(width=1.9 * n_ranks + 1.2, height=0.62 * n_steps + 1.0)
    cmap = plt.get_cmap("tab10")
    for r in log.to_dict("records"):
        ag = r["phase"] == "all-gather"
        ax.add_patch(Rectangle((r["rank"], r["step"]), 1, 1, facecolor=cmap(r["recv_chunk"] % 10),
                               alpha=0.35 if ag else 0.8, edgecolor="white", lw=2))
        held = r.get("holds")
        summed = ("Σ r" + "+".join(str(h) for h in held)) if held else ""
        ax.text(r["rank"] + 0.5, r["step"] + 0.5, f"chunk {r['recv_chunk']} ← r{r['from']}\n{summed}",
                ha="center", va="center", fontsize=7)
    rs_steps = int((log.groupby("step")["phase"].first() == "reduce-scatter").sum())
    ax.axhline(rs_steps, color="black", lw=1.5)
    ax.set_xlim(0, n_ranks)
    ax.set_ylim(n_steps, 0)
    ax.set_xticks([i + 0.5 for i in range(n_ranks)], [f"rank {i}" for i in range(n_ranks)])
    ax.set_yticks([i + 0.5 for i in range(n_steps)],
                  [f"{i} {'RS' if i < rs_steps else 'AG'}" for i in range(n_steps)])
    ax.set_ylabel("step (RS = reduce-scatter: add; AG = all-gather: copy)", fontsize=8)
    ax.xaxis.tick_top()
    ax.tick_params(length=0, labelsize=8)
    ax.set_title(title or f"ring all-reduce on {n_ranks} ranks: the chunk each rank receives per step", fontsize=9)
    return ax


def memory_timeline(step, references: dict[str, float] | None = None, *, ax=None, unit: str = "MiB",
                    title: str | None = None):
    """Allocated memory through one training step (``labkit.memory.StepMemoryRecorder(...).result``): the measured curve,
    the forward / backward / optimizer phases shaded, the peak marked, and ``references`` ({label:
    bytes}, e.g. modelled parameters, + gradients, + optimizer states) as dashed horizontal lines.
    Taught in chapter 13 (memory anatomy, §3)."""
    scale = {"MiB": 2**20, "MB": 1e6, "GiB": 2**30, "GB": 1e9, "KiB": 2**10}
    if unit not in scale:
        raise ValueError(f"unit={unit!r}: one of {sorted(scale)}")
    ax = _ax(ax)
    s, k = step.samples, scale[unit]
    for p in step.phases.to_dict("records"):
        ax.axvspan(p["start_ms"], p["end_ms"], color=PALETTE.get(p["phase"], "#DDDDDD"), alpha=0.15, lw=0)
        ax.text((p["start_ms"] + p["end_ms"]) / 2, 1.0, p["phase"], transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize=8)
    ax.step(s["t_ms"], s["allocated"] / k, where="post", color="black", lw=1.2, label="allocated (measured)")
    i = s["allocated"].idxmax()
    ax.plot([s.loc[i, "t_ms"]], [s.loc[i, "allocated"] / k], "v", color="#C44E52",
            label=f"peak {s.loc[i, 'allocated'] / k:.1f} {unit} ({s.loc[i, 'phase']})")
    colors = ["#4C72B0", "#64B5CD", "#8172B3", "#55A868", "#DD8452", "#937860"]
    for j, (label, v) in enumerate((references or {}).items()):
        ax.axhline(v / k, ls="--", lw=1, color=colors[j % len(colors)], label=label)
    ax.set_xlabel("time since the step began (ms)")
    ax.set_ylabel(f"allocated ({unit})")
    if title:
        ax.set_title(title, pad=14)
    legend_outside(ax)
    return ax


def ddp_timeline(tl, *, ax=None, title: str | None = None):
    """One DDP step on two lanes (``labkit.trace.ddp_timeline``): forward, backward and the optimizer
    step on the compute lane, each gradient bucket's all-reduce on the communication lane, with a tick
    where backward launched it. Taught in chapter 9 (trace analytics, §2)."""
    if ax is None:
        _, (ax,) = new_axes(width=8.0, height=2.6)
    lanes = {"compute": 1.0, "all-reduce": 0.0}
    h = 0.6
    for name, span in (("forward", tl.forward), ("optimizer", tl.optimizer)):
        if span:
            ax.broken_barh([(span[0], span[1] - span[0])], (lanes["compute"] - h / 2, h), color=PALETTE[name],
                           label=name)
    bw = tl.backward
    ax.broken_barh(list(zip(bw["start_ms"], bw["end_ms"] - bw["start_ms"], strict=True)),
                   (lanes["compute"] - h / 2, h), color=PALETTE["backward"], label="backward (autograd)")
    colors = ["#DD8452", "#C44E52", "#937860", "#8172B3"]
    for b in tl.buckets.to_dict("records"):
        c = colors[b["bucket"] % len(colors)]
        ax.broken_barh([(b["start_ms"], b["end_ms"] - b["start_ms"])], (lanes["all-reduce"] - h / 2, h), color=c,
                       label=f"bucket {b['bucket']} all-reduce")
        ax.plot([b["launch_ms"]] * 2, [lanes["compute"] - h / 2, lanes["all-reduce"] + h / 2], ls=":", color=c, lw=1)
        ax.text(b["start_ms"], lanes["all-reduce"] - h / 2 - 0.08, f"b{b['bucket']}", ha="left", va="top",
                fontsize=7, color=c)
    ax.set_yticks(list(lanes.values()), ["compute\n(main thread)", "all-reduce\n(comm thread)"])
    ax.set_ylim(-0.75, 1.55)
    ax.set_xlabel("ms since the step began")
    ax.set_title(title or f"rank {tl.rank}, step {tl.step}: bucketed all-reduce beside backward", fontsize=9)
    legend_outside(ax)
    return ax


def grad_histogram(rows, layers=None, *, ax=None, fmt: str = "fp16", title: str | None = None):
    """Per-layer histograms of log2|gradient| (``labkit.train.precision.grad_stats`` rows of one step, or several
    runs' rows as {label: rows}) against ``fmt``'s limits: values left of its smallest subnormal become 0,
    between it and the smallest normal lose precision, right of its largest value become inf. The
    gradients are as backward left them, × the loss scale each row carries. Taught in chapter 18."""
    from labkit.train.precision import format_info, hist_edges

    runs = rows if isinstance(rows, dict) else {"": rows}
    ax = _ax(ax)
    k = hist_edges()
    info = format_info(fmt)
    lo, tiny, hi = (math.log2(info[n]) for n in ("smallest_subnormal", "smallest_normal", "max"))
    ax.axvspan(k[0], lo, color="#C44E52", alpha=0.08, lw=0)
    ax.axvspan(hi, k[-1] + 1, color="#C44E52", alpha=0.08, lw=0)
    for x, name in ((lo, "smallest subnormal"), (tiny, "smallest normal"), (hi, "max")):
        ax.axvline(x, color="#C44E52", ls="--" if name != "smallest normal" else ":", lw=1)
        ax.text(x, 1.0, f" {fmt} {name}", transform=ax.get_xaxis_transform(), rotation=90, va="top",
                ha="right", fontsize=7, color="#C44E52")
    colors = ["#4C72B0", "#DD8452", "#55A868", "#8172B3", "#937860", "#64B5CD"]
    j = 0
    for label, run in runs.items():
        for r in run:
            if layers is not None and r["layer"] not in layers:
                continue
            name = " ".join(s for s in (label, r["layer"], f"(×{r['scale']:g})") if s)
            ax.stairs(r["hist"], [*k, k[-1] + 1], color=colors[j % len(colors)], lw=1.3, label=name)
            j += 1
    ax.set_xlabel("log2 |gradient value|  (bin k holds [2^k, 2^(k+1)))")
    ax.set_ylabel("values")
    ax.set_title(title or f"gradients against the {fmt} range", fontsize=9)
    legend_outside(ax)
    return ax


def zero_stages(stages: dict, live=None, *, n_ranks: int | None = None, axes=None):
    """Per-rank bytes by ZeRO stage, stacked as parameters, gradients and optimizer state (ZeRO, Rajbhandari
    et al. SC 2020, Figure 1): ``stages`` maps a label to a :func:`labkit.memory.model_state_bytes` result.
    With ``live`` (``labkit.memory.measure_knobs``' table, one row per FSDP2 knob) a second panel shows the
    parameter bytes rank 0 held, measured (bars) against ``memory.sharding``'s prediction (markers), at the
    forward peak and between forward and backward, beside its model states. Taught in chapter 20."""
    if not stages:
        raise ValueError("stages is empty: pass {label: memory.model_state_bytes(...)} for at least one stage")
    if axes is None:
        axes = new_axes(2 if live is not None else 1, width=5.2, height=3.6)[1]
    ax = axes[0]
    labels, bottom = list(stages), [0.0] * len(stages)
    for part, color in (("params", "#4C72B0"), ("grads", "#DD8452"), ("optimizer", "#55A868")):
        vals = [getattr(stages[k], part) / 1e9 for k in labels]
        ax.bar(labels, vals, bottom=bottom, color=color, label={"params": "parameters", "grads": "gradients", "optimizer": "optimizer state"}[part])
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, total in enumerate(bottom):
        ax.annotate(f"{total:.3g} GB", (i, total), ha="center", textcoords="offset points", xytext=(0, 2), fontsize=8)
    ax.set_ylabel("model states per rank, GB")
    ax.set_title("ZeRO stages" + (f" on {n_ranks} ranks" if n_ranks else "") + " (model)")
    ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    ax.legend(fontsize=7)
    if live is None:
        return axes
    ax, knobs, x = axes[1], list(live.index), range(len(live))
    for off, col, pred, color, name in ((-0.2, "params peak fwd MB", "predicted peak MB", "#4C72B0", "at the forward peak"),
                                        (0.2, "params after fwd MB", "predicted after MB", "#64B5CD", "forward → backward")):
        ax.bar([i + off for i in x], live[col], width=0.4, color=color, label=f"measured, {name}")
        ax.plot([i + off for i in x], live[pred], "k_", ms=12, mew=2)
    ax.plot([], [], "k_", ms=12, mew=2, label="predicted (memory.sharding)")
    ax.axhline(float(live["model states MB"].iloc[0]), color="#55A868", ls="--", lw=1, label="model states, measured")
    ax.set_xticks(list(x), knobs, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("parameter bytes on rank 0, MB")
    ax.set_title("FSDP2 knobs, live ranks")
    legend_outside(ax)
    return axes


def recompute_tradeoff(costs, *, budget_bytes: float | None = None, measured=None, axes=None):
    """Activation memory against recompute cost, one point per checkpointing policy: ``costs`` is
    ``labkit.memory.recompute.policy_costs``' table (bytes and extra FLOPs; the cheapest policy under
    ``budget_bytes`` ringed). With ``measured`` (``recompute.policy_table``: saved bytes measured and
    predicted, FLOPs counted) a first panel shows the live model the same way. Taught in chapter 21."""
    panels = [("live", measured)] if measured is not None else []
    panels.append(("priced", costs))
    if axes is None:
        axes = new_axes(len(panels), width=5.0, height=3.6)[1]
    for ax, (kind, t) in zip(axes, panels, strict=True):
        if kind == "live":
            x, y, unit = (t["executed_over_model"] - 1) * 100, t["saved_bytes"] / 2**20, "MiB"
            ax.plot(x, t["predicted_bytes"] / 2**20, "k_", ms=14, mew=2, label="predicted")
            ax.set_title("measured on this machine")
        else:
            x, y, unit = t["extra_flops"] * 100, t["activation_bytes"] / 2**30, "GiB"
            ax.set_title("priced by the model")
            if budget_bytes is not None:
                ax.axhline(budget_bytes / 2**30, color="#C44E52", ls="--", lw=1, label="budget")
                fits = t[t["activation_bytes"] <= budget_bytes].sort_values("extra_flops")
                if len(fits):
                    ax.plot(fits["extra_flops"].iloc[0] * 100, fits["activation_bytes"].iloc[0] / 2**30, "o", ms=14,
                            mfc="none", mec="#C44E52", label="cheapest that fits")
        names = t.index if "policy" not in t else t["policy"]
        ax.plot(x, y, "o-", color="#4C72B0", label="activations kept")
        for i, (xi, yi, n) in enumerate(zip(x, y, names, strict=True)):
            ax.annotate(str(n), (xi, yi), textcoords="offset points", xytext=(5, 3 if i % 2 else -11), fontsize=8)
        ax.set_xlabel("recomputed FLOPs, % of the model's")
        ax.set_ylabel(f"activations saved for backward, {unit}")
        ax.legend(fontsize=7)
    return axes


def scaling_case(case, modelled: dict, *, axes=None):
    """Expected, measured and fixed scaling of a scale-out case (``labkit.teaching.cases.thirteen_b``) beside the
    performance model's view (``case.modelled()``: pure DP before and after, the fix after): aggregate
    tokens/s against GPUs with the linear line, and scaling efficiency per GPU. Taught in chapter 29."""
    g0, g1 = case.gpus_before, case.gpus_after
    base, measured, fixed = (k * 1e3 for k in case.source_per_gpu_k)
    m0, m1, mfix = (p.tokens_per_s_per_gpu for p in modelled.values())
    if axes is None:
        axes = new_axes(2, width=5.0, height=3.6)[1]
    ax = axes[0]
    ax.plot([g0, g1], [base * g0 / 1e3, base * g1 / 1e3], "k--", lw=1, label="expected (linear)")
    ax.plot([g0, g1], [base * g0 / 1e3, measured * g1 / 1e3], "o-", color="#C44E52", label="source, measured")
    ax.plot([g1], [fixed * g1 / 1e3], "*", ms=12, color="#C44E52", label="source, fixed")
    ax.plot([g0, g1], [m0 * g0 / 1e3, m1 * g1 / 1e3], "s:", color="#4C72B0", label="model, pure DP")
    ax.plot([g1], [mfix * g1 / 1e3], "P", ms=10, color="#4C72B0", label="model, the fix")
    ax.set(xlabel="GPUs", ylabel="aggregate k tokens/s", xticks=[g0, g1], title="throughput", ylim=(0, None))
    ax.legend(fontsize=7)
    ax = axes[1]
    groups = {"source": (measured / base, fixed / base), "model": (m1 / m0, mfix / m0)}
    for off, (who, (e1, e2)), color in zip((-0.2, 0.2), groups.items(), ("#C44E52", "#4C72B0"), strict=True):
        ax.bar([off, 1 + off], [e1 * 100, e2 * 100], width=0.4, color=color, label=who)
        for xi, e in ((off, e1), (1 + off, e2)):
            ax.annotate(f"{e:.0%}", (xi, e * 100), ha="center", textcoords="offset points", xytext=(0, 2), fontsize=8)
    ax.axhline(100, color="k", ls="--", lw=1)
    ax.set_xticks([0, 1], [f"{g1} GPUs, measured", f"{g1} GPUs, fixed"], fontsize=8)
    ax.set(ylabel=f"scaling efficiency vs {g0} GPUs, %", title="per GPU")
    ax.legend(fontsize=7)
    return axes

"""The BERT-large case reviewed end to end, the source's KPIs against labkit's thresholds, and the course's
checklist — every figure derived from :func:`labkit.teaching.cases.bert_large`, :class:`labkit.diagnose.Thresholds` and
the course manifest (:mod:`labkit.course`), none typed by hand.

- :func:`bert_steps` — the case's step, one row per stage of the story (1 GPU → … → the 2.7× target).
- :func:`target_scenarios` — what a target speed-up needs: fixes combined, each a modelled step.
- :func:`kpi_table` — the source's five KPIs evaluated on the case's steps beside labkit's rules.
- :func:`checklist` — the diagnosis-and-tuning checklist, one row per check, thresholds and chapters resolved.
- :func:`next_directions` — the source's "next directions" placed on the course map.

Taught in chapter 30 (the case review and the checklist).
"""
from __future__ import annotations

from labkit import checks, course
from labkit.comm.models import ring_time
from labkit.perf.steptime import StepParts
from labkit.teaching.cases.bert import LINKS, BertLargeCase, bert_large

__all__ = ["TARGET_SPEEDUP", "bert_steps", "target_scenarios", "kpi_table", "checklist", "next_directions",
           "NEXT_DIRECTIONS", "KPI_SOURCE"]

#: The source's final speed-up of the BERT-large case on 4 GPUs (over one GPU, the global batch kept).
TARGET_SPEEDUP = 2.7
#: The source's KPIs: (name, metric key, comparison, threshold).
KPI_SOURCE = (("GPU-Util > 80 %", "gpu_util", ">", 0.80), ("communication < 40 %", "comm", "<", 0.40),
              ("pipeline efficiency > 70 %", "pipeline", ">", 0.70), ("power ≥ 80 % TDP", "power", ">=", 0.80),
              ("PCIe ≤ 70 %", "pcie", "<=", 0.70))


def _case(case) -> BertLargeCase:
    c = bert_large() if case is None else case
    if not isinstance(c, BertLargeCase):
        raise checks.ArgumentTypeError(f"case must be a labkit.teaching.cases.BertLargeCase (labkit.teaching.cases.bert_large()), "
                                       f"got {type(c).__name__}")
    return c


def bert_steps(case=None, target: float = TARGET_SPEEDUP) -> list[dict]:
    """The BERT-large step at each stage of the story, in ms, with its speed-up over one GPU and its
    efficiency (speed-up ÷ N). Taught in chapter 30."""
    c = _case(case)
    t = checks.positive("target", target)
    rows = [("1 GPU", c.t1_ms, "the source's one-GPU step"),
            (f"{c.n} GPUs, ideal", c.ideal_ms, f"t₁/N = {c.t1_ms:g}/{c.n}"),
            (f"{c.n} GPUs, no overlap", c.step_ms(False), f"{c.compute_ms:g} + {c.comm_ms:g} + {c.sync_ms:g}"),
            (f"{c.n} GPUs, overlapped", c.step_ms(True), f"max({c.compute_ms:g}, {c.comm_ms:g}) + {c.sync_ms:g}"),
            ("+ named overheads", c.named_step_ms, f"{c.step_ms(True):g} + {c.named_overhead_ms:g}"),
            (f"measured ({c.measured_speedup:g}×)", c.measured_step_ms,
             f"{c.t1_ms:g}/{c.measured_speedup:g}: + {c.unexplained_ms:g} ms unexplained"),
            (f"target ({t:g}×)", c.t1_ms / t, f"{c.t1_ms:g}/{t:g}")]
    return [{"stage": s, "step (ms)": ms, "speed-up": c.t1_ms / ms, "efficiency": c.t1_ms / ms / c.n, "how": how}
            for s, ms, how in rows]


def half_precision_comm_ms(case=None) -> float:
    """The case's all-reduce with 2-byte gradients on the link its 120 ms implies: the ring model (Thakur et al.
    2005) of half the bytes at :meth:`BertLargeCase.implied_link_bw`. Taught in chapter 30."""
    c = _case(case)
    return ring_time("all_reduce", c.n_params * 2, c.n, alpha=0.0, beta=1 / c.implied_link_bw(0.0)) * 1e3


def target_scenarios(case=None, target: float = TARGET_SPEEDUP) -> list[dict]:
    """Fixes of the case combined, each as a modelled step max(compute, comm) + sync + the overheads left,
    and whether it reaches ``target`` (default the source's 2.7×). The fixes: the named overheads removed
    (a prefetching loader, an asynchronous checkpoint, logging off the step), the unexplained rest found and
    removed, the source's communication fix (its +40 % bandwidth utilisation: ``BertLargeCase.fixed_comm_ms``)
    and 2-byte gradients (:func:`half_precision_comm_ms`). Taught in chapter 30."""
    c = _case(case)
    t = checks.positive("target", target)
    half = half_precision_comm_ms(c)
    rows = []
    comms = ((f"fp32 gradients ({c.comm_ms:g} ms)", c.comm_ms),
             (f"source's fix: +{c.comm_util_gain:.0%} bandwidth ({c.fixed_comm_ms:.0f} ms)", c.fixed_comm_ms),
             (f"2-byte gradients ({half:.0f} ms)", half))
    for comm_name, comm in comms:
        for over_name, named, unexplained in (("as measured", c.named_overhead_ms, c.unexplained_ms),
                                              ("named overheads removed", 0.0, c.unexplained_ms),
                                              ("unexplained found and removed", c.named_overhead_ms, 0.0),
                                              ("all overheads removed", 0.0, 0.0)):
            step = StepParts(c.compute_ms, comm, c.sync_ms).step(True) + named + unexplained
            rows.append({"all-reduce": comm_name, "overheads": over_name, "step (ms)": step,
                         "speed-up": c.t1_ms / step, f"reaches {t:g}×": c.t1_ms / step >= t})
    return rows


def _kpi_values(c: BertLargeCase, step_ms: float, serial_ms: float) -> dict:
    """The KPIs' metrics on a step of ``step_ms`` whose overlapped part is the case's and whose rest
    (``serial_ms``: overheads) runs on the host with the GPU idle. The source's definitions: pipeline
    efficiency = useful compute time ÷ total time (有效计算时间/总耗时: 90/135 = 67 %, 90/200 = 45 %);
    communication share = comm ÷ (comm + compute) (120/210 = 57 %, the same on both steps)."""
    busy = c.step_ms(True)                  # some kernel runs: compute or the all-reduce, then the sync
    exposed = c.parts.exposed_comm(True) * 1e3
    need = c.implied_link_bw()
    return {"gpu_util": busy / step_ms, "compute": c.compute_ms / step_ms,
            "comm": c.comm_ms / (c.comm_ms + c.compute_ms), "comm_of_step": c.comm_ms / step_ms,
            "comm_exposed": exposed / step_ms, "pipeline": c.compute_ms / step_ms, "power": None,
            "pcie": need / LINKS["PCIe 3.0 x16"] * c.comm_ms / step_ms, "serial": serial_ms}


def _thresholds(th, fields):
    missing = [f for f in fields if not isinstance(getattr(th, f, None), (int, float))]
    if missing:
        raise checks.ArgumentTypeError(f"thresholds must be a labkit.diagnose.Thresholds (it lacks {missing}), got "
                                       f"{type(th).__name__}")
    return th


def kpi_table(thresholds, case=None) -> list[dict]:
    """The source's KPIs (:data:`KPI_SOURCE`) on the case's overlapped step and its measured step, beside the
    rule of ``thresholds`` (a :class:`labkit.diagnose.Thresholds`) that judges the same thing, and whether the KPI is wrong or
    unmeasurable as stated (``warn``). GPU-Util is the share of the step in which some kernel runs (the
    all-reduce kernel included); PCIe is the link's load if the all-reduce ran over PCIe 3.0 x16, as the
    source says. Pipeline efficiency is the source's useful compute ÷ total time and communication its
    comm ÷ (comm + compute) (:func:`_kpi_values`). Taught in chapter 30."""
    c = _case(case)
    th = _thresholds(thresholds, ("mfu_low", "comm_exposed", "data_wait", "host_wait", "severity_high"))
    ov, me = _kpi_values(c, c.step_ms(True), 0.0), _kpi_values(c, c.measured_step_ms, c.overhead_ms)
    need_share = c.implied_link_bw() / LINKS["PCIe 3.0 x16"]
    m_min = next(m for m in range(1, 1000) if m / (m + 3) > 0.7)   # 1F1B with p = 4 stages: m/(m+p−1) > 70 %
    labkit_rule = {
        "gpu_util": (f"MFU < {th.mfu_low:.0%} → compute finding; exposed communication > {th.comm_exposed:.0%} and "
                     f"data wait > {th.data_wait:.0%} judged apart", f"compute share {ov['compute']:.0%} / "
                     f"{me['compute']:.0%}; exposed communication {ov['comm_exposed']:.0%} / {me['comm_exposed']:.0%}"),
        "comm": (f"EXPOSED communication > {th.comm_exposed:.0%} of the step → communication finding",
                 f"exposed {ov['comm_exposed']:.0%} / {me['comm_exposed']:.0%}"),
        "pipeline": (f"no rule by that name: the time it counts as lost is judged by cause — exposed communication > "
                     f"{th.comm_exposed:.0%}, data wait > {th.data_wait:.0%}, host wait > {th.host_wait:.0%} — and "
                     f"the work by MFU < {th.mfu_low:.0%}", f"compute {ov['compute']:.0%} / {me['compute']:.0%} of "
                     f"the step; (a pipeline-parallel layout's m/(m+p−1) is another quantity: with p = 4, 1F1B "
                     f"needs m ≥ {m_min} micro-batches for > 70 %)"),
        "power": ("no rule: MFU judges the work, whatever the power", "the source gives no power figure"),
        "pcie": ("no rule: the link is fitted from busbw (chapter 11) and judged by exposed communication",
                 f"the all-reduce needs {need_share:.0%} of PCIe 3.0 x16 while it runs"),
    }
    warn = {
        "gpu_util": f"counts the all-reduce kernel as busy: {ov['gpu_util']:.0%} on a step whose compute is "
                    f"{ov['compute']:.0%}",
        "comm": f"counts the all-reduce hidden under compute: comm/(comm + compute) = {ov['comm']:.0%} while "
                f"{ov['comm_exposed']:.0%} / {me['comm_exposed']:.0%} of the step is exposed",
        "pipeline": f"{ov['pipeline']:.0%} and {me['pipeline']:.0%} fail the source's own > 70 %: the step is "
                    f"{c.step_ms(True) - c.compute_ms:g} ms / {c.measured_step_ms - c.compute_ms:g} ms longer than "
                    f"its {c.compute_ms:g} ms of compute",
        "power": "power is not work; no figure in the case",
        "pcie": f"the source's own 120 ms needs {need_share:.0%} of PCIe 3.0 x16: ≤ 70 % cannot hold",
    }
    ops = {">": lambda a, b: a > b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b}
    def verdict(v, op, limit):
        return "n/a" if v is None else ("passes" if ops[op](v, limit) else "fails")

    rows = []
    for name, key, op, limit in KPI_SOURCE:
        rule, value = labkit_rule[key]
        rows.append({"KPI": name, "overlapped step": ov[key], "KPI, overlapped": verdict(ov[key], op, limit),
                     "measured step": me[key], "KPI, measured": verdict(me[key], op, limit), "labkit's rule": rule,
                     "labkit's figures (overlapped / measured)": value, "⚠": warn[key]})
    return rows


#: The checks of a diagnosis, in the order of chapter 14's tree: (family, what to measure, the Thresholds field
#: it is held against, the labkit call, the chapters that fix it).
_CHECKS = (
    ("baseline", "record tokens/s, step spread, MFU, utilisation, comm and data waits, peak memory", None,
     "labkit.train.run / RunRecord", ("ch07", "ch14")),
    ("compute", "MFU (model FLOPs ÷ time ÷ peak)", "mfu_low", "labkit.flops.mfu / labkit.diagnose",
     ("ch15", "ch16", "ch17", "ch18")),
    ("communication", "exposed collective time ÷ step", "comm_exposed", "labkit.trace.analyze",
     ("ch19", "ch20", "ch23", "ch24")),
    ("data", "data-loader wait ÷ step", "data_wait", "labkit.trace.analyze", ("ch22",)),
    ("memory", "peak memory ÷ capacity", "memory_near", "labkit.memory", ("ch13", "ch20", "ch21")),
    ("scheduling", "device waiting for the host ÷ step", "host_wait", "labkit.trace.analyze", ("ch17", "ch27")),
    ("stragglers", "time ranks wait for a late peer inside collectives ÷ step", "peer_wait",
     "TraceAnalysis.peer_wait_share", ("ch27",)),
    ("proof", "A/B before and after, interleaved, with the noise floor", "min_score", "labkit.measure.ab.ab_train",
     ("ch28",)),
    ("keep it fast", "a regression monitor on the run series", None, "labkit.measure.regress", ("ch28",)),
)


def checklist(thresholds) -> list[dict]:
    """The course's checklist, one row per check in diagnosis order: what to measure, labkit's threshold
    (read from ``thresholds``, a :class:`labkit.diagnose.Thresholds`), the labkit call, and the chapters
    that fix it with their titles from the course manifest. Taught in chapter 30."""
    th = _thresholds(thresholds, [c[2] for c in _CHECKS if c[2]])
    rows = []
    for i, (family, what, field_, call, chapters) in enumerate(_CHECKS, 1):
        limit = "" if field_ is None else f"{field_} = {getattr(th, field_):g}"
        titles = "; ".join(f"{ch} {course.entry(ch).title}" for ch in chapters)
        rows.append({"#": i, "family": family, "measure": what, "labkit threshold": limit, "labkit call": call,
                     "fix in": titles})
    return rows


#: The source's "next directions": (name, what it is, citation, the chapter it extends, its place).
NEXT_DIRECTIONS = (
    ("PipeDream", "pipeline parallelism with 1F1B scheduling and weight stashing (asynchronous); its flushed "
     "variant PipeDream-Flush is the 1F1B schedule labkit.train runs", "Narayanan et al. 2019, SOSP; Narayanan "
     "et al. 2021, ICML (PipeDream-Flush)", "ch24", "already in the course: 1F1B in chapter 24; asynchronous weight "
     "versions change the optimiser's semantics"),
    ("1-bit Adam", "compress Adam's gradient communication to 1 bit per value with error feedback after a "
     "warm-up with full precision", "Tang et al. 2021, ICML", "ch23", "next to the fp16 and PowerSGD hooks of "
     "chapter 23: fewer bytes per all-reduce, at a convergence risk to be checked"),
    ("XLA", "a whole-graph compiler (fusion, layout) for training, as torch.compile is for PyTorch",
     "openxla.org", "ch17", "the same idea as chapter 17's torch.compile"),
    ("TensorRT", "an inference optimiser and runtime: it does not train", "NVIDIA TensorRT documentation",
     "ch17", "outside the course: training throughput is not what it optimises"),
)


def next_directions() -> list[dict]:
    """:data:`NEXT_DIRECTIONS` with each chapter's title and status from the course manifest. Taught in
    chapter 30."""
    rows = []
    for name, what, cite, ch, place in NEXT_DIRECTIONS:
        e = course.entry(ch)
        rows.append({"direction": name, "what it is": what, "source": cite,
                     "course map": f"{ch} {e.title} ({e.status})", "place": place})
    return rows

"""The 13B case reviewed end to end (chapter 29): its utilisation figures reconciled with its rates, its slow
link as a SYNTHETIC fabric, and its fix split into two modelled steps.

Everything here starts from :func:`labkit.teaching.cases.thirteen_b` (the source's inputs, read coherently: 1.8k →
1.05k → 1.65k tokens/s per GPU) and, where a model is needed, :meth:`ThirteenBCase.modelled`
(``labkit.perf.predict``). Time is counted **per token per GPU**: at ``k`` thousand tokens/s per GPU one token
takes 1/k ms of one GPU, and a share of the step is the same share of that time.

- :func:`util_readings` — GPU-Util and the NCCL wait on 64 and 128 GPUs under the two ways to read
  nvidia-smi's GPU-Util; the one that keeps compute per token constant is the coherent one.
- :func:`fix_steps` — the planner's fix (TP + PP inside nodes, accumulation: the model's exposed
  communication per token) and the loader fix (prefetch + mmap: the idle time back to its 64-GPU level) as
  steps from the measured 1.05k, in both orders, with the share of "58 % → 92 %" each explains.

Taught in chapter 29 (case review: more GPUs, slower training).
"""
from __future__ import annotations

from labkit import checks
from labkit.teaching.cases.thirteen_b import ThirteenBCase

__all__ = ["util_readings", "coherent_util_reading", "exposed_comm_ms_per_token", "fix_steps"]

READINGS = ("NCCL kernels count as busy (NVML's definition)", "GPU-Util is compute only")


def _case(case) -> ThirteenBCase:
    if not isinstance(case, ThirteenBCase):
        raise checks.ArgumentTypeError(f"case must be a labkit.teaching.cases.ThirteenBCase (thirteen_b()), got "
                                       f"{type(case).__name__} {case!r:.60}")
    return case


def util_readings(case) -> list[dict]:
    """Two readings of the source's GPU-Util (92 → 71 %) beside its NCCL wait (8 → 27 %), each split into
    compute / NCCL wait / no kernel running, and the compute time per token per GPU they imply on 64 and 128
    GPUs (share × 1/k ms). The same model on the same GPU needs the same compute per token, so the coherent
    reading keeps it (nearly) constant. NVML documents ``utilization.gpu`` as the share of time "one or more
    kernels was executing" — an NCCL kernel waiting on the network is one. Taught in chapter 29."""
    c = _case(case)
    rates = c.source_per_gpu_k[:2]
    out = []
    for name in READINGS:
        row = {"reading": name, "possible": True}
        for g, util, nccl, k in zip((c.gpus_before, c.gpus_after), c.gpu_util, c.nccl_wait, rates, strict=True):
            compute = util - nccl if name == READINGS[0] else util
            idle = 1 - util if name == READINGS[0] else 1 - util - nccl
            if compute < -1e-9 or idle < -1e-9:      # the figures cannot be read this way: a share < 0
                row["possible"] = False
            compute, idle = max(compute, 0.0), max(idle, 0.0)
            row.update({f"compute {g}": compute, f"NCCL wait {g}": nccl, f"no kernel {g}": idle,
                        f"compute ms/token {g}": compute / k})
        g0, g1 = c.gpus_before, c.gpus_after
        row["compute per token 128/64"] = (row[f"compute ms/token {g1}"] / row[f"compute ms/token {g0}"]
                                           if row[f"compute ms/token {g0}"] > 0 else float("inf"))
        out.append(row)
    return out


def coherent_util_reading(case) -> dict:
    """The possible row of :func:`util_readings` (no negative share) whose compute per token changes least
    between 64 and 128 GPUs; raises if neither reading is possible. Taught in chapter 29."""
    ok = [r for r in util_readings(case) if r["possible"]]
    if not ok:
        c = _case(case)
        raise ValueError(f"GPU-Util {c.gpu_util} and NCCL wait {c.nccl_wait} leave a negative share under both "
                         "readings: check the figures")
    return min(ok, key=lambda r: abs(r["compute per token 128/64"] - 1))


def exposed_comm_ms_per_token(pred) -> float:
    """A prediction's exposed communication and pipeline bubble, in ms per token per GPU (everything of the
    step that is neither compute nor sync). Taught in chapter 29."""
    t = pred.terms()
    other = sum(v for k, v in t.items() if k not in ("compute", "sync"))
    return 1e3 * other * pred.n_gpus / pred.tokens_per_step


def fix_steps(case, *, achievable: float = 0.5) -> list[dict]:
    """The source's fix as two modelled steps from its measured 128-GPU rate, in both orders.

    Start: the coherent utilisation reading on 128 GPUs — compute, NCCL wait and no-kernel time per token
    per GPU (:func:`coherent_util_reading`). **Planner** (TP + PP inside nodes, accumulation): the NCCL wait
    scaled by the model's exposed communication per token, fix ÷ pure DP on 128 (:meth:`ThirteenBCase.modelled`).
    **Loader** (prefetch + mmap): the no-kernel time back to its 64-GPU level. Each row: the per-GPU rate,
    scaling efficiency against 1.8k, the points gained and their share of the source's 58 % → 92 %.
    Taught in chapter 29."""
    c = _case(case)
    r = coherent_util_reading(c)
    g0, g1 = c.gpus_before, c.gpus_after
    k128 = c.source_per_gpu_k[1]
    t = {"compute": r[f"compute {g1}"] / k128, "comm": r[f"NCCL wait {g1}"] / k128,
         "idle": r[f"no kernel {g1}"] / k128}
    preds = list(c.modelled(achievable=achievable).values())
    ratio = exposed_comm_ms_per_token(preds[2]) / exposed_comm_ms_per_token(preds[1])
    after = {"planner": ("comm", t["comm"] * ratio), "loader": ("idle", r[f"no kernel {g0}"] / c.base_k)}
    target = c.stated_efficiency[1] - c.stated_efficiency[0]
    names = {"planner": "planner: TP + PP inside nodes, accumulation", "loader": "loader: prefetch + mmap"}
    out = []
    for order in (("planner", "loader"), ("loader", "planner")):
        cur = dict(t)
        eff = c.efficiency(1 / sum(cur.values()))
        out.append({"order": " then ".join(order), "step": "measured on 128 GPUs (start)", **_row(cur, c),
                    "points gained": 0.0, "share of 58→92": 0.0})
        for step in order:
            term, value = after[step]
            cur[term] = value
            new = c.efficiency(1 / sum(cur.values()))
            out.append({"order": " then ".join(order), "step": names[step], **_row(cur, c),
                        "points gained": new - eff, "share of 58→92": (new - eff) / target})
            eff = new
    return out


def _row(cur: dict, c: ThirteenBCase) -> dict:
    k = 1 / sum(cur.values())
    return {"compute ms/token": cur["compute"], "comm ms/token": cur["comm"], "no-kernel ms/token": cur["idle"],
            "per GPU (k tokens/s)": k, "scaling efficiency": c.efficiency(k)}

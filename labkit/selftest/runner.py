"""Running the self-check: named checks, each in its own time budget, one failure never stopping the rest.

A :class:`Check` is a name, the chapters that teach its path, a time budget (full and ``--quick``) and a
function ``fn(backend, plan, budget_s) -> figures``. The function returns its figures when the path
works and its numbers are plausible, raises :class:`Skip` when it cannot apply here (one GPU for a
two-rank launch, a device not in the catalogue) and :class:`Failed` when it ran but a number is outside
its band; any other exception is a failure with its error text. Every outcome is a
:class:`CheckResult` with the wall time next to the budget.

Budgets: a check is not started when the time already spent plus its budget would pass the total
(``total_budget_s``, 8 minutes by default) — it is skipped, saying so — and the checks that launch
ranks get their budget as the launch's timeout, so a hung check ends as a failure, not a hung run.

Taught in chapter 7 (timing), chapter 11 (communication), chapter 13 (memory), chapter 19/20 (DDP and
FSDP) and chapter 4 (MFU).
"""
from __future__ import annotations

import datetime as _dt
import time
import traceback

from labkit import checks
from labkit.selftest.base import STATUSES, Check, CheckResult, Failed, Skip
from labkit.selftest.gpu import CHECKS

__all__ = ["Check", "CheckResult", "Skip", "Failed", "run_checks", "TOTAL_BUDGET_S", "STATUSES"]

TOTAL_BUDGET_S = 480.0          # the whole run on one H200: under 8 minutes
MAX_ERROR_CHARS = 4000          # a LaunchError carries rank tracebacks: keep their end


def _error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    tb = traceback.extract_tb(e.__traceback__)
    if tb:
        last = tb[-1]
        text += f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.name})"
    return text if len(text) <= MAX_ERROR_CHARS else "…" + text[-MAX_ERROR_CHARS:]


def run_one(check: Check, backend, plan: dict, budget_s: float, *, clock=time.monotonic) -> CheckResult:
    """Run one check, turning every outcome into a :class:`CheckResult` (never raising, but for Ctrl-C)."""
    base = {"name": check.name, "title": check.title, "chapters": check.chapters, "budget_s": budget_s}
    t0 = clock()
    try:
        figures = check.fn(backend, plan, budget_s)
        status, reason, error = "passed", None, None
    except Skip as e:
        figures, status, reason, error = e.figures, "skipped", str(e), None
    except Failed as e:
        figures, status, reason, error = e.figures, "failed", str(e), None
    except Exception as e:  # noqa: BLE001 - a broken path is a result, the other checks still run
        figures, status, reason, error = {}, "failed", "the path raised an error", _error_text(e)
    seconds = clock() - t0
    if not isinstance(figures, dict):
        figures, status, reason = {}, "failed", f"check returned {type(figures).__name__}, not a dict of figures"
    if seconds > budget_s and status == "passed":
        reason = f"passed, but took {seconds:.1f} s against a budget of {budget_s:.0f} s"
    return CheckResult(**base, status=status, seconds=seconds, figures=figures, reason=reason, error=error)


def run_checks(backend, *, checks_to_run=None, quick: bool = False, total_budget_s: float = TOTAL_BUDGET_S,
               clock=time.monotonic, now=None, progress=None) -> dict:
    """Run ``checks_to_run`` (default: every check of :data:`labkit.selftest.gpu.CHECKS`) on ``backend``.

    Returns the report as a dict (:mod:`labkit.selftest.report` writes it): device, versions, date,
    plan, each check's :class:`CheckResult` and a summary. ``backend`` is a
    :class:`~labkit.selftest.backend.CudaBackend` or anything with its methods; ``clock`` (seconds) and
    ``now`` (a datetime) are injectable for tests; ``progress(result)`` is called after each check.
    A backend with no usable device raises ValueError with its reason.
    Taught in chapter 7 (timing) and chapter 4 (MFU).
    """
    total_budget_s = checks.positive("total_budget_s", total_budget_s)
    quick = checks.flag("quick", quick)
    checks_to_run = list(CHECKS if checks_to_run is None else checks_to_run)
    names = [c.name for c in checks_to_run]
    if len(set(names)) != len(names):
        raise ValueError(f"checks_to_run: names must be unique, got {names}")
    why = backend.unavailable()
    if why:
        raise ValueError(why)
    started = now or _dt.datetime.now(_dt.timezone.utc)
    plan = backend.plan(quick)
    n_dev = backend.device_count()
    report = {"kind": "labkit.selftest", "format": 1, "recorded_by": backend.recorded_by,
              "backend": backend.kind, "device": backend.device_name(0), "n_devices": n_dev,
              "devices": [backend.device_name(i) for i in range(n_dev)],
              "date": started.replace(microsecond=0).isoformat(), "quick": quick,
              "versions": backend.versions(), "total_budget_s": total_budget_s, "plan": _jsonable(plan),
              "checks": []}
    t_start = clock()
    for check in checks_to_run:
        budget = check.budget(quick)
        spent = clock() - t_start
        if spent + budget > total_budget_s:
            res = CheckResult(name=check.name, title=check.title, chapters=check.chapters, status="skipped",
                              seconds=0.0, budget_s=budget,
                              reason=f"not started: {spent:.0f} s spent + its budget {budget:.0f} s would pass "
                                     f"the total budget of {total_budget_s:.0f} s")
        else:
            res = run_one(check, backend, plan, budget, clock=clock)
            try:
                backend.release()
            except Exception as e:  # noqa: BLE001 - a failed cleanup is noted, not fatal
                res.reason = (res.reason + "; " if res.reason else "") + f"release failed: {_error_text(e)}"
        report["checks"].append(res.to_dict())
        if progress is not None:
            progress(res)
    report["wall_s"] = clock() - t_start
    report["summary"] = {s: sum(1 for c in report["checks"] if c["status"] == s) for s in STATUSES}
    return report


def _jsonable(plan: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in plan.items()}

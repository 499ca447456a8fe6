"""Seeded hangs on live ranks, for hang diagnosis from Flight Recorder dumps (chapter 27).

:func:`hang_job` is a rank target for :func:`labkit.launch`: ``steps`` training-like steps, each a
"data loader" fetch, a little compute, then one all-reduce of the gradient (``numel`` float32 values)
on a process group of its own (``group_desc="hang_demo"``) whose timeout is ``timeout_s`` — short, so a
hang surfaces in seconds as gloo's timeout error in the ranks that wait. One rank (``rank``) goes
wrong at step ``step`` (counted from 1) in the way ``kind`` names:

- ``"none"``: nothing goes wrong (a clean job, which a diagnosis must not call hung);
- ``"skip"``: the rank skips that step's all-reduce, then waits at the job's end for the others
  (a barrier on the world group) — one collective fewer than its peers on ``hang_demo``;
- ``"size"``: the rank all-reduces a gradient of ``numel + 1`` values at that step (a size mismatch);
- ``"loader"``: the rank's data loader stalls for ``stall_s`` seconds before that step's all-reduce;
- ``"exit"``: the rank leaves the job (``sys.exit(3)``) before that step's all-reduce.

Launch it with the Flight Recorder armed (``labkit.launch(..., flight_recorder=DIR)``) and read the
dumps with :func:`labkit.diagnose.hang.diagnose_hang`.

Lab 9's graded hang is :class:`HangJob`: this job on 4 ranks, its kind, rank, step and gradient size drawn from the
learner's ticket (:mod:`labkit.teaching.tickets`; no public name maps a seed to its hang) and shown by neither the job nor
the :class:`HangRun` it returns. The learner names the rank, the collective and the cause from the dumps and the
launch's outcome; the grader re-derives them from the recorded dumps (``_cause_of``) and holds them to the ticket.
"""
from __future__ import annotations

import datetime as _dt
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit import checks

__all__ = ["HANG_KINDS", "hang_job", "HangJob", "HangRun"]

HANG_KINDS = ("none", "skip", "size", "loader", "exit")


def hang_job(kind: str = "none", rank: int = 2, step: int = 3, *, steps: int = 4, numel: int = 256,
             timeout_s: float = 3.0, stall_s: float = 30.0) -> dict:
    """One rank of a job with a seeded hang (module docstring); returns how many all-reduces it issued.

    Runs inside :func:`labkit.launch` (torch.distributed initialised). Taught in chapter 27 (reading a
    hung job's Flight Recorder dumps)."""
    if kind not in HANG_KINDS:
        raise ValueError(f"kind={kind!r} is not a hang kind; choose one of {HANG_KINDS}")
    checks.count("steps", steps)
    checks.count("numel", numel)
    timeout_s = checks.number("timeout_s", timeout_s, low=0, low_open=True)
    stall_s = checks.number("stall_s", stall_s, low=0)
    import torch
    import torch.distributed as dist

    me, world = dist.get_rank(), dist.get_world_size()
    checks.count("step", step)
    if step > steps:
        raise ValueError(f"step={step} is past the job's last step (steps={steps})")
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} is not a rank of this job (0..{world - 1})")
    group = dist.new_group(timeout=_dt.timedelta(seconds=timeout_s), group_desc="hang_demo")
    faulty = kind != "none" and me == rank
    issued = 0
    weights = torch.randn(numel, generator=torch.Generator().manual_seed(me))
    for s in range(1, steps + 1):
        if faulty and s == step and kind == "loader":
            time.sleep(stall_s)                    # the data loader of this rank stalls
        batch = torch.randn(numel, generator=torch.Generator().manual_seed(1000 * s + me))
        grad = (weights * batch).tanh()
        if faulty and s == step:
            if kind == "exit":
                sys.exit(3)                        # the rank leaves the job
            if kind == "skip":
                continue                           # no all-reduce this step
            if kind == "size":
                grad = torch.cat([grad, grad[:1]])  # one value too many
        dist.all_reduce(grad, group=group)
        issued += 1
        weights -= 0.01 * grad[:numel] / world
    dist.barrier()                                 # the job's end, on the world group
    return {"rank": me, "all_reduces": issued}


# ----------------------------------------------------------------------------- lab 9's graded hang
LAB = "lab09_collectives"
JOB_RANKS = 4                      # a majority to read a mismatch against (3 against 1)
JOB_STEPS = 4
JOB_TIMEOUT_S = 4.0                # the collective timeout: the waiting ranks fail after this
CAUSES = ("skip", "size", "loader", "exit")   # what a ticket draws: HANG_KINDS less "none"


def _draw(seed) -> dict:
    """The hang ``seed`` (a ticket or a practice seed, :mod:`labkit.teaching.tickets`) draws: kind, rank, step and the
    gradient's size — the size ties a job's dumps to its ticket (a copied dump shows another size)."""
    from labkit.teaching import tickets

    d = tickets.digest(LAB, seed)
    return {"kind": CAUSES[d % len(CAUSES)], "rank": (d >> 8) % JOB_RANKS,
            "step": 2 + (d >> 16) % (JOB_STEPS - 2), "numel": 200 + (d >> 24) % 800}


def _graded_hang(seed, key: str | None) -> dict:
    """The grader's view: ``seed``'s draw plus ``seq``, the collective its hang shows at — a skip shows at the last
    step's (``JOB_STEPS``), whatever its step: collectives pair by their order on the group, so the skipping rank's
    later all-reduces complete the others' earlier ones and only the others' last one is left unmatched; with the
    instructor's ``key`` only a ticket it issued (ValueError otherwise, :func:`labkit.teaching.tickets.verify`)."""
    from labkit.teaching import tickets

    if key is not None:
        tickets.verify(key, LAB, seed)
    d = _draw(seed)
    return {**d, "seq": JOB_STEPS if d["kind"] == "skip" else d["step"]}


def _cause_of(dg, failed_rank) -> str | None:
    """The cause a hung job's evidence shows — its dumps' diagnosis ``dg`` and the rank the launcher saw fail
    first (``failed_rank``): a size mismatch is ``"size"``; a rank missing from collective #k that waits in
    another group's collective skipped #k (``"skip"``: it went on to the next one, a desync); one that waits in
    none ended on its own (``"exit"``: the launcher saw it fail before any peer's timeout) or was alive, stuck
    outside every collective until the launcher stopped it (``"loader"``: its data loader, here). None when the
    evidence shows none of these (no hang, or another kind)."""
    if not dg.hung or len(dg.culprits) != 1:
        return None
    if dg.kind == "size":
        return "size"
    if dg.kind == "order":
        return "skip"
    if dg.kind != "not_reached":
        return None
    culprit = dg.culprits[0]
    if any(culprit in f.waiting for f in dg.findings[1:]):
        return "skip"
    return "exit" if failed_rank == culprit else "loader"


@dataclass
class HangRun:
    """What :meth:`HangJob.run` saw: the ranks' Flight Recorder dumps (``files``, in ``folder``) and the launch's
    outcome — the rank the launcher saw fail first, its exit code and the last line of its error, whether the launch
    timed out — with the launch's stamp (the launching process, its UTC start and end: ``launch``). It names no
    fault: the dumps and the outcome are the evidence. Taught in lab 9 (chapter 27's hang diagnosis)."""

    folder: Path
    files: list[Path]
    failed_rank: int | None
    exit_code: int | None
    timed_out: bool
    error: str
    launch: dict = field(default_factory=dict)

    def outcome(self) -> dict:
        """The outcome and stamp as an evidence value (``book.submit(..., launch=run.outcome())``). Lab 9."""
        return {**self.launch, "failed_rank": self.failed_rank, "exit_code": self.exit_code,
                "timed_out": self.timed_out, "error": self.error}

    def __repr__(self) -> str:
        ranks = sorted(int(p.name.rsplit("_", 1)[-1].split(".")[0]) for p in self.files)
        what = ("the job finished" if self.failed_rank is None and not self.timed_out else
                f"launch: {self.error}" if self.error else "the launch failed")
        return f"HangRun({what}; dumps of ranks {ranks} in {self.folder.parent.name}/{self.folder.name}/)"


class HangJob:
    """Lab 9's hung job: :func:`hang_job` on ``JOB_RANKS`` gloo ranks, one all-reduce per step on a group whose
    timeout is ``JOB_TIMEOUT_S`` — one rank goes wrong at one step in a way ``seed`` draws (a ticket from the
    instructor, or a practice number) and this object does not show. :meth:`run` launches it with the Flight
    Recorder armed and returns the dumps and the launch's outcome (:class:`HangRun`). Taught in lab 9."""

    def __init__(self, seed):
        from labkit.teaching import tickets

        tickets.parse(seed)            # a practice seed or a ticket; ValueError naming it otherwise
        self.seed = seed

    def __repr__(self) -> str:
        return (f"HangJob(seed={self.seed!r}: {JOB_RANKS} gloo ranks, {JOB_STEPS} steps of one all-reduce each, "
                f"collective timeout {JOB_TIMEOUT_S:g} s)")

    def run(self, folder, *, timeout_s: float = 180) -> HangRun:
        """Launch the job on ``JOB_RANKS`` gloo ranks with the Flight Recorder armed, one dump per rank in a new
        subfolder of ``folder`` (``run-1``, ``run-2``, …: a re-run never meets an earlier run's dumps); it hangs and
        ends in seconds (the waiting ranks' collective timeout, or the launch's ``timeout_s``). Returns
        :class:`HangRun`. Taught in lab 9."""
        import datetime as dt
        import os

        from labkit.launcher import LaunchError, launch
        from labkit.launcher.flight import FR_FILE_PREFIX

        timeout_s = checks.number("timeout_s", timeout_s, low=10)
        d = _draw(self.seed)
        kwargs = {"kind": d["kind"], "rank": d["rank"], "step": d["step"], "numel": d["numel"],
                  "steps": JOB_STEPS, "timeout_s": JOB_TIMEOUT_S, "stall_s": timeout_s}

        def now() -> str:
            return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")

        if not isinstance(folder, str | os.PathLike) or not os.fspath(folder).strip():
            raise checks.ArgumentTypeError(f"folder must be a folder path for the ranks' dumps, got {folder!r}")
        base = Path(folder)
        base.mkdir(parents=True, exist_ok=True)
        n = 1 + max((int(p.name[4:]) for p in base.glob("run-*") if p.name[4:].isdigit()), default=0)
        folder = base / f"run-{n}"
        folder.mkdir()
        started = now()
        err = None
        try:
            launch("labkit.diagnose.seeded_hangs:hang_job", JOB_RANKS, backend="gloo", timeout_s=timeout_s,
                   kwargs=kwargs, stream=False, log_dir=False, flight_recorder=folder)
        except LaunchError as e:
            err = e
        ended = now()
        files = sorted((p for p in folder.glob(f"{FR_FILE_PREFIX}*") if p.is_file()), key=lambda p: p.name)
        error = ""
        if err is not None:
            first = str(err).splitlines()[0].split(";")[0]         # "rank N failed (…)": the dump note dropped
            last = [x.strip() for x in (err.traceback or "").splitlines() if x.strip()]
            raised = last and not err.timed_out and re.match(r"^[A-Za-z_][\w.]*(Error|Exit|Exception|Interrupt)\b",
                                                              last[-1])
            error = first + (f" — {last[-1][:200]}" if raised else "")     # the exception it raised, if one
        return HangRun(folder, files, None if err is None else err.rank, None if err is None else err.exit_code,
                       bool(err is not None and err.timed_out), error,
                       {"pid": os.getpid(), "started_at": started, "ended_at": ended})


def _graded_reading(files, launch, *, pid, written_at, seed, key: str | None) -> dict:
    """The grader's reading of a learner's recorded hang (lab 9's hidden checks): ``files`` — the dumps the
    evidence lists (already SHA-checked), ``launch`` — :meth:`HangRun.outcome`, ``pid``/``written_at`` — the
    kernel that wrote the evidence and when. Checks, each a ValueError saying what failed: the ticket (with ``key``,
    one it issued); the dumps read, of this execution (the launch's process is the evidence's kernel, it ended before
    the evidence was written, and every collective in the dumps was recorded inside it) and of the ticket's job (its
    gradient's size, at least ``JOB_RANKS - 1`` ranks). Returns ``want`` (the ticket's hang), ``dg`` (the
    diagnosis re-derived from the dumps), ``cause`` (:func:`_cause_of`)."""
    import datetime as dt

    from labkit.diagnose.hang import diagnose_hang
    from labkit.trace.flight import read_dump

    want = _graded_hang(seed, key)

    def utc(stamp):
        try:
            t = dt.datetime.fromisoformat(stamp)
        except (TypeError, ValueError):
            return None
        return t if t.tzinfo is not None else None

    if not isinstance(launch, dict):
        raise ValueError("no launch recorded with the dumps (record launch=run.outcome() of HangJob.run)")
    start, end, written = utc(launch.get("started_at")), utc(launch.get("ended_at")), utc(written_at)
    if launch.get("pid") != pid or None in (start, end, written):
        raise ValueError(f"the job was launched by process {launch.get('pid')!r}, not by the kernel that recorded "
                         f"this evidence ({pid!r}): a run of another execution (copied in?) is not evidence of this one")
    if not start <= end <= written + dt.timedelta(seconds=1):
        raise ValueError("the job's launch did not end before its evidence was written")
    if len(files) < JOB_RANKS - 1:
        raise ValueError(f"the evidence lists {len(files)} Flight Recorder dump(s); the hung job's {JOB_RANKS} ranks "
                         f"leave at least {JOB_RANKS - 1}")
    dumps = [read_dump(p) for p in files]
    lo, hi = start.timestamp() * 1e9 - 1e9, end.timestamp() * 1e9 + 1e9     # ±1 s: clocks read in two processes
    times = [e.time_created_ns for d in dumps for e in d.entries]
    if not times or not all(isinstance(t, int) and lo <= t <= hi for t in times):
        raise ValueError("the dumps hold collectives recorded outside this notebook's launch of the job (copied in?)")
    sizes = {e.input_sizes for d in dumps for e in d.entries if e.group_desc == "hang_demo"}
    if not sizes or not sizes <= {((want["numel"],),), ((want["numel"] + 1,),)}:
        raise ValueError("the dumps are not of this ticket's job (its all-reduces have another size)")
    dg = diagnose_hang(dumps, world_size=JOB_RANKS)
    return {"want": want, "dg": dg, "cause": _cause_of(dg, launch.get("failed_rank"))}

"""Limits and clean-up for untrusted notebook runs (POSIX).

- :class:`Limits`: CPU seconds per process (the kernel and each rank get their own budget), largest
  file written (``RLIMIT_FSIZE``) and address space (``RLIMIT_AS``; 8 GiB on a CPU machine, off where
  CUDA is present — see :func:`default_memory_mb`). The file and memory limits are rlimits applied in a
  ``preexec_fn`` so they are inherited by the kernel and every rank it starts (``setrlimit(2)``).
  The CPU limit is *not* ``RLIMIT_CPU``: with any ``RLIMIT_CPU`` set, Linux reads a process's CPU time
  on the scheduler tick, so ``time.process_time()`` inside the notebook advances in steps of 4 ms on a
  ``CONFIG_HZ=250`` kernel and a learner's CPU-time measurement reads 0 or 4 ms (PLATFORM_NOTES).
  :func:`wait_within` enforces it from outside instead, polling every process of the submission.
- :func:`become_subreaper`: ``prctl(PR_SET_CHILD_SUBREAPER)`` (Linux ≥ 3.4, ``prctl(2)``), so processes a
  submission orphans (a hung rank whose launcher died) are re-parented to the executor, which kills them.
- :func:`die_with_parent`: ``prctl(PR_SET_PDEATHSIG)`` in a child, so the executor and checker get SIGTERM
  when the grader dies (even by ``kill -9``); the executor then kills its kernel and ranks and exits.
- :func:`kill_tree`: SIGKILL a process and all its descendants (psutil).
- :func:`file_hashes`/:func:`changed`: what a submission must leave byte-identical on disk (the labkit package,
  the lab's folder), compared before and after; :func:`cage_roots`: what a caged submission sees through an
  overlay (:mod:`labkit.teaching.grading.isolation`).

Taught in the instructor notes of the labs (``labkit grade --help``).
"""
from __future__ import annotations

import ctypes
import hashlib
import math
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
CPU_MEMORY_MB = 8192


def default_memory_mb() -> int | None:
    """RLIMIT_AS default: 8 GiB per process on a machine without NVIDIA devices, off with them.

    Measured (``benchmarks/bench_grade.py --probe-as``, torch 2.13 CPU): training the tiny model needs
    ≈ 0.86 GB of address space in one process and ≈ 0.93 GB per DDP rank (768 MiB fails with gloo,
    512 MiB fails in OpenBLAS), so 8 GiB only stops runaways. The CUDA runtime reserves far more
    virtual address space than it uses, so an address-space limit breaks CUDA initialisation: on a GPU
    machine memory is left to the hub's cgroup limits.
    """
    return None if os.path.exists("/dev/nvidiactl") else CPU_MEMORY_MB


@dataclass(frozen=True)
class Limits:
    """Per-submission limits; ``None`` leaves a limit off."""

    notebook_s: float = 600.0          # wall-clock for the whole notebook
    cell_s: float = 120.0              # wall-clock per cell (the kernel is interrupted, then the cell fails)
    cpu_s: int | None = 1200           # CPU seconds per process (watched by wait_within, not RLIMIT_CPU)
    fsize_mb: int | None = 512         # RLIMIT_FSIZE: no file larger than this
    memory_mb: int | None = field(default_factory=lambda: default_memory_mb())  # RLIMIT_AS, see below
    output_mb: float = 4.0             # cell outputs kept per notebook; the rest is dropped and counted

    def __post_init__(self):
        for name in ("notebook_s", "cell_s", "output_mb"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"Limits.{name}={v!r}; must be a finite number > 0")
        for name in ("cpu_s", "fsize_mb", "memory_mb"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ValueError(f"Limits.{name}={v!r}; must be a positive integer or None")

    def within_inherited(self) -> tuple[Limits, list[str]]:
        """These limits clamped to the hard rlimits this process inherited (``ulimit -v``, ``ulimit -f``):
        an unprivileged process cannot raise a hard limit (``setrlimit(2)``: EPERM), so asking for 8 GiB
        under ``ulimit -v 4000000`` would fail every submission in ``preexec_fn``. Returns the limits to
        apply and one note per limit lowered."""
        import resource

        changes, notes = {}, []
        for name, res, flag in (("memory_mb", resource.RLIMIT_AS, "ulimit -v"),
                                ("fsize_mb", resource.RLIMIT_FSIZE, "ulimit -f")):
            hard = resource.getrlimit(res)[1]
            if hard == resource.RLIM_INFINITY:
                continue
            cap = max(1, hard // 2**20)
            want = getattr(self, name)
            if want is None or want > cap:
                changes[name] = cap
                notes.append(f"{name}={want} MiB is above the inherited hard limit ({flag}: {hard:,} bytes); "
                             f"submissions run under {cap} MiB")
        if not changes:
            return self, []
        import dataclasses

        return dataclasses.replace(self, **changes), notes

    def preexec(self, parent_death: int | None = signal.SIGTERM):
        """A ``preexec_fn`` that applies the file and memory rlimits in the child (new session: own process
        group) and asks the kernel to send the child ``parent_death`` when the process that started it
        dies (:func:`die_with_parent`). The CPU limit is watched from outside (:func:`wait_within`) so CPU
        clocks stay precise."""
        import resource  # imported here, in the parent: importing between fork and exec can deadlock

        fsize, mem = self.fsize_mb, self.memory_mb
        inf = resource.RLIM_INFINITY   # never ask for more than the hard limit inherited (within_inherited)
        fsize_hard, mem_hard = (h if h != inf else 2**63 - 1 for _, h in
                                (resource.getrlimit(resource.RLIMIT_FSIZE), resource.getrlimit(resource.RLIMIT_AS)))
        on_death = die_with_parent(parent_death) if parent_death else None

        def apply():  # runs in the child between fork and exec: no imports, no locks
            if fsize:
                f = min(fsize * 2**20, fsize_hard)
                resource.setrlimit(resource.RLIMIT_FSIZE, (f, f))
            if mem:
                m = min(mem * 2**20, mem_hard)
                resource.setrlimit(resource.RLIMIT_AS, (m, m))
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
            if on_death:
                on_death()

        return apply


def die_with_parent(sig: int = signal.SIGTERM):
    """A function to call in a child between fork and exec: ``prctl(PR_SET_PDEATHSIG, sig)`` (Linux,
    ``prctl(2)``), so the child gets ``sig`` when the thread that forked it dies — the grader's worker
    thread, which waits for the child, so in practice the grader itself, even under ``kill -9``. If the
    parent died before the call, the child exits at once. A no-op where prctl is missing (not Linux)."""
    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def arm():
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def over_cpu(pid: int, cpu_s: float):
    """The first process of ``pid``'s tree whose own CPU time (user + system) passed ``cpu_s``, or None."""
    import psutil

    try:
        procs = [psutil.Process(pid), *descendants(pid)]
    except psutil.Error:
        return None
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        if t.user + t.system > cpu_s:
            return p
    return None


def wait_within(proc, *, timeout: float, cpu_s: float | None, poll_s: float = 0.25) -> tuple[int | None, str | None]:
    """Wait for ``proc``; stop its whole tree when the wall-clock ``timeout`` passes or one of its
    processes uses more than ``cpu_s`` CPU seconds. Returns (exit code, None | "deadline" | "cpu limit")."""
    import subprocess
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.wait(timeout=min(poll_s, max(0.0, deadline - time.monotonic()))), None
        except subprocess.TimeoutExpired:
            pass
        why = "deadline" if time.monotonic() >= deadline else (
            "cpu limit" if cpu_s and over_cpu(proc.pid, cpu_s) is not None else None)
        if why:
            kill_tree(proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            return proc.returncode, why


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill_tree(pid: int, *, include_self: bool = True) -> int:
    """SIGKILL ``pid``'s descendants (and ``pid`` itself); returns how many processes were signalled."""
    import psutil

    procs = descendants(pid)
    if include_self:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    n = 0
    for p in procs:
        try:
            p.kill()
            n += 1
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)
    return n


def file_hashes(paths) -> dict[str, str]:
    """SHA-256 of every file under ``paths`` (notebooks, hidden checks, code, data; not ``__pycache__``), by
    path: what a submission must leave byte-identical, compared before and after its run."""
    out = {}
    for root in paths:
        root = Path(root)
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())
        for p in files:
            if "__pycache__" in p.parts:
                continue
            try:
                out[str(p)] = "link:" + os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
            except OSError:
                out[str(p)] = "<unreadable>"
    return out


def changed(before: dict, after: dict) -> list[str]:
    """The files written, created or deleted between two :func:`file_hashes`."""
    return sorted([f"changed {p}" for p in before if p in after and after[p] != before[p]]
                  + [f"deleted or renamed {p}" for p in before if p not in after]
                  + [f"created {p}" for p in after if p not in before])


def fingerprint(paths) -> str:
    """SHA-256 over the names and bytes of every file under ``paths`` (:func:`file_hashes`)."""
    return hashlib.sha256(repr(sorted(file_hashes(paths).items())).encode()).hexdigest()


def tamper_verdict(caged: bool, touched: list, on_disk: list, report: dict) -> tuple[str | None, list, str]:
    """(status or None, what was done, the note) after a run. ``touched``: what a caged run changed behind
    its overlay (never on disk); ``on_disk``: :func:`changed` of the protected files on disk. A change on
    disk is ``labkit-modified`` — a grader-side state, nothing graded until the files are restored and the
    batch re-run (uncaged, the submission may have made it; caged, it cannot have: someone edited labkit or
    the lab meanwhile). A write, deletion or rename behind the overlay, or a signal aimed at the grader
    (``report["signalled"]``), is ``tampered``: this submission scores 0, everyone else is graded as usual."""
    if on_disk:
        who = "by someone else (the submission ran caged)" if caged else "while this submission ran"
        return "labkit-modified", on_disk[:5], (
            f"files of labkit or the lab changed on disk {who}: {'; '.join(on_disk[:5])}; nothing is graded "
            "until they are restored (reinstall labkit) and the batch re-run")
    what = touched[:5] + ([f"sent {report['signalled']} to the grader"] if report.get("signalled") else [])
    if not what:
        return None, [], ""
    return "tampered", what, (f"tampered: {'; '.join(what)} ({'the submission ran in a cage: ' if caged else ''}"
                              "the instructor's files and the grader are unchanged; only this submission's grade "
                              "is affected)")


def default_protected() -> list[Path]:
    """What a submission must not modify on disk, hashed before and after each run: the labkit package (the
    grader's own code; add more with ``GradeConfig.protect``). The lab's folder is always added; where
    submissions are caged (:mod:`labkit.teaching.grading.isolation`) the checkout, the grading output and the Python
    environment are behind an overlay as well."""
    import labkit

    return [Path(labkit.__file__).resolve().parent]


def cage_roots(lab_dir: Path, out: Path, extra=()) -> list[Path]:
    """The folders a caged submission sees through an overlay: the course checkout (where there is one), the
    labkit package, the lab's folder, the grading output (gradebook, feedback, everyone's work), the Python
    environment (a virtual environment only: never the system's), and ``extra``."""
    import sys

    import labkit

    roots = [Path(labkit.__file__).resolve().parent, lab_dir, out, *map(Path, extra)]
    try:
        from labkit.paths import repo_root

        roots.append(repo_root())
    except FileNotFoundError:
        pass
    if sys.prefix != sys.base_prefix:
        roots.append(Path(sys.prefix))
    return roots


def env_for_submission(work: Path, base: dict | None = None) -> dict:
    """Environment of a submission's run: its own work folder, no display, one BLAS thread per core share."""
    env = dict(os.environ if base is None else base)
    for k in ("PYTHONSTARTUP", "PYTHONHOME", "PYTHONINSPECT"):
        env.pop(k, None)
    env["LABKIT_WORK"] = str(work)
    env["MPLBACKEND"] = "Agg"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def python_cmd() -> list[str]:
    """This interpreter, without the current folder on ``sys.path`` (a submission's folder may hold a
    ``labkit.py`` or ``torch.py`` of its own): ``-P`` on Python ≥ 3.11, ``-I`` before."""
    import sys

    return [sys.executable, "-P" if sys.version_info >= (3, 11) else "-I"]

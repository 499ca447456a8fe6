"""The launcher's view of running ranks: one :class:`_Rank` per process (its reader thread, log file and
``wait4`` bookkeeping), the :class:`_Job` that stops them all, and the supervision loop — stream output,
notice a dead rank, pick the root cause, collect results, or turn a failure or a hang into a
:class:`~labkit.launcher.results.LaunchError` (stack dumps via ``faulthandler`` on SIGUSR1).

Stopping means SIGTERM to each rank's process group and to every process carrying the launch's marker
(:mod:`labkit.launcher.sweep`: descendants that left the group or the session), SIGKILL to the groups
after ``GRACE_S``, SIGKILL to every marked process until none is left, then reaping with ``wait4``
(which also gives each rank's peak RSS). Taught in chapter 5 (scaling: running N ranks).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

from labkit.launcher import sweep
from labkit.launcher.results import LaunchError, RankResult

GRACE_S = 3.0            # SIGTERM → SIGKILL


# ----------------------------------------------------------------------------- live process registry (atexit)
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:  # pragma: no cover - runs at interpreter exit
    for job in list(_LIVE):
        with contextlib.suppress(Exception):
            job.stop(grace=1.0)


class _Rank:
    """One rank process, its reader thread and its bookkeeping."""

    def __init__(self, rank: int, proc: subprocess.Popen, log_path: Path | None, out: queue.Queue):
        self.rank = rank
        self.proc = proc
        self.pid = proc.pid
        self.t0 = time.monotonic()
        self.wall_s: float | None = None
        self.exit_code: int | None = None
        self.peak_rss: int | None = None
        self.tail: list[str] = []
        self._log = open(log_path, "w", encoding="utf-8", errors="replace") if log_path else None  # noqa: SIM115
        self.reader = threading.Thread(target=self._read, args=(out,), daemon=True,
                                       name=f"labkit-rank{rank}-reader")
        self.reader.start()

    def _read(self, out: queue.Queue) -> None:
        # one thread per pipe: a full pipe never blocks the rank; whole lines only
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            log = self._log
            if log is not None:
                with contextlib.suppress(ValueError):     # closed by close() after a join timeout
                    log.write(line + "\n")
                    log.flush()
            self.tail.append(line)
            if len(self.tail) > 200:
                del self.tail[:100]
            out.put((self.rank, line))
        self.proc.stdout.close()

    @property
    def done(self) -> bool:
        return self.exit_code is not None

    def exited(self) -> bool:
        """Has the process exited? (Not reaped yet, so its pid/pgid cannot be reused.)"""
        if self.done:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def reap(self) -> None:
        """Kill what is left of the rank's process group (e.g. DataLoader workers), then reap the rank."""
        if self.done:
            return
        self.signal_group(signal.SIGKILL)
        try:
            _, status, ru = os.wait4(self.pid, 0)
            code = os.waitstatus_to_exitcode(status)
            rss = ru.ru_maxrss
            self.peak_rss = int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB
        except ChildProcessError:
            code = self.proc.returncode if self.proc.returncode is not None else -9
        self.proc.returncode = code
        self.exit_code = code
        self.wall_s = time.monotonic() - self.t0

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def close(self, join_s: float = 2.0) -> None:
        self.reader.join(join_s)
        if self._log:
            self._log.close()
            self._log = None


class _Job:
    def __init__(self, run_dir: Path | None, launch_id: str):
        self.run_dir = run_dir
        self.launch_id = launch_id      # every rank and descendant carries it (sweep.MARKER)
        self.ranks: list[_Rank] = []
        self.out: queue.Queue = queue.Queue()
        self.leftovers: list[int] = []  # marked processes that survived the teardown (normally none)

    def alive(self) -> list[_Rank]:
        return [r for r in self.ranks if not r.done]

    def stop(self, grace: float = GRACE_S) -> None:
        """SIGTERM each live rank's process group and every marked process, SIGKILL the groups after
        ``grace``, SIGKILL every marked process until none is left, reap everything."""
        live = [r for r in self.ranks if not r.done and not r.exited()]
        for r in live:
            r.signal_group(signal.SIGTERM)
        if live:
            with contextlib.suppress(Exception):
                sweep.signal_marked(self.launch_id, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while live and time.monotonic() < deadline:
            live = [r for r in live if not r.exited()]
            time.sleep(0.02)
        for r in self.ranks:
            if not r.done:
                r.signal_group(signal.SIGKILL)
        try:        # setsid'd descendants too; before close(): they may hold a rank's stdout pipe open
            self.leftovers = sweep.kill_marked(self.launch_id)
        except Exception:  # noqa: BLE001 - teardown goes on; the groups are already dead
            self.leftovers = []
        for r in self.ranks:
            r.reap()            # SIGKILL to the group, then wait4
        for r in self.ranks:
            r.close()


# ----------------------------------------------------------------------------- supervision
def _drain(job: _Job, stream: bool, rank0_only: bool) -> None:
    while True:
        try:
            rank, line = job.out.get_nowait()
        except queue.Empty:
            return
        if stream and (rank == 0 or not rank0_only):
            print(f"[rank {rank}] {line}", flush=True)


def _poll(job: _Job, stream: bool, rank0_only: bool, wait_s: float = 0.0):
    """Print what the ranks wrote, reap the ranks that exited; ("fail", rank) if one failed, else None."""
    try:
        rank, line = job.out.get(timeout=wait_s) if wait_s > 0 else job.out.get_nowait()
        if stream and (rank == 0 or not rank0_only):
            print(f"[rank {rank}] {line}", flush=True)
        _drain(job, stream, rank0_only)
    except queue.Empty:
        pass
    newly_failed = []
    for r in job.alive():
        if r.exited():
            r.reap()
            if r.exit_code != 0:
                newly_failed.append(r)
    return ("fail", _root_cause(newly_failed, job)) if newly_failed else None


def _supervise(job: _Job, deadline: float, stream: bool, rank0_only: bool):
    """Print output as it comes; return None when all ranks succeeded, else ("fail", rank) / ("timeout",)."""
    while True:
        failure = _poll(job, stream, rank0_only, wait_s=0.05)
        if failure:
            return failure
        if not job.alive():
            return None
        if time.monotonic() > deadline:
            return ("timeout",)


_PEER_ERROR = re.compile(r"Connection closed by peer|Connection reset|DistBackendError|Broken pipe|"
                         r"ProcessGroupGloo|NCCL communicator was aborted|Socket Timeout", re.I)


def _root_cause(failed: list[_Rank], job: _Job) -> _Rank:
    """Among ranks found dead in the same poll, prefer one that did not fail *because* a peer died."""
    run_dir = job.run_dir

    def secondary(r: _Rank) -> bool:
        err = run_dir / f"rank{r.rank}.error"
        return err.exists() and bool(_PEER_ERROR.search(err.read_text(errors="replace")))

    return sorted(failed, key=lambda r: (secondary(r), r.rank))[0]


def _collect(job: _Job, run_dir: Path, logs: Path | None, need_result: bool) -> list[RankResult]:
    """Every rank's result; a value the launcher cannot unpickle, or a function rank that exited 0
    without leaving one (``os._exit(0)``), is a :class:`LaunchError` naming the rank."""
    out = []
    where = f" (logs: {logs})" if logs else ""
    for r in job.ranks:
        r.close()
        value = None
        path = run_dir / f"rank{r.rank}.result"
        if path.exists():
            try:
                with open(path, "rb") as f:
                    value = pickle.load(f)
            except Exception as e:  # noqa: BLE001 - a class only the rank has, a CUDA tensor without CUDA...
                raise LaunchError(
                    f"rank {r.rank}'s return value could not be unpickled in the launching process "
                    f"({type(e).__name__}: {e}); return plain Python data, CPU tensors or objects of classes "
                    f"importable here{where}", rank=r.rank, exit_code=r.exit_code, log_dir=logs) from e
        elif need_result:
            raise LaunchError(f"rank {r.rank} exited with {_signame(r.exit_code)} but left no return value "
                              f"(os._exit() in the target?){where}", rank=r.rank, exit_code=r.exit_code,
                              log_dir=logs, traceback="\n".join(r.tail[-20:]))
        out.append(RankResult(rank=r.rank, exit_code=r.exit_code, wall_s=r.wall_s or 0.0,
                              peak_rss_bytes=r.peak_rss, value=value))
    return out


def _signame(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _make_error(job, run_dir, logs, failure, timeout_s, stream, rank0_only, note: str = "") -> LaunchError:
    if failure[0] == "fail":
        r = failure[1]
        err = run_dir / f"rank{r.rank}.error"
        tb = err.read_text(errors="replace") if err.exists() else ""
        if not tb:
            # no Python traceback (os._exit, a signal, a crash in C): show the last output lines
            r.close()
            tb = "(no Python traceback: the process ended without raising)\nlast output:\n" + "\n".join(r.tail[-20:])
        if stream and rank0_only and r.rank != 0:
            print("\n".join(f"[rank {r.rank}] {x}" for x in r.tail[-20:]), flush=True)
        where = f" (logs: {logs})" if logs else ""
        return LaunchError(f"rank {r.rank} failed ({_signame(r.exit_code)}){note}; the other ranks were stopped"
                           f"{where}\n"
                           f"--- rank {r.rank} traceback ---\n{tb}",
                           rank=r.rank, traceback=tb, exit_code=r.exit_code, log_dir=logs)
    # timeout: ask every live rank for its Python stack (faulthandler on SIGUSR1), then name the
    # rank that is not waiting inside torch.distributed (the others wait for it in a collective)
    live = job.alive()
    for r in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(r.pid, signal.SIGUSR1)
    stacks: dict[int, str] = {}
    wait_until = time.monotonic() + 3.0      # a loaded machine may take a moment to run the handlers
    while True:
        for r in live:
            p = run_dir / f"rank{r.rank}.stack"
            stacks[r.rank] = p.read_text(errors="replace") if p.exists() else ""
        if all(_top_frame(t) for t in stacks.values()) or time.monotonic() > wait_until:
            break
        time.sleep(0.05)
    suspect, waiting = None, []
    for rank, text in stacks.items():
        top = _top_frame(text)
        if top and "torch/distributed" in top.replace("\\", "/"):
            waiting.append(rank)
        elif suspect is None:
            suspect = rank
    if suspect is None and live:
        suspect = live[0].rank
    tb = _main_stack(stacks.get(suspect, "")) if suspect is not None else ""
    waiting_txt = f"; ranks {waiting} were waiting inside torch.distributed" if waiting else ""
    return LaunchError(
        f"launch timed out after {timeout_s:g} s{note}; rank {suspect} is the suspect (not in a collective)"
        f"{waiting_txt}; all ranks were stopped\n--- rank {suspect} stack ---\n{tb}",
        rank=suspect, traceback=tb, exit_code=None, log_dir=logs, timed_out=True)


def _main_stack(stack_dump: str) -> str:
    """The main thread's block of a faulthandler dump (the worker wrote the main thread's ident first)."""
    lines = stack_dump.splitlines()
    if not lines or not lines[0].startswith("main thread "):
        return stack_dump
    ident = lines[0].split()[-1]
    block, inside = [], False
    for line in lines[1:]:
        if line.startswith(("Thread 0x", "Current thread 0x")):
            inside = ident in line
        if inside:
            block.append(line)
    return "\n".join(block) if block else stack_dump


def _top_frame(stack_dump: str) -> str | None:
    """The innermost frame of the main thread in a faulthandler dump ("most recent call first")."""
    for line in _main_stack(stack_dump).splitlines():
        line = line.strip()
        if line.startswith("File "):
            return line
    return None

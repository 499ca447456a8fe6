"""Every process a launch started, wherever it went: found by a marker in its environment.

Each launch has an id; every rank gets ``LABKIT_LAUNCH_ID=<id>`` (a comma-separated list when a rank
launches ranks of its own) and every descendant inherits it — DataLoader workers, compile workers,
and children that left the rank's process group *and* session (``setsid``, ``start_new_session``),
which ``killpg`` cannot reach. Teardown signals the rank process groups first, then every process on
the system whose environment carries the id (:func:`kill_marked`), until none is left.

Linux reads ``/proc/<pid>/environ`` (≈ 3 ms for a few hundred processes; zombies have an empty
environment and are skipped) and signals through a pidfd opened *before* re-checking the marker, so a
reused pid is never hit; elsewhere psutil does the same (``Process.environ()``). A process that
``exec``s with a clean environment drops the marker and is not found (a cgroup would catch it, but
needs privileges a notebook does not have).

Taught in chapter 5 (scaling: running N ranks — what "stopping every rank" has to reach).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

__all__ = ["MARKER", "new_launch_id", "marker_value", "marked_pids", "signal_marked", "kill_marked",
           "pid_namespace", "sweep_stale_run_dirs"]

MARKER = "LABKIT_LAUNCH_ID"


def new_launch_id() -> str:
    """A fresh id: the launcher's pid and 16 random hex digits (no comma, no '='). Chapter 5."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:16]}"


def marker_value(launch_id: str, inherited: str | None = None) -> str:
    """The ``LABKIT_LAUNCH_ID`` value for a rank: the ids of enclosing launches, then this one. Chapter 5."""
    ids = [x for x in (inherited or "").split(",") if x]
    return ",".join([*ids, launch_id])


def _carries(environ: bytes, launch_id: bytes) -> bool:
    if launch_id not in environ:
        return False
    prefix = MARKER.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return launch_id in entry[len(prefix):].split(b",")
    return False


def _read_environ(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


def _scan_linux(launch_id: str, sig: int | None) -> list[int]:
    me, lid, found = os.getpid(), launch_id.encode(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            if not _carries(_read_environ(pid), lid):
                continue
        except OSError:                  # gone, or not ours to read
            continue
        found.append(pid)
        if sig is not None:
            _signal_linux(pid, lid, sig)
    return found


def _signal_linux(pid: int, lid: bytes, sig: int) -> None:
    fd = None
    with contextlib.suppress(OSError, AttributeError):
        fd = os.pidfd_open(pid)          # pins *this* process: a reused pid is not signalled
    try:
        if fd is not None and not _carries(_read_environ(pid), lid):
            return                       # it exited and the pid went to someone else
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)


def _scan_psutil(launch_id: str, sig: int | None) -> list[int]:
    import psutil

    me, lid, found = os.getpid(), launch_id.encode(), []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            value = p.environ().get(MARKER)
            if value is None or not _carries(f"{MARKER}={value}".encode(), lid):
                continue
            found.append(p.pid)
            if sig is not None:
                p.send_signal(sig)       # psutil checks the pid was not reused
        except (psutil.Error, OSError):  # NoSuchProcess, ZombieProcess, AccessDenied
            continue
    return found


def _scan(launch_id: str, sig: int | None) -> list[int]:
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        return _scan_linux(launch_id, sig)
    return _scan_psutil(launch_id, sig)


def marked_pids(launch_id: str) -> list[int]:
    """PIDs of live (non-zombie) processes carrying ``launch_id`` in ``LABKIT_LAUNCH_ID``. Chapter 5."""
    return _scan(launch_id, None)


def signal_marked(launch_id: str, sig: int) -> int:
    """Send ``sig`` once to every process carrying the marker; how many there were. Chapter 5."""
    return len(_scan(launch_id, sig))


def kill_marked(launch_id: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every marked process, again and again until a scan finds none (a process may fork while
    it is being killed) or ``timeout_s`` passes; returns the PIDs still found at the end (normally []).
    Taught in chapter 5 (what stopping every rank has to reach)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        left = _scan(launch_id, signal.SIGKILL)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(delay)                # killed processes release their memory (and environ) quickly
        delay = min(delay * 2, 0.1)


# ---------------------------------------------------------------- run folders of dead launchers
def pid_namespace() -> str:
    """This process's PID namespace (``pid:[inode]``; ``namespaces(7)``), or "" where /proc has none."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def sweep_stale_run_dirs() -> None:
    """Remove run folders of launchers that died without cleaning up (SIGKILL: no finally, no atexit).

    A folder's name holds its launcher's pid, which means something only in the PID namespace it was taken
    in: a launcher in another one (a submission the grader runs in its own namespace, a container sharing
    /tmp) would find that pid absent and delete a live launch's folder. So a folder is swept only when its
    ``pidns`` file names this namespace (an older folder without one, only once it is an hour old)."""
    mine = pid_namespace()
    for d in Path(tempfile.gettempdir()).glob("labkit-launch-*-*"):
        try:
            pid = int(d.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if pid == os.getpid():
            continue
        try:
            theirs = (d / "pidns").read_text().strip()
        except OSError:
            theirs = None
        if theirs is None:
            try:
                if time.time() - d.stat().st_mtime < 3600:
                    continue
            except OSError:
                continue
        elif theirs != mine:
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            # its ranks died with it (PDEATHSIG); what they started in sessions of their own did not
            with contextlib.suppress(OSError):
                kill_marked((d / "launch_id").read_text().strip(), timeout_s=2.0)
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass

"""labkit.launch's limits and teardown (issue #13): a cap on ranks checked before anything starts, rank
supervision from the first rank started, a teardown that reaches descendants in sessions of their own
(found by the launch's LABKIT_LAUNCH_ID marker), input checks for timeout_s / log_dir, and LaunchError
for every rank-side failure (a value that cannot be pickled or unpickled, a rank that left no result)."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from labkit.launcher import LaunchError, launch, parent, sweep

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- rank targets (importable: this module)
def setsid_child_then_fail(pid_dir):
    """Start a child in a session of its own (out of reach of killpg), then fail (rank 1) or hang."""
    import torch.distributed as dist

    import labkit

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    rank = dist.get_rank()
    Path(pid_dir, f"grandchild{rank}").write_text(f"{child.pid} {os.environ[sweep.MARKER]} {labkit.__file__}")
    dist.barrier()
    if rank == 1:
        raise RuntimeError("fault after starting a setsid child")
    time.sleep(600)


def _load_fails(tag):
    raise RuntimeError(f"this value cannot be rebuilt here ({tag})")


class UnloadableInLauncher:
    """Pickles fine in the rank; unpickling it raises RuntimeError (like a CUDA tensor where there is no
    CUDA, or an instance of a class only the rank can import)."""

    def __reduce__(self):
        return (_load_fails, ("unpickle test",))


def return_unloadable():
    return UnloadableInLauncher()


def return_lock():
    import threading

    return threading.Lock()


def exit_zero_without_result():
    os._exit(0)


# ---------------------------------------------------------------- helpers
def _marked(launch_ids) -> list[psutil.Process]:
    """Every live process on the system whose environment carries one of ``launch_ids`` (psutil)."""
    out = []
    for p in psutil.process_iter():
        try:
            value = p.environ().get(sweep.MARKER)
            if value and set(value.split(",")) & set(launch_ids) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


def _kill_marked(launch_ids) -> None:
    for p in _marked(launch_ids):
        try:
            p.kill()
        except psutil.Error:
            pass


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _descendants() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


_BEFORE: set[int] = set()


def _new_descendants() -> list[psutil.Process]:
    """Descendants this test started: a pytest worker that ran other tests first may hold long-lived
    children of theirs (a DataLoader's forkserver, torch.compile's worker pool)."""
    return [p for p in _descendants() if p.pid not in _BEFORE]


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """launch's temp folders land in a folder of this test's own, to check none is left behind;
    the processes alive before the test are noted so only the test's own leftovers count."""
    _BEFORE.clear()
    _BEFORE.update(p.pid for p in _descendants())
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


# ---------------------------------------------------------------- tests
def test_over_the_cap_refused_before_anything_starts(private_tmp, monkeypatch):
    monkeypatch.delenv(parent.MAX_NPROCS_ENV, raising=False)
    before = {p.pid for p in _descendants()}
    t0 = time.monotonic()
    with pytest.raises(ValueError) as ei:
        launch("test_launcher:fail_in_rank_1", 1000, stream=False, log_dir=False)
    took = time.monotonic() - t0
    msg = str(ei.value)
    assert "nprocs=1000" in msg and "max_nprocs" in msg and parent.MAX_NPROCS_ENV in msg
    assert f"{parent.max_nprocs_default()}" in msg
    assert {p.pid for p in _descendants()} <= before           # no process was started
    assert list(private_tmp.iterdir()) == []                   # no temp folder was made
    assert took < 30                                           # ≈ 0 s: nothing started
    # the keyword and the environment variable lower or raise the cap
    with pytest.raises(ValueError, match="max_nprocs=1"):
        launch("test_launcher:fail_in_rank_1", 2, max_nprocs=1, stream=False, log_dir=False)
    monkeypatch.setenv(parent.MAX_NPROCS_ENV, "1")
    with pytest.raises(ValueError, match=f"{parent.MAX_NPROCS_ENV}=1"):
        launch("test_launcher:fail_in_rank_1", 2, stream=False, log_dir=False)
    monkeypatch.setenv(parent.MAX_NPROCS_ENV, "lots")
    with pytest.raises(ValueError, match=f"{parent.MAX_NPROCS_ENV}='lots'"):
        launch("test_launcher:fail_in_rank_1", 2, stream=False, log_dir=False)
    with pytest.raises(TypeError, match="max_nprocs must be an int"):
        launch("test_launcher:fail_in_rank_1", 2, max_nprocs=2.5, stream=False, log_dir=False)
    assert {p.pid for p in _descendants()} <= before


def test_cap_rule(monkeypatch):
    """max(8, 4 × cores) CPU ranks; max_nprocs= and LABKIT_MAX_NPROCS override; NCCL: one per GPU."""
    monkeypatch.delenv(parent.MAX_NPROCS_ENV, raising=False)
    monkeypatch.setattr(parent, "cores_available", lambda: 1)
    assert parent.max_nprocs_default() == 8
    parent._check_cap(8, "gloo", None)
    with pytest.raises(ValueError, match=r"nprocs=9 .*max\(8, 4 × 1 cores\)"):
        parent._check_cap(9, "gloo", None)
    parent._check_cap(9, "gloo", 9)                             # the keyword raises the cap
    monkeypatch.setattr(parent, "cores_available", lambda: 16)
    assert parent.max_nprocs_default() == 64
    monkeypatch.setenv(parent.MAX_NPROCS_ENV, "100")
    assert parent.max_nprocs_default() == 100
    parent._check_cap(100, "gloo", None)
    with pytest.raises(ValueError, match="nprocs=101"):
        parent._check_cap(101, "gloo", None)
    with pytest.raises(ValueError, match="nprocs=101"):
        parent._check_cap(101, "nccl", None)    # the environment variable bounds NCCL launches too
    monkeypatch.delenv(parent.MAX_NPROCS_ENV)
    parent._check_cap(101, "nccl", None)        # NCCL: the GPU count bounds it (_choose_backend)


def test_setsid_grandchild_does_not_outlive_the_launch(tmp_path, private_tmp):
    """A rank starts a child in its own session and fails: after the LaunchError no process on the
    system carries the launch's marker, and the ranks imported this worktree's labkit."""
    ids = set()
    try:
        t0 = time.monotonic()
        with pytest.raises(LaunchError) as ei:
            launch(setsid_child_then_fail, 2, args=(str(tmp_path),), stream=False, log_dir=False, timeout_s=120)
        took = time.monotonic() - t0
        assert ei.value.rank == 1 and "fault after starting a setsid child" in ei.value.traceback
        info = [(tmp_path / f"grandchild{r}").read_text().split() for r in range(2)]
        pids = [int(x[0]) for x in info]
        ids = {x[1].split(",")[-1] for x in info}
        assert len(ids) == 1                                    # one marker for the whole launch
        assert all(Path(x[2]).resolve().is_relative_to(ROOT / "labkit") for x in info), info
        assert _marked(ids) == [], "a process carrying the launch's marker survived"
        assert not any(_alive(p) for p in pids)
        assert took < 100
        assert list(private_tmp.iterdir()) == []
    finally:
        _kill_marked(ids)


def test_failure_while_starting_stops_the_starting(monkeypatch, private_tmp):
    """A rank that fails before the others are started: no further rank is started, LaunchError names it."""
    started = []
    real = parent._start_rank

    def start_then_wait_for_rank0(cmd, env):
        proc = real(cmd, env)
        started.append(proc.pid)
        deadline = time.monotonic() + 60                        # rank 0 fails in ≈ 1 s (its import)
        while len(started) == 1 and time.monotonic() < deadline:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                break
            time.sleep(0.02)
        return proc

    monkeypatch.setattr(parent, "_start_rank", start_then_wait_for_rank0)
    # a missing function fails in the rank while loading the target, before the rendezvous (the parent now
    # refuses it before starting any rank, issue #37: its check is skipped here to reach the rank-start path)
    monkeypatch.setattr(parent, "_check_attribute", lambda *a: None)
    with pytest.raises(LaunchError) as ei:
        launch("test_launcher_hardening:no_such_function", 4, stream=False, log_dir=False, timeout_s=120)
    assert len(started) == 1, f"{len(started)} ranks were started after rank 0 had failed"
    assert ei.value.rank == 0 and "no_such_function" in ei.value.traceback
    assert "1 of 4 started" in str(ei.value)
    assert _new_descendants() == [] and list(private_tmp.iterdir()) == []


def test_timeout_must_be_finite(private_tmp):
    for bad in (math.inf, 1e300, math.nan, 0, -5):
        with pytest.raises(ValueError, match="timeout_s=") as ei:
            launch("labkit.launcher:whoami", 1, timeout_s=bad, stream=False, log_dir=False)
        assert "30 days" in str(ei.value) and not isinstance(ei.value, OverflowError)
    with pytest.raises(TypeError, match="timeout_s must be a number"):
        launch("labkit.launcher:whoami", 1, timeout_s="60", stream=False, log_dir=False)
    assert _new_descendants() == [] and list(private_tmp.iterdir()) == []


def test_log_dir_checks(tmp_path, private_tmp):
    a_file = tmp_path / "not_a_folder.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is an existing file") as ei:
        launch("labkit.launcher:whoami", 1, log_dir=a_file, stream=False)
    assert str(a_file) in str(ei.value)
    with pytest.raises(ValueError, match="cannot be made a folder") as ei:
        launch("labkit.launcher:whoami", 1, log_dir=a_file / "sub", stream=False)
    assert str(a_file / "sub") in str(ei.value)
    with pytest.raises(TypeError, match="log_dir must be a folder path"):
        launch("labkit.launcher:whoami", 1, log_dir=True, stream=False)
    with pytest.raises(TypeError, match="must be picklable"):
        launch("labkit.launcher:whoami", 1, args=(lambda: 0,), stream=False, log_dir=False)
    assert _new_descendants() == [] and list(private_tmp.iterdir()) == []    # no temp folder leaked


def test_values_that_do_not_travel_are_launch_errors(private_tmp):
    with pytest.raises(LaunchError) as ei:            # pickled in the rank, fails to unpickle here
        launch(return_unloadable, 1, stream=False, log_dir=False, timeout_s=120)
    e = ei.value
    assert e.rank == 0 and "could not be unpickled" in str(e) and "unpickle test" in str(e)
    with pytest.raises(LaunchError) as ei:            # cannot be pickled in the rank
        launch(return_lock, 1, stream=False, log_dir=False, timeout_s=120)
    assert ei.value.rank == 0 and "rank 0's return value (lock) could not be pickled" in str(ei.value)
    with pytest.raises(LaunchError, match="left no return value") as ei:
        launch(exit_zero_without_result, 1, stream=False, log_dir=False, timeout_s=120)
    assert ei.value.rank == 0 and ei.value.exit_code == 0
    assert _new_descendants() == [] and list(private_tmp.iterdir()) == []


def test_sweep_finds_and_kills_marked_processes_only():
    """The marker sweep kills a process (and its setsid'd child) carrying the id, nothing else."""
    lid = sweep.new_launch_id()
    env = {**os.environ, sweep.MARKER: sweep.marker_value(lid, "outer-1")}
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
            "time.sleep(600)'], start_new_session=True); print('up', flush=True); time.sleep(600)")
    marked = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             env={**os.environ, sweep.MARKER: "someone-else"})
    try:
        assert marked.stdout.readline() == b"up\n"
        deadline = time.monotonic() + 30
        while len(sweep.marked_pids(lid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(sweep.marked_pids(lid)) == 2                      # the process and its setsid'd child
        assert sweep.marked_pids("outer-1") == sweep.marked_pids(lid)  # nested launches: both ids
        assert sweep.kill_marked(lid) == []
        assert marked.wait(timeout=30) == -signal.SIGKILL
        assert other.poll() is None                                  # not ours: untouched
        assert _marked({lid}) == []
    finally:
        for p in (marked, other):
            p.kill()
            p.wait()
            if p.stdout:
                p.stdout.close()
        _kill_marked({lid})

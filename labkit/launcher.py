"""Run a function on N ranks from a notebook cell, a script or the CLI — and get results back.

``launch(target, nprocs)`` starts ``nprocs`` **fresh** Python processes (``python -m labkit.launcher``;
the notebook kernel is never forked: forking a kernel that has run a matmul deadlocks, and a function
defined in a notebook cannot be pickled into a spawned process), initialises ``torch.distributed`` in
each (NCCL when there is one GPU per rank, gloo on CPU), runs the target and pickles each rank's return
value back through a result file. Rank output is streamed line by line with a ``[rank N]`` prefix
(reader threads; whole lines only, never interleaved mid-line) and kept in per-rank log files.

Failure handling (what ``torchrun`` and ``accelerate.notebook_launcher`` leave to you):

- a rank that raises, exits or is killed → the other ranks (which would block forever in their next
  collective) are stopped and :class:`LaunchError` names the failing rank with its traceback;
- a hang past ``timeout_s`` → every rank dumps its Python stack (``faulthandler`` on SIGUSR1); the rank
  that is *not* waiting inside ``torch.distributed`` is named as the suspect;
- the notebook's stop button (``KeyboardInterrupt`` in the launching process) → the whole process tree
  is stopped.

Stopping means SIGTERM to each rank's process group (every rank runs in its own session, so its
DataLoader workers go too), SIGKILL after a grace period, then reaping with ``wait4`` (which also gives
each rank's peak RSS). Ranks die with the launcher (``PR_SET_PDEATHSIG`` on Linux, a parent watchdog
elsewhere). Rendezvous: the launcher hosts a ``TCPStore`` on 127.0.0.1 with port 0 (the kernel picks
a free port — no race between choosing and binding) and the ranks join it as clients exactly as under
``torchrun`` (``TORCHELASTIC_USE_AGENT_STORE``), so the same target also runs under plain torchrun::

    torchrun --standalone --nproc_per_node=4 -m labkit run --parallel ddp   # CLI form of labkit.train.run

(``--standalone`` picks a free rendezvous port; ``--master_port=0`` is handed to the workers as port 0.)

Environment per rank, as torchrun sets it: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``; plus ``OMP_NUM_THREADS = cores //
nprocs`` (≥ 1) so ranks do not fight over cores, and ``GLOO_SOCKET_IFNAME`` = the loopback interface.

Taught in chapter 5 (scaling: running N ranks), chapter 19 (DDP) and chapter 20 (FSDP).
Linux and macOS (process groups and ``wait4``); not Windows.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import importlib
import importlib.util
import os
import pickle
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKENDS = ("auto", "gloo", "nccl")
GRACE_S = 3.0            # SIGTERM → SIGKILL
KEEP_LOG_RUNS = 20       # default log folders kept under work_dir("launch")


# ----------------------------------------------------------------------------- results / errors
@dataclass
class RankResult:
    """What one rank left behind: return value, exit code, wall time and peak RSS (``wait4``).

    Taught in chapter 5 (scaling: running N ranks)."""

    rank: int
    exit_code: int | None
    wall_s: float
    peak_rss_bytes: int | None
    value: Any = None


@dataclass
class LaunchResult:
    """All ranks' results. ``.value`` is rank 0's return value, ``.values`` every rank's.

    Taught in chapter 5 (scaling: running N ranks)."""

    ranks: list[RankResult]
    log_dir: Path | None
    wall_s: float
    backend: str
    nprocs: int = field(init=False)

    def __post_init__(self):
        self.nprocs = len(self.ranks)

    @property
    def values(self) -> list[Any]:
        return [r.value for r in self.ranks]

    @property
    def value(self) -> Any:
        return self.ranks[0].value

    def log(self, rank: int = 0) -> str:
        """The full output of one rank (from its log file)."""
        if self.log_dir is None:
            raise ValueError("this launch kept no log files (log_dir=False)")
        return (Path(self.log_dir) / f"rank{rank}.log").read_text(errors="replace")

    def __repr__(self) -> str:
        rss = [f"{r.peak_rss_bytes / 2**20:.0f}" if r.peak_rss_bytes else "?" for r in self.ranks]
        return (f"LaunchResult({self.nprocs} ranks, backend={self.backend}, wall {self.wall_s:.1f} s, "
                f"exit codes {[r.exit_code for r in self.ranks]}, peak RSS MiB {rss}, "
                f"value={self.value!r:.80})")


class LaunchError(RuntimeError):
    """A rank failed, the launch timed out, or the ranks could not start.

    ``.rank`` is the failing (or, for a hang, the suspected) rank, ``.traceback`` its traceback text
    (or stack dump), ``.exit_code`` its exit code (negative: killed by that signal), ``.log_dir`` where
    the per-rank logs are, ``.timed_out`` whether the timeout fired.

    Taught in chapter 5 (scaling: running N ranks) and chapter 19 (a failing DDP rank).
    """

    def __init__(self, message: str, *, rank: int | None = None, traceback: str = "",
                 exit_code: int | None = None, log_dir: Path | None = None, timed_out: bool = False):
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback
        self.exit_code = exit_code
        self.log_dir = log_dir
        self.timed_out = timed_out


# ----------------------------------------------------------------------------- target resolution
def _resolve_target(target) -> tuple:
    """Turn a function / "module:function" / script path into a picklable spec the worker runs."""
    if isinstance(target, _CellTarget):
        return target.spec
    if callable(target) and not isinstance(target, str | os.PathLike):
        mod = getattr(target, "__module__", None)
        qual = getattr(target, "__qualname__", None)
        if mod is None or qual is None or "<locals>" in qual or "<lambda>" in qual:
            raise TypeError(
                f"target={target!r} cannot be imported by a fresh process (lambda or nested function); "
                "pass a module-level function, a 'module:function' string or a script path")
        if mod == "__main__":
            main_file = getattr(sys.modules.get("__main__"), "__file__", None)
            if not main_file:
                raise TypeError(
                    f"target={qual!r} is defined in a notebook (or interactive) session, which a fresh "
                    "process cannot import. Put it in a .py module and import it, or use the cell "
                    "magic %%launch (load with `%load_ext labkit.launcher`)")
            return ("file_func", str(Path(main_file).resolve()), qual)
        return ("func", mod, qual)
    if isinstance(target, str | os.PathLike):
        s = os.fspath(target)
        if s.endswith(".py") or os.sep in s or Path(s).is_file():
            p = Path(s)
            if not p.is_file():
                raise ValueError(f"target={s!r}: no such script file")
            return ("script", str(p.resolve()))
        if ":" in s:
            mod, _, qual = s.partition(":")
            if not mod or not qual:
                raise ValueError(f"target={s!r}: expected 'module:function'")
            spec = importlib.util.find_spec(mod)
            if spec is None:
                raise ValueError(f"target={s!r}: module {mod!r} is not importable here")
            return ("func", mod, qual)
        raise ValueError(f"target={s!r}: expected a function, 'module:function' or a path to a .py script")
    raise TypeError(f"target must be a function, 'module:function' or a script path, got {type(target).__name__}")


def _choose_backend(backend: str, nprocs: int) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid; choose one of {BACKENDS}")
    n_gpu = 0
    if backend in ("auto", "nccl"):
        import torch

        n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if n_gpu >= nprocs else "gloo"
    if backend == "nccl" and n_gpu < nprocs:
        raise ValueError(f"backend='nccl' needs one GPU per rank: nprocs={nprocs} but {n_gpu} GPU(s) visible")
    return backend


def cores_available() -> int:
    """CPU cores this process may use (affinity mask where the OS has one).

    Taught in chapter 5 (ranks share the cores: OMP_NUM_THREADS = cores // nprocs)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _loopback_ifname() -> str | None:
    for name in ("lo", "lo0"):
        if Path(f"/sys/class/net/{name}").exists() or (sys.platform == "darwin" and name == "lo0"):
            return name
    return None


def _rank_env(rank: int, nprocs: int, port: int, backend: str, run_dir: Path, timeout_s: float,
              user_env: dict | None) -> dict[str, str]:
    env = dict(os.environ)
    # the target must import in the rank exactly as here: same sys.path (cwd included)
    paths = [os.getcwd() if p == "" else p for p in sys.path]
    paths = [p for p in paths if p and os.path.isdir(p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(nprocs), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",   # join the launcher's store as a client (torchrun does this)
        "OMP_NUM_THREADS": str(max(1, cores_available() // nprocs)),
        "PYTHONUNBUFFERED": "1",
        "LABKIT_RUN_DIR": str(run_dir), "LABKIT_BACKEND": backend,
        "LABKIT_TIMEOUT_S": str(timeout_s), "LABKIT_PARENT_PID": str(os.getpid()),
    })
    lo = _loopback_ifname()
    if backend == "gloo" and lo and "GLOO_SOCKET_IFNAME" not in (user_env or {}):
        env["GLOO_SOCKET_IFNAME"] = lo
    for k in ("MPLBACKEND",):   # a notebook kernel's inline backend does not exist in a plain process
        if env.get(k, "").startswith("module://"):
            env.pop(k)
    if user_env:
        env.update({str(k): str(v) for k, v in user_env.items()})
    return env


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
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.ranks: list[_Rank] = []
        self.out: queue.Queue = queue.Queue()

    def alive(self) -> list[_Rank]:
        return [r for r in self.ranks if not r.done]

    def stop(self, grace: float = GRACE_S) -> None:
        """SIGTERM each live rank's process group, SIGKILL after ``grace``, reap everything."""
        live = [r for r in self.ranks if not r.done and not r.exited()]
        for r in live:
            r.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while live and time.monotonic() < deadline:
            live = [r for r in live if not r.exited()]
            time.sleep(0.02)
        for r in self.ranks:
            r.reap()            # SIGKILL to the group, then wait4
        for r in self.ranks:
            r.close()


# ----------------------------------------------------------------------------- launch
def launch(target: Callable | str | os.PathLike, nprocs: int, *, backend: str = "auto",
           timeout_s: float = 300, args: tuple = (), kwargs: dict | None = None,
           env: dict | None = None, stream: bool = True, rank0_only: bool = False,
           log_dir: str | os.PathLike | None = None) -> LaunchResult:
    """Run ``target(*args, **kwargs)`` on ``nprocs`` fresh ranks with torch.distributed initialised.

    target: a module-level function, a ``"module:function"`` string, or a script path (a script runs as
    under torchrun: ``__main__``, ``sys.argv = [path, *args]``, and it initialises torch.distributed
    itself with ``init_process_group(backend)``; the environment it needs is set).
    backend: "auto" (NCCL when there are ≥ nprocs GPUs, else gloo), "gloo" or "nccl".
    timeout_s: wall-clock limit for the whole launch; on expiry every rank dumps its stack and the
    launch fails with :class:`LaunchError` (``.timed_out``) naming the rank not waiting in a collective.
    env: extra environment variables for every rank. stream: print rank output live with a
    ``[rank N]`` prefix; rank0_only: print only rank 0's (all ranks are still logged).
    log_dir: where per-rank logs go (default: a fresh folder under ``labkit.paths.work_dir("launch")``,
    the 20 newest kept).

    Returns :class:`LaunchResult`; raises :class:`LaunchError` when a rank fails or time runs out,
    ``KeyboardInterrupt`` (after stopping every rank) when the cell is interrupted.

    Taught in chapter 5 (scaling), chapter 19 (DDP) and chapter 20 (FSDP).
    """
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r} is not valid; use an int ≥ 1")
    if not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} is not valid; use a number of seconds > 0")
    if not isinstance(args, tuple | list):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict or None, got {type(kwargs).__name__}")
    spec = _resolve_target(target)
    backend = _choose_backend(backend, nprocs)
    if spec[0] == "script" and kwargs:
        raise ValueError("kwargs cannot be passed to a script target; pass command-line args=(...)")

    _sweep_stale_run_dirs()
    run_dir = Path(tempfile.mkdtemp(prefix=f"labkit-launch-{os.getpid()}-"))
    logs = _make_log_dir(log_dir)
    job = _Job(run_dir)
    store = None
    t_start = time.monotonic()
    sigint_old = None
    try:
        with open(run_dir / "spec.pkl", "wb") as f:
            pickle.dump({"target": spec, "args": tuple(args), "kwargs": dict(kwargs or {})}, f)
        from torch.distributed import TCPStore

        # the launcher hosts the rendezvous store; port 0 = a free port chosen by the kernel at bind time
        store = TCPStore("127.0.0.1", 0, None, True, timeout=_dt.timedelta(seconds=max(30.0, timeout_s)),
                         wait_for_workers=False)
        port = store.port
        _LIVE.add(job)
        for rank in range(nprocs):
            proc = subprocess.Popen(
                [sys.executable, "-m", "labkit.launcher", str(run_dir), str(rank)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=_rank_env(rank, nprocs, port, backend, run_dir, timeout_s, env),
                start_new_session=True, close_fds=True,
            )
            job.ranks.append(_Rank(rank, proc, logs / f"rank{rank}.log" if logs else None, job.out))
        failure = _supervise(job, t_start + timeout_s, stream, rank0_only)
        if failure is None:
            results = _collect(job, run_dir)
            return LaunchResult(ranks=results, log_dir=logs, wall_s=time.monotonic() - t_start,
                                backend=backend)
        raise _make_error(job, run_dir, logs, failure, timeout_s, stream, rank0_only)
    finally:
        # a second stop-button press during cleanup must not leave processes behind
        if threading.current_thread() is threading.main_thread():
            sigint_old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            job.stop()
            _drain(job, stream, rank0_only)
            _LIVE.discard(job)
            if store is not None:
                del store
            shutil.rmtree(run_dir, ignore_errors=True)
        finally:
            if sigint_old is not None:
                signal.signal(signal.SIGINT, sigint_old)


def _sweep_stale_run_dirs() -> None:
    """Remove run folders of launchers that died without cleaning up (SIGKILL: no finally, no atexit)."""
    for d in Path(tempfile.gettempdir()).glob("labkit-launch-*-*"):
        try:
            pid = int(d.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass


def _make_log_dir(log_dir) -> Path | None:
    if log_dir is False:
        return None
    if log_dir is not None:
        p = Path(log_dir)
        p.mkdir(parents=True, exist_ok=True)
        return p
    from labkit.paths import work_dir

    base = work_dir("launch")
    old = sorted((d for d in base.iterdir() if d.is_dir()), key=lambda d: d.name)
    for d in old[:-KEEP_LOG_RUNS + 1] if len(old) >= KEEP_LOG_RUNS else []:
        with contextlib.suppress(OSError):
            if time.time() - d.stat().st_mtime > 600:     # never a folder a running launch may still use
                shutil.rmtree(d, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=base))


def _drain(job: _Job, stream: bool, rank0_only: bool) -> None:
    while True:
        try:
            rank, line = job.out.get_nowait()
        except queue.Empty:
            return
        if stream and (rank == 0 or not rank0_only):
            print(f"[rank {rank}] {line}", flush=True)


def _supervise(job: _Job, deadline: float, stream: bool, rank0_only: bool):
    """Print output as it comes; return None when all ranks succeeded, else ("fail", rank) / ("timeout",)."""
    while True:
        try:
            rank, line = job.out.get(timeout=0.05)
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
        if newly_failed:
            return ("fail", _root_cause(newly_failed, job))
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


def _collect(job: _Job, run_dir: Path) -> list[RankResult]:
    out = []
    for r in job.ranks:
        r.close()
        value = None
        path = run_dir / f"rank{r.rank}.result"
        if path.exists():
            with open(path, "rb") as f:
                value = pickle.load(f)
        out.append(RankResult(rank=r.rank, exit_code=r.exit_code, wall_s=r.wall_s or 0.0,
                              peak_rss_bytes=r.peak_rss, value=value))
    return out


def _signame(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _make_error(job, run_dir, logs, failure, timeout_s, stream, rank0_only) -> LaunchError:
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
        return LaunchError(f"rank {r.rank} failed ({_signame(r.exit_code)}); the other ranks were stopped{where}\n"
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
        f"launch timed out after {timeout_s:g} s; rank {suspect} is the suspect (not in a collective)"
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


# ----------------------------------------------------------------------------- the rank side
def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:   # parent already gone before prctl took effect
        os._exit(1)

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="labkit-parent-watch").start()


def _load_target(spec: tuple):
    kind = spec[0]
    if kind == "func":
        obj = importlib.import_module(spec[1])
    elif kind == "file_func":
        s = importlib.util.spec_from_file_location("__labkit_main__", spec[1])
        obj = importlib.util.module_from_spec(s)
        sys.modules["__labkit_main__"] = obj
        s.loader.exec_module(obj)
    else:
        raise ValueError(f"unknown target kind {kind!r}")
    for part in spec[2].split("."):
        obj = getattr(obj, part)
    return obj


def init_distributed(backend: str | None = None, timeout_s: float | None = None):
    """Initialise torch.distributed from the torchrun-style environment (idempotent); returns the device.

    Works the same under :func:`launch` and plain ``torchrun``. NCCL ranks are pinned to
    ``cuda:LOCAL_RANK``. Taught in chapter 19 (DDP).
    """
    import torch
    import torch.distributed as dist

    backend = backend or os.environ.get("LABKIT_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        t = float(timeout_s or os.environ.get("LABKIT_TIMEOUT_S") or 1800)
        kw = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, init_method="env://", timeout=_dt.timedelta(seconds=t), **kw)
    return device


def whoami() -> dict:
    """This rank's identity: rank, world size, backend, pid, host, threads (the "hello world" of ch05).

    ``labkit.launch("labkit.launcher:whoami", 4).values`` shows four ranks and how the launcher set
    them up. Taught in chapter 5 (scaling: running N ranks).
    """
    import socket

    import torch
    import torch.distributed as dist

    init = dist.is_available() and dist.is_initialized()
    return {"rank": dist.get_rank() if init else 0, "world_size": dist.get_world_size() if init else 1,
            "backend": dist.get_backend() if init else None, "pid": os.getpid(),
            "host": socket.gethostname(), "torch_threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                   "MASTER_PORT", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")}}


def shutdown_distributed() -> None:
    """``barrier()`` then ``destroy_process_group()`` (without the barrier one FSDP2 teardown in four
    aborted on gloo — PLATFORM_NOTES). Taught in chapter 19 (DDP)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _worker_main(argv: list[str]) -> int:
    import faulthandler
    import runpy

    run_dir, rank = Path(argv[0]), int(argv[1])
    _die_with_parent(int(os.environ.get("LABKIT_PARENT_PID", os.getppid())))
    stack_file = open(run_dir / f"rank{rank}.stack", "w")  # noqa: SIM115 - must stay open for faulthandler
    # faulthandler names threads by ident; say which one is the main thread
    stack_file.write(f"main thread 0x{threading.main_thread().ident:016x}\n")
    stack_file.flush()
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=sys.stderr)
    ok = False
    try:
        with open(run_dir / "spec.pkl", "rb") as f:
            try:
                spec = pickle.load(f)
            except (AttributeError, ModuleNotFoundError) as e:
                raise TypeError("the launch's args/kwargs hold an object whose class this rank cannot import "
                                "(defined in a notebook or __main__?); move the class into a .py module") from e
        target, args, kwargs = spec["target"], spec["args"], spec["kwargs"]
        if target[0] == "script":
            sys.argv = [target[1], *map(str, args)]
            sys.path.insert(0, str(Path(target[1]).parent))
            try:
                runpy.run_path(target[1], run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise
            value = None
        elif target[0] == "cell":
            init_distributed()
            ns = runpy.run_path(target[1], run_name="__labkit_cell__")
            value = ns.get("result")
        else:
            fn = _load_target(target)
            init_distributed()
            value = fn(*args, **kwargs)
        tmp = run_dir / f".rank{rank}.result.tmp"
        try:
            with open(tmp, "wb") as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"rank {rank}'s return value ({type(value).__name__}) cannot be pickled "
                            f"back to the launcher: {e}") from e
        os.replace(tmp, run_dir / f"rank{rank}.result")
        ok = True
    except BaseException:  # noqa: BLE001 - report everything, including SystemExit(1) / KeyboardInterrupt
        text = traceback.format_exc()
        (run_dir / f"rank{rank}.error").write_text(text)
        sys.stderr.write(text)
    finally:
        if ok:
            with contextlib.suppress(Exception):
                shutdown_distributed()
        sys.stdout.flush()
        sys.stderr.flush()
    # os._exit: never hang in interpreter shutdown on a half-dead process group after a failure
    os._exit(0 if ok else 1)


# ----------------------------------------------------------------------------- IPython cell magic
def load_ipython_extension(ipython) -> None:
    """``%load_ext labkit.launcher`` registers the cell magic ``%%launch``::

        %%launch -n 4 [--timeout 120] [--backend gloo] [--rank0-only]
        import torch.distributed as dist
        print(dist.get_rank(), dist.get_world_size())
        result = dist.get_rank() ** 2       # a variable named `result` comes back

    The cell's code is written to a temporary module file and run on N fresh ranks with torch.distributed
    initialised; it sees only what it imports itself (not the notebook's variables). The magic returns
    the :class:`LaunchResult` (``_.values`` holds every rank's ``result``).
    Taught in chapter 5 (scaling).
    """
    ipython.register_magic_function(_launch_magic, magic_kind="cell", magic_name="launch")


def _launch_magic(line: str, cell: str):
    import argparse
    import shlex

    p = argparse.ArgumentParser(prog="%%launch", add_help=False)
    p.add_argument("-n", "--nprocs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--backend", default="auto")
    p.add_argument("--rank0-only", action="store_true")
    try:
        a = p.parse_args(shlex.split(line))
    except SystemExit as e:
        raise ValueError(f"%%launch {line!r}: usage: %%launch -n N [--timeout S] [--backend auto|gloo|nccl] "
                         "[--rank0-only]") from e
    d = Path(tempfile.mkdtemp(prefix="labkit-cell-"))
    try:
        path = d / "labkit_cell.py"
        path.write_text(cell)
        return launch(_CellTarget(str(path)), a.nprocs, backend=a.backend, timeout_s=a.timeout,
                      rank0_only=a.rank0_only)
    finally:
        shutil.rmtree(d, ignore_errors=True)


class _CellTarget:
    """A cell's code saved as a file (the ``%%launch`` magic): run with torch.distributed initialised."""

    def __init__(self, path: str):
        self.spec = ("cell", path)


if __name__ == "__main__":
    from labkit import launcher as _self  # run the worker from the importable module, not __main__

    _self._worker_main(sys.argv[1:])

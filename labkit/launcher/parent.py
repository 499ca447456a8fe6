"""The parent side of a launch: :func:`launch` resolves the target, picks the backend, hosts the
rendezvous store, starts ``nprocs`` fresh ``python -m labkit.launcher`` ranks with a torchrun-style
environment, supervises them (:mod:`labkit.launcher.supervise`) and returns their results or raises.

Taught in chapter 5 (scaling: running N ranks), chapter 19 (DDP) and chapter 20 (FSDP).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from labkit import checks
from labkit.launcher.results import LaunchResult
from labkit.launcher.supervise import _LIVE, _collect, _drain, _Job, _make_error, _Rank, _supervise

__all__ = ["launch", "cores_available", "BACKENDS"]

BACKENDS = ("auto", "gloo", "nccl")
KEEP_LOG_RUNS = 20       # default log folders kept under work_dir("launch")


class _CellTarget:
    """A cell's code saved as a file (the ``%%launch`` magic): run with torch.distributed initialised."""

    def __init__(self, path: str):
        self.spec = ("cell", path)


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
    checks.count("nprocs", nprocs)
    checks.positive("timeout_s", timeout_s)      # seconds
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

"""The parent side of a launch: :func:`launch` checks its inputs (a cap on ranks, the timeout, the log
folder), resolves the target, picks the backend, hosts the rendezvous store, starts ``nprocs`` fresh
``python -m labkit.launcher`` ranks with a torchrun-style environment and the launch's marker
(:mod:`labkit.launcher.sweep`), supervises them from the first one started
(:mod:`labkit.launcher.supervise`) and returns their results or raises.

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
from labkit.launcher import flight, sweep
from labkit.launcher.results import LaunchError, LaunchResult
from labkit.launcher.supervise import _LIVE, _collect, _drain, _Job, _make_error, _poll, _Rank, _supervise

__all__ = ["launch", "cores_available", "max_nprocs_default", "BACKENDS", "MAX_NPROCS_ENV", "MAX_TIMEOUT_S"]

BACKENDS = ("auto", "gloo", "nccl")
KEEP_LOG_RUNS = 20       # default log folders kept under work_dir("launch")
MAX_NPROCS_ENV = "LABKIT_MAX_NPROCS"
MAX_TIMEOUT_S = 30 * 86400   # 30 days: timedelta/TCPStore/NCCL timeouts overflow far above this


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
            _check_attribute(s, mod, qual)
            return ("func", mod, qual)
        raise ValueError(f"target={s!r}: expected a function, 'module:function' or a path to a .py script")
    raise TypeError(f"target must be a function, 'module:function' or a script path, got {type(target).__name__}")


def _check_attribute(s: str, mod: str, qual: str) -> None:
    """Refuse ``module:function`` whose function is missing or not callable before any rank starts (each
    rank would import the module and die on the same AttributeError). The module is imported here once,
    as every rank will import it anyway."""
    try:
        obj = importlib.import_module(mod)
    except Exception as e:       # the module's own import error: the ranks would hit it too
        raise ValueError(f"target={s!r}: importing module {mod!r} failed ({type(e).__name__}: {e})") from None
    for part in qual.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"target={s!r}: module {mod!r} has no {qual!r} (no attribute {part!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"target={s!r}: {mod}.{qual} is a {type(obj).__name__}, not a function")


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


def max_nprocs_default() -> int:
    """The most CPU (gloo) ranks a launch starts unless told otherwise: ``max(8, 4 × cores)``, or the
    ``LABKIT_MAX_NPROCS`` environment variable. Every rank is a full Python process with torch
    (≈ 0.25 GiB), so 1,000 ranks would need ≈ 230 GiB. Taught in chapter 5 (scaling)."""
    raw = os.environ.get(MAX_NPROCS_ENV)
    if raw is None or raw.strip() == "":
        return max(8, 4 * cores_available())
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MAX_NPROCS_ENV}={raw!r} is not valid: use an int >= 1 (the most ranks a launch "
                         "may start) or unset it for the default max(8, 4 × cores)")
    return value


def _check_cap(nprocs: int, backend: str, max_nprocs) -> None:
    """Refuse, before anything starts, more ranks than the machine can hold."""
    if max_nprocs is not None:
        cap, why = checks.count("max_nprocs", max_nprocs), f"max_nprocs={max_nprocs}"
    elif os.environ.get(MAX_NPROCS_ENV, "").strip():
        cap, why = max_nprocs_default(), f"{MAX_NPROCS_ENV}={os.environ[MAX_NPROCS_ENV]}"
    elif backend == "nccl":
        return            # one rank per GPU: _choose_backend has already refused more ranks than GPUs
    else:
        cap = max_nprocs_default()
        why = f"max(8, 4 × {cores_available()} cores) for CPU ranks"
    if nprocs > cap:
        raise ValueError(
            f"nprocs={nprocs} is more ranks than this launch allows ({cap}: {why}); every rank is a full "
            f"Python process with torch (≈ 0.25 GiB each). Use nprocs <= {cap}, or raise the cap with "
            f"launch(..., max_nprocs=N) or the environment variable {MAX_NPROCS_ENV}=N")


def _check_log_dir(log_dir) -> None:
    if log_dir is None or log_dir is False:
        return
    if not isinstance(log_dir, str | os.PathLike):
        raise checks.ArgumentTypeError(
            f"log_dir must be a folder path, None (a fresh folder under work_dir('launch')) or False (no "
            f"logs), got {type(log_dir).__name__} {log_dir!r}")
    p = Path(log_dir)
    if p.exists() and not p.is_dir():
        raise ValueError(f"log_dir={os.fspath(log_dir)!r} is an existing file, not a folder: pass a folder "
                         "path (created if missing), None for a fresh folder, or False for no log files")


def _loopback_ifname() -> str | None:
    for name in ("lo", "lo0"):
        if Path(f"/sys/class/net/{name}").exists() or (sys.platform == "darwin" and name == "lo0"):
            return name
    return None


def _rank_env(rank: int, nprocs: int, port: int, backend: str, run_dir: Path, timeout_s: float,
              user_env: dict | None, launch_id: str, flight_dir: Path | None = None) -> dict[str, str]:
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
    if flight_dir is not None:    # chapter 27: every collective recorded; dumped on a failure or a hang
        flight.rank_env(env, flight_dir)
    if user_env:
        env.update({str(k): str(v) for k, v in user_env.items()})
    # the marker every descendant inherits (teardown finds them by it); after user_env: not overridable
    env[sweep.MARKER] = sweep.marker_value(launch_id, os.environ.get(sweep.MARKER))
    return env


def _start_rank(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """One rank process in its own session (its group is its own and its DataLoader workers')."""
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True, close_fds=True)


# ----------------------------------------------------------------------------- launch
def launch(target: Callable | str | os.PathLike, nprocs: int, *, backend: str = "auto",
           timeout_s: float = 300, args: tuple = (), kwargs: dict | None = None,
           env: dict | None = None, stream: bool = True, rank0_only: bool = False,
           log_dir: str | os.PathLike | None = None, max_nprocs: int | None = None,
           flight_recorder: str | os.PathLike | None = None) -> LaunchResult:
    """Run ``target(*args, **kwargs)`` on ``nprocs`` fresh ranks with torch.distributed initialised.

    target: a module-level function, a ``"module:function"`` string, or a script path (a script runs as
    under torchrun: ``__main__``, ``sys.argv = [path, *args]``, and it initialises torch.distributed
    itself with ``init_process_group(backend)``; the environment it needs is set).
    backend: "auto" (NCCL when there are ≥ nprocs GPUs, else gloo), "gloo" or "nccl".
    timeout_s: wall-clock limit for the whole launch, in seconds: finite, > 0 and at most 30 days
    (``inf`` is refused with a ValueError — there is no "no limit"; pass a large number); on expiry every
    rank dumps its stack and the launch fails with :class:`LaunchError` (``.timed_out``) naming the rank
    not waiting in a collective.
    env: extra environment variables for every rank. stream: print rank output live with a
    ``[rank N]`` prefix; rank0_only: print only rank 0's (all ranks are still logged).
    log_dir: a folder for the per-rank logs (created if missing; an existing *file* is a ValueError);
    None (default): a fresh folder under ``labkit.paths.work_dir("launch")``, the 20 newest kept;
    False: no log files.
    max_nprocs: the most ranks this launch may start. Default: the environment variable
    ``LABKIT_MAX_NPROCS`` if set, else ``max(8, 4 × cores)`` for CPU (gloo) ranks and one rank per GPU
    for NCCL. More ranks than the cap is a ValueError before any process starts (each rank is a whole
    Python process with torch, ≈ 0.25 GiB).
    flight_recorder: a folder (created if missing; one already holding dumps is a ValueError) for
    PyTorch's Flight Recorder: every rank records its collectives (``TORCH_FR_BUFFER_SIZE``, default
    2000 entries, unless ``env`` sets it) and writes its record, in torch's pickle format under torch's
    default name ``nccl_trace_rank_<rank>``, when it finishes, when it fails, and — from a thread, while
    it is blocked in a collective — when the launch times out or another rank fails (the launcher waits
    up to ``FR_WAIT_S`` for the dumps before stopping the ranks). Read them with ``labkit diagnose --hang
    DIR`` (:func:`labkit.diagnose.hang.diagnose_hang`). Default None: off. In ``env``:
    ``LABKIT_FR_FORMAT=json`` writes torch's JSON dump instead (``nccl_trace_rank_<rank>.json``);
    ``LABKIT_FR_STACKS=1`` adds each collective's Python frames to the pickle (its first dump in a
    process imports ≈ 800 modules: ≈ 1.3 s of CPU, measured 10 s of wall time on 2 loaded cores).

    Ranks are supervised from the first one started: one that fails while others are still being
    started stops the starting. Teardown reaches every descendant: each rank's process group, then every
    process carrying the launch's ``LABKIT_LAUNCH_ID`` marker (children started in a new session too).

    Returns :class:`LaunchResult`; raises :class:`LaunchError` when a rank fails, cannot start, returns
    a value the launcher cannot unpickle or time runs out, ``KeyboardInterrupt`` (after stopping every
    rank) when the cell is interrupted, ValueError/TypeError for bad arguments (before starting anything).

    Taught in chapter 5 (scaling), chapter 19 (DDP) and chapter 20 (FSDP).
    """
    checks.count("nprocs", nprocs)
    try:
        timeout_s = checks.number("timeout_s", timeout_s, low=0, low_open=True, high=MAX_TIMEOUT_S)
    except ValueError as e:   # ArgumentTypeError keeps its type
        raise type(e)(f"{e} (seconds; {MAX_TIMEOUT_S:.0f} s = 30 days; there is no unlimited timeout: "
                      "pass a large number)") from None
    if not isinstance(args, tuple | list):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict or None, got {type(kwargs).__name__}")
    if env is not None and not isinstance(env, dict):
        raise TypeError(f"env must be a dict of environment variables or None, got {type(env).__name__}")
    _check_log_dir(log_dir)
    spec = _resolve_target(target)
    if flight_recorder is not None and spec[0] == "script":
        raise ValueError("flight_recorder needs a function target (a script initialises torch.distributed itself; "
                         "set TORCH_FR_BUFFER_SIZE in env= and dump with torch._C._distributed_c10d._dump_fr_trace)")
    backend = _choose_backend(backend, nprocs)
    _check_cap(nprocs, backend, max_nprocs)
    if spec[0] == "script" and kwargs:
        raise ValueError("kwargs cannot be passed to a script target; pass command-line args=(...)")
    payload = _pickle_spec(spec, args, kwargs)
    flight_dir = flight.check_folder(flight_recorder)

    sweep.sweep_stale_run_dirs()
    logs = _make_log_dir(log_dir)
    job = _Job(None, sweep.new_launch_id())
    store = None
    t_start = time.monotonic()
    deadline = t_start + timeout_s
    sigint_old = None
    try:
        run_dir = _make_run_dir(job, payload)
        store = _host_store(timeout_s)
        _LIVE.add(job)
        failure = None
        for rank in range(nprocs):      # supervised from the first rank: a failure stops the starting
            _add_rank(job, rank, nprocs, store.port, backend, timeout_s, env, logs, flight_dir)
            failure = _poll(job, stream, rank0_only) or (("timeout",) if time.monotonic() > deadline else None)
            if failure:
                break
        note = f" while ranks were starting ({len(job.ranks)} of {nprocs} started)" if failure else ""
        failure = failure or _supervise(job, deadline, stream, rank0_only)
        if failure is None:
            results = _collect(job, run_dir, logs, need_result=spec[0] != "script")
            return LaunchResult(ranks=results, log_dir=logs, wall_s=time.monotonic() - t_start,
                                backend=backend)
        if flight_dir is not None:
            note += flight.request_dumps(job, flight_dir)
        raise _make_error(job, run_dir, logs, failure, timeout_s, stream, rank0_only, note)
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
            if job.run_dir is not None:
                shutil.rmtree(job.run_dir, ignore_errors=True)
        finally:
            if sigint_old is not None:
                signal.signal(signal.SIGINT, sigint_old)


def _pickle_spec(spec: tuple, args, kwargs) -> bytes:
    try:
        return pickle.dumps({"target": spec, "args": tuple(args), "kwargs": dict(kwargs or {})},
                            protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - PicklingError, TypeError, AttributeError...
        raise checks.ArgumentTypeError(f"args/kwargs must be picklable to reach the ranks; pickling them "
                                       f"failed: {type(e).__name__}: {e}") from e


def _make_run_dir(job: _Job, payload: bytes) -> Path:
    """The launch's temp folder (removed by launch's finally, or by the next launch if this one is killed)."""
    try:
        job.run_dir = Path(tempfile.mkdtemp(prefix=f"labkit-launch-{os.getpid()}-"))
        (job.run_dir / "launch_id").write_text(job.launch_id)    # the sweep of a dead launcher's folder
        (job.run_dir / "pidns").write_text(sweep.pid_namespace())      # whose pid the folder's name is
        (job.run_dir / "spec.pkl").write_bytes(payload)
    except OSError as e:
        raise LaunchError(f"could not create the launch's run folder in {tempfile.gettempdir()}: {e}") from e
    return job.run_dir


def _host_store(timeout_s: float):
    """The rendezvous store; port 0 = a free port chosen by the kernel at bind time."""
    from torch.distributed import TCPStore

    try:
        return TCPStore("127.0.0.1", 0, None, True, timeout=_dt.timedelta(seconds=max(30.0, timeout_s)),
                        wait_for_workers=False)
    except (RuntimeError, OSError) as e:
        raise LaunchError(f"could not host the rendezvous store on 127.0.0.1: {e}") from e


def _add_rank(job: _Job, rank: int, nprocs: int, port: int, backend: str, timeout_s: float,
              env: dict | None, logs: Path | None, flight_dir: Path | None = None) -> None:
    cmd = [sys.executable, "-m", "labkit.launcher", str(job.run_dir), str(rank)]
    try:
        proc = _start_rank(cmd, _rank_env(rank, nprocs, port, backend, job.run_dir, timeout_s, env,
                                          job.launch_id, flight_dir))
    except OSError as e:        # EAGAIN / ENOMEM: out of processes or memory
        raise LaunchError(f"could not start rank {rank} of {nprocs} ({type(e).__name__}: {e}); the {rank} "
                          "rank(s) already started were stopped", rank=rank, log_dir=logs) from e
    try:
        job.ranks.append(_Rank(rank, proc, logs / f"rank{rank}.log" if logs else None, job.out))
    except BaseException as e:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        if isinstance(e, OSError):
            raise LaunchError(f"could not open rank {rank}'s log file in {logs}: {e}", rank=rank,
                              log_dir=logs) from e
        raise


def _make_log_dir(log_dir) -> Path | None:
    if log_dir is False:
        return None
    if log_dir is not None:
        p = Path(log_dir)
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:      # a file in the way (FileExistsError, NotADirectoryError), no permission
            raise ValueError(f"log_dir={os.fspath(log_dir)!r} cannot be made a folder "
                             f"({type(e).__name__}: {e.strerror or e}): pass a folder path you can write "
                             "to, None for a fresh folder, or False for no log files") from e
        return p
    from labkit.paths import work_dir

    try:
        return _fresh_log_dir(work_dir("launch"))
    except OSError as e:
        raise LaunchError(f"could not create a log folder for the launch ({e}); pass log_dir=<folder> "
                          "or log_dir=False") from e


def _fresh_log_dir(base: Path) -> Path:
    old = sorted((d for d in base.iterdir() if d.is_dir()), key=lambda d: d.name)
    for d in old[:-KEEP_LOG_RUNS + 1] if len(old) >= KEEP_LOG_RUNS else []:
        with contextlib.suppress(OSError):
            if time.time() - d.stat().st_mtime > 600:     # never a folder a running launch may still use
                shutil.rmtree(d, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=base))

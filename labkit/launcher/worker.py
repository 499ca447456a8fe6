"""The rank side of a launch: what ``python -m labkit.launcher RUN_DIR RANK`` runs in each fresh process.

:func:`_worker_main` ties the rank's life to the launcher's (``PR_SET_PDEATHSIG`` on Linux, a parent
watchdog elsewhere), arms ``faulthandler`` on SIGUSR1 for hang reports, loads the target by module
path (:func:`_load_target`), initialises torch.distributed (:func:`init_distributed`, the same under
plain ``torchrun``), runs it and pickles its return value (or its traceback) into the run folder.

Taught in chapter 5 (scaling: running N ranks) and chapter 19 (DDP).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from labkit.launcher import flight

__all__ = ["init_distributed", "whoami", "shutdown_distributed"]


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
        store = _attempt_store(_dt.timedelta(seconds=t))
        if store is not None:
            kw.update(store=store, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        else:
            kw["init_method"] = "env://"
        dist.init_process_group(backend, timeout=_dt.timedelta(seconds=t), **kw)
    return device


def _attempt_store(timeout):
    """Under a torchrun agent's store: a client of it with keys prefixed by the restart attempt, else None.

    torch 2.13 reuses the agent's TCPStore across elastic restarts without a per-attempt prefix, so a
    restarted worker can read the previous attempt's gloo addresses and fail with "Connection refused"
    (pytorch/pytorch#167288; seen here on 2 of 3 restarts on a loaded machine). Chapter 27."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in os.environ:
        return None
    import torch.distributed as dist

    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                           int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"labkit/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", client)


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
    flight.arm(run_dir, rank)
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
            raise TypeError(f"rank {rank}'s return value ({type(value).__name__}) could not be pickled "
                            f"to send it back to the launcher ({type(e).__name__}: {e}); return plain "
                            "Python data, tensors or objects of importable classes") from e
        os.replace(tmp, run_dir / f"rank{rank}.result")
        flight.dump_if_armed(rank)          # a finished rank's record too: the baseline of a clean job
        ok = True
    except BaseException:  # noqa: BLE001 - report everything, including SystemExit(1) / KeyboardInterrupt
        text = traceback.format_exc()
        flight.dump_if_armed(rank)          # the failing rank's own record, before it is gone
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

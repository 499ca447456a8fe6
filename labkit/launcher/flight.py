"""The Flight Recorder side of a launch (``launch(..., flight_recorder=DIR)``): arm PyTorch's Flight
Recorder in every rank, and have every rank write its record into ``DIR`` — when it finishes, when it
fails, and, from a thread while it is blocked in a collective, when the launcher asks (a timeout, or
another rank failed).

Files are torch's: the pickle ``torch._C._distributed_c10d._dump_fr_trace()`` returns, under torch's
default name ``nccl_trace_rank_<rank>`` (``TORCH_FR_DUMP_TEMP_FILE`` defaults to
``/tmp/nccl_trace_rank_``), or torch's JSON (``LABKIT_FR_FORMAT=json``, ``nccl_trace_rank_<rank>.json``).
Read them with ``labkit diagnose --hang DIR`` (:mod:`labkit.diagnose.hang`).

Taught in chapter 27 (hang diagnosis from Flight Recorder dumps).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path

from labkit import checks

__all__ = ["dump_flight_record", "FR_FILE_PREFIX", "FR_BUFFER_DEFAULT", "FR_WAIT_S"]

FR_DIR_ENV = "LABKIT_FR_DIR"          # set by launch(flight_recorder=DIR): where each rank's record goes
FR_FILE_PREFIX = "nccl_trace_rank_"    # torch's default dump name (TORCH_FR_DUMP_TEMP_FILE=/tmp/nccl_trace_rank_)
FR_STACKS_ENV = "LABKIT_FR_STACKS"     # "1": each entry's Python frames in the dump (slow first dump)
FR_FORMAT_ENV = "LABKIT_FR_FORMAT"     # "json": torch's JSON dump (nccl_trace_rank_<rank>.json); default pickle
FR_REQUEST = "fr.dump"                 # the launcher creates this file in the run folder: "dump now"
FR_BUFFER_DEFAULT = 2000               # entries kept per rank unless env= sets TORCH_FR_BUFFER_SIZE
FR_WAIT_S = 20.0                       # the longest the launcher waits for the ranks' dumps before stopping them


# ----------------------------------------------------------------------------- rank side
def dump_flight_record(rank: int, folder: str | os.PathLike) -> Path | None:
    """Write this rank's Flight Recorder record (torch's pickle, as torch's own writer does) to
    ``folder/nccl_trace_rank_<rank>`` (``LABKIT_FR_FORMAT=json``: torch's JSON, ``….json``); the path,
    or None when the dump failed. Never raises (it runs while a rank is failing).
    Taught in chapter 27 (hang diagnosis)."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

        if os.environ.get(FR_FORMAT_ENV, "pickle") == "json":     # torch's JSON dump has no frames
            data, suffix = _dump_fr_trace_json(), ".json"
        else:
            # symbolizing the Python frames the first time imports ≈ 800 modules (≈ 1.3 s of CPU, 10 s of
            # wall time on 2 loaded cores, measured): only when asked (LABKIT_FR_STACKS=1)
            data, suffix = _dump_fr_trace(includeStackTraces=os.environ.get(FR_STACKS_ENV, "") == "1"), ""
        path = Path(folder) / f"{FR_FILE_PREFIX}{rank}{suffix}"
        tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")   # the dump thread and a failing
        # main thread may both write
        tmp.write_bytes(data)
        os.replace(tmp, path)                  # a reader never sees half a dump
        return path
    except Exception as e:  # noqa: BLE001 - a failing rank's report must go on
        sys.stderr.write(f"[labkit] rank {rank}: Flight Recorder dump failed: {type(e).__name__}: {e}\n")
        return None


def dump_if_armed(rank: int) -> None:
    """Dump when this rank runs under ``launch(flight_recorder=...)``; otherwise nothing. Chapter 27."""
    if os.environ.get(FR_DIR_ENV):
        dump_flight_record(rank, os.environ[FR_DIR_ENV])


def arm(run_dir: Path, rank: int) -> None:
    """A daemon thread that dumps this rank's record when the launcher asks (a hang or a peer's failure):
    it works while the main thread is blocked inside a collective (gloo's wait releases the GIL). Chapter 27."""
    folder = os.environ.get(FR_DIR_ENV)
    if not folder:
        return

    def watch():
        request = run_dir / FR_REQUEST
        while not request.exists():
            time.sleep(0.05)
        dump_flight_record(rank, folder)

    threading.Thread(target=watch, daemon=True, name="labkit-fr-dump").start()


# ----------------------------------------------------------------------------- launcher side
def check_folder(folder) -> Path | None:
    """The dumps' folder: created if missing; one already holding dumps is refused (a new launch must not
    overwrite the records of an earlier hang). Chapter 27."""
    if folder is None:
        return None
    if not isinstance(folder, str | os.PathLike) or not os.fspath(folder).strip():
        raise checks.ArgumentTypeError(f"flight_recorder must be a folder path for the ranks' Flight Recorder "
                                       f"dumps, or None (off), got {type(folder).__name__} {folder!r}")
    p = Path(folder)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"flight_recorder={os.fspath(folder)!r} cannot be made a folder ({type(e).__name__}: "
                         f"{e.strerror or e}): pass a folder you can write to") from e
    old = sorted(f.name for f in p.glob(f"{FR_FILE_PREFIX}*"))
    if old:
        raise ValueError(f"flight_recorder={os.fspath(folder)!r} already holds Flight Recorder dumps "
                         f"({', '.join(old[:4])}{', …' if len(old) > 4 else ''}) of an earlier launch; pass an empty "
                         "or new folder so they are not overwritten")
    return p.resolve()


def rank_env(env: dict, folder: Path) -> None:
    """Arm the recorder in a rank's environment (``TORCH_FR_BUFFER_SIZE`` unless already set). Chapter 27."""
    env.setdefault("TORCH_FR_BUFFER_SIZE", str(FR_BUFFER_DEFAULT))
    env["TORCH_FR_DUMP_TEMP_FILE"] = str(folder / FR_FILE_PREFIX)     # torch's own writer (NCCL) too
    env[FR_DIR_ENV] = str(folder)


def request_dumps(job, folder: Path, wait_s: float = FR_WAIT_S) -> str:
    """Ask every live rank of ``job`` for its record (its dump thread watches for the request file), wait
    until each rank has dumped or exited, or ``wait_s``; a note saying which dumps are there. Chapter 27."""
    def dumped(rank: int) -> bool:
        return any((folder / f"{FR_FILE_PREFIX}{rank}{suffix}").exists() for suffix in ("", ".json"))

    with contextlib.suppress(OSError):
        (job.run_dir / FR_REQUEST).touch()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if all(dumped(r.rank) or r.exited() for r in job.ranks):
            break
        time.sleep(0.05)
    have = [r.rank for r in job.ranks if dumped(r.rank)]
    missing = [r.rank for r in job.ranks if r.rank not in have]
    miss = f", none from rank(s) {missing}" if missing else ""
    return (f"; Flight Recorder dumps of rank(s) {have} in {folder}{miss} — read them with "
            f"`labkit diagnose --hang {folder}`")

"""Read PyTorch Flight Recorder dumps: one file per rank, torch's pickle or JSON format.

The Flight Recorder (``TORCH_FR_BUFFER_SIZE=N`` in a rank's environment) keeps the last N collectives
each rank issued; ``torch._C._distributed_c10d._dump_fr_trace()`` returns them pickled,
``_dump_fr_trace_json()`` as JSON, and torch's own writer (NCCL's watchdog on a timeout) saves the pickle
as ``TORCH_FR_DUMP_TEMP_FILE`` + rank, by default ``/tmp/nccl_trace_rank_<rank>``. A dump is a dict:
``version``, ``pg_config``, ``pg_status`` (per process-group id: last enqueued / started / completed
sequence number), ``entries`` — one per collective: ``collective_seq_id`` (the collective's number in its
process group, counted from 1 on every rank: the key that matches collectives across ranks),
``p2p_seq_id``, ``profiling_name`` (``gloo:all_reduce``), ``process_group`` (name, description),
``input_sizes``/``output_sizes``, ``input_dtypes``/``output_dtypes``, ``state``, ``retired``,
``record_id``, ``time_created_ns`` and, when asked for, ``frames`` (torch 2.13,
``torch/csrc/distributed/c10d/FlightRecorder*``; torch's analyser ``torch.distributed.flight_recorder``
reads the same files).

:func:`read_dump` reads one file, :func:`read_dumps` a folder (the rank from each file name, as torch's
analyser does: the digits that end the name, before an optional ``.json``/``.pkl`` suffix). Files from a
user are never unpickled with ``pickle.load``: an Unpickler that refuses every global except an allow-list
(torch's dumps hold only dicts, lists, tuples, strings, numbers, booleans and None — checked with
``pickletools`` on torch 2.13's dumps), a size cap, and regular files only (a FIFO would block).

Taught in chapter 27 (hang diagnosis from Flight Recorder dumps).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FlightEntry", "FlightDump", "read_dump", "read_dumps", "DEFAULT_PREFIX", "MAX_DUMP_BYTES"]

DEFAULT_PREFIX = "nccl_trace_rank_"      # torch's default TORCH_FR_DUMP_TEMP_FILE is /tmp/nccl_trace_rank_
MAX_DUMP_BYTES = 512 * 2**20             # a 20,000-entry dump with frames is a few MB; far above is not a dump
_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)(?P<ext>\.json|\.pkl|\.pickle)?$")
_ALLOWED_GLOBALS = frozenset({("collections", "OrderedDict")})   # harmless containers only
_ENTRY_KEYS = ("collective_seq_id", "profiling_name", "process_group")


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles plain data; any other global (a class, a function: code a pickle could run) is refused."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refuses global {module}.{name} (a Flight Recorder dump holds plain data only)")


@dataclass(frozen=True)
class FlightEntry:
    """One collective as one rank recorded it. Taught in chapter 27."""

    seq: int                      # collective_seq_id (p2p ops: p2p_seq_id, with is_p2p)
    op: str                       # all_reduce, broadcast, barrier, send 0->1 ...
    backend: str                  # gloo, nccl ...
    group: str                    # process-group name ("0" is the default group)
    group_desc: str               # its description ("default_pg", or new_group(group_desc=...))
    input_sizes: tuple
    output_sizes: tuple
    input_dtypes: tuple
    output_dtypes: tuple
    state: str
    retired: bool | None
    record_id: int
    time_created_ns: int | None
    is_p2p: bool = False
    frames: tuple = ()            # (name, filename, line), innermost first, when the dump has them

    @property
    def call_site(self) -> str | None:
        """The innermost frame outside torch: where the user's code issued the collective."""
        for name, filename, line in self.frames:
            if "/torch/" not in filename.replace("\\", "/"):
                return f"{filename}:{line} in {name}"
        return None


@dataclass
class FlightDump:
    """One rank's Flight Recorder record. Taught in chapter 27."""

    rank: int
    path: Path
    format: str                   # "pickle" or "json"
    version: str
    entries: list[FlightEntry]
    pg_config: dict = field(default_factory=dict)
    pg_status: dict = field(default_factory=dict)


def _sizes(v) -> tuple:
    return tuple(tuple(int(x) for x in s) if isinstance(s, list | tuple) else s for s in (v or ()))


def _entry(raw, where: str) -> FlightEntry:
    if not isinstance(raw, dict) or any(k not in raw for k in _ENTRY_KEYS):
        raise ValueError(f"{where} is not a Flight Recorder entry: it needs {', '.join(_ENTRY_KEYS)}")
    name, pg = raw["profiling_name"], raw["process_group"]
    if not isinstance(name, str) or not isinstance(pg, list | tuple) or len(pg) != 2:
        raise ValueError(f"{where}: profiling_name must be a string like 'gloo:all_reduce' and process_group a "
                         f"(name, description) pair, got {name!r} and {pg!r}")
    backend, _, op = name.partition(":")
    is_p2p = bool(raw.get("is_p2p", False))
    seq = raw.get("p2p_seq_id") if is_p2p else raw["collective_seq_id"]
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise ValueError(f"{where}: the sequence number must be an int >= 0, got {seq!r}")
    try:
        frames = tuple((str(f["name"]), str(f["filename"]), int(f["line"])) for f in raw.get("frames") or ())
        return FlightEntry(
            seq=seq, op=op or name, backend=backend if op else "", group=str(pg[0]), group_desc=str(pg[1]),
            input_sizes=_sizes(raw.get("input_sizes")), output_sizes=_sizes(raw.get("output_sizes")),
            input_dtypes=tuple(raw.get("input_dtypes") or ()), output_dtypes=tuple(raw.get("output_dtypes") or ()),
            state=str(raw.get("state", "")), retired=raw.get("retired"), record_id=int(raw.get("record_id", -1)),
            time_created_ns=raw.get("time_created_ns"), is_p2p=is_p2p, frames=frames)
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"{where}: malformed field ({type(e).__name__}: {e})") from None


def _read_bytes(path: Path) -> bytes:
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"Flight Recorder dump {path}: cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else "not a file"
        raise ValueError(f"Flight Recorder dump {path} is {kind}, not a regular file: a dump is the file a rank "
                         "wrote (torch's pickle or JSON)")
    if st.st_size > MAX_DUMP_BYTES:
        raise ValueError(f"Flight Recorder dump {path} is {st.st_size / 2**20:.0f} MiB, above the "
                         f"{MAX_DUMP_BYTES / 2**20:.0f} MiB a dump can plausibly be: not a Flight Recorder dump")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))   # never blocks, even if swapped for a FIFO
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_DUMP_BYTES + 1)


def read_dump(path: str | os.PathLike, rank: int | None = None) -> FlightDump:
    """One rank's dump (pickle or JSON, told apart by the first byte); ``rank`` from the file name unless
    given. Anything else — an empty, truncated or foreign file — is a ValueError naming the file.
    Taught in chapter 27."""
    path = Path(path)
    if rank is None:
        m = _NAME.match(path.name)
        if not m:
            raise ValueError(f"Flight Recorder dump {path}: the rank is not in its name (expected a name ending in "
                             f"the rank, like {DEFAULT_PREFIX}3 or {DEFAULT_PREFIX}3.json); pass rank=")
        rank = int(m["rank"])
    data = _read_bytes(path)
    if not data:
        raise ValueError(f"Flight Recorder dump {path} is empty")
    if data[:1] == b"\x80":
        fmt = "pickle"
        try:
            doc = _SafeUnpickler(io.BytesIO(data)).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, MemoryError,
                AttributeError) as e:
            raise ValueError(f"Flight Recorder dump {path}: not a readable pickle ({type(e).__name__}: {e}); a "
                             "truncated or foreign file") from None
    elif data.lstrip()[:1] == b"{":
        fmt = "json"
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"Flight Recorder dump {path}: not valid JSON ({e}); a truncated or foreign file") from None
    else:
        raise ValueError(f"Flight Recorder dump {path} is neither torch's pickle (starts with byte 0x80) nor JSON "
                         f"(starts with '{{'): it starts with {data[:12]!r}")
    if not isinstance(doc, dict) or not isinstance(doc.get("entries", []), list) or "version" not in doc:
        got = sorted(doc)[:6] if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"Flight Recorder dump {path}: a {fmt} file but not a Flight Recorder dump (it needs "
                         f"'version' and a list 'entries'; it holds {got})")
    entries = [_entry(e, f"{path} entry {i}") for i, e in enumerate(doc.get("entries", []))]
    entries.sort(key=lambda e: e.record_id)
    pg_status = doc.get("pg_status") if isinstance(doc.get("pg_status"), dict) else {}
    pg_config = doc.get("pg_config") if isinstance(doc.get("pg_config"), dict) else {}
    return FlightDump(rank=rank, path=path, format=fmt, version=str(doc["version"]), entries=entries,
                      pg_config=pg_config, pg_status=pg_status)


def read_dumps(folder: str | os.PathLike) -> tuple[list[FlightDump], list[str]]:
    """Every rank's dump in ``folder`` (files named ``<prefix><rank>``, ``.json``/``.pkl`` optional; one
    prefix per folder) and the names of the other files, ignored. An empty folder, a folder without dumps,
    two dumps of one rank, or a dump that does not read is a ValueError naming it. Taught in chapter 27."""
    if not isinstance(folder, str | os.PathLike) or not os.fspath(folder).strip():
        raise TypeError(f"folder must be a path to a folder of Flight Recorder dumps, got {folder!r}")
    d = Path(folder)
    if not d.is_dir():
        what = "does not exist" if not d.exists() else "is a file, not a folder"
        raise ValueError(f"Flight Recorder folder {d} {what}: pass the folder the ranks dumped into")
    names = sorted(p.name for p in d.iterdir() if not p.name.startswith("."))
    if not names:
        raise ValueError(f"Flight Recorder folder {d} is empty: no rank dumped there (was TORCH_FR_BUFFER_SIZE "
                         "set, and did the job fail or time out?)")
    found: dict[int, str] = {}
    prefixes: set[str] = set()
    ignored = []
    for name in names:
        m = _NAME.match(name)
        if not m:
            ignored.append(name)
            continue
        rank = int(m["rank"])
        if rank in found:
            raise ValueError(f"Flight Recorder folder {d} holds two dumps of rank {rank} ({found[rank]} and {name}): "
                             "keep one per rank")
        found[rank] = name
        prefixes.add(m["prefix"])
    if not found:
        raise ValueError(f"Flight Recorder folder {d} holds no dump: files {names[:5]} — a dump's name ends in its "
                         f"rank ({DEFAULT_PREFIX}0, {DEFAULT_PREFIX}1, … or with .json)")
    if len(prefixes) > 1:
        raise ValueError(f"Flight Recorder folder {d} mixes dumps of different names ({sorted(prefixes)}): one job's "
                         "dumps per folder")
    return [read_dump(d / found[r], rank=r) for r in sorted(found)], ignored

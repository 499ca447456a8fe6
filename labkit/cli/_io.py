"""The CLI's error boundary and its file readers: every bad input becomes one line that names the file.

:func:`labkit.cli.main` catches :data:`BAD_INPUT` and prints ``labkit <command>: error: <describe(e)>``
with exit code 2 (``--debug`` re-raises for the traceback). Commands read their inputs through
:func:`read_text` / :func:`read_json`, which refuse a folder, an empty file, a binary file and JSON of
the wrong shape with a ValueError naming the file, and wrap library calls in :func:`naming` so an
error that does not say which file it is about (a ``UnicodeDecodeError``, a ``KeyError`` from a
malformed record) gets the file's name in front.

Stdlib only: ``labkit --help`` stays cheap.
"""
from __future__ import annotations

import json
import sys
import zlib
from contextlib import contextmanager
from pathlib import Path

# What bad input raises: unreadable paths (OSError: IsADirectoryError, PermissionError, BadGzipFile …),
# undecodable or malformed content (ValueError: UnicodeDecodeError, JSONDecodeError …), documents of the
# wrong shape (TypeError, KeyError, IndexError), truncated or corrupt compressed files (EOFError, zlib.error).
BAD_INPUT = (OSError, ValueError, TypeError, LookupError, EOFError, zlib.error)

MAX_MESSAGE = 1000      # characters of one error line; --debug shows everything
MAX_INPUT_MB = 128      # a text input (log, table, record, config) past this is refused while it is read;
                        # LABKIT_MAX_INPUT_MB raises it


def one_line(text: str) -> str:
    """``text`` on one line (whitespace runs collapsed), at most :data:`MAX_MESSAGE` characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= MAX_MESSAGE else s[: MAX_MESSAGE - 1] + "…"


def describe(e: BaseException) -> str:
    """One line for an exception: what went wrong, the file when the exception knows it."""
    if isinstance(e, UnicodeDecodeError):
        msg = f"not UTF-8 text ({e.reason} at byte {e.start})"
    elif isinstance(e, OSError) and e.filename is not None:
        msg = f"{e.filename}: {e.strerror or e}" + (f" -> {e.filename2}" if e.filename2 else "")
    elif isinstance(e, KeyError):
        msg = f"missing key {e.args[0]!r}" if e.args else "missing key"
    else:
        msg = str(e) or "no message"
    if not isinstance(e, (ValueError, OSError)):      # a TypeError, KeyError, EOFError: say which
        msg = f"{type(e).__name__}: {msg}"
    return one_line(msg)


@contextmanager
def naming(path, what: str = "file", *, also: tuple = ()):
    """Put ``what path:`` in front of a bad-input error that does not already name ``path``.

    ``also``: more exception types to convert (e.g. a library's ValidationError that is no ValueError).
    """
    try:
        yield
    except BrokenPipeError:                  # our output's reader left: not about the input
        raise
    except (*BAD_INPUT, *also) as e:
        msg = describe(e)
        if str(path) in msg and isinstance(e, BAD_INPUT):
            raise
        raise ValueError(f"{what} {path}: {msg}") from e


def max_input_bytes() -> int:
    """The size limit of one text input: ``LABKIT_MAX_INPUT_MB`` (MB), else :data:`MAX_INPUT_MB`."""
    import os

    env = os.environ.get("LABKIT_MAX_INPUT_MB")
    try:
        mb = float(env) if env else MAX_INPUT_MB
    except ValueError:
        mb = float("nan")
    if not 0 < mb < 1e9:
        raise ValueError(f"environment variable LABKIT_MAX_INPUT_MB={env!r} is not valid: use a number of MB > 0")
    return int(mb * 2**20)


def _too_big(what, name, limit) -> ValueError:
    return ValueError(f"{what} {name} is larger than the limit of {limit / 2**20:,.0f} MB (is it the right "
                      "file? /dev/zero and other endless streams are refused; LABKIT_MAX_INPUT_MB raises the limit)")


def read_bytes(path, what: str = "file") -> bytes:
    """The bytes of a regular, non-empty file; ValueError naming it for a missing path, a folder, an
    empty file or one past :func:`max_input_bytes` (checked while reading: an endless stream such as
    ``/dev/zero`` ends in one error). ``"-"`` reads stdin."""
    limit = max_input_bytes()
    if str(path) == "-":
        src = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else None
        data = src.read(limit + 1) if src is not None else sys.stdin.read(limit + 1).encode()
        if len(data) > limit:
            raise _too_big(what, "from stdin", limit)
        if not data.strip():
            raise ValueError(f"{what} from stdin is empty")
        return data
    p = Path(path)
    from labkit.checks import refuse_special

    refuse_special(what, p)         # a FIFO would block the open for ever, a device never ends
    if not p.exists():
        raise ValueError(f"{what} {p} does not exist")
    if p.is_dir():
        raise ValueError(f"{what} {p} is a folder, not a file")
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ValueError(f"{what} {p} cannot be read ({e.strerror or e})") from e
    if len(data) > limit:
        raise _too_big(what, p, limit)
    if not data.strip():
        raise ValueError(f"{what} {p} is empty")
    return data


def read_text(path, what: str = "file") -> str:
    """The text of a UTF-8 file (:func:`read_bytes` first). A file with NUL bytes or mostly undecodable
    bytes is binary and refused, naming the file; a few stray bytes in a log are replaced (U+FFFD)."""
    data = read_bytes(path, what)
    name = "stdin" if str(path) == "-" else str(path)
    nul = data.find(b"\x00", 0, 65536)
    if nul >= 0:
        raise ValueError(f"{what} {name} is a binary file, not text (NUL byte at {nul})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", errors="replace")
        if text.count("\ufffd") > max(8, len(text) // 200):          # > 0.5% undecodable: not a text log
            raise ValueError(f"{what} {name} is a binary file, not UTF-8 text ({e.reason} at byte {e.start})"
                             ) from None
        return text


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number",
               bool: "true/false", type(None): "null"}


def read_json(path, what: str = "file", *, expect: type | None = dict, hint: str = ""):
    """The parsed JSON of a file (:func:`read_text` first): a ValueError naming the file and the line for
    invalid JSON, and for a document that is not of type ``expect`` (an object by default)."""
    text = read_text(path, what)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} {path} is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise ValueError(f"{what} {path} is nested too deeply to be read") from None
    if expect is not None and not isinstance(doc, expect):
        want = _JSON_TYPES.get(expect, expect.__name__)
        raise ValueError(f"{what} {path} is not a JSON {want} (it holds a JSON {_JSON_TYPES.get(type(doc), '?')})"
                         + (f"; {hint}" if hint else ""))
    return doc

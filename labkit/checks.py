"""One way to validate arguments: every bad value gets an error that names the parameter, the value
and what would be valid.

A wrong *type* raises :class:`ArgumentTypeError`, which is both a ``TypeError`` and a ``ValueError``,
so callers that catch either (the CLI catches ``ValueError``) see it; a value of the right type out
of range raises ``ValueError``. Booleans are never numbers here (``True`` is not a count of 1).
NumPy scalars are accepted and returned as Python ``int``/``float``.

Used by every module that takes numbers from users (estimators, configs, the launcher).
"""
from __future__ import annotations

import math
import numbers
import os
import stat

__all__ = ["ArgumentTypeError", "number", "positive", "nonneg", "count", "whole", "fraction", "one_of", "flag",
           "finite_result", "MAX_LINE", "long_line", "special_file", "refuse_special"]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (e.g. a string where a number is needed)."""


def number(name: str, value, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False, finite: bool = True) -> float:
    """``value`` as a float, checked to be a real number (not a bool) in [low, high].

    ``low_open``/``high_open`` exclude the bound; ``finite=False`` admits ±inf (never NaN).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    try:
        v = float(value)
    except OverflowError:      # an int beyond float range (10**400)
        raise ValueError(f"{name}={value!r} is not valid: use {_range(low, high, low_open, high_open, finite)}"
                         ) from None
    bad = math.isnan(v) or (finite and math.isinf(v))
    if low is not None:
        bad = bad or (v <= low if low_open else v < low)
    if high is not None:
        bad = bad or (v >= high if high_open else v > high)
    if bad:
        raise ValueError(f"{name}={value!r} is not valid: use {_range(low, high, low_open, high_open, finite)}")
    return v


def _range(low, high, low_open, high_open, finite) -> str:
    kind = "a finite number" if finite else "a number"
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return kind + (" " + " and ".join(parts) if parts else "")


def positive(name: str, value) -> float:
    """A finite number > 0 (sizes, times, rates, peaks)."""
    return number(name, value, low=0, low_open=True)


def nonneg(name: str, value) -> float:
    """A finite number >= 0 (delays, overheads, shares of time)."""
    return number(name, value, low=0)


def fraction(name: str, value, *, open_low: bool = False, open_high: bool = False) -> float:
    """A number in [0, 1] (a share, an efficiency); ``open_*`` exclude 0 or 1."""
    return number(name, value, low=0, high=1, low_open=open_low, high_open=open_high)


def count(name: str, value, *, at_least: int = 1, at_most: int | None = None) -> int:
    """An integer (not a bool, not a float) in [at_least, at_most] (ranks, layers, steps, batch sizes)."""
    hi = f" and <= {at_most}" if at_most is not None else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__} {value!r} "
                                f"(use an int >= {at_least}{hi})")
    v = int(value)
    if v < at_least or (at_most is not None and v > at_most):
        raise ValueError(f"{name}={short_repr(value)} is not valid: use an int >= {at_least}{hi}")
    return v


def short_repr(value) -> str:
    """``repr(value)``, but an int of more than 30 digits as ``<int of N digits>`` and anything longer than
    60 characters cut: an error line stays one readable line (a config with 10**400 layers)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"<int of {len(str(abs(value))) if value.bit_length() < 13000 else '>4000'} digits>"
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def whole(name: str, value, *, at_least: int = 1, at_most: int | None = None) -> int:
    """As :func:`count`, but an integral float (``7.5e9``, ``4e6``: how people write big counts) is
    accepted and returned as an int; ``7.5e9 + 0.5``, NaN and inf are refused."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
        v = number(name, value)
        if not v.is_integer():
            raise ValueError(f"{name}={value!r} is not valid: use a whole number >= {at_least} (an int, or a "
                             "float with no fractional part such as 7.5e9)")
        value = int(v)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{name} must be a whole number, got {type(value).__name__} {value!r} "
                                f"(use an int >= {at_least} or an integral float such as 7.5e9)")
    return count(name, value, at_least=at_least, at_most=at_most)


def flag(name: str, value) -> bool:
    """``value`` if it is a bool (``True``/``False``, NumPy bools included); ``"False"``, 0 or None are
    refused rather than read as truthy or falsy."""
    import numpy as np

    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise ArgumentTypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def one_of(name: str, value, choices):
    """``value`` if it is one of ``choices``, else a ValueError listing them."""
    try:
        ok = value in choices
    except TypeError:   # unhashable value against a set/dict
        ok = False
    if not ok:
        shown = list(choices)
        raise ValueError(f"{name}={value!r} is not valid: choose one of {shown}")
    return value


def finite_result(name: str, value, *, positive: bool = False, **inputs):
    """``value`` (a computed figure) if it is finite (and > 0 with ``positive``); an overflow to ±inf,
    a NaN or an underflow to 0 from extreme but finite inputs (``tokens=1e300``, ``peak_flops=1e-300``)
    becomes a ValueError naming the result and ``inputs``, never a silent inf or a later division by 0."""
    if isinstance(value, numbers.Integral) or math.isfinite(value):   # a Python int never overflows
        if not positive or value > 0:
            return value
    shown = ", ".join(f"{k}={v!r}" for k, v in inputs.items())
    what = "a number > 0" if positive else "a finite number"
    raise ValueError(f"{name} = {value} is not {what}: the inputs are beyond any meaningful range ({shown})")


#: The longest line labkit's text parsers read (64 KiB). Real output of nccl-tests, NCCL logs,
#: nvidia-smi, dcgmi, nsys stats and lscpu has lines of at most a few KiB; a longer line is a mangled or
#: binary file, and refusing it up front keeps every parser linear in the size of its input.
MAX_LINE = 64 * 1024


def long_line(lineno: int, line: str, what: str) -> str | None:
    """The message for a line of a ``what`` file longer than :data:`MAX_LINE`, None for a sane line.

    Parsers that keep good rows and list bad ones skip the line with this message; the others raise it.
    """
    if len(line) <= MAX_LINE:
        return None
    return (f"line {lineno} is {len(line):,} characters long, longer than any real {what} line "
            f"(at most {MAX_LINE:,} are read); is this the right file?")


_SPECIAL = ((stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISCHR, "character device"),
            (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))


def special_file(path) -> str | None:
    """What kind of special file ``path`` names ("FIFO (named pipe)", "character device", …), None for a
    regular file, a folder or a path that does not exist. ``os.stat`` never blocks, even on a FIFO with no
    writer (``open`` would wait for one for ever)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):      # missing, unreadable, a NUL in the name: the reader says so itself
        return None
    return next((kind for test, kind in _SPECIAL if test(mode)), None)


def refuse_special(what: str, path) -> None:
    """The one check every labkit reader makes before opening a user's path: a FIFO, a device or a
    socket is refused with a ValueError naming it (a FIFO with no writer blocks ``open`` for ever,
    ``/dev/zero`` never ends, ``/dev/stdin`` waits on a terminal). A missing path or a folder passes:
    the reader names those in its own words. Taught in chapter 9 (reading a trace one trusts)."""
    kind = special_file(path)
    if kind is not None:
        raise ValueError(f"{what} {os.fspath(path)} is a {kind}, not a regular file: labkit reads only regular "
                         "files (save the stream to a file first, or use '-' for stdin where the command takes it)")

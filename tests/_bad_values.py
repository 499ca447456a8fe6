"""Seeded generator of bad values, by class, for the fuzz tests of labkit.record and labkit.measure.regress.

``hypothesis`` is not installed in the course venv, so the fuzz tests draw from these classes with a
seeded ``random.Random``: every class is drawn for every parameter, with random magnitudes.

:func:`expect_refused` asserts the documented error: a ValueError (``labkit.checks.ArgumentTypeError``
is one too) whose message names the parameter — never a raw TypeError, KeyError, AttributeError,
ZeroDivisionError or OverflowError.
"""
from __future__ import annotations

import math
import random

import numpy as np

from labkit.checks import ArgumentTypeError

SCALARS = ("none", "text", "numeric_text", "bool", "np_bool", "nan", "inf", "neg_inf", "negative", "zero",
           "tiny", "above_one", "huge_float", "huge_int", "list", "dict", "object", "complex", "np_float")


def value(cls: str, rng: random.Random):
    """One value of class ``cls`` (random magnitude where the class has one)."""
    return {
        "none": lambda: None,
        "text": lambda: rng.choice(["", "abc", "false", "True", "none", "0.5 s"]),
        "numeric_text": lambda: repr(rng.uniform(0, 1)),
        "bool": lambda: rng.choice([True, False]),
        "np_bool": lambda: rng.choice([np.True_, np.False_]),
        "nan": lambda: rng.choice([float("nan"), np.nan, np.float32("nan")]),
        "inf": lambda: rng.choice([math.inf, np.inf]),
        "neg_inf": lambda: -math.inf,
        "negative": lambda: rng.choice([-rng.uniform(1e-12, 1e9), -rng.randint(1, 10**6), -1e-7]),
        "zero": lambda: rng.choice([0, 0.0, -0.0, np.int64(0)]),
        "tiny": lambda: rng.choice([5e-324, 1e-300, rng.uniform(1e-12, 1e-9)]),
        "above_one": lambda: 1 + rng.uniform(1e-6, 1e6),
        "huge_float": lambda: rng.uniform(1e307, 1.7e308),
        "huge_int": lambda: 10 ** rng.randint(309, 800),
        "list": lambda: [rng.random()],
        "dict": lambda: {"x": rng.random()},
        "object": lambda: object(),
        "complex": lambda: complex(rng.random(), 1.0),
        "np_float": lambda: np.float64(rng.uniform(0.01, 0.99)),
    }[cls]()


def is_finite_real(v) -> bool:
    """A real number (not a bool) that is finite as a float."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def expect_refused(fn, names, what=""):
    """``fn()`` must raise ValueError (or ArgumentTypeError) naming one of ``names``."""
    names = (names,) if isinstance(names, str) else tuple(names)
    try:
        out = fn()
    except ArgumentTypeError as e:
        msg = str(e)
    except ValueError as e:
        msg = str(e)
    except Exception as e:  # noqa: BLE001 - the point: any other exception is a bug
        raise AssertionError(f"{what}: raised {type(e).__name__} ({e}), not a documented ValueError") from e
    else:
        raise AssertionError(f"{what}: accepted, returned {out!r:.200}")
    assert any(n in msg for n in names), f"{what}: error does not name {names}: {msg}"
    return msg

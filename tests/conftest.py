"""Every test sees an empty labkit cache (no calibration) unless it makes one: a learner's or CI's
calibrated peaks never leak into what a test expects (labkit.hardware.calibration). The collection is ordered
longest first for xdist (below)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_labkit_cache(tmp_path_factory):
    import os

    old = os.environ.get("LABKIT_CACHE_DIR")
    os.environ["LABKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("labkit-cache"))
    yield
    if old is None:
        os.environ.pop("LABKIT_CACHE_DIR", None)
    else:
        os.environ["LABKIT_CACHE_DIR"] = old


def _copy_of_the_session_calibration(dest) -> str:
    """A private copy of the test session's calibration (the root conftest.py measured it before any worker
    started); calibrates here when the session has none (a harness that skipped the root conftest)."""
    import os
    import shutil
    from pathlib import Path

    from labkit.hardware.calibration import FILE, calibrate

    src = os.environ.get("LABKIT_TEST_CALIBRATION")
    if src and (Path(src) / FILE).is_file():
        shutil.copy(Path(src) / FILE, Path(dest) / FILE)
    else:
        os.environ["LABKIT_CACHE_DIR"] = str(dest)
        calibrate("cpu", ("fp32",), threads=[1, 2], rounds=2, max_seconds=3.0)
    return str(dest)


@pytest.fixture
def calibrated_peaks(tmp_path_factory):
    """A cache holding this machine's fp32 calibration for 1 and 2 threads, for tests whose verdicts
    divide by a peak (MFU thresholds): a 1-second in-process measurement on a loaded machine can stop
    at 256² and come out 1.5× low (labkit.hardware.calibration). Restores the empty cache afterwards."""
    import os

    old = os.environ.get("LABKIT_CACHE_DIR")
    try:
        os.environ["LABKIT_CACHE_DIR"] = _copy_of_the_session_calibration(tmp_path_factory.mktemp("calibrated"))
        yield os.environ["LABKIT_CACHE_DIR"]
    finally:
        if old is None:
            os.environ.pop("LABKIT_CACHE_DIR", None)
        else:
            os.environ["LABKIT_CACHE_DIR"] = old


# ---------------------------------------------------------------- the order xdist hands tests out
# `make test` runs `pytest -n 2 --dist loadgroup`: each worker takes the next unit of the collection as it frees up
# (a few queued). Collected in file order, the longest tests came last and one worker ran them alone while the
# other sat idle. So the collection is ordered longest first by tests/data/durations.json (seconds per test, from
# a suite run's junit XML: `python tests/_durations.py JUNIT.xml`). The tests that share a module- or class-scoped
# fixture (a live launch built once) are one unit, on one worker, so that fixture is built once, and weigh their
# sum. A test the file does not know weighs its notebook's manifest cpu_s (tests/test_notebooks.py), 60 s if marked
# slow, else 0 s.
DURATIONS = Path(__file__).resolve().parent / "data" / "durations.json"
UNKNOWN_SLOW_S = 60.0


def duration_key(item) -> str:
    """``test_file.py::test_name[params]``: the key of tests/data/durations.json."""
    return f"{item.path.name}::{item.name}"


def _shares_a_wider_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) or {}
    return any(d and d[-1].scope in ("module", "class", "package") for d in defs.values())


@pytest.hookimpl(tryfirst=True)      # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    import json

    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    units: dict[str, list] = {}
    for item in items:
        if _shares_a_wider_fixture(item):
            group = item.path.stem
            item.add_marker(pytest.mark.xdist_group(group))
            units.setdefault(f"@{group}", []).append(item)
        else:
            units[item.nodeid] = [item]

    def guess(item) -> float:
        entry = getattr(getattr(item, "callspec", None), "params", {}).get("entry")
        if item.get_closest_marker("notebook") and hasattr(entry, "cpu_s"):     # a notebook executed
            return float(entry.cpu_s)
        return UNKNOWN_SLOW_S if item.get_closest_marker("slow") else 0.0

    def weight(unit):
        return sum(known[k] if (k := duration_key(i)) in known else guess(i) for i in unit)

    items[:] = [i for unit in sorted(units.values(), key=weight, reverse=True) for i in unit]

"""The test session's one calibration (:mod:`labkit.hardware.calibration`).

Notebooks and MFU verdicts divide by a peak and put a ridge point at peak ÷ bandwidth. Measured inside
each test while the other xdist worker loads the machine, those swing several-fold (a ridge point below
every shape of chapter 6's sweep was seen in CI). So the controlling process calibrates once, before any
worker starts, into a temporary cache named by ``$LABKIT_TEST_CALIBRATION``; tests that divide by a peak
use a copy of it (``tests/conftest.py``: ``calibrated_peaks``, ``calibrated_cache``), the nbval run's
kernels read it directly, and every other test still sees an empty cache. This is the learner's path too:
``make course`` runs ``labkit calibrate --if-missing`` before opening the course.

Set ``LABKIT_TEST_CALIBRATION`` to an existing cache directory to reuse one (it is then not deleted).
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

TEST_CALIBRATION_ENV = "LABKIT_TEST_CALIBRATION"


def pytest_configure(config):
    if hasattr(config, "workerinput") or os.environ.get(TEST_CALIBRATION_ENV):
        return                       # an xdist worker (the controller calibrated) or a cache given
    import torch

    from labkit.hardware.calibration import CACHE_ENV, calibrate

    path = tempfile.mkdtemp(prefix="labkit-test-calibration-")
    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = path
    try:
        # this process's thread count and 1 (each of two CPU ranks), fp32: what the notebooks divide by
        # strict=False: on a loaded CI machine an unconfirmed peak is still the session's one denominator (a
        # learner's `labkit calibrate` refuses it instead; tests/test_hardware.py checks that)
        calibrate("cpu", ("fp32",), threads=sorted({torch.get_num_threads(), 1}), rounds=2, max_seconds=3.0,
                  strict=False)
    finally:
        if old is None:
            os.environ.pop(CACHE_ENV)
        else:
            os.environ[CACHE_ENV] = old
    os.environ[TEST_CALIBRATION_ENV] = config._labkit_test_calibration = path
    config._labkit_old_cache = old
    if config.getoption("nbval_lax", default=False):
        os.environ[CACHE_ENV] = path     # the nbval run: its kernels read the session's calibration


def pytest_unconfigure(config):
    path = getattr(config, "_labkit_test_calibration", None)
    if path:
        from labkit.hardware.calibration import CACHE_ENV

        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(TEST_CALIBRATION_ENV, None)
        old = config._labkit_old_cache
        if old is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = old


# ---------------------------------------------------------------- the order `pytest -n 2` hands tests out
# xdist's default ("load") sends each worker long runs of consecutive tests in file order, so a long test late in
# the alphabet can start when the other worker has nothing left. Under `-n` with the default distribution, the
# workers sort the collection longest first and the controller hands it out one unit at a time (a unit: one test
# of PER_TEST_MODULES, else a whole module, whose module-scoped fixtures are then built once), so the last units are
# short and the two workers end together. A test's expected seconds: tests/data/test_seconds.json (measured), else
# the manifest's cpu_s for a notebook, else 20 s for a `slow` test (the marker's definition), else 0.1 s.

#: modules whose tests share no module-scoped fixture (checked below): each test is its own unit
PER_TEST_MODULES = ("tests/test_notebooks.py", "tests/test_grading_labs.py")


def _unit(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return nodeid if module in PER_TEST_MODULES else module


def _expected_seconds(item, measured: dict) -> float:
    if item.nodeid in measured:
        return float(measured[item.nodeid])
    entry = getattr(getattr(item, "callspec", None), "params", {}).get("entry")
    if getattr(entry, "cpu_s", None) is not None and item.get_closest_marker("notebook"):
        return float(entry.cpu_s)
    return 20.0 if item.get_closest_marker("slow") else 0.1


def _longest_first(config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and config.getoption("dist", "no") == "load"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """On an xdist worker of a `-n` run: units longest first (the same order on every worker: a stable sort of
    the collection by figures read from files)."""
    if not hasattr(config, "workerinput") or config.workerinput.get("labkit_order") != "longest-first":
        return
    import json
    from pathlib import Path

    measured = json.loads((Path(__file__).parent / "tests" / "data" / "test_seconds.json").read_text())["seconds"]
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(_unit(item.nodeid), []).append(item)
        if _unit(item.nodeid) == item.nodeid:
            shared = [n for n, defs in item._fixtureinfo.name2fixturedefs.items()
                      if defs and defs[-1].scope in ("module", "class", "package")]
            if shared:
                raise pytest.UsageError(f"{item.nodeid} uses the module-scoped fixture(s) {shared}: its module "
                                        "cannot be in conftest.PER_TEST_MODULES (each worker would build them)")
    cost = {u: sum(_expected_seconds(i, measured) for i in its) for u, its in units.items()}
    items[:] = [i for u in sorted(units, key=lambda u: -cost[u]) for i in units[u]]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist controller) tell each worker to sort its collection, when the controller schedules by unit."""
    if _longest_first(node.config):
        node.workerinput["labkit_order"] = "longest-first"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`-n N` with the default distribution: one unit (see _unit) at a time, in the workers' (longest-first)
    collection order."""
    if not _longest_first(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False      # keep the collection's order (xdist would sort by test count)
    return LongestFirst(config, log)

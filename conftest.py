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

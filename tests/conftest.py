"""Every test sees an empty labkit cache (no calibration) unless it makes one: a learner's or CI's
calibrated peaks never leak into what a test expects (labkit.hardware.calibration)."""
from __future__ import annotations

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


@pytest.fixture(scope="session")
def copy_session_calibration():
    """``copy_session_calibration(folder)`` puts the session's calibration in ``folder`` and returns it: for a
    module-scoped fixture that launches ranks reading a calibrated cache (tests/test_diagnose.py's ``live``),
    which would otherwise calibrate again, under the load of the other worker."""
    return _copy_of_the_session_calibration


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

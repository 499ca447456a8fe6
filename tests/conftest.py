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

"""A wheel built from the repository installs into a fresh venv that already holds torch, leaves that
torch untouched (same version, same files), pulls none of the course extras, and ``import labkit`` plus
the README's loop recipe run there. Slow (a venv, torch and labkit's dependencies): ~1-2 minutes."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
PROBE = "import json, torch; print(json.dumps([torch.__version__, torch.__file__]))"

# ~2 minutes of CPU; on a loaded 2-core machine the disk-bound installs have taken 9.5 minutes of wall time
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _run(cmd, cwd, timeout=900):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _recipe() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return next(b for b in blocks if "meter_for" in b)


def test_wheel_installs_beside_an_existing_torch_and_keeps_it(tmp_path):
    wheels = tmp_path / "wheels"
    try:           # build with this venv's setuptools when it is recent enough (no isolated env to fetch)
        import setuptools

        recent = int(setuptools.__version__.split(".")[0]) >= 68        # pyproject's build requirement
    except (ImportError, ValueError):
        recent = False
    isolation = ["--no-build-isolation"] if recent else []
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", wheels, ROOT], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = wheels.glob("labkit_throughput-*.whl")

    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", venv], tmp_path)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    r = _run([py, "-m", "pip", "install", "-q", TORCH], tmp_path)
    if r.returncode != 0:
        pytest.skip(f"{TORCH} could not be installed into a fresh venv here (offline, no local wheel): "
                    f"{r.stderr.strip()[-300:]}")
    before = _run([py, "-c", PROBE], tmp_path).stdout

    # a plain install, as a user would: the installed torch satisfies torch>=2.4, so pip keeps it
    r = _run([py, "-m", "pip", "install", wheel], tmp_path)
    if r.returncode != 0 and re.search(r"(?i)connection|network|resolve host|no matching distribution", r.stderr):
        pytest.skip(f"labkit's dependencies could not be fetched here: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not re.search(r"(?m)^\s*(Collecting|Downloading) torch\b", r.stdout), r.stdout
    after = _run([py, "-c", PROBE], tmp_path).stdout
    assert json.loads(after) == json.loads(before)            # same version, same file: torch untouched

    listed = {d["name"].lower() for d in json.loads(_run([py, "-m", "pip", "list", "--format", "json"],
                                                         tmp_path).stdout)}
    assert "labkit-throughput" in listed
    assert not listed & {"jupyterlab", "papermill", "transformers", "ipykernel", "pytest"}, listed

    # outside the repository (cwd = tmp_path): the installed labkit, its CLI, and the README recipe
    r = _run([py, "-c", "import labkit, pathlib; print(labkit.__version__, pathlib.Path(labkit.__file__).parent)"],
             tmp_path)
    assert r.returncode == 0, r.stderr
    assert str(venv) in r.stdout
    assert _run([venv / "bin" / "labkit", "--help"], tmp_path).returncode == 0
    r = _run([py, "-c", _recipe()], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "tok/s" in r.stdout and "MFU" in r.stdout

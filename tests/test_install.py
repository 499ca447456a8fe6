"""A wheel built from the repository installs into a fresh venv that already holds torch, leaves that
torch untouched (same version, same files), pulls none of the course extras, and ``import labkit`` plus
the README's loop recipe run there.

The venv's torch is this environment's own, shown to it by a ``.pth`` file (as ``--system-site-packages`` shows a
system torch): pip sees it installed and must keep it, exactly as with a torch unpacked into the venv, without
unpacking ~750 MB again (that install was most of this test's minutes). It lies outside the venv, so pip could
never uninstall or overwrite it; a pip that wanted another torch would install one into the venv, which the
probe (torch's version and file) and the "Collecting torch" check catch. labkit's other dependencies are installed
into the venv for real. Slow (a venv, a wheel, labkit's dependencies): ~1 minute."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = "import json, torch; print(json.dumps([torch.__version__, torch.__file__]))"

# ~2 minutes of CPU; on a loaded 2-core machine the disk-bound installs have taken 9.5 minutes of wall time
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _run(cmd, cwd, timeout=900):
    # without the caller's PYTHONPATH: a checkout on it would make pip see labkit installed, and import it there
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _recipe() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return next(b for b in blocks if "meter_for" in b)


def _host_torch(dest: Path) -> Path:
    """``dest``: links to this environment's torch and the distributions it requires (files and metadata), for
    a venv's ``.pth`` to name; ``dest`` is outside that venv."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    dest.mkdir()
    want, seen = ["torch"], set()
    while want:
        name = canonicalize_name(want.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue              # a requirement this environment does without (pip then installs it)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                want.append(req.name)
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            if not (dest / top).exists() and Path(dist.locate_file(top)).exists():
                (dest / top).symlink_to(Path(dist.locate_file(top)).resolve())
    assert any(dest.glob("torch-*.dist-info")) and (dest / "torch").is_dir(), sorted(p.name for p in dest.iterdir())
    return dest


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
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).stdout.strip()
    (Path(site) / "host_torch.pth").write_text(f"{_host_torch(tmp_path / 'host-torch')}\n")
    r = _run([py, "-c", PROBE], tmp_path)
    assert r.returncode == 0, r.stderr
    before = r.stdout
    assert json.loads(before)[1].startswith(str(tmp_path / "host-torch")), before    # the venv's torch is that one

    # a plain install, as a user would: the installed torch satisfies torch>=2.4, so pip keeps it
    r = _run([py, "-m", "pip", "install", wheel], tmp_path)
    if r.returncode != 0 and re.search(r"(?i)connection|network|resolve host|no matching distribution", r.stderr):
        pytest.skip(f"labkit's dependencies could not be fetched here: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not re.search(r"(?m)^\s*(Collecting|Downloading) torch\b", r.stdout), r.stdout
    assert re.search(r"(?m)^Requirement already satisfied: torch\b", r.stdout), r.stdout
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

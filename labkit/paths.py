"""Where labkit finds the course's data and writes its own files.

Notebooks reach shipped data through these functions rather than relative paths, so a notebook
runs the same from its own folder, from a test harness's build copy, or from an installed package.
"""
from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def repo_root() -> Path:
    """The checkout that holds ``labkit/`` and ``datasets/`` (``LABKIT_ROOT`` overrides)."""
    env = os.environ.get("LABKIT_ROOT")
    if env:
        return Path(env).resolve()
    root = _PKG.parent
    if (root / "datasets").is_dir():
        return root
    raise FileNotFoundError(
        f"labkit is not running from a checkout (no datasets/ beside {_PKG}); "
        "set LABKIT_ROOT to the folder of your labkit clone"
    )


def datasets_dir() -> Path:
    """The shipped data: corpus, recorded traces and logs (``datasets/``)."""
    return repo_root() / "datasets"


def dataset(*parts: str) -> Path:
    """Path of a shipped data file; a clear error names what is there when it is missing."""
    p = datasets_dir().joinpath(*parts)
    if not p.exists():
        parent = p.parent
        have = sorted(x.name for x in parent.iterdir()) if parent.is_dir() else []
        raise FileNotFoundError(f"no dataset {'/'.join(parts)!r} in {datasets_dir()}; found here: {have}")
    return p


def user_work_root() -> Path:
    """This user's own work folder: ``$XDG_DATA_HOME/labkit/work`` (default ``~/.local/share/labkit/work``)."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "labkit" / "work"


def _writable(folder: Path) -> bool:
    """``folder`` exists and this process may create files in it, or it can be created."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return os.access(probe, os.W_OK | os.X_OK)


def work_dir(*parts: str) -> Path:
    """A writable folder for files a notebook makes (traces, records, lab evidence); ``LABKIT_WORK`` overrides.

    Defaults to ``build/work`` in the checkout, so chapter 9 can read the trace chapter 8 wrote; when the
    checkout is read-only (a course installed for many users on a JupyterHub) or absent, to this user's own
    :func:`user_work_root` — nothing a learner makes is ever written into a shared course.
    """
    base = os.environ.get("LABKIT_WORK")
    if base:
        root = Path(base)
    else:
        try:
            root = repo_root() / "build" / "work"
        except FileNotFoundError:
            root = user_work_root()
        if not _writable(root):
            root = user_work_root()
    p = root.joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p

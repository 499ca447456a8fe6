"""Where labkit finds the course's data and writes its own files.

Notebooks reach shipped data through these functions rather than relative paths, so a notebook
runs the same from its own folder, from a test harness's build copy, or from an installed package.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import tempfile
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


_OWNER = ".labkit-scratch-owner"       # in each scratch folder: the pid and pid namespace of the process it serves


def scratch_dir(prefix: str, *, at_exit: bool = True) -> Path:
    """A new, empty folder in the temporary folder for what one run of a notebook makes and nothing reads
    afterwards (the traces, checkpoints and dumps of a chapter's live jobs), removed with everything in it when
    the process exits (``atexit``: a Jupyter kernel's shutdown, papermill's included; ``at_exit=False`` leaves it
    to the caller). A kernel killed outright (nbval stops its kernels with SIGKILL) runs no exit handler, so
    :func:`sweep_scratch` runs first: running a chapter again and again does not fill ``/tmp`` (chapter 27 left
    256 MB there per run).
    What should stay goes in :func:`work_dir`. ``prefix``: the folder name's start, 1-40 letters, digits, ``_``,
    ``.`` or ``-``. Used by chapters 24, 26, 27, lab 10 and the grader's cages.
    """
    if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", prefix):
        raise ValueError(f"prefix={prefix!r} is not valid: give 1-40 letters, digits, '_', '.' or '-'")
    sweep_scratch()
    p = Path(tempfile.mkdtemp(prefix=prefix))
    (p / _OWNER).write_text(f"{os.getpid()} {_pid_namespace()}\n")
    if at_exit:
        atexit.register(remove_scratch, p)
    return p


def sweep_scratch() -> list[Path]:
    """Remove the scratch folders (:func:`scratch_dir`'s, any prefix) in the temporary folder whose process is
    gone: same pid namespace as this one, pid no longer running (a pid of another namespace — a grader's cage —
    means nothing here, so those are left). Returns the folders removed. Run by :func:`scratch_dir` and at the end
    of a ``make test`` nbval run (:mod:`labkit.teaching.nbval_startup`), whose kernels are killed, not shut down."""
    here, gone = _pid_namespace(), []
    for old in Path(tempfile.gettempdir()).iterdir():
        try:
            pid, ns = (old / _OWNER).read_text().split()
        except (OSError, ValueError):
            continue                     # not a scratch folder of labkit's
        if ns == here and pid.isdecimal() and not _running(int(pid)):
            remove_scratch(old)
            gone.append(old)
    return gone


@contextlib.contextmanager
def scratch(prefix: str):
    """:func:`scratch_dir` for a ``with`` block: the folder is removed when the block ends, however it ends (and,
    should the process be killed inside it, by the next :func:`scratch_dir` or :func:`sweep_scratch`). Used by
    :func:`labkit.trace.analyze` and :func:`labkit.trace.critical_path` for the ranks' summaries (chapter 9)."""
    folder = scratch_dir(prefix, at_exit=False)
    try:
        yield folder
    finally:
        remove_scratch(folder)


def remove_scratch(folder) -> None:
    """Remove ``folder`` and everything in it, also folders left without permissions (overlayfs leaves its
    work/work folder mode 000); a folder already gone is not an error."""
    for root, dirs, _ in os.walk(folder):
        for d in dirs:
            try:
                os.chmod(Path(root, d), 0o700)
            except OSError:
                pass
    shutil.rmtree(folder, ignore_errors=True)


def _pid_namespace() -> str:
    """This process's pid namespace (a pid means nothing outside it: a grader's cage has its own)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:                      # pragma: no cover - not Linux
        return "-"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                      # another user's process: running
        return True
    return True

"""The ``%%launch`` IPython cell magic: run a notebook cell's code on N fresh ranks.

``%load_ext labkit.launcher`` calls :func:`load_ipython_extension` (re-exported by the package face).
Taught in chapter 5 (scaling: running N ranks).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from labkit.launcher.parent import _CellTarget, launch

__all__ = ["load_ipython_extension"]


def load_ipython_extension(ipython) -> None:
    """``%load_ext labkit.launcher`` registers the cell magic ``%%launch``::

        %%launch -n 4 [--timeout 120] [--backend gloo] [--rank0-only]
        import torch.distributed as dist
        print(dist.get_rank(), dist.get_world_size())
        result = dist.get_rank() ** 2       # a variable named `result` comes back

    The cell's code is written to a temporary module file and run on N fresh ranks with torch.distributed
    initialised; it sees only what it imports itself (not the notebook's variables). The magic returns
    the :class:`LaunchResult` (``_.values`` holds every rank's ``result``).
    Taught in chapter 5 (scaling).
    """
    ipython.register_magic_function(_launch_magic, magic_kind="cell", magic_name="launch")


def _launch_magic(line: str, cell: str):
    import argparse
    import shlex

    p = argparse.ArgumentParser(prog="%%launch", add_help=False)
    p.add_argument("-n", "--nprocs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--backend", default="auto")
    p.add_argument("--rank0-only", action="store_true")
    try:
        a = p.parse_args(shlex.split(line))
    except SystemExit as e:
        raise ValueError(f"%%launch {line!r}: usage: %%launch -n N [--timeout S] [--backend auto|gloo|nccl] "
                         "[--rank0-only]") from e
    d = Path(tempfile.mkdtemp(prefix="labkit-cell-"))
    try:
        path = d / "labkit_cell.py"
        path.write_text(cell)
        return launch(_CellTarget(str(path)), a.nprocs, backend=a.backend, timeout_s=a.timeout,
                      rank0_only=a.rank0_only)
    finally:
        shutil.rmtree(d, ignore_errors=True)

"""``python -m labkit.launcher RUN_DIR RANK``: one rank of a launch, started by
:func:`labkit.launcher.parent.launch`. The worker runs from the importable
:mod:`labkit.launcher.worker`, not from ``__main__``, so what it pickles names a real module.

Taught in chapter 5 (scaling: running N ranks).
"""
from __future__ import annotations

import sys

from labkit.launcher.worker import _worker_main

if __name__ == "__main__":
    _worker_main(sys.argv[1:])

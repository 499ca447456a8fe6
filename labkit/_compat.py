"""Old module names that moved in 0.2 keep working for one release (removed in 0.3).

``import labkit.trace_load`` (or ``from labkit.comm_models import ring_time``) imports the module's
new home and registers it under the old name too — the *same* module object, so functions, classes
and pickles agree — with a ``DeprecationWarning`` that names the new home. See ARCHITECTURE.md.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old name (under labkit.) -> new name (under labkit.)
MOVED = {
    "trace_load": "trace.load",
    "trace_breakdown": "trace.breakdown",
    "trace_hta": "trace.hta",
    "trace_intervals": "intervals",
    "synthetic": "trace.synthetic",
    "comm_models": "comm.models",
    "comm_bench": "comm.bench",
    "comm_parse": "comm.parse",
    "comm_synth": "comm.synthetic",
    "nsys_live": "nsys.live",
    "nsys_synth": "nsys.synthetic",
    "memory_measure": "memory.measure",
    "perf_validate_fit": "perf_validate.fit",      # moved in 0.2.x: perf_validate became a package
    "perf_validate_runs": "perf_validate.runs",
}


def load_moved(old: str):
    """The module that ``labkit.<old>`` moved to (imported), with a DeprecationWarning."""
    new = MOVED[old]
    warnings.warn(f"labkit.{old} moved to labkit.{new}; the old name is removed in labkit 0.3",
                  DeprecationWarning, stacklevel=3)
    return importlib.import_module(f"labkit.{new}")


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str):
        self.old = old

    def create_module(self, spec):
        module = load_moved(self.old)  # the new module itself, registered under the old name too
        self.spec = module.__spec__    # importlib overwrites __spec__ after this; exec_module restores it
        return module

    def exec_module(self, module):
        module.__spec__ = self.spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        head, _, old = fullname.partition(".")
        if head != "labkit" or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(old))


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())

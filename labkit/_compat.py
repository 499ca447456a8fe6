"""Old module paths keep working until labkit 0.4, each with a DeprecationWarning naming its new home.

``import labkit.regress`` (or ``from labkit.tune_accum import ...``, or ``labkit.perf_validate.fit``)
imports the module's new home and registers it under the old name too — the *same* module object, so
functions, classes and pickles agree. No file stays at an old path: the finder below answers for them.
0.3 regrouped the top level into packages by concept (ARCHITECTURE.md, "chapter -> package"); 0.2's
moves (``labkit.trace_load``, ...) point at today's homes. The table is written by the 0.3 codemod.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old name (under labkit.) -> new name (under labkit.); a moved package's files follow it
MOVED = {
    'trace_load': 'trace.load',
    'trace_breakdown': 'trace.breakdown',
    'trace_hta': 'trace.hta',
    'trace_intervals': 'intervals',
    'synthetic': 'trace.synthetic',
    'comm_models': 'comm.models',
    'comm_bench': 'comm.bench',
    'comm_parse': 'comm.parse',
    'comm_synth': 'comm.synthetic',
    'nsys_live': 'nsys.live',
    'nsys_synth': 'nsys.synthetic',
    'memory_measure': 'memory.measure',
    'perf_validate_fit': 'perf.validate.fit',
    'perf_validate_runs': 'perf.validate.runs',
    'models': 'model.gpt',
    'model_config': 'model.config',
    'shapes': 'model.shapes',
    'moe': 'model.moe',
    'moe_stats': 'model.expert_load',
    'recompute_policy': 'model.recompute_policy',
    'attention': 'kernels.attention',
    'fusion': 'kernels.fusion',
    'roofline': 'kernels.roofline',
    'mfu': 'flops.mfu',
    'meter': 'measure.meter',
    'streams': 'measure.streams',
    'claims': 'measure.claims',
    'ab': 'measure.ab',
    'regress': 'measure.regress',
    'regress_series': 'measure.series',
    'scaling': 'measure.scaling',
    'pipeline': 'data.loading',
    'batch': 'train.batch',
    'precision': 'train.precision',
    'ring_attention': 'train.ring_attention',
    'tune': 'tuning.sweep',
    'tune_accum': 'tuning.accumulation',
    'cost': 'perf.cost',
    'scheduling': 'perf.scheduling',
    'perf_validate': 'perf.validate',
    'cases': 'teaching.cases',
    'faults': 'teaching.faults',
    'capstone': 'teaching.capstone',
    'tickets': 'teaching.tickets',
    'quiz': 'teaching.quiz',
    'widgets': 'teaching.widgets',
    'viz': 'teaching.viz',
    'notebooks': 'teaching.notebooks',
    'grading': 'teaching.grading',
    'cases.review': 'teaching.cases.review_bert',
    'cases.thirteen_b_review': 'teaching.cases.review_thirteen_b',
    'diagnose.hang_workloads': 'diagnose.seeded_hangs',
    'train.config_checks': 'train.option_checks',
}
REMOVED_IN = "labkit 0.4"
# names that moved between files: module (under labkit.) -> {name: its new module}
MOVED_NAMES = {
    "trace.load": {n: "trace.runs" for n in ("read_rank", "read_ranks", "check_one_run", "MIXED_START_S")},
    "memory.estimate": {n: "memory.buffers" for n in ("ddp_bucket_sizes", "comm_buffer_bytes")},
}


def _new_name(old: str) -> str | None:
    """Where ``labkit.<old>`` lives now (``perf_validate.fit`` -> ``perf.validate.fit``), or None."""
    if old in MOVED:
        return MOVED[old]
    head, _, rest = old.rpartition(".")
    while head:
        if head in MOVED:
            return f"{MOVED[head]}.{old[len(head) + 1:]}"
        head, _, rest = head.rpartition(".")
    return None


def load_moved(old: str):
    """The module that ``labkit.<old>`` moved to (imported), with a DeprecationWarning naming it."""
    new = _new_name(old)
    if new is None:
        raise ModuleNotFoundError(f"labkit.{old} is not a moved module; moved ones: {sorted(MOVED)}")
    warnings.warn(f"labkit.{old} moved to labkit.{new}; the old name is removed in {REMOVED_IN}",
                  DeprecationWarning, stacklevel=3)
    return importlib.import_module(f"labkit.{new}")


def moved_attribute(module: str, name: str):
    """``labkit.<module>.<name>`` that moved to another file: the object, with a DeprecationWarning naming
    its new home; an AttributeError for any other name (the module's own ``__getattr__`` calls this)."""
    short = module.removeprefix("labkit.")
    new = MOVED_NAMES.get(short, {}).get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(f"labkit.{short}.{name} moved to labkit.{new}.{name}; the old name is removed in {REMOVED_IN}",
                  DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(f"labkit.{new}"), name)


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
        if head != "labkit" or _new_name(old) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(old))


def install() -> None:
    """First on ``sys.meta_path``: it answers only for moved names, and a stale file or an editable
    install's finder must not hand out the old module under its old name."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


def lazy_face(package: str, names: dict, files: tuple, all_names, fallback: str | None = None):
    """``(__getattr__, __dir__)`` of a package face that hands each name of ``names`` (name → file) out from the
    file that defines it, imported on first use, each file of ``files`` as a submodule, and — with ``fallback``
    — every other attribute of that one file (its old module path: ``labkit.data`` was ``data.py``). Importing
    one file of the package then never imports the others, nor torch. The faces of ARCHITECTURE.md's packages
    call it."""
    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        if name in files:
            return importlib.import_module(f"{package}.{name}")
        if fallback and not name.startswith("__"):
            module = importlib.import_module(f"{package}.{fallback}")
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(files) | set(all_names))

    return __getattr__, __dir__

"""labkit — measure, model and diagnose the throughput of LLM training.

The library behind the labkit course (``chapters/``, ``labs/``). Submodules are imported lazily,
so ``import labkit`` is cheap and never touches a GPU::

    import labkit
    spec = labkit.hardware.lookup("H100 SXM")
    fpt = labkit.flops.model_flops_per_token(labkit.flops.preset("gpt2-124m"))
    print(labkit.flops.mfu.mfu(tokens_per_s=1.2e5, flops_per_token=fpt, n_devices=1, peak_flops=spec.peak("bf16")))

The packages are named for what the course teaches — ``hardware``, ``flops``, ``model``, ``kernels``,
``measure``, ``data``, ``train``, ``tuning``, ``comm``, ``memory``, ``trace``, ``nsys``, ``telemetry``,
``perf``, ``diagnose``, ``teaching`` — over a few foundation files (``units``, ``checks``, ``paths``,
``record``, ``course``, ``intervals``); ARCHITECTURE.md maps each chapter to its package. See
``labkit.course`` for the map from functions to the chapters that teach them.
"""
from __future__ import annotations

import importlib
import pkgutil

from labkit import _compat
from labkit._version import __version__  # noqa: F401

_compat.install()     # old module paths that moved (regress, trace_load, ... under labkit.) work until 0.4

# every module of the package, imported on first use (`labkit.flops`, `labkit.trace`, ...)
_SUBMODULES = {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")}
# public callables re-exported at the top level: name -> "module:attribute"
_EXPORTS = {
    "launch": "launcher:launch",
    "LaunchError": "launcher:LaunchError",
    "RunRecord": "record:RunRecord",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        mod, attr = _EXPORTS[name].split(":")
        value = getattr(importlib.import_module(f"labkit.{mod}"), attr)
        globals()[name] = value
        return value
    if name in _compat.MOVED:
        return _compat.load_moved(name)
    if name in _SUBMODULES:
        module = importlib.import_module(f"labkit.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _SUBMODULES | set(_EXPORTS))

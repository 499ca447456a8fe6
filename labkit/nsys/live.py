"""Live Nsight Systems recording (GPU machines with ``nsys``): profile the reference training loop.

:func:`record` profiles :func:`demo_training` with ``nsys`` when a CUDA GPU and nsys are present and
exports the report to SQLite for :func:`labkit.nsys.sqlite.read_sqlite`. Without them, chapter 10
reads the SYNTHETIC reports of :mod:`labkit.nsys.synthetic`.

Taught in chapter 10 (Nsight Systems and NVTX).
"""
from __future__ import annotations

from pathlib import Path

from labkit import checks

__all__ = ["demo_training", "record"]


def demo_training(steps: int = 8, *, model: str = "small") -> int:
    """The reference training loop (:func:`labkit.train.train`) for :func:`record` to profile: on a CUDA
    device its meter opens an NVTX range per step and per phase (data / forward / backward / optimizer),
    so the nsys timeline is labelled; without CUDA it runs on the CPU. Returns the number of steps run.
    Taught in chapter 10."""
    from labkit.train import TrainConfig, train

    steps = checks.count("steps", steps, at_least=2)
    train(TrainConfig(model=model, steps=steps, warmup_steps=1, label="nsys-demo"))
    return steps


def record(out_prefix: str | Path, *, steps: int = 8, timeout_s: float = 300, nsys_exe: str = "nsys") -> Path:
    """Profile :func:`demo_training` with Nsight Systems and export SQLite; returns the .sqlite path.
    Needs ``nsys`` on PATH and a CUDA GPU (RuntimeError otherwise). Runs::

        nsys profile -t cuda,nvtx,osrt -o <out_prefix> --force-overwrite true python -c "..."
        nsys export --type sqlite --force-overwrite true -o <out_prefix>.sqlite <out_prefix>.nsys-rep

    Taught in chapter 10."""
    import shutil
    import subprocess
    import sys

    steps = checks.count("steps", steps)
    checks.positive("timeout_s", timeout_s)
    exe = shutil.which(nsys_exe)
    if exe is None:
        raise RuntimeError(f"record: {nsys_exe!r} is not on PATH; read a recorded report instead")
    out_prefix = Path(out_prefix)
    code = f"from labkit.nsys.live import demo_training; demo_training({steps})"
    subprocess.run([exe, "profile", "-t", "cuda,nvtx,osrt", "-o", str(out_prefix), "--force-overwrite", "true",
                    sys.executable, "-c", code], check=True, timeout=timeout_s, capture_output=True)
    db = out_prefix.with_suffix(".sqlite")
    subprocess.run([exe, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(db),
                    str(out_prefix.with_suffix(".nsys-rep"))], check=True, timeout=timeout_s, capture_output=True)
    return db

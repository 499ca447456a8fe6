"""Every ```python block of README.md runs: on this CPU, and again as if on a GPU (CUDA reported
available, an H100's name) — each in a fresh namespace."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


def test_the_loop_recipe_is_ten_lines():
    recipe = [b for b in BLOCKS if "meter_for" in b]
    assert recipe and len(recipe[0].strip().splitlines()) <= 10


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_block_runs_on_this_cpu(i, capsys):
    exec(compile(BLOCKS[i], f"README.md block {i}", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip()          # every block prints what it computed


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_block_runs_as_if_on_a_gpu(i, monkeypatch, capsys):
    """CUDA faked as present with an H100's name: device look-ups take the GPU branch; a block whose
    tensors live on the CPU keeps its meter on the CPU (the meter follows the model's device)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA H100 80GB HBM3")
    from labkit.hardware.peak import resolve_peak

    peak, source = resolve_peak("auto", "bf16")       # the fake is seen: the catalogue's H100 peak
    assert source.startswith("catalogue:H100")
    exec(compile(BLOCKS[i], f"README.md block {i}", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip()

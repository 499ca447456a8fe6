"""What `make course` passes to JupyterLab, read from the Makefile (shared by the hub and browser tests)."""
from __future__ import annotations

import re
import shlex

from labkit.paths import repo_root


def lab_flags() -> dict[str, str]:
    """The `--Class.trait=value` flags of the Makefile's LAB_FLAGS, as {"Class.trait": "value"}."""
    text = re.sub(r"\\\n", " ", (repo_root() / "Makefile").read_text())
    line = next(row for row in text.splitlines() if row.startswith("LAB_FLAGS"))
    return dict(f[2:].split("=", 1) for f in shlex.split(line.split(":=", 1)[1]) if f.startswith("--") and "=" in f)

#!/usr/bin/env bash
# Create .venv and install labkit with the course and test extras, the CPU build of torch first
# where there is no NVIDIA GPU (so pip never pulls a multi-GB CUDA build onto a laptop or CI).
# Idempotent: a second run only re-checks. Used by `make course` and `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=${LABKIT_TORCH_VERSION:-2.13.0}
EXTRA=${1:-dev}

"$PY" -c 'import sys; assert sys.version_info >= (3, 10), "labkit needs Python >= 3.10, found " + sys.version.split()[0]'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
stamp=.venv/.labkit-$EXTRA-$(sha1sum pyproject.toml | cut -c1-12)
if [ -f "$stamp" ]; then exit 0; fi

echo "bootstrap: setting up .venv with labkit[$EXTRA] (first time: a few minutes; later runs are instant)"
if ! "$VPY" -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "bootstrap: installing torch==$TORCH_VERSION (CUDA build: nvidia-smi found)"
    "$VPY" -m pip install -q "torch==$TORCH_VERSION"
  else
    # PyTorch's CPU-only wheel index when it can be reached; otherwise pip's configured sources
    # (an offline mirror or a local wheel of the same version).
    cpu_index=https://download.pytorch.org/whl/cpu
    if "$VPY" -c "import urllib.request as u; u.urlopen('$cpu_index/', timeout=5)" 2>/dev/null; then
      extra=(--extra-index-url "$cpu_index")
    else
      extra=()
    fi
    echo "bootstrap: installing torch==$TORCH_VERSION (CPU build: no NVIDIA GPU here)"
    "$VPY" -m pip install -q "torch==$TORCH_VERSION" "${extra[@]}" 2>&1 | grep -v "is ignored" || true
    "$VPY" -c 'import torch' 2>/dev/null || { echo "bootstrap: could not install torch==$TORCH_VERSION" >&2; exit 1; }
  fi
fi
echo "bootstrap: installing labkit and the [$EXTRA] extras"
"$VPY" -m pip install -q -e ".[$EXTRA]" 2>&1 | grep -v "is ignored" || true
"$VPY" -c 'import labkit, torch, papermill' || { echo "bootstrap: install failed" >&2; exit 1; }
# the kernel the notebooks name ("python3"), pointing at this venv; same display name as ipykernel's
"$VPY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)" >/dev/null
"$VPY" -m jupyter labextension disable "@jupyterlab/apputils-extension:announcements" >/dev/null 2>&1 || true
touch "$stamp"
echo "bootstrap: ready (.venv)"

#!/usr/bin/env bash
# Create .venv and install minfer with its three kernel plugins (editable). Idempotent.
# On a machine without an NVIDIA GPU this installs torch's CPU build (torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip_q() { python -m pip install -q --disable-pip-version-check "$@"; }
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then pip_q "torch>=2.11"; else pip_q "torch==2.13.0"; fi
fi
pip_q -e ".[test,triton,serve]" -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs \
  -e examples/minfer-example-plugin

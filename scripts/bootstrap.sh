#!/usr/bin/env bash
# Creates .venv (once) and installs vllm-fleet with the CPU build of vLLM and the test tools.
# Re-running is cheap: pip finds everything satisfied. DESIGN §3 explains the torchvision step.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.fleet-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[cpu,dev]'
  # PyPI's torchvision/torchaudio do not match torch 2.13.0+cpu and break `import transformers`.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  touch "$stamp"
fi

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
  # The CPU stack is ~1 GB from PyPI (triton alone 286 MB, pulled in by xgrammar). One CI run
  # lost its connection at 202 MB and every resume got no more bytes, so a failed install is
  # retried after a pause; wheels that did arrive are in pip's cache and are not fetched again.
  # PIP_RESUME_RETRIES rather than the flag: a pip older than 25.1 (if its upgrade failed too)
  # ignores the variable but refuses the flag.
  retry() {
    for pause in 20 60 0; do
      if "$@"; then return 0; fi
      if [ "$pause" = 0 ]; then echo "bootstrap: failed 3 times: $*" >&2; return 1; fi
      echo "bootstrap: failed, retrying in ${pause} s: $*" >&2
      sleep "$pause"
    done
  }
  retry .venv/bin/python -m pip install -q --upgrade pip
  PIP_RESUME_RETRIES=20 retry .venv/bin/python -m pip install -q -e '.[cpu,dev]'
  # PyPI's torchvision/torchaudio do not match torch 2.13.0+cpu and break `import transformers`.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  touch "$stamp"
fi

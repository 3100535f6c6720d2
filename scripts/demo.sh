#!/usr/bin/env bash
# The demo: install (once), generate the tiny model (once), then run two CPU vLLM instances and
# the gateway on :8080 in the foreground. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
# The fleet file's default vllm_command is `python -m vllm...`: make that the venv's python.
export PATH="$PWD/.venv/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/vllm-fleet make-tiny-model .fleet/tiny-model
exec .venv/bin/vllm-fleet up -c examples/demo-cpu.yaml

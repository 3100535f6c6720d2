#!/usr/bin/env bash
# On the 2×H200 device machine, after ../shared/gpu-vllm's wheels were carried to /tmp/w:
#   bash bench/gpu/run.sh pair|tp     (carry .gpu/tools and .whl2: pydantic-settings, dotenv, tenacity, httptools)
set -uo pipefail
. bench/gpu/kit.sh
OUT=${OUT:-/tmp/out}
pkill -f "vllm_fleet.cli up" 2>/dev/null; sleep 1
python3 -c "from vllm_fleet.tinymodel import make_tiny_model; print(make_tiny_model('/tmp/tiny-model'))" || exit 1
python3 bench/gpu/gpu_fleet.py "$1" --model-dir /tmp/tiny-model --out "$OUT" "${@:2}"

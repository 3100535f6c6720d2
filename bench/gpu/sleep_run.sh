#!/usr/bin/env bash
# Issue 15 on one H200: three random-weight Llamas (1.4 B, 2.8 B, 5.6 B) share GPU 0 through vLLM's
# sleep mode behind the gateway. On the device machine, after ../shared/gpu-vllm's folders were
# carried to /tmp/w (prepare.sh's header), with .gpu/tools and .whl2 (pydantic-settings,
# python-dotenv, tenacity, httptools for Python 3.12) carried:
#   bash bench/gpu/sleep_run.sh start            # models + `vllm-fleet up` (left running), ≈ 6–8 min
#   bash bench/gpu/sleep_run.sh measure          # wakes with room, with a swap, 5 min mixed load, stop
set -uo pipefail
. bench/gpu/kit.sh
W=/tmp/sleep-run
mkdir -p "$W"
python3 bench/gpu/sleep_swap.py "$1" --out "$W" "${@:2}"
rc=$?
cp "$W"/*.json "$W"/up.log "$W"/fleet.yaml "${OUT:-/tmp/out}"/ 2>/dev/null
exit $rc

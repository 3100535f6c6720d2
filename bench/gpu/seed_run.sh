#!/usr/bin/env bash
# Issue 23, Seed 001's layout on four GPUs (nvidia-h200-x4): a 5.6 B "14B-style" random-weight Llama
# TP=2 on GPUs 0,1, a 2.8 B "8B-style" one TP=2 on GPUs 2,3, and a 1.4 B third model TP=2 on GPUs
# 2,3 too, asleep by default: the fleet file that `vllm-fleet plan --model A --model B --model C
# --asleep` writes, run by `vllm-fleet up` (bench/gpu/seed_layout.py does the work; its docstring
# says what each phase measures). State stays under /tmp/seed-run between calls while the machine is
# warm; `up` runs on (setsid) from `start` to `stop`.
#
# Here, once, in the project's root (the checkout the session started in: only it travels):
#   bash ../shared/gpu-vllm/prepare.sh      # vLLM 0.24.0's wheels as .gpu/c0 … .gpu/c6 and .gpu/tools
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
#       -d .whl2 pydantic-settings==2.16.3 python-dotenv==1.2.4 tenacity==9.2.1 httptools==0.9.0
#   (.gpu/ and .whl2/ are git-ignored and may be there already from earlier runs: `ls .gpu .whl2`;
#   `ls .gpu` shows how many cN folders there are, seven for vLLM 0.24.0)
# Then on the device, kind nvidia-h200-x4, back to back (a machine stays warm 30 s after a call):
#   1. carry [".gpu/c0"]  command: mkdir -p /tmp/w && cp .gpu/c0/* /tmp/w/         (starts the machine, ≈1–2 min)
#   2. carry [".gpu/c1"]  command: cp .gpu/c1/* /tmp/w/      … one call per folder, through .gpu/c6
#   3. carry [".gpu/tools", ".whl2"]  timeout_s 600
#        command: bash bench/gpu/seed_run.sh prepare start     # models, plan, check, up → ready: ≈6–9 min
#   4. carry [".gpu/tools", ".whl2"]  timeout_s 600
#        command: bash bench/gpu/seed_run.sh wait measure      # isolation, chat, /fleet, tiers, wakes: ≈2–4 min
#   5. carry [".gpu/tools", ".whl2"]  timeout_s 600
#        command: bash bench/gpu/seed_run.sh orphan stop       # SIGKILL → freed → restart → serving: ≈3–5 min
# About 20–25 minutes of the session's 30 of device time (four GPUs count in full). A phase that
# runs out of this call's time (--deadline-s, 560 s) stops and its JSON names the call to make next
# (e.g. `wait measure` when the fleet is still loading). Each call returns its phases' JSON files,
# fleet.yaml and seed-run.tgz (everything under /tmp/seed-run but the models: logs, plan, check).
# Rehearse the whole sequence without GPUs (fake vLLMs, a stand-in nvidia-smi), here:
#   .venv/bin/python bench/gpu/seed_layout.py prepare start measure orphan stop --rehearse --out /tmp/seed-rehearse
set -uo pipefail
. bench/gpu/kit.sh
W=/tmp/seed-run
mkdir -p "$W"
python3 bench/gpu/seed_layout.py "$@" --out "$W"
rc=$?
O=${OUT:-/tmp/out}
mkdir -p "$O"
for phase in "$@"; do [ -f "$W/$phase.json" ] && cp "$W/$phase.json" "$O/"; done
cp "$W/fleet.yaml" "$O/" 2>/dev/null
tar czf "$O/seed-run.tgz" -C "$W" --exclude=models --exclude=admin.key . 2>/dev/null
exit $rc

#!/usr/bin/env bash
# Issue 21's twin passes on two GPUs of one host (bench/gpu/twin_pairs.py), after ../shared/gpu-vllm's
# folders were carried to /tmp/w (prepare.sh's header), with .gpu/tools and .whl2 carried:
#   bash bench/gpu/twin_run.sh start                    # tiny model + `vllm-fleet up` with a and b (left running)
#   bash bench/gpu/twin_run.sh run --conc 1024 --passes 9
#   bash bench/gpu/twin_run.sh stop                     # stop `up`, twin_stats.py's tables
set -uo pipefail
. bench/gpu/kit.sh
W=/tmp/twin
mkdir -p "$W"
if [ "$1" = start ] && [ ! -d /tmp/tiny-model ]; then
  python3 -c "from vllm_fleet.tinymodel import make_tiny_model; print(make_tiny_model('/tmp/tiny-model'))" || exit 1
fi
python3 bench/gpu/twin_pairs.py "$1" --out "$W" "${@:2}"  # side-*.json stay there: a call returns few files
rc=$?
cp "$W"/rows.json "$W"/start.json "$W"/run.json "$W"/stop.json "$W"/fleet.yaml "${OUT:-/tmp/out}"/ 2>/dev/null
tail -c 200000 "$W"/up.log > "${OUT:-/tmp/out}"/up.log 2>/dev/null
exit $rc

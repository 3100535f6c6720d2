#!/usr/bin/env bash
# Issue 21's GPU benchmark on one H200 (bench/gpu/serve_pairs.py), after ../shared/gpu-vllm's
# folders were carried to /tmp/w (prepare.sh's header), with .gpu/tools and .whl2 carried:
#   bash bench/gpu/serve_run.sh start                       # tiny model + `vllm-fleet up` (left running)
#   bash bench/gpu/serve_run.sh run --conc 256 --passes 3   # interleaved direct/gateway passes
#   bash bench/gpu/serve_run.sh run --conc 512 --passes 4 --pin   # each pair again on CPUs of their own
#   bash bench/gpu/serve_run.sh run --conc 512 --passes 4 --targets direct,gateway,burn   # + CPU load, no relay
#   bash bench/gpu/serve_run.sh start --client-core         # `up` on all but the last core, the client there
#   bash bench/gpu/serve_run.sh stop                        # stop `up`, the table of medians and ratios
# PAIRS=twin_pairs W=/tmp/twin runs twin_pairs.py the same way (twin_run.sh).
set -uo pipefail
. bench/gpu/kit.sh
W=${W:-/tmp/serve-pairs}
mkdir -p "$W"
if [ "$1" = start ] && [ ! -d /tmp/tiny-model ]; then
  python3 -c "from vllm_fleet.tinymodel import make_tiny_model; print(make_tiny_model('/tmp/tiny-model'))" || exit 1
fi
python3 "bench/gpu/${PAIRS:-serve_pairs}.py" "$1" --out "$W" "${@:2}"
rc=$?
cp "$W"/*.json "$W"/fleet.yaml "$W"/vllm-trace.txt "$W"/variant.log "${OUT:-/tmp/out}"/ 2>/dev/null
tail -c 200000 "$W"/up.log > "${OUT:-/tmp/out}"/up.log 2>/dev/null
exit $rc

#!/usr/bin/env bash
# Issue 21's twin passes on two GPUs of one host (bench/gpu/twin_pairs.py), after ../shared/gpu-vllm's
# folders were carried to /tmp/w (prepare.sh's header), with .gpu/tools and .whl2 carried:
#   bash bench/gpu/twin_run.sh start                    # tiny model + `vllm-fleet up` with a and b (left running)
#   bash bench/gpu/twin_run.sh run --conc 1024 --passes 9
#   bash bench/gpu/twin_run.sh run --conc 512 --passes 4 --kinds gb,ga --window 120   # longer windows, swap pairs only
#   bash bench/gpu/twin_run.sh stop                     # stop `up`, twin_stats.py's tables
# serve_run.sh's steps (the kit, the model, the files copied to $OUT) with twin_pairs.py.
PAIRS=twin_pairs W=/tmp/twin exec bash bench/gpu/serve_run.sh "$@"

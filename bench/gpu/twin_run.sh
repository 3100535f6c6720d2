#!/usr/bin/env bash
# Issue 21's twin passes on two GPUs of one host (bench/gpu/twin_pairs.py), after ../shared/gpu-vllm's
# folders were carried to /tmp/w (prepare.sh's header), with .gpu/tools and .whl2 carried:
#   bash bench/gpu/twin_run.sh start                    # tiny model + `vllm-fleet up` with a and b (left running)
#   bash bench/gpu/twin_run.sh run --conc 1024 --passes 9
#   bash bench/gpu/twin_run.sh run --conc 512 --passes 4 --kinds gb,ga --window 120   # longer windows, swap pairs only
#   bash bench/gpu/twin_run.sh run --conc 512 --passes 4 --kinds gb,ga --ramp 10 --warmup 16 --window 60  # staggered starts
#   bash bench/gpu/twin_run.sh run --conc 512 --passes 2 --kinds jb,ja --jitter-ms 50     # direct both, one side's arrivals spread
#   bash bench/gpu/twin_run.sh run --conc 512 --passes 8 --kinds gb,ga,gbi,gai     # i: the direct side also holds
#                                                       # --direct-idle (512) idle connections, as the gateway's pool
#   bash bench/gpu/twin_run.sh run --conc 512 --passes 8 --kinds gb,ga,gbh,gah     # h: the same idle connections held
#                                                       # by a process of their own (window_client.py --conc 0)
#   bash bench/gpu/twin_run.sh stop                     # stop `up`, twin_stats.py's tables
# With the 2.8 B random-weight model (far more GPU work per token than the tiny one), made on the GPU first:
#   (. bench/gpu/kit.sh; python3 -m vllm_fleet.cli make-tiny-model /tmp/m28 --hidden 3072 --layers 28 --heads 24 \
#     --kv-heads 8 --intermediate 8192 --dtype bfloat16 --device cuda)
#   bash bench/gpu/twin_run.sh start --model-dir /tmp/m28
#   bash bench/gpu/twin_run.sh run --model-dir /tmp/m28 --conc 256 --passes 4 --kinds gb,ga --warmup 15 --window 60 --tail 10
#   (a request lives 4-14 s with it: a longer warm-up and tail; results/twin-2b8-h200x2)
#   bash bench/gpu/twin_run.sh run --model-dir /tmp/m28 --conc 256 --passes 6 --kinds gb,ga,gbp,gap,gb,ga --warmup 15 --window 30 --tail 10
#   (gbp/gap: each engine core loop alone on a CPU of its own; results/twin-apart-h200x2)
#   bash bench/gpu/twin_run.sh start --model-dir /tmp/m28 "--vllm-args=--max-model-len 2048"   # vLLM's defaults: CUDA graphs
#   bash bench/gpu/twin_run.sh run --model-dir /tmp/m28 --conc 256 --passes 8 --kinds gb,ga --warmup 15 --window 30 --tail 10 --profile
#   (--profile: py-spy on each side's API server and engine core; prof.py; results/twin-graphs-h200x2. Install it first:
#    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl2/py_spy*.whl  (its wheel in .whl2))
# serve_run.sh's steps (the kit, the model, the files copied to $OUT) with twin_pairs.py.
PAIRS=twin_pairs W=/tmp/twin exec bash bench/gpu/serve_run.sh "$@"

#!/usr/bin/env bash
# bench/gpu/pick_pairs.py on one GPU, after ../shared/gpu-vllm's folders were carried to /tmp/w
# (prepare.sh's header, then kit_fit.sh here), with .gpu/tools and .whl2 carried; the 2.8 B model made on the GPU first
# (twin_run.sh's header):
#   bash bench/gpu/pick_run.sh start --model-dir /tmp/m28 "--vllm-command=python -m vllm.entrypoints.cli.main serve" \
#     "--vllm-args=--max-model-len 2048 --api-server-count 2"
#   bash bench/gpu/pick_run.sh run --model-dir /tmp/m28 --conc 512 --passes 8 --kinds d,g,r,r,g,d
#   (--ramp 10,0 with --kinds d,g,g,d: the streams started over 10 s and together, a cycle each in turn)
#   bash bench/gpu/pick_run.sh stop
PAIRS=pick_pairs W=/tmp/pick exec bash bench/gpu/serve_run.sh "$@"

#!/usr/bin/env bash
# Issue 19 on nvidia-h200-x2: one vLLM instance over a Ray cluster on the one host, behind the
# gateway, with faults (bench/gpu/ray_measure.py does the measuring).
#
# Here, once:  EXTRA="ray==2.60.0" bash ../shared/gpu-vllm/prepare.sh     (.gpu/c0 … c9, Ray in c6+c7)
#              .whl2: pydantic-settings, python-dotenv, tenacity, httptools (kit.sh installs them)
# There: carry .gpu/c0 … .gpu/c9 one call each, back to back (prepare.sh's header), then call
#              carry [".gpu/tools", ".whl2"]   command: bash bench/gpu/ray_run.sh
# again and again, at once after each other: every call does the next steps that fit in its
# ${LIMIT:-570} s and stops; the cluster and the fleet run on between calls (setsid, /tmp/ray-run).
#
# Steps: setup, two raylets (one GPU each: CUDA_VISIBLE_DEVICES=0 / =1, node IPs 127.0.0.1 / .2),
# `vllm-fleet up` with pipeline parallel 2 over them (TP 1); if that fails, one raylet with both
# GPUs and TP 2; chat (curl, stream and not), `ray status`, nvidia-smi, tokens/s; SIGKILL of the
# API server; SIGKILL of the worker raylet and its rejoin (two raylets only); the same instance
# with the mp backend for tokens/s. Every call leaves $OUT/ray-run.tgz (all results so far) and
# $OUT/call.log. Here, unpack the last ray-run.tgz into bench/gpu/results/ray-run1/.
set -uo pipefail
W=/tmp/ray-run
O=${OUT:-/tmp/out}
mkdir -p "$W/logs" "$O"
RAY="python3 -m ray.scripts.scripts"
M="python3 bench/gpu/ray_measure.py"
COMMON="--disable-usage-stats --num-cpus 8 --object-store-memory 2000000000"

head_start() {  # $1: the head's CUDA_VISIBLE_DEVICES, $2: its GPU count
  CUDA_VISIBLE_DEVICES=$1 VLLM_HOST_IP=127.0.0.1 setsid -w $RAY start --head --node-ip-address 127.0.0.1 \
    --port 6379 --num-gpus "$2" --include-dashboard=false $COMMON --node-manager-port 6380 \
    --object-manager-port 6381 --metrics-export-port 6382 --dashboard-agent-listen-port 6383 \
    --dashboard-agent-grpc-port 6384 --runtime-env-agent-port 6385 --ray-client-server-port 6386 \
    --min-worker-port 20000 --max-worker-port 20499 </dev/null >>"$W/ray-start.log" 2>&1
}
worker_start() {  # $1: first port (a rejoin takes fresh ports: the dead node's may linger)
  local b=$1
  CUDA_VISIBLE_DEVICES=1 VLLM_HOST_IP=127.0.0.2 setsid -w $RAY start --address 127.0.0.1:6379 \
    --node-ip-address 127.0.0.2 --num-gpus 1 $COMMON --node-manager-port "$b" --object-manager-port $((b+1)) \
    --metrics-export-port $((b+2)) --dashboard-agent-listen-port $((b+3)) --dashboard-agent-grpc-port $((b+4)) \
    --runtime-env-agent-port $((b+5)) --min-worker-port $((b+100)) --max-worker-port $((b+599)) \
    </dev/null >>"$W/ray-start.log" 2>&1
}

if [ "${1:-}" = worker-start ]; then  # the rejoin, run by ray_measure.py kill-raylet
  . bench/gpu/kit.sh >/dev/null
  worker_start "$2"; rc=$?; tail -5 "$W/ray-start.log"; exit $rc
fi

exec > >(tee -a "$W/calls.log" "$O/call.log") 2>&1
START=$(date +%s)
LIMIT=${LIMIT:-570}
. bench/gpu/ray_steps.sh
nodes() {  # alive Ray nodes, as the GCS lists them
  local n
  n=$(python3 -c "import ray; ray.init(address='127.0.0.1:6379', logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))" 2>/dev/null | tail -1)
  case $n in ''|*[!0-9]*) echo 0 ;; *) echo "$n" ;; esac
}
cluster_wait() {  # cluster_wait N: until `ray status` lists N active nodes (60 s at most)
  local t0; t0=$(date +%s)
  while [ "$(nodes)" -lt "$1" ] && [ $(( $(date +%s) - t0 )) -lt 60 ]; do sleep 1; done
  say "the GCS lists $(nodes) alive node(s) after $(( $(date +%s) - t0 ))s of waiting"
}
fleet_up() {  # fleet_up TAG: start `vllm-fleet up` on $W/fleet-TAG.yaml (setsid), wait for it to serve
  local tag=$1
  python3 -m vllm_fleet.cli check -c "$W/fleet-$tag.yaml" >"$W/check-$tag.txt" 2>&1
  say "check rc=$?"; grep -E -- '--distributed|RAY_ADDRESS|CUDA_VISIBLE' "$W/check-$tag.txt" | head -5
  rm -f "$W/logs/tiny.log"
  setsid python3 -m vllm_fleet.cli up -c "$W/fleet-$tag.yaml" </dev/null >"$W/up-$tag.log" 2>&1 &
  echo $! >"$W/up.pid"; echo "$tag" >"$W/running"
  $M wait --log "$W/logs/tiny.log" --timeout "$(( $(left) - 40 < 330 ? $(left) - 40 : 330 ))" \
    --json "$W/wait-$tag.json"
}
fleet_stop() {  # SIGTERM to `up`, wait for it to end
  [ -e "$W/up.pid" ] || return 0
  local pid; pid=$(cat "$W/up.pid"); kill -TERM "$pid" 2>/dev/null
  local t=0; while [ -e "/proc/$pid" ] && [ $t -lt 90 ]; do sleep 1; t=$((t+1)); done
  say "fleet (up pid $pid) stopped after ${t}s"; rm -f "$W/up.pid" "$W/running"
}

say "call starts, $(left)s to use"
if fits setup 150; then
  . bench/gpu/kit.sh || exit 1
  nvidia-smi -L; python3 -c "import ray, vllm; print('ray', ray.__version__, 'vllm', vllm.__version__)"
  python3 -m vllm_fleet.cli make-tiny-model /tmp/tiny-model
  smi >"$W/nvidia-smi-idle.txt"; $RAY stop --force >/dev/null 2>&1
  mark setup
else
  . bench/gpu/kit.sh >/dev/null || exit 1
fi

if fits cluster2 90; then
  t=$(date +%s.%N)
  head_start 0 1; say "head rc=$?"
  worker_start 6400; say "worker rc=$?"
  cluster_wait 2
  echo "two raylets: $(awk "BEGIN{print $(date +%s.%N) - $t}") s from the first ray start to both alive" \
    | tee "$W/cluster2-time.txt"
  ray_status | tee "$W/ray-status-cluster2.txt"
  mark cluster2
fi

if fits up-pp2 360; then  # pipeline parallel 2 across the two raylets (TP 1)
  $M fleet --backend ray --tp 1 --pp 2 --gpus 0 --log-dir "$W/logs" --state-dir "$W/state" --out "$W/fleet-pp2.yaml"
  if fleet_up pp2; then echo pp2-two-raylets >"$W/shape"
  else
    say "PP=2 over two raylets did not serve"; cp "$W/logs/tiny.log" "$W/tiny-pp2-failed.log"
    ray_status >"$W/ray-status-pp2-failed.txt"; smi >"$W/nvidia-smi-pp2-failed.txt"; fleet_stop
    smi >"$W/nvidia-smi-pp2-after-stop.txt"; ps -eo pid,args | grep 'ray::' | grep -v grep >"$W/ps-pp2-after-stop.txt"
    echo failed >"$W/pp2.failed"
  fi
  mark up-pp2
fi

if [ -e "$W/pp2.failed" ] && fits up-tp2-one-raylet 400; then  # fallback: one raylet with both GPUs
  $RAY stop --force >/dev/null 2>&1; sleep 2
  head_start 0,1 2; cluster_wait 1; ray_status >"$W/ray-status-cluster1.txt"
  $M fleet --backend ray --tp 2 --pp 1 --gpus 0,1 --log-dir "$W/logs" --state-dir "$W/state" --out "$W/fleet-tp2.yaml"
  if fleet_up tp2; then echo tp2-one-raylet >"$W/shape"; else say "TP=2 on one raylet did not serve either"; fi
  mark up-tp2-one-raylet
fi

SHAPE=$(cat "$W/shape" 2>/dev/null || echo none)
if [ "$SHAPE" != none ]; then
  if fits show-ray 60; then show ray; mark show-ray; fi
  if fits load-ray 90; then $M load --model tiny --conc 64 --tokens 128 --json "$W/load-ray.json"; mark load-ray; fi
  if fits kill-api 280; then
    $M kill-api --timeout $(( $(left) - 20 < 260 ? $(left) - 20 : 260 )) --json "$W/kill-api.json"
    show after-kill-api; mark kill-api
  fi
  if [ "$SHAPE" = pp2-two-raylets ] && fits kill-raylet 320; then
    $M kill-raylet --node-ip 127.0.0.2 --observe 30 --rejoin "bash bench/gpu/ray_run.sh worker-start 7400" \
      --timeout $(( $(left) - 20 < 290 ? $(left) - 20 : 290 )) --json "$W/kill-raylet.json"
    show after-kill-raylet; mark kill-raylet
  fi
fi

if fits stop-ray 120; then
  [ -n "$(cat "$W/running" 2>/dev/null)" ] && fleet_stop
  for s in 0 2 5; do sleep $s; echo "## +${s}s after the fleet stopped"; smi; done >"$W/nvidia-smi-after-stop.txt" 2>&1
  ray_status >"$W/ray-status-after-stop.txt"; ps -eo pid,args | grep 'ray::' | grep -v grep >"$W/ps-after-stop.txt"
  cat "$W/nvidia-smi-after-stop.txt" "$W/ps-after-stop.txt"
  $RAY stop --force >"$W/ray-stop.txt" 2>&1; mark stop-ray
fi

# The same instance with vLLM's own multiprocessing executor (no Ray), for tokens/s.
case $SHAPE in pp2-two-raylets) TP=1 PP=2 ;; *) TP=2 PP=1 ;; esac
if fits up-mp 360; then
  $M fleet --backend mp --tp $TP --pp $PP --gpus 0,1 --log-dir "$W/logs" --state-dir "$W/state" --out "$W/fleet-mp.yaml"
  fleet_up mp || echo failed >"$W/mp.failed"
  mark up-mp
fi
if [ ! -e "$W/mp.failed" ] && fits load-mp 150; then
  show mp; $M load --model tiny --conc 64 --tokens 128 --json "$W/load-mp.json"; fleet_stop; mark load-mp
fi

# Last, if a call is left for it: tensor parallel 2 over the two raylets, the shape that failed
# before with `IndexError: device_id 1 is out of range for assigned_physical_gpu_ids [1]`. In vLLM
# 0.24's source that error comes from the custom all-reduce's P2P check (custom_all_reduce.py
# _can_p2p, VLLM_SKIP_P2P_CHECK=1 by default): its "same node" test is a /dev/shm probe, which two
# raylets on one host pass, so it looks up local device 1 in a worker that Ray gave one GPU.
# Separate hosts fail that probe and skip the custom all-reduce. Here it is turned off by hand
# (and the symmetric-memory all-reduce, which makes the same one-node assumption).
if [ "$SHAPE" = pp2-two-raylets ] && fits tp2-two-raylets 420; then
  head_start 0 1; worker_start 6400; cluster_wait 2
  $M fleet --backend ray --tp 2 --pp 1 --gpus 0 --log-dir "$W/logs" --state-dir "$W/state" \
    --extra=--disable-custom-all-reduce --env VLLM_ALLREDUCE_USE_SYMM_MEM=0 --out "$W/fleet-tp2x2.yaml"
  if fleet_up tp2x2; then
    show tp2x2; $M load --model tiny --conc 64 --tokens 128 --json "$W/load-tp2x2.json"
  else cp "$W/logs/tiny.log" "$W/tiny-tp2x2-failed.log"
  fi
  fleet_stop; $RAY stop --force >/dev/null 2>&1; mark tp2-two-raylets
fi
exit_call

#!/usr/bin/env bash
# Issue 19 on ONE GPU (nvidia-h200 or nvidia-h100-x1, when nvidia-h200-x2 is not lent): a real Ray
# cluster of one raylet holding the one GPU, `vllm-fleet up` with a `distributed_executor_backend:
# ray` instance (TP 1) behind the gateway, chat, `ray status`, who holds the GPU, tokens/s, SIGKILL
# of the API server sampled for 90 s, SIGTERM of `up`, `ray stop`; then the same instance without
# Ray (no distributed_executor_backend) for tokens/s. bench/gpu/ray_measure.py does the measuring.
#
# Here, once: EXTRA="ray==2.60.0" bash ../shared/gpu-vllm/prepare.sh  (.gpu/c0 … c9), .whl2 (kit.sh).
# There: carry .gpu/c0 … .gpu/c9 one call each, back to back (`mkdir -p /tmp/w && cp .gpu/cN/* /tmp/w/`),
# then carry [".gpu/tools", ".whl2"], command: bash bench/gpu/ray_one_gpu.sh, again at once until
# every step is done: each call does the steps that fit in its ${LIMIT:-570} s; the cluster and
# the fleet run on between calls (setsid, /tmp/ray-run). Each call leaves $OUT/ray-run.tgz.
#
# FAULTS=1 W=/tmp/ray-faults: the other faults instead of chat/load/mp: SIGKILL of the Ray actor
# that holds the GPU, SIGKILL of the API server's whole process group, SIGKILL of the (only)
# raylet with a new raylet joining the GCS 30 s later (`bash bench/gpu/ray_one_gpu.sh rejoin`).
set -uo pipefail
export W=${W:-/tmp/ray-run}
O=${OUT:-/tmp/out}
mkdir -p "$W/logs" "$O"
RAY="python3 -m ray.scripts.scripts"
M="python3 bench/gpu/ray_measure.py"
GMU=${GMU:-0.3}

if [ "${1:-}" = rejoin ]; then  # a raylet for the one GPU joins the running GCS (run by kill-raylet)
  . bench/gpu/kit.sh >/dev/null
  gcs=$(cat /tmp/ray/ray_current_cluster 2>/dev/null || echo 127.0.0.1:6379)
  CUDA_VISIBLE_DEVICES=0 setsid -w $RAY start --address "$gcs" --num-gpus 1 --num-cpus 8 --disable-usage-stats \
    --object-store-memory 2000000000 --dashboard-agent-listen-port 52400 </dev/null >>"$W/rejoin.log" 2>&1
  rc=$?; tail -5 "$W/rejoin.log"; exit $rc
fi

exec > >(tee -a "$W/calls.log" "$O/call.log") 2>&1
START=$(date +%s)
LIMIT=${LIMIT:-570}
. bench/gpu/ray_steps.sh
fleet_up() {  # fleet_up TAG: `vllm-fleet up` on $W/fleet-TAG.yaml (setsid), wait until it serves
  local tag=$1
  python3 -m vllm_fleet.cli check -c "$W/fleet-$tag.yaml" >"$W/check-$tag.txt" 2>&1
  say "check rc=$?"; grep -E -- '--distributed|RAY_ADDRESS|CUDA_VISIBLE|gpu-memory' "$W/check-$tag.txt" | head -6
  rm -f "$W/logs/tiny.log"
  echo "$(date +%s.%N)" >"$W/up-$tag.t0"
  setsid python3 -m vllm_fleet.cli up -c "$W/fleet-$tag.yaml" </dev/null >"$W/up-$tag.log" 2>&1 &
  echo $! >"$W/up.pid"; echo "$tag" >"$W/running"
  $M wait --log "$W/logs/tiny.log" --timeout "$(( $(left) - 40 < 330 ? $(left) - 40 : 330 ))" \
    --json "$W/wait-$tag.json"
}
fleet_stop() {  # SIGTERM to `up`, wait for it to end; keep the instance's log
  [ -e "$W/up.pid" ] || return 0
  local pid tag t=0; pid=$(cat "$W/up.pid"); tag=$(cat "$W/running" 2>/dev/null)
  local t0; t0=$(date +%s.%N); kill -TERM "$pid" 2>/dev/null
  while [ -e "/proc/$pid" ] && [ $t -lt 360 ]; do sleep 0.25; t=$((t+1)); done
  say "fleet (up pid $pid) ended $(awk "BEGIN{print $(date +%s.%N) - $t0}") s after SIGTERM" | tee "$W/stop-$tag.txt"
  cp "$W/logs/tiny.log" "$W/tiny-$tag.log" 2>/dev/null; cp "$W/logs/gateway.log" "$W/gateway-$tag.log" 2>/dev/null
  rm -f "$W/up.pid" "$W/running"
}

say "call starts, $(left)s to use"
if fits setup 150; then
  . bench/gpu/kit.sh || exit 1
  nvidia-smi -L; python3 -c "import ray, vllm; print('ray', ray.__version__, 'vllm', vllm.__version__)"
  env | grep -E '^(NCCL_NVLS|TORCH_SYMM|NVSHMEM|VLLM_USE_FLASHINFER)' | sort
  python3 -m vllm_fleet.cli make-tiny-model /tmp/tiny-model
  smi >"$W/nvidia-smi-idle.txt"; $RAY stop --force >/dev/null 2>&1
  mark setup
else
  . bench/gpu/kit.sh >/dev/null || exit 1
fi

if fits cluster1 90; then  # one raylet holding the one GPU; the variables above are in its env too
  t=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=0 VLLM_HOST_IP=127.0.0.1 setsid -w $RAY start --head --node-ip-address 127.0.0.1 \
    --port 6379 --num-gpus 1 --num-cpus 8 --include-dashboard=false --disable-usage-stats \
    --object-store-memory 2000000000 </dev/null >"$W/ray-start.log" 2>&1
  say "ray start rc=$? after $(awk "BEGIN{print $(date +%s.%N) - $t}") s"; tail -4 "$W/ray-start.log"
  for p in $(pgrep -x raylet); do echo "raylet $p: $(tr '\0' '\n' </proc/$p/environ | grep -E '^(NCCL_NVLS|TORCH_SYMM|NVSHMEM|VLLM_USE_FLASHINFER|CUDA_VISIBLE)' | tr '\n' ' ')"; done | tee "$W/raylet-env.txt"
  ray_status | tee "$W/ray-status-cluster1.txt"
  mark cluster1
fi

if fits up-ray 360; then
  $M fleet --backend ray --tp 1 --pp 1 --gpus 0 --gmu "$GMU" --log-dir "$W/logs" --state-dir "$W/state" --out "$W/fleet-ray.yaml" >/dev/null
  cat "$W/fleet-ray.yaml"
  if fleet_up ray; then echo ok >"$W/ray.ok"
  else say "the Ray instance did not serve"; cp "$W/logs/tiny.log" "$W/tiny-ray-failed.log"; smi; ray_status; fi
  mark up-ray
fi

if [ -e "$W/ray.ok" ] && [ "${FAULTS:-0}" = 1 ]; then
  K="--observe 60 --probe 2"
  if fits kill-actor 200; then
    $M kill-actor $K --timeout $(( $(left) - 30 < 300 ? $(left) - 30 : 300 )) --json "$W/kill-actor.json"
    show after-kill-actor; mark kill-actor
  fi
  if fits kill-group 200; then
    $M kill-group $K --timeout $(( $(left) - 30 < 300 ? $(left) - 30 : 300 )) --json "$W/kill-group.json"
    show after-kill-group; mark kill-group
  fi
  if fits kill-raylet 260; then
    $M kill-raylet --node-ip "" --observe 30 --min-s 60 --probe 2 --rejoin "bash bench/gpu/ray_one_gpu.sh rejoin" \
      --timeout $(( $(left) - 30 < 330 ? $(left) - 30 : 330 )) --json "$W/kill-raylet.json"
    show after-kill-raylet; mark kill-raylet
  fi
  touch "$W/done.up-mp" "$W/done.load-mp"
elif [ -e "$W/ray.ok" ]; then
  if fits show-ray 60; then show ray; mark show-ray; fi
  if fits load-ray 100; then $M load --model tiny --conc 64 --tokens 128 --json "$W/load-ray.json"; mark load-ray; fi
  if fits kill-api 200; then
    $M kill-api --observe 90 --timeout $(( $(left) - 30 < 330 ? $(left) - 30 : 330 )) --json "$W/kill-api.json"
    show after-kill-api; mark kill-api
  fi
fi

if fits stop-ray 150; then
  [ -n "$(cat "$W/running" 2>/dev/null)" ] && fleet_stop
  for s in 0 2 5; do sleep $s; echo "## +${s}s more after the fleet stopped"; smi; owners; done >"$W/nvidia-smi-after-stop.txt" 2>&1
  ray_status >"$W/ray-status-after-stop.txt"
  ps -eo pid,ppid,args | grep 'ray::' | grep -v grep >"$W/ps-after-stop.txt"
  cat "$W/nvidia-smi-after-stop.txt" "$W/ray-status-after-stop.txt" "$W/ps-after-stop.txt"
  $RAY stop >"$W/ray-stop.txt" 2>&1; echo "ray stop rc=$?" >>"$W/ray-stop.txt"; sleep 2
  { echo "## after ray stop"; smi; pgrep -a raylet; pgrep -a gcs_server; ps -eo pid,args | grep 'ray::' | grep -v grep; } >>"$W/ray-stop.txt" 2>&1
  cat "$W/ray-stop.txt"; $RAY stop --force >/dev/null 2>&1
  mark stop-ray
fi

# The same instance without Ray (no distributed_executor_backend: vLLM's own mp executor), for tokens/s.
if fits up-mp 360; then
  $M fleet --backend none --tp 1 --pp 1 --gpus 0 --gmu "$GMU" --log-dir "$W/logs" --state-dir "$W/state" --out "$W/fleet-mp.yaml" >/dev/null
  fleet_up mp || { echo failed >"$W/mp.failed"; cp "$W/logs/tiny.log" "$W/tiny-mp-failed.log"; }
  mark up-mp
fi
if [ ! -e "$W/mp.failed" ] && fits load-mp 150; then
  show mp; $M load --model tiny --conc 64 --tokens 128 --json "$W/load-mp.json"; fleet_stop
  smi >"$W/nvidia-smi-after-mp.txt"; mark load-mp
fi
exit_call

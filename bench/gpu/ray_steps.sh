# Sourced by bench/gpu/ray_one_gpu.sh and ray_run.sh once they have set W (the run's directory),
# O ($OUT), RAY, M, START and LIMIT: steps that resume across device calls (done.STEP files in
# $W), what every call leaves in $OUT, and what each run shows of the cluster and the GPUs.
left() { echo $((LIMIT - ($(date +%s) - START))); }
say() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - START ))s] $*"; }
done_() { [ -e "$W/done.$1" ]; }
mark() { touch "$W/done.$1"; say "step $1 done"; }
fits() {  # fits STEP SECONDS: not done yet, and that many seconds are left in this call
  done_ "$1" && return 1
  if [ "$(left)" -lt "$2" ]; then say "step $1 needs ${2}s, $(left)s left: next call"; exit_call; fi
  say "== step $1"
}
exit_call() {  # $OUT/<run>.tgz (all results so far) and Ray's logs when they fit what comes back
  tar czf "$O/$(basename "$W").tgz" -C "$(dirname "$W")" "$(basename "$W")" 2>/dev/null
  if [ -d /tmp/ray/session_latest/logs ]; then
    tar czf "$O/ray-logs.tgz" -C /tmp/ray/session_latest --exclude='*.jsonl' logs 2>/dev/null
    [ "$(stat -c %s "$O/ray-logs.tgz")" -gt 15000000 ] && rm -f "$O/ray-logs.tgz"
  fi
  say "call ends; steps done: $(cd "$W" && ls done.* 2>/dev/null | sed 's/done.//' | tr '\n' ' ')"
  exit 0
}
smi() { nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv; \
        nvidia-smi --query-gpu=index,uuid,memory.used,memory.total --format=csv; }
ray_status() {  # `ray status`, then the GCS's own list of nodes (in case the former needs the dashboard)
  timeout 60 $RAY status --address 127.0.0.1:6379 2>&1
  echo "## ray.nodes()"
  timeout 60 python3 -c "
import ray; ray.init(address='127.0.0.1:6379', logging_level='ERROR')
for n in ray.nodes():
    print(n['NodeManagerAddress'], 'alive' if n['Alive'] else 'dead', {k: v for k, v in n['Resources'].items() if k in ('GPU', 'CPU')})
print('available:', {k: v for k, v in ray.available_resources().items() if k in ('GPU', 'CPU')})" 2>&1 | grep -v '^20..-'
}
owners() {  # who holds each GPU, and whose child it is
  for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); do
    local pp; pp=$(ps -o ppid= -p "$p" | tr -d ' ')
    echo "$p $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-100) (parent $pp: $(ps -o args= -p "$pp" | cut -c1-100))"
  done
}
show() {  # show TAG: chat through the gateway (curl, stream and not; ray_measure), ray status (not for
          # TAG mp, the run without Ray), nvidia-smi, the supervisor's instances, processes, GPU owners
  local tag=$1
  { echo "## non-streaming"; curl -s -m 60 http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \
      -d '{"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}'
    echo; echo "## streaming"; curl -sN -m 60 http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \
      -d '{"model": "tiny", "stream": true, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}'
  } >"$W/curl-$tag.txt" 2>&1
  head -c 700 "$W/curl-$tag.txt"; echo
  $M chat --model tiny --json "$W/chat-$tag.json"
  [ "$tag" = mp ] || { ray_status >"$W/ray-status-$tag.txt"; cat "$W/ray-status-$tag.txt"; }
  smi >"$W/nvidia-smi-$tag.txt"; cat "$W/nvidia-smi-$tag.txt"
  curl -s http://127.0.0.1:9400/instances >"$W/instances-$tag.json"
  ps -eo pid,ppid,pgid,rss,args --sort=pid | grep -E 'ray::|raylet|gcs_server|vllm|EngineCore|api_server|gateway' \
    | grep -v grep | cut -c1-220 >"$W/ps-$tag.txt"
  owners >"$W/gpu-owners-$tag.txt"; cat "$W/gpu-owners-$tag.txt"
}

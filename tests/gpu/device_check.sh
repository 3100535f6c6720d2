#!/usr/bin/env bash
# GPU isolation check on a 2-GPU device machine (run from the repo root there):
#   vllm-fleet gpus; vllm-fleet up with two one-GPU probe instances; each instance must see only
#   its own GPU (torch's UUIDs, and nvidia-smi --query-compute-apps); SIGTERM leaves nothing.
# Needs the wheels in .whl/ for what the machine lacks (fastapi, uvicorn, pydantic, ...).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
get() { python3 -c 'import sys,urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
chat() { python3 - "$1" <<'PY'
import json, sys, urllib.request as u
req = u.Request("http://127.0.0.1:8080/v1/chat/completions", method="POST",
                data=json.dumps({"model": sys.argv[1], "messages": [{"role": "user", "content": "gpus?"}]}).encode(),
                headers={"content-type": "application/json"})
r = u.urlopen(req, timeout=10)
print(r.headers.get("x-fleet-backend"), json.loads(json.load(r)["choices"][0]["message"]["content"]))
PY
}
fleet() { python3 -c 'import sys; from vllm_fleet.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
echo "== nvidia-smi"; nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used --format=csv
echo "== vllm-fleet gpus"; fleet gpus
echo "== vllm-fleet check"; fleet check -c tests/gpu/probe-fleet.yaml
echo "== vllm-fleet up"
# Leftovers of an earlier call on a warm machine would hold the ports.
pkill -f tests/gpu/probe_server.py; pkill -f "gateway -c /tmp/fleet-state"; sleep 0.5
python3 -m vllm_fleet.cli up -c tests/gpu/probe-fleet.yaml > "$OUT/up.log" 2>&1 &
UP=$!
t0=$(date +%s.%N)
for _ in $(seq 1 240); do
  python3 -c 'import json,sys,urllib.request as u; d=json.load(u.urlopen("http://127.0.0.1:8080/fleet", timeout=2)); sys.exit(0 if all(b["healthy"] for b in d["backends"]) else 1)' 2>/dev/null && break
  sleep 0.5
done
echo "ready after $(python3 -c "import time; print(round(time.time()-$t0,1))") s"
echo "== /fleet"; get http://127.0.0.1:8080/fleet
for m in probe-a probe-b; do
  echo "== chat $m via gateway"
  chat $m
done
echo "== nvidia-smi --query-compute-apps"; nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv
echo "== process groups of the instances"; ps -eo pid,pgid,args | grep -E "probe_server|gateway" | grep -v grep
echo "== supervisor /instances"; get http://127.0.0.1:9400/instances
echo "== SIGTERM up"; kill -TERM $UP; wait $UP; echo "up exited with $?"
sleep 1
echo "== left behind (expect nothing):"; ps -eo pid,pgid,args | grep -E "probe_server|-m gateway" | grep -v grep || echo "(none)"
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv
echo "== up log tail"; tail -n 30 "$OUT/up.log"

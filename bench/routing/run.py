"""Routing policies side by side on real vLLM (the CPU build): two replicas of the tiny model,
one gateway per policy, the same conversations for each (issue #8).

Per policy and workload: TTFT p50/p99 as the client sees it (request sent → first SSE event), and
the replicas' prefix-cache hit rate over that run (delta of vllm:prefix_cache_hits_total over
vllm:prefix_cache_queries_total, both replicas summed). Before each run both replicas' prefix
caches are emptied (POST /reset_prefix_cache, vLLM's dev-mode endpoint), so no policy inherits
another's cache; the policies run in a rotated order each round, to spread any drift.

    .venv/bin/python bench/routing/run.py [--rounds 2] [--conversations 24] [--quick] [--workers N]

Writes bench/routing/results/routing.{md,json} (routing-workersN.{md,json} with --workers N > 1)
and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload  # noqa: E402

from gateway.load import parse_load  # noqa: E402
from tests.support.procs import Gateway, free_port  # noqa: E402
from tests.support.real_vllm import TINY_MODEL_DIR, start_real_vllm  # noqa: E402
from vllm_fleet.tinymodel import make_tiny_model  # noqa: E402

POLICIES = ["round_robin", "least_in_flight", "load_aware", "prefix_aware"]
MODEL = "tiny"
OUT = Path(__file__).resolve().parent / "results"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def one_turn(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]],
                   max_tokens: int) -> tuple[float, str]:
    """TTFT (s) and the answer's text."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0}
    t0 = time.perf_counter()
    ttft = None
    text: list[str] = []
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {await r.text()}")
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            data = line[6:].strip()
            if data == b"[DONE]":
                continue  # read on to the end of the response, as the openai SDK does
            for choice in json.loads(data).get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
    assert ttft is not None
    return ttft, "".join(text)


async def drive(url: str, convs: list[workload.Conversation], concurrency: int, max_tokens: int,
                limit_s: float) -> tuple[list[float], list[int], float]:
    """Each worker takes the next conversation and runs its turns, pausing between them."""
    queue: asyncio.Queue[workload.Conversation] = asyncio.Queue()
    for c in convs:
        c.messages = [{"role": "system", "content": c.system}]
        queue.put_nowait(c)
    ttfts: list[float] = []
    turns: list[int] = []
    deadline = time.monotonic() + limit_s
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=300)) as s:
        async def worker() -> None:
            while time.monotonic() < deadline:
                try:
                    c = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                for t in range(c.turns()):
                    c.messages.append({"role": "user", "content": c.next_user(t)})
                    ttft, answer = await one_turn(s, url, c.messages, max_tokens)
                    ttfts.append(ttft)
                    turns.append(t)
                    c.messages.append({"role": "assistant", "content": answer})
                    if t < len(c.think_s):
                        await asyncio.sleep(c.think_s[t])

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ttfts, turns, time.perf_counter() - t0


def cache_counters(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for u in urls:
        load = parse_load(httpx.get(u + "/metrics", timeout=10).content)
        hits += load.prefix_hits
        queries += load.prefix_queries
    return hits, queries


def reset_caches(urls: list[str]) -> None:
    for u in urls:
        for _ in range(50):
            r = httpx.post(u + "/reset_prefix_cache", timeout=10)
            if r.status_code == 200 and r.json().get("success", True) is not False:
                break
            time.sleep(0.1)  # blocks still held by a finishing request
        else:
            raise RuntimeError(f"{u} would not reset its prefix cache: {r.status_code} {r.text}")


def every_worker_ready(url: str, workers: int) -> None:
    """Each worker probes on its own: wait until answers on fresh connections, 3 per worker in a
    row, all see both replicas in rotation."""
    in_a_row, deadline = 0, time.monotonic() + 30
    while in_a_row < 3 * workers and time.monotonic() < deadline:
        fleet = httpx.get(url + "/fleet", headers={"connection": "close"}, timeout=5).json()
        in_a_row = in_a_row + 1 if all(b["healthy"] for b in fleet["backends"]) else 0
        time.sleep(0.05)


def run_policy(policy: str, kind: str, urls: list[str], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    convs = workload.build(kind, args.conversations, args.turns, args.system_prompts, args.system_chars,
                           args.document_chars, args.hot_share, args.think_s, args.seed)
    config = {"backend": "vllm", "vllm_instances": [
        {"host": u, "models": [MODEL], "name": f"replica-{i}"} for i, u in enumerate(urls)]}
    gw = Gateway(tmp, config, {"FLEET_ROUTING_POLICY": policy, "FLEET_LOG_LEVEL": "warning",
                               "FLEET_HEALTH_INTERVAL_S": "1"}, args=["--workers", str(args.workers)])
    try:
        every_worker_ready(gw.url, args.workers)
        reset_caches(urls)
        h0, q0 = cache_counters(urls)
        ttfts, turns, wall = asyncio.run(drive(gw.url, convs, args.concurrency, args.max_tokens, args.limit_s))
        h1, q1 = cache_counters(urls)
        decisions = [ln for ln in httpx.get(gw.url + "/metrics").text.splitlines()
                     if ln.startswith("fleet_routing_decisions_total{")]
        per_backend = [ln for ln in httpx.get(gw.url + "/metrics").text.splitlines()
                       if ln.startswith("fleet_requests_total{") and 'code="200"' in ln]
    finally:
        gw.stop()
    later = [x for x, t in zip(ttfts, turns, strict=True) if t > 0]
    return {
        "policy": policy, "workload": kind, "requests": len(ttfts), "wall_s": round(wall, 2),
        "ttft_p50_ms": round(1000 * pct(ttfts, 0.5), 1), "ttft_p99_ms": round(1000 * pct(ttfts, 0.99), 1),
        "ttft_mean_ms": round(1000 * statistics.fmean(ttfts), 1),
        "followup_ttft_p50_ms": round(1000 * pct(later, 0.5), 1) if later else None,
        "hit_rate": round((h1 - h0) / (q1 - q0), 4) if q1 > q0 else None,
        "prefix_queries": q1 - q0, "decisions": decisions, "per_backend": per_backend,
        "loadavg_1m_after": os.getloadavg()[0],  # the bench itself keeps ≈2 busy; well above means other work
    }


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| workload | policy | requests | TTFT p50 ms | TTFT p99 ms | follow-up TTFT p50 ms | prefix-cache hit rate "
           "| p50 vs round_robin |", "|---|---|---|---|---|---|---|---|"]
    for kind in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == kind]
        base = statistics.median(r["ttft_p50_ms"] for r in mine if r["policy"] == "round_robin")
        for policy in POLICIES:
            runs = [r for r in mine if r["policy"] == policy]
            if not runs:
                continue

            def med(key: str, runs: list[dict[str, Any]] = runs) -> float:
                return statistics.median(r[key] for r in runs if r[key] is not None)
            p50 = med("ttft_p50_ms")
            n = sum(r["requests"] for r in runs)
            out.append(f"| {kind} | {policy} | {n} | {p50:.1f} | {med('ttft_p99_ms'):.1f} "
                       f"| {med('followup_ttft_p50_ms'):.1f} | {med('hit_rate'):.1%} | {p50 / base - 1:+.0%} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workloads", default="uniform,skewed")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--conversations", type=int, default=32)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8, help="conversations open at once")
    p.add_argument("--think-s", type=float, default=1.0, help="mean pause between an answer and the next turn")
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--system-chars", type=int, default=2000)
    p.add_argument("--document-chars", type=int, default=12000)
    p.add_argument("--hot-share", type=float, default=0.8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--limit-s", type=float, default=240.0, help="bound on one policy's run")
    p.add_argument("--seed", type=int, default=8)
    p.add_argument("--kv-blocks", type=int, default=0,
                   help="vLLM's --num-gpu-blocks-override: a KV cache smaller than both replicas' working set")
    p.add_argument("--quick", action="store_true", help="1 round, 8 conversations: a smoke run")
    p.add_argument("--workers", type=int, default=1, help="gateway worker processes (--workers N)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.conversations = 1, 8
    policies = args.policies.split(",")
    model_dir = make_tiny_model(str(TINY_MODEL_DIR))
    tmp = Path(tempfile.mkdtemp(prefix="routing-bench-"))
    cpus = sorted(os.sched_getaffinity(0))
    servers = []
    rows: list[dict[str, Any]] = []
    try:
        for i in range(2):
            # One core each where there are two: the replicas must not share a core's compute.
            env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(cpus[i % len(cpus)])}
            extra = ["--num-gpu-blocks-override", str(args.kv_blocks)] if args.kv_blocks else []
            servers.append(start_real_vllm(model_dir, free_port(), [MODEL], extra, log_path=tmp / f"vllm-{i}.log",
                                           env=env))
        urls = [s.url for s in servers]
        for rnd in range(args.rounds):
            for kind in args.workloads.split(","):
                order = policies[rnd % len(policies):] + policies[:rnd % len(policies)]
                for policy in order:
                    row = run_policy(policy, kind, urls, args, tmp)
                    row["round"] = rnd
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k not in ("decisions", "per_backend")}),
                          flush=True)
    finally:
        for s in servers:
            s.stop()
    md = table(rows)
    settings = {k: v for k, v in vars(args).items() if k != "quick"}
    OUT.mkdir(exist_ok=True)
    name = "routing" if args.workers == 1 else f"routing-workers{args.workers}"
    (OUT / f"{name}.json").write_text(json.dumps({"settings": settings, "runs": rows}, indent=1))
    (OUT / f"{name}.md").write_text(f"Settings: `{json.dumps(settings)}`\n\n{md}\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the web console costs: the page in the browser, its polling on the gateway, and the hot path.

Runs a fleet of two fake vLLM instances under the real supervisor and gateway (tests/console's
fixture, keys on) and Debian's chromium through Playwright, then reports:

- first render (the page's ``fleet-first-render`` mark, ms from navigation start) over fresh loads,
  and the page weight (every response body of one load: HTML, JS, CSS, the first state JSON);
- one ``/ui/api/state`` poll: gateway CPU µs (utime+stime from /proc) and sequential polls/s;
- the proxy's hot path (non-streaming chat, 16 concurrent, the fake upstream) without and with
  ``--consoles`` simulated consoles polling as the page does (state each second, activity every
  two), alternated: requests/s and gateway CPU µs per request;
- the activity hook alone (begin, count, ttfb, end), in this process: µs per request.

    flock /tmp/fleet-cpu-heavy.lock .venv/bin/python bench/console.py [--consoles 10] [--seconds 8]

Writes bench/results/console.json. docs/console.md quotes a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.metrics import GatewayMetrics  # noqa: E402
from tests.console.conftest import ADMIN_KEY, CLIENT_KEY, chromium_path, start_fleet, stop_fleet  # noqa: E402

AUTH = {"Authorization": f"Bearer {CLIENT_KEY}"}
CHAT = {"model": "alpha-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def browser_figures(url: str, loads: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    assert exe, "no chromium on PATH (apt-get install chromium)"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe)
        renders, weight = [], {}
        for i in range(loads):
            ctx = browser.new_context()
            ctx.add_init_script(f"sessionStorage.setItem('fleet.key', {CLIENT_KEY!r})")
            page = ctx.new_page()
            sizes: dict[str, int] = {}
            if i == 0:
                page.on("response", lambda r, s=sizes: s.__setitem__(r.url.split("/", 3)[3], len(r.body())))
            page.goto(url + "/ui")
            page.wait_for_selector("body[data-rendered='1']")
            renders.append(page.evaluate("performance.getEntriesByName('fleet-first-render')[0].startTime"))
            if i == 0:
                weight = {k: v for k, v in sizes.items() if not k.startswith("ui/api/activity")}
            ctx.close()
        browser.close()
    return {"first_render_ms": {"median": statistics.median(renders), "max": max(renders), "min": min(renders),
                                "loads": loads},
            "page_weight_bytes": {**weight, "total": sum(weight.values())}}


async def poll_cost(url: str, gw_pid: int, n: int) -> dict[str, float]:
    async with aiohttp.ClientSession(headers=AUTH) as s:
        for _ in range(20):  # warm-up
            await (await s.get(url + "/ui/api/state")).read()
        c0, t0 = _cpu_seconds(gw_pid), time.perf_counter()
        size = 0
        for _ in range(n):
            size = len(await (await s.get(url + "/ui/api/state")).read())
        wall, cpu = time.perf_counter() - t0, _cpu_seconds(gw_pid) - c0
    return {"cpu_us_per_poll": cpu / n * 1e6, "polls_per_s_sequential": n / wall, "state_json_bytes": size}


async def _console(s: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> None:
    tick = 0
    while not stop.is_set():
        await (await s.get(url + "/ui/api/state")).read()
        if tick % 2 == 0:
            await (await s.get(url + "/ui/api/activity")).read()
        tick += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def hot_path(url: str, gw_pid: int, seconds: float, consoles: int) -> dict[str, float]:
    stop = asyncio.Event()
    done = 0
    async with aiohttp.ClientSession(headers=AUTH) as s:
        async def client() -> None:
            nonlocal done
            while not stop.is_set():
                async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
                    await r.read()
                    assert r.status == 200, r.status
                done += 1
        pollers = [asyncio.create_task(_console(s, url, stop)) for _ in range(consoles)]
        c0, t0 = _cpu_seconds(gw_pid), time.perf_counter()
        clients = [asyncio.create_task(client()) for _ in range(16)]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*clients, *pollers)
        wall, cpu = time.perf_counter() - t0, _cpu_seconds(gw_pid) - c0
    return {"consoles": consoles, "req_per_s": done / wall, "gateway_cpu_us_per_req": cpu / done * 1e6}


def hook_cost(n: int = 200_000) -> float:
    m = GatewayMetrics()
    a = m.activity
    t0 = time.perf_counter()
    for _ in range(n):
        e = a.begin()
        m.count("alpha-chat", "alpha", 200)
        m.observe_ttfb("alpha-chat", 0.01)
        a.end(e)
    per = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):  # the same metric calls without the hook's begin/end, as the baseline
        m.count("alpha-chat", "alpha", 200)
        m.observe_ttfb("alpha-chat", 0.01)
    return (per - (time.perf_counter() - t0) / n) * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--consoles", type=int, default=10)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--loads", type=int, default=10)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="console-bench-"))
    fleet = start_fleet(tmp, [{"name": "alpha", "model": "m-alpha", "served_model_names": ["alpha-chat"]},
                              {"name": "beta", "model": "m-beta"}], env={"FLEET_ADMIN_KEYS": ADMIN_KEY})
    try:
        fleet.wait_running()
        gw_pid = int(fleet.instances()["gateway"]["pid"])
        out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count()}
        out.update(browser_figures(fleet.gateway, args.loads))
        out["poll"] = asyncio.run(poll_cost(fleet.gateway, gw_pid, 500))
        runs = []
        for consoles in (0, args.consoles, 0, args.consoles):
            runs.append(asyncio.run(hot_path(fleet.gateway, gw_pid, args.seconds, consoles)))
        out["hot_path"] = runs
        out["activity_hook_us_per_req"] = hook_cost()
    finally:
        stop_fleet(fleet)
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "console.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""The supervisor side of the ``vllm-fleet`` subcommands; each returns the process exit code.

A ConfigError raised here is turned into exit 2 by the CLI, with its message naming the key.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

from fleet_supervisor.fleet import run_fleet
from fleet_supervisor.plan import describe, infernet_for, make_plan
from fleetspec.fleetfile import load_fleet
from fleetspec.gpus import discover_gpus

STATUS_TIMEOUT_S = 5.0


def cmd_up(path: str) -> int:
    fleet = load_fleet(path)
    plan = make_plan(fleet, discover_gpus(), str(path))
    return asyncio.run(run_fleet(plan))


def cmd_check(path: str) -> int:
    fleet = load_fleet(path)
    print(describe(make_plan(fleet, discover_gpus(), str(path))))
    return 0


def cmd_infernet_config(path: str) -> int:
    # No host check: this is also run next to a fleet that is up, whose ports are taken.
    print(json.dumps(infernet_for(load_fleet(path), discover_gpus()), indent=2))
    return 0


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def cmd_gpus() -> int:
    gpus = discover_gpus()
    if not gpus:
        print("no GPU found (NVML and nvidia-smi found none); device: cpu instances still work")
        return 0
    print(table(["index", "name", "memory total MiB", "memory used MiB", "tier", "uuid"],
                [[g.index, g.name, g.memory_total_mib, g.memory_used_mib, g.tier.value, g.uuid] for g in gpus]))
    return 0


def _get_json(url: str) -> dict[str, Any] | str:
    """The JSON body, or a one-line reason why there is none."""
    try:
        resp = httpx.get(url, timeout=STATUS_TIMEOUT_S)
    except httpx.HTTPError as e:
        return f"cannot reach {url}: {e}"
    if resp.status_code != 200:
        return f"{url} answered HTTP {resp.status_code}"
    try:
        body = resp.json()
    except ValueError:
        return f"{url} did not answer JSON"
    return body if isinstance(body, dict) else f"{url} answered {type(body).__name__}, not an object"


def _ago(since: object) -> str:
    return f"{time.time() - since:.0f}s" if isinstance(since, int | float) else "-"


def cmd_status(gateway_url: str, supervisor_url: str | None) -> int:
    code = 0
    fleet = _get_json(gateway_url.rstrip("/") + "/fleet")
    if isinstance(fleet, str):
        print(f"gateway: {fleet}", file=sys.stderr)
        code = 1
    else:
        print(f"gateway {gateway_url}  ready={fleet.get('ready')}  node vram tier={fleet.get('vram_tier')}")
        rows = [[b.get("name"), b.get("url"), ",".join(b.get("models") or []), b.get("healthy"), b.get("state"),
                 b.get("in_flight"), b.get("vram_tier"), b.get("last_error")] for b in fleet.get("backends") or []]
        print(table(["backend", "url", "models", "healthy", "state", "in flight", "tier", "last error"], rows))
    if supervisor_url:
        inst = _get_json(supervisor_url.rstrip("/") + "/instances")
        if isinstance(inst, str):
            print(f"supervisor: {inst}", file=sys.stderr)
            return 1
        rows = [[i.get("name"), i.get("state"), _ago(i.get("since")), i.get("pid"), i.get("restarts"), i.get("url"),
                 i.get("last_exit")] for i in inst.get("instances") or []]
        print()
        print(f"supervisor {supervisor_url}")
        print(table(["instance", "state", "for", "pid", "restarts", "url", "last exit"], rows))
    return code

"""The supervisor side of the ``vllm-fleet`` subcommands; each returns the process exit code.

A ConfigError raised here is turned into exit 2 by the CLI, with its message naming the key.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from fleet_supervisor.fleet import run_fleet
from fleet_supervisor.gateway_child import stored_admin_key
from fleet_supervisor.leftovers import settle
from fleet_supervisor.plan import describe, infernet_for, make_plan
from fleetspec.errors import ConfigError
from fleetspec.fleetfile import load_fleet
from fleetspec.gpus import discover_gpus

STATUS_TIMEOUT_S = 5.0


def _say(message: str) -> None:
    print(f"[fleet] {message}", flush=True)


def cmd_up(path: str) -> int:
    fleet = load_fleet(path)
    # Before the host check: what a killed earlier run left holds the very ports it checks.
    settle(fleet.supervisor, stop_them=True, say=_say)
    plan = make_plan(fleet, discover_gpus(), str(path))
    return asyncio.run(run_fleet(plan))


def cmd_check(path: str) -> int:
    fleet = load_fleet(path)
    settle(fleet.supervisor, stop_them=False, say=_say)
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


def admin_key_for(given: str | None, state_dir: str) -> str | None:
    """--admin-key, else FLEET_ADMIN_KEY, else the key `up` keeps in STATE_DIR/admin.key."""
    if given:
        return given
    if os.environ.get("FLEET_ADMIN_KEY"):
        return os.environ["FLEET_ADMIN_KEY"]
    return stored_admin_key(Path(state_dir))


def cmd_admin(gateway_url: str, name: str, action: str, key: str | None) -> int:
    """POST /admin/instances/NAME/ACTION on the gateway: 0 when done, 1 when refused."""
    url = f"{gateway_url.rstrip('/')}/admin/instances/{name}/{action}"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = httpx.post(url, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        print(f"cannot reach {url}: {e}", file=sys.stderr)
        return 1
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if resp.status_code == 200:
        print(body.get("message", "done"))
        return 0
    message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
    print(f"{action} {name}: HTTP {resp.status_code}: {message or resp.text[:200]}", file=sys.stderr)
    return 1


def cmd_reload(path: str, wait_s: float | None) -> int:
    """Check FILE here (exit 2 naming the key), then ask the running `up` of that fleet to apply it."""
    from fleet_supervisor.command import probe_host

    fleet = load_fleet(path)
    sup = fleet.supervisor
    if not sup.metrics_port:
        raise ConfigError(f"{path}: supervisor.metrics_port is 0, so the running fleet cannot be reached; "
                          "send SIGHUP to `vllm-fleet up` instead")
    url = f"http://{probe_host(sup.metrics_host)}:{sup.metrics_port}"
    key = admin_key_for(None, sup.state_dir) or os.environ.get("FLEET_ADMIN_KEYS", "").split(",")[0].strip()
    try:
        resp = httpx.post(url + "/reload", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    except httpx.HTTPError as e:
        print(f"cannot reach the running fleet at {url}: {e}", file=sys.stderr)
        return 1
    body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
    if resp.status_code == 400:
        raise ConfigError(str(body.get("error", resp.text)))
    if resp.status_code != 202:
        print(f"reload refused: HTTP {resp.status_code}: {body.get('error', resp.text[:200])}", file=sys.stderr)
        return 1
    for what in ("added", "removed", "changed", "unchanged"):
        print(f"{what:>9}: {', '.join(body.get(what) or []) or '-'}")
    for note in body.get("notes") or []:
        print(f"     note: {note}")
    if wait_s is None:
        return 0
    want = {i.name for i in fleet.instances}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        got = _get_json(url + "/instances")
        if isinstance(got, dict):
            states = {i["name"]: i["state"] for i in got.get("instances", []) if i.get("name") != "gateway"}
            if set(states) == want and all(s in ("RUNNING", "SLEEPING") for s in states.values()):
                print("applied: every instance is up")
                return 0
        time.sleep(0.5)
    print(f"not applied within {wait_s:g}s; `vllm-fleet status --supervisor-url {url}` shows where it is",
          file=sys.stderr)
    return 1


def cmd_status(gateway_url: str, supervisor_url: str | None) -> int:
    code = 0
    fleet = _get_json(gateway_url.rstrip("/") + "/fleet")
    if isinstance(fleet, str):
        print(f"gateway: {fleet}", file=sys.stderr)
        code = 1
    else:
        print(f"gateway {gateway_url}  ready={fleet.get('ready')}  node vram tier={fleet.get('vram_tier')}")
        rows = [[b.get("name"), b.get("url"), ",".join(b.get("models") or []), b.get("healthy"), b.get("state"),
                 b.get("supervisor_state"), b.get("in_flight"), b.get("vram_tier"), b.get("last_error")]
                for b in fleet.get("backends") or []]
        print(table(["backend", "url", "models", "healthy", "state", "instance", "in flight", "tier", "last error"],
                    rows))
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

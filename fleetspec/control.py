"""The control channel between the supervisor and the gateway (docs/architecture.md §3).

A WebSocket at ``GET /control`` on the supervisor's endpoint; each gateway worker holds one. The
supervisor owns instance state and sends it; the gateway owns requests and sends what it sees of
them (demand for sleeping models, activity, drain acknowledgements) and admin commands it was
given. Both sides import only this module of each other's vocabulary. Every message is a JSON
object with a ``type``; ``parse`` checks the fields each side relies on and raises ValueError
naming what is wrong, so a bad peer is logged and ignored rather than crashing a loop.
"""

from __future__ import annotations

import json
from typing import Any

PATH = "/control"
TOKEN_ENV = "FLEET_CONTROL_TOKEN"
URL_ENV = "FLEET_SUPERVISOR_URL"

# supervisor -> gateway
INSTANCES = "instances"  # {instances: [{name, state, epoch, url, models, wakes}]}
RESULT = "result"  # {id, ok, status, message}: status as HTTP: 200, 404 no such instance, 409 refused
# gateway -> supervisor
DEMAND = "demand"  # {model, waiting}: requests wait for a model with no awake replica
ACTIVITY = "activity"  # {in_flight: {instance: n}, last_request: {instance: unix time}, in_rotation: {instance: epoch}}
DRAINED = "drained"  # {instance, epoch}: nothing routed to it in that epoch, nothing in flight on it
COMMAND = "command"  # {id, instance, action}

ACTIONS = ("sleep", "wake", "restart")

# The supervisor's instance states the gateway acts on (fleet_supervisor/state.py has them all).
DRAINING = "DRAINING"
SLEEPING = "SLEEPING"
WAKING = "WAKING"
RUNNING = "RUNNING"

_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    INSTANCES: {"instances": list},
    RESULT: {"id": int, "ok": bool, "status": int, "message": str},
    DEMAND: {"model": str, "waiting": int},
    ACTIVITY: {"in_flight": dict, "last_request": dict, "in_rotation": dict},
    DRAINED: {"instance": str, "epoch": int},
    COMMAND: {"id": int, "instance": str, "action": str},
}
_INSTANCE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str, "state": str, "epoch": int, "url": str, "models": list, "wakes": bool,
}


def encode(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields})


def _check(doc: dict[str, Any], fields: dict[str, type | tuple[type, ...]], where: str) -> None:
    for key, typ in fields.items():
        value = doc.get(key)
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise ValueError(f"{where}: '{key}' must be {getattr(typ, '__name__', typ)}, got {value!r}")


def parse(text: str | bytes) -> dict[str, Any]:
    """One message, checked; ValueError says what is wrong with it."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"control message is not JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("type"), str):
        raise ValueError("control message must be an object with a 'type'")
    kind = doc["type"]
    fields = _FIELDS.get(kind)
    if fields is None:
        raise ValueError(f"unknown control message type {kind!r}")
    _check(doc, fields, kind)
    if kind == INSTANCES:
        for i, inst in enumerate(doc["instances"]):
            if not isinstance(inst, dict):
                raise ValueError(f"instances[{i}] must be an object")
            _check(inst, _INSTANCE_FIELDS, f"instances[{i}]")
    if kind == COMMAND and doc["action"] not in ACTIONS:
        raise ValueError(f"command: action must be one of {', '.join(ACTIONS)}, got {doc['action']!r}")
    return doc

"""The gateway as one more child of ``up``: its launch spec and supervision settings, and the
fleet's admin key that the spec carries."""

from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path

from fleet_supervisor.command import LaunchSpec, probe_host
from fleet_supervisor.hub import ControlHub
from fleet_supervisor.plan import Plan
from fleetspec import control
from fleetspec.fleetfile import SupervisorSection

_GATEWAY_STARTUP_S = 120.0  # the gateway needs no model; a long deadline would only hide a hang
ADMIN_KEY_FILE = "admin.key"


def gateway_supervision(sup: SupervisorSection) -> SupervisorSection:
    """The instances' supervision settings, with a start-up deadline fit for the gateway."""
    return sup.model_copy(update={"startup_timeout_s": min(sup.startup_timeout_s, _GATEWAY_STARTUP_S)})


def gateway_spec(plan: Plan, hub: ControlHub | None) -> LaunchSpec:
    """The gateway's launch spec, with the control channel's address and token when there is one,
    and an admin key (FLEET_ADMIN_KEYS wins; else .fleet/admin.key, made once, readable by its owner)."""
    spec = plan.gateway
    sup = plan.fleet.supervisor
    extra: dict[str, str] = {}
    if "FLEET_ADMIN_KEYS" not in spec.env:
        extra["FLEET_ADMIN_KEYS"] = admin_key(Path(sup.state_dir))
    if hub is not None:
        extra[control.URL_ENV] = f"http://{probe_host(sup.metrics_host)}:{sup.metrics_port}"
        extra[control.TOKEN_ENV] = hub.token
    return dataclasses.replace(spec, env={**spec.env, **extra})


def stored_admin_key(state_dir: Path) -> str | None:
    """The key kept in ``state_dir/admin.key``; None when there is none (or it cannot be read)."""
    try:
        return (state_dir / ADMIN_KEY_FILE).read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def admin_key(state_dir: Path) -> str:
    """The fleet's admin key: read from ``state_dir/admin.key``, or made there (mode 0600)."""
    key = stored_admin_key(state_dir)
    if key:
        return key
    path = state_dir / ADMIN_KEY_FILE
    state_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key + "\n")
    return key

"""The resolved plan: every child's exact argv and environment, the GPUs, the Infernet JSON.

``check`` prints it and ``up`` runs it, from the same object, so what ``check`` shows is what
``up`` does.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_supervisor.command import LaunchSpec, gateway_spec, instance_spec, sleep_mode
from fleet_supervisor.cpus import Placement, allowed_cpus, physical_cores, place
from fleet_supervisor.hostcheck import check_host
from fleet_supervisor.sleeplevel import available_ram_bytes, sleep_levels
from fleetspec.fleetfile import FleetFile
from fleetspec.gpus import Gpu
from fleetspec.infernet import backends_from_fleet, render_infernet

INFERNET_FILE = "infernet.json"


@dataclass(frozen=True)
class Plan:
    fleet: FleetFile
    source: str
    gpus: list[Gpu]
    instances: list[LaunchSpec]
    gateway: LaunchSpec
    infernet: dict[str, Any]
    infernet_path: Path
    placement: Placement


def infernet_for(fleet: FleetFile, gpus: list[Gpu]) -> dict[str, Any]:
    """The multi-instance Infernet JSON, with tiers from the memory NVML reports."""
    specs = backends_from_fleet(fleet, {g.index: g.memory_total_mib for g in gpus})
    return render_infernet(specs, fleet.vram_tier)


def make_plan(fleet: FleetFile, gpus: list[Gpu], source: str, env: Mapping[str, str] | None = None,
              *, check: bool = True, held: frozenset[int] = frozenset(), placement: Placement | None = None) -> Plan:
    """Resolve ``fleet`` for this host; with ``check`` raise ConfigError when it does not fit
    (``held``: ports the running fleet already listens on, for a live reload; ``placement``: the
    running fleet's CPUs, which a reload keeps because the gateway keeps its own until the next ``up``)."""
    if check:
        check_host(fleet, gpus, source, env, held)
    infernet_path = Path(fleet.supervisor.state_dir) / INFERNET_FILE
    levels = sleep_levels(fleet, [i for i in fleet.instances if sleep_mode(fleet, i) == "vllm"],
                          available_ram_bytes())
    if placement is None:
        allowed = allowed_cpus()
        placement = place(fleet, allowed, physical_cores(allowed))
    return Plan(
        fleet=fleet, source=source, gpus=gpus,
        instances=[dataclasses.replace(instance_spec(fleet, inst, env, levels.get(inst.name, (1, ""))),
                                       cpus=placement.instances) for inst in fleet.instances],
        gateway=dataclasses.replace(gateway_spec(fleet, infernet_path.resolve(), env), cpus=placement.gateway),
        infernet=infernet_for(fleet, gpus), infernet_path=infernet_path, placement=placement,
    )


def write_infernet(plan: Plan) -> Path:
    """Write atomically, so a gateway (re)reading it never sees half a file."""
    path = plan.infernet_path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(plan.infernet, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def _env_text(env: Mapping[str, str]) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) or "(inherited only)"


def _sleep_lines(spec: LaunchSpec) -> list[str]:
    s = spec.sleep
    if s is None:
        return []
    what = f"vLLM sleep mode, level {s.level} ({s.level_reason})" if s.mode == "vllm" else \
        "cold (the process is stopped, and started again on demand)"
    idle = f"after {s.cfg.idle_s:g}s idle" if s.cfg.idle_s else "only when another model needs the memory"
    return [f"  sleep:   {what}; share {s.share:g} of {', '.join(s.devices)}; sleeps {idle}; "
            f"{'preloaded' if s.cfg.preload else 'asleep after start-up'}"]


def describe(plan: Plan) -> str:
    """Human-readable plan for ``vllm-fleet check``: the command lines can be pasted into a shell."""
    fleet = plan.fleet
    by_index = {g.index: g for g in plan.gpus}
    tiers = {b["name"]: b["vram_tier"] for b in plan.infernet["vllm_instances"]}
    lines = [f"fleet file: {plan.source}  (valid)",
             f"GPUs on this host: {len(plan.gpus) or 'none'}"]
    for g in plan.gpus:
        lines.append(f"  [{g.index}] {g.name}  {g.memory_total_mib} MiB  {g.tier.value}  {g.uuid}")
    for inst, spec in zip(fleet.instances, plan.instances, strict=True):
        gpus = ", ".join(f"{i} ({by_index[i].name})" if i in by_index else str(i) for i in inst.gpus) or "none"
        lines += [
            "",
            f"instance {inst.name}",
            f"  model:   {inst.model}  served as {', '.join(inst.names)}",
            f"  device:  {inst.device}   GPUs: {gpus}   tp={inst.tp} pp={inst.pipeline_parallel_size}",
            f"  url:     {inst.url}   vram tier: {tiers.get(inst.name, 'unknown')}",
            f"  log:     {spec.log_path}",
            *_sleep_lines(spec),
            f"  env:     {_env_text(spec.env_overrides)}",
            f"  command: {shlex.join(spec.argv)}",
        ]
    gw = plan.gateway
    sup = fleet.supervisor
    metrics = f"http://{sup.metrics_host}:{sup.metrics_port}/metrics" if sup.metrics_port else "off"
    lines += [
        "",
        f"gateway  health {gw.health_url}",
        f"  env:     {_env_text(gw.env_overrides)}",
        f"  command: {shlex.join(gw.argv)}",
        f"  config:  {plan.infernet_path}  (node vram tier {plan.infernet['vram_tier']})",
        f"  cpus:    {plan.placement.describe()}",
        "",
        f"supervisor  metrics {metrics}  startup_timeout_s={sup.startup_timeout_s:g} "
        f"health_interval_s={sup.health_interval_s:g} health_failures={sup.health_failures} "
        f"stop_grace_s={sup.stop_grace_s:g} orphan_grace_s={sup.orphan_grace_s:g} "
        f"start_retries={sup.start_retries} start_secs={sup.start_secs:g} "
        f"backoff={sup.backoff_initial_s:g}..{sup.backoff_max_s:g}s",
    ]
    return "\n".join(lines)

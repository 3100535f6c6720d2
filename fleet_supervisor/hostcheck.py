"""Validation that depends on this host: do the GPUs exist, are the ports free, are the CPUs there.

fleetspec checks what a fleet file says; only the supervisor, which starts processes here, can
check it against the machine. Every problem names the instance and the key, and all of them are
reported at once so one ``vllm-fleet check`` shows everything to fix.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping

from fleet_supervisor.command import GATEWAY_CHILD, gateway_address
from fleet_supervisor.cpus import allowed_cpus
from fleet_supervisor.cpus import problems as cpu_problems
from fleetspec.errors import ConfigError
from fleetspec.fleetfile import FleetFile
from fleetspec.gpus import Gpu


def port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or None when it can.

    SO_REUSEADDR matches what uvicorn and aiohttp do, so a port in TIME_WAIT after a previous
    run counts as free, as it is for them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return "is already in use"
            return f"cannot be bound: {e.strerror or e}"
    return None


def host_problems(fleet: FleetFile, gpus: list[Gpu], env: Mapping[str, str] | None = None,
                  held: frozenset[int] = frozenset()) -> list[str]:
    """``held``: ports the running fleet listens on itself (a live reload), not a conflict."""
    problems: list[str] = []
    present = {g.index for g in gpus}
    have = ", ".join(str(i) for i in sorted(present)) if present else "none (no GPU found by NVML or nvidia-smi)"
    for i, inst in enumerate(fleet.instances):
        where = f"instances[{i}] ({inst.name})"
        if inst.name == GATEWAY_CHILD:
            problems.append(f"{where}.name: '{GATEWAY_CHILD}' is reserved for the gateway child; rename the instance")
        missing = [g for g in inst.gpus if g not in present] if inst.device == "cuda" else []
        if missing:
            problems.append(f"{where}.gpus: GPU {', '.join(map(str, missing))} does not exist on this host "
                            f"(GPUs here: {have}); use those indices (`vllm-fleet gpus` lists them)")
        if inst.port is not None and inst.port not in held:
            why = port_in_use("127.0.0.1", inst.port)
            if why:
                problems.append(f"{where}.port: port {inst.port} on 127.0.0.1 {why}; stop what listens there, or "
                                "choose another port (leave port out to get the next free one from base_port)")
    host, port = gateway_address(fleet, env)
    why = None if port in held else port_in_use(host, port)
    if why:
        source = "FLEET_PORT" if port != fleet.gateway.port else "gateway.port"
        problems.append(f"gateway.port: port {port} on {host} {why}; stop what listens there, or change "
                        f"{source}")
    problems += cpu_problems(fleet, allowed_cpus())
    sup = fleet.supervisor
    if sup.metrics_port:
        if sup.metrics_port == port or sup.metrics_port in {inst.port for inst in fleet.instances}:
            problems.append(f"supervisor.metrics_port: port {sup.metrics_port} is also used by the gateway "
                            "or an instance; choose another")
        elif sup.metrics_port not in held:
            why = port_in_use(sup.metrics_host, sup.metrics_port)
            if why:
                problems.append(f"supervisor.metrics_port: port {sup.metrics_port} on {sup.metrics_host} {why}; "
                                "choose another, or 0 to turn the supervisor's endpoint off")
    return problems


def check_host(fleet: FleetFile, gpus: list[Gpu], source: str, env: Mapping[str, str] | None = None,
               held: frozenset[int] = frozenset()) -> None:
    """Raise ConfigError (exit 2) listing every host problem of ``fleet``."""
    problems = host_problems(fleet, gpus, env, held)
    if problems:
        raise ConfigError(f"{source}: does not fit this host\n" + "\n".join(f"  {p}" for p in problems))

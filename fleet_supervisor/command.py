"""The command line and environment of each child: vLLM instances and the gateway.

Everything here is pure (no processes, no I/O) so ``vllm-fleet check`` can print exactly what
``vllm-fleet up`` would run.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fleetspec.fleetfile import FleetFile, Instance
from fleetspec.sleep import SleepSection, devices, share

GATEWAY_CHILD = "gateway"  # the gateway's name in logs, metrics and /instances
DEFAULT_GATEWAY_COMMAND = ["python", "-m", "gateway", "-c", "{config}"]
CPU_KVCACHE_GIB = "1"  # DESIGN §3: keeps the CPU build small; an instance env may raise it
# vLLM closes an idle connection after 5 s; the gateway that `up` starts keeps its connections to
# the instances open ahead of requests (gateway/warm.py), which only works if they stay open.
KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
KEEP_ALIVE_S = "3600"


@dataclass(frozen=True)
class SleepPlan:
    """How an instance with a ``sleep:`` block sleeps, resolved for this host (fleetspec/sleep.py)."""

    mode: str  # "vllm" (sleep mode endpoints) or "cold" (stop and start the process group)
    level: int  # vLLM sleep level (mode vllm)
    cfg: SleepSection
    devices: tuple[str, ...]  # budget keys: GPU indices, or "cpu"
    share: float
    level_reason: str = ""  # why this level, for `check`


@dataclass(frozen=True)
class LaunchSpec:
    """What it takes to start one child and to know that it is alive."""

    name: str
    argv: list[str]
    env: dict[str, str]  # the complete environment of the child, not a diff
    health_url: str
    log_path: Path
    env_overrides: dict[str, str]  # the part of ``env`` that the supervisor set, for ``check``
    models: tuple[str, ...] = ()  # served names (instances only)
    sleep: SleepPlan | None = None
    cpus: frozenset[int] | None = None  # the CPUs it and its children run on (cpus.py); None: every CPU


def sleep_mode(fleet: FleetFile, inst: Instance) -> str | None:
    """``vllm`` where vLLM's sleep mode can work (CUDA, vLLM as the command), else ``cold``."""
    if inst.sleep is None:
        return None
    if inst.sleep.mode != "auto":
        return inst.sleep.mode
    looks_like_vllm = any("vllm" in part for part in fleet.vllm_command)
    return "vllm" if inst.device == "cuda" and looks_like_vllm else "cold"


def resolve_python(argv: list[str]) -> list[str]:
    """A leading ``python``/``python3`` means this interpreter: the venv that has vLLM installed,
    not whichever python comes first on PATH."""
    if argv and argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return list(argv)


def vllm_argv(fleet: FleetFile, inst: Instance) -> list[str]:
    argv = resolve_python(fleet.vllm_command)
    argv += ["--model", inst.model, "--served-model-name", *inst.names]
    argv += ["--tensor-parallel-size", str(inst.tp), "--pipeline-parallel-size", str(inst.pipeline_parallel_size)]
    argv += ["--host", "127.0.0.1", "--port", str(inst.port)]
    # On the CPU build --gpu-memory-utilization is the fraction of *host* memory to reserve and
    # vLLM refuses to start when that much is not free; VLLM_CPU_KVCACHE_SPACE sizes the cache
    # instead. So a CPU instance passes it only when the fleet file sets it on purpose.
    if inst.device == "cuda" or "gpu_memory_utilization" in inst.model_fields_set:
        argv += ["--gpu-memory-utilization", str(inst.gpu_memory_utilization)]
    if inst.distributed_executor_backend is not None:
        argv += ["--distributed-executor-backend", inst.distributed_executor_backend]
    if sleep_mode(fleet, inst) == "vllm" and "--enable-sleep-mode" not in inst.vllm_args:
        argv.append("--enable-sleep-mode")
    return argv + list(inst.vllm_args)


def vllm_env_overrides(inst: Instance, mode: str | None = None) -> dict[str, str]:
    """Variables the supervisor sets for an instance; the instance's own ``env`` wins."""
    out: dict[str, str] = {}
    if mode == "vllm":
        out["VLLM_SERVER_DEV_MODE"] = "1"  # serves /sleep, /wake_up, /is_sleeping (on loopback only)
    if inst.device == "cpu":
        # An empty list hides every GPU, so a CPU instance never grabs one by accident.
        out["CUDA_VISIBLE_DEVICES"] = ""
        out["VLLM_CPU_KVCACHE_SPACE"] = CPU_KVCACHE_GIB
    else:
        # NVML numbers GPUs in PCI bus order; CUDA's default "fastest first" order may differ,
        # and then CUDA_VISIBLE_DEVICES would select GPUs other than the ones checked.
        out["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if not inst.uses_ray:
            out["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in inst.gpus)
        # With Ray the workers are actors that each raylet starts with the GPUs *it* was given at
        # `ray start` (vLLM never copies CUDA_VISIBLE_DEVICES to them), and the API server here
        # holds no GPU. Narrowing the API server's view would only skew vLLM's own GPU count check,
        # so the node's share is fixed where Ray reads it: `CUDA_VISIBLE_DEVICES=... ray start`.
    out.update(inst.env)
    return out


def instance_spec(fleet: FleetFile, inst: Instance, base_env: Mapping[str, str] | None = None,
                  sleep_level: tuple[int, str] = (1, "")) -> LaunchSpec:
    base = os.environ if base_env is None else base_env
    mode = sleep_mode(fleet, inst)
    overrides = vllm_env_overrides(inst, mode)
    if inst.uses_ray and "RAY_ADDRESS" not in base:
        # Join the cluster that `ray start` made, or fail at once: without an address ray.init()
        # would quietly start a one-node cluster and wait forever for the other nodes' GPUs.
        overrides.setdefault("RAY_ADDRESS", "auto")
    if KEEP_ALIVE_ENV not in base:
        overrides.setdefault(KEEP_ALIVE_ENV, KEEP_ALIVE_S)
    env = {**base, **overrides}
    return LaunchSpec(
        name=inst.name,
        argv=vllm_argv(fleet, inst),
        env=env,
        health_url=f"{inst.url}/health",
        log_path=Path(fleet.supervisor.log_dir) / f"{inst.name}.log",
        env_overrides=overrides,
        models=tuple(inst.names),
        sleep=None if inst.sleep is None or mode is None else SleepPlan(
            mode, sleep_level[0], inst.sleep, tuple(devices(inst)), share(inst), sleep_level[1]),
    )


def gateway_address(fleet: FleetFile, base_env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """Where the gateway will listen: FLEET_HOST/FLEET_PORT already in the environment win over
    the fleet file, because that is how the gateway itself reads them."""
    env = os.environ if base_env is None else base_env
    host = env.get("FLEET_HOST") or fleet.gateway.host
    port_text = env.get("FLEET_PORT")
    port = int(port_text) if port_text and port_text.isdigit() else fleet.gateway.port
    return host, port


def probe_host(host: str) -> str:
    """A wildcard listen address is reached through loopback."""
    if host in ("0.0.0.0", "", "*"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def gateway_spec(fleet: FleetFile, config_path: Path, base_env: Mapping[str, str] | None = None) -> LaunchSpec:
    base = dict(os.environ if base_env is None else base_env)
    host, port = gateway_address(fleet, base)
    template = fleet.gateway_command or DEFAULT_GATEWAY_COMMAND
    argv = [part.replace("{config}", str(config_path)) for part in resolve_python(template)]
    overrides = {k: v for k, v in (("FLEET_HOST", host), ("FLEET_PORT", str(port))) if base.get(k) != v}
    # The file's routing reaches the gateway (which reads infernet.json) as variables; a variable
    # the user set wins, as everywhere else.
    g = fleet.gateway
    if "routing_policy" in g.model_fields_set and "FLEET_ROUTING_POLICY" not in base:
        overrides["FLEET_ROUTING_POLICY"] = g.routing_policy.value
    if g.routing_policies and "FLEET_ROUTING_POLICIES" not in base:
        overrides["FLEET_ROUTING_POLICIES"] = json.dumps(g.routing_policies)
    # The Infernet JSON carries no gateway settings, so gateway.workers travels as a variable; one
    # already in the environment wins, as for host and port.
    if fleet.gateway.workers != 1 and "FLEET_WORKERS" not in base:
        overrides["FLEET_WORKERS"] = str(fleet.gateway.workers)
    # Its instances keep idle connections for KEEP_ALIVE_S, so it may open them ahead of requests.
    if "FLEET_UPSTREAM_WARM" not in base:
        overrides["FLEET_UPSTREAM_WARM"] = "true"
    return LaunchSpec(
        name=GATEWAY_CHILD,
        argv=argv,
        env={**base, **overrides},
        health_url=f"http://{probe_host(host)}:{port}/health",
        log_path=Path(fleet.supervisor.log_dir) / f"{GATEWAY_CHILD}.log",
        env_overrides=overrides,
    )

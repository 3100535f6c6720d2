"""The fleet file (DESIGN §2): which vLLM instances to run, on which GPUs and ports.

Parsing happens in two steps. Pydantic checks types and names the bad key; ``check_fleet`` then
checks the rules that span instances (unique names, disjoint GPUs, unique ports, parallel sizes),
again naming the instance and the key. Rules that depend on the host (do the GPUs exist, is the
port free) belong to the supervisor, which is the only one that starts anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleetspec.documents import load_document
from fleetspec.errors import ConfigError, from_validation_error
from fleetspec.policies import Policy
from fleetspec.tiers import VramTier

DEFAULT_VLLM_COMMAND = ["python", "-m", "vllm.entrypoints.openai.api_server"]


class _Strict(BaseModel):
    # Unknown keys are typos far more often than intent: reject them by name.
    model_config = ConfigDict(extra="forbid")


class GatewaySection(_Strict):
    host: str = "0.0.0.0"
    port: int = Field(8080, ge=1, le=65535)
    # The gateway's routing policy for every model, and per served name (gateway/routing.py).
    routing_policy: Policy = Policy.LEAST_IN_FLIGHT
    routing_policies: dict[str, Policy] = Field(default_factory=dict)
    workers: int = Field(1, ge=1, le=256)  # gateway server processes (README: what each keeps to itself)


class SupervisorSection(_Strict):
    """Lifecycle knobs, named after supervisord's where one exists."""

    startup_timeout_s: float = Field(900.0, gt=0)  # big models load for minutes
    health_interval_s: float = Field(5.0, gt=0)
    health_timeout_s: float = Field(5.0, gt=0)
    health_failures: int = Field(3, ge=1)  # failed probes in a row before a restart
    stop_grace_s: float = Field(30.0, ge=0)  # stopwaitsecs
    backoff_initial_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)
    start_retries: int = Field(5, ge=0)  # rapid failures in a row before FATAL
    start_secs: float = Field(60.0, ge=0)  # RUNNING this long resets the failure count
    log_dir: str = "logs"  # one <instance>.log per instance (and gateway.log), relative to the cwd
    state_dir: str = ".fleet"  # where `up` writes infernet.json for the gateway it launches
    progress_interval_s: float = Field(5.0, gt=0)  # `up` prints instance states this often while loading
    # The supervisor's own endpoint: /metrics (fleet_instance_*), /instances (JSON). 0 turns it off.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9400, ge=0, le=65535)


class Instance(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    model: str = Field(min_length=1)
    served_model_names: list[str] = Field(default_factory=list)
    gpus: list[int] = Field(default_factory=list)
    tensor_parallel_size: int | None = Field(None, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    port: int | None = Field(None, ge=1, le=65535)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    device: Literal["cuda", "cpu"] = "cuda"
    vllm_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    vram_tier: VramTier | None = None  # overrides the tier computed from the GPUs
    # "ray": the tensor x pipeline group may span nodes of a Ray cluster started beforehand with
    # `ray start` (deploy/ray/README.md); ``gpus`` is then only this node's share of it.
    # "mp" forces vLLM's single-node multiprocessing executor; None leaves the choice to vLLM.
    distributed_executor_backend: Literal["mp", "ray"] | None = None

    @property
    def uses_ray(self) -> bool:
        return self.distributed_executor_backend == "ray"

    @property
    def names(self) -> list[str]:
        return self.served_model_names or [self.model]

    @property
    def tp(self) -> int:
        if self.tensor_parallel_size is not None:
            return self.tensor_parallel_size
        if self.device == "cpu":
            return 1
        return max(1, len(self.gpus) // self.pipeline_parallel_size)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class FleetFile(_Strict):
    gateway: GatewaySection = Field(default_factory=lambda: GatewaySection())
    supervisor: SupervisorSection = Field(default_factory=lambda: SupervisorSection())
    vllm_command: list[str] = Field(default_factory=lambda: list(DEFAULT_VLLM_COMMAND), min_length=1)
    base_port: int = Field(8001, ge=1, le=65535)
    vram_tier: VramTier | None = None  # node tier override
    # argv of the gateway child; "{config}" is replaced by the Infernet JSON path.
    # None = [sys.executable, -m, gateway, -c, {config}]. Lets tests and other gateways plug in.
    gateway_command: list[str] | None = Field(None, min_length=1)
    instances: list[Instance] = Field(min_length=1)


def _where(i: int, inst: Instance, key: str) -> str:
    return f"instances[{i}] ({inst.name}).{key}"


def _ray_problems(i: int, inst: Instance) -> list[str]:
    """A Ray group is world size tp x pp over the whole cluster; this node holds part of it."""
    if inst.tensor_parallel_size is None:
        # The default (local GPUs / pp) is exactly what a group spanning nodes is not.
        return [f"{_where(i, inst, 'tensor_parallel_size')}: must be set for distributed_executor_backend: ray "
                "(the group spans nodes, so it cannot be derived from this node's gpus)"]
    world = inst.tp * inst.pipeline_parallel_size
    if world < len(inst.gpus):
        return [f"{_where(i, inst, 'tensor_parallel_size')}: tensor_parallel_size ({inst.tp}) x "
                f"pipeline_parallel_size ({inst.pipeline_parallel_size}) = {world} is less than this node's "
                f"share of the group (gpus: {len(inst.gpus)})"]
    return []


def check_fleet(fleet: FleetFile) -> list[str]:
    """Cross-instance rules; returns one message per violation, each naming instance and key."""
    problems: list[str] = []
    seen_names: dict[str, int] = {}
    gpu_owner: dict[int, str] = {}
    for i, inst in enumerate(fleet.instances):
        if inst.name in seen_names:
            problems.append(f"{_where(i, inst, 'name')}: duplicate name, also instances[{seen_names[inst.name]}]")
        seen_names.setdefault(inst.name, i)
        if inst.device == "cpu":
            if inst.uses_ray:
                problems.append(f"{_where(i, inst, 'distributed_executor_backend')}: ray needs device: cuda")
            if inst.gpus:
                problems.append(f"{_where(i, inst, 'gpus')}: must be empty for device: cpu")
            continue  # the CPU build may shard over sockets: its sizes are vLLM's business
        if not inst.gpus:
            problems.append(f"{_where(i, inst, 'gpus')}: device: cuda needs at least one GPU")
            continue
        if len(set(inst.gpus)) != len(inst.gpus):
            problems.append(f"{_where(i, inst, 'gpus')}: lists a GPU twice: {inst.gpus}")
        for g in inst.gpus:
            if g < 0:
                problems.append(f"{_where(i, inst, 'gpus')}: GPU index {g} is negative")
            elif g in gpu_owner and gpu_owner[g] != inst.name:
                problems.append(f"{_where(i, inst, 'gpus')}: GPU {g} is already used by instance '{gpu_owner[g]}'")
            gpu_owner.setdefault(g, inst.name)
        if inst.uses_ray:
            problems += _ray_problems(i, inst)
        elif inst.tp * inst.pipeline_parallel_size != len(inst.gpus):
            problems.append(
                f"{_where(i, inst, 'tensor_parallel_size')}: tensor_parallel_size ({inst.tp}) x "
                f"pipeline_parallel_size ({inst.pipeline_parallel_size}) must equal the number of gpus "
                f"({len(inst.gpus)})"
            )
    served = {n for inst in fleet.instances for n in inst.names}
    for name in fleet.gateway.routing_policies:
        if name not in served:
            problems.append(f"gateway.routing_policies.{name}: no instance serves a model of that name "
                            f"(served: {', '.join(sorted(served))})")
    ports: dict[int, str] = {fleet.gateway.port: "gateway.port"}
    for i, inst in enumerate(fleet.instances):
        if inst.port is None:
            continue
        if inst.port in ports:
            problems.append(f"{_where(i, inst, 'port')}: port {inst.port} is already used by {ports[inst.port]}")
        ports.setdefault(inst.port, _where(i, inst, "port"))
    return problems


def assign_ports(fleet: FleetFile) -> None:
    """Give each instance without a port the next free one counting up from ``base_port``."""
    taken = {fleet.gateway.port} | {inst.port for inst in fleet.instances if inst.port is not None}
    nxt = fleet.base_port
    for inst in fleet.instances:
        if inst.port is None:
            while nxt in taken:
                nxt += 1
            inst.port = nxt
            taken.add(nxt)


def parse_fleet(data: dict[str, Any], source: str = "fleet file") -> FleetFile:
    try:
        fleet = FleetFile.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(source, e) from e
    problems = check_fleet(fleet)
    if problems:
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(f"  {p}" for p in problems))
    assign_ports(fleet)
    return fleet


def load_fleet(path: str | Path) -> FleetFile:
    return parse_fleet(load_document(path), str(path))

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
from fleetspec.sleep import SleepSection, SwapSection, budget_problems
from fleetspec.tiers import VramTier

DEFAULT_VLLM_COMMAND = ["python", "-m", "vllm.entrypoints.openai.api_server"]


class _Strict(BaseModel):
    # Unknown keys are typos far more often than intent: reject them by name.
    model_config = ConfigDict(extra="forbid")


class GatewaySection(_Strict):
    host: str = Field("0.0.0.0", description="address the gateway listens on (FLEET_HOST wins)")
    port: int = Field(8080, ge=1, le=65535, description="port the gateway listens on (FLEET_PORT wins)")
    routing_policy: Policy = Field(Policy.LEAST_IN_FLIGHT, description="every model's routing policy "
                                   "(gateway/routing.py, docs/gateway.md#routing-policies)")
    routing_policies: dict[str, Policy] = Field(
        default_factory=dict, description="per served model name, a policy other than routing_policy; each name "
        "must be served by some instance")
    workers: int = Field(1, ge=1, le=256, description="gateway server processes sharing the port "
                         "(docs/gateway.md#several-gateway-workers: what each keeps to itself)")
    # The gateway on the CPUs that vLLM's busy API server and engine-core threads use slowed vLLM's
    # decoding on H200s at 512 streams; on CPUs of its own it did not (bench/gpu/results/serve-pin-h200-512).
    cpus: Literal["auto", "all"] | list[int] = Field(
        "auto", description="CPUs of its own for the gateway that `up` launches, the instances on the rest: auto "
        "gives it `workers` physical cores (the last ones) when every instance is device: cuda and that is at "
        "most a quarter of the cores this process may use; all: every process on every CPU; a list: these CPU "
        "ids for the gateway (`up` says the placement; a change applies at the next `up`)")


class SupervisorSection(_Strict):
    """Lifecycle knobs, named after supervisord's where one exists."""

    startup_timeout_s: float = Field(900.0, gt=0, description="STARTING must reach RUNNING (/health 200) within "
                                     "this; big models load for minutes")
    health_interval_s: float = Field(5.0, gt=0, description="seconds between /health probes while RUNNING "
                                     "(while STARTING: every 0.25 s at most)")
    health_timeout_s: float = Field(5.0, gt=0, description="deadline of one probe")
    health_failures: int = Field(3, ge=1, description="failed probes in a row before a restart")
    stop_grace_s: float = Field(30.0, ge=0, description="SIGTERM to the process group, this long, then SIGKILL to "
                                "the group (supervisord's stopwaitsecs)")
    orphan_grace_s: float = Field(3.0, ge=0, description="instead of stop_grace_s, if shorter, when the API server "
                                  "already died (a crash): nobody will shut its leftovers (EngineCore, workers) "
                                  "down, and the restart and their GPU memory wait for them")
    drain_stalled_s: float = Field(30.0, ge=0, description="a draining instance whose /metrics still says requests "
                                   "run or wait, with its token counters flat this long, counts as drained (vLLM "
                                   "with several API servers can leave its gauges up after cut streams); 0: wait "
                                   "for the gauges however long")
    backoff_initial_s: float = Field(1.0, ge=0, description="first restart delay; restart n waits initial × 2^(n−1)")
    backoff_max_s: float = Field(60.0, ge=0, description="cap of the restart delay")
    start_retries: int = Field(5, ge=0, description="FATAL (stays down) once rapid failures in a row exceed this")
    start_secs: float = Field(60.0, ge=0, description="a run RUNNING this long resets the rapid-failure count")
    log_dir: str = Field("logs", description="one <instance>.log per instance and gateway.log, relative to the "
                         "working directory")
    state_dir: str = Field(".fleet", description="where `up` writes infernet.json for the gateway it launches "
                           "(and admin.key), and processes.json: what it started, for the next `up` and `check` "
                           "to find if it is killed")
    progress_interval_s: float = Field(5.0, gt=0, description="`up` prints each loading instance's state and "
                                       "elapsed time this often")
    metrics_host: str = Field("127.0.0.1", description="address of the supervisor's endpoint: /metrics, "
                              "/instances, /health, /control, and /logs, /gpus for the web console")
    metrics_port: int = Field(9400, ge=0, le=65535, description="port of that endpoint; 0 turns it off (then no "
                              "instance may have a sleep: block)")


class Instance(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
                      description="unique; names its log file, its metrics series and its backend in the gateway")
    model: str = Field(min_length=1, description="passed to vLLM as --model (a Hugging Face id or a local path)")
    served_model_names: list[str] = Field(
        default_factory=list, description="--served-model-name: the names clients send as `model`; default [model]. "
        "Instances sharing a name are replicas of one model")
    gpus: list[int] = Field(default_factory=list, description="NVML indices of its GPU group: CUDA_VISIBLE_DEVICES; "
                            "disjoint from other instances' (unless both sleep); empty for device: cpu")
    tensor_parallel_size: int | None = Field(None, ge=1, description="default len(gpus) / pipeline_parallel_size; "
                                             "tensor × pipeline must equal len(gpus) (with ray: at least)")
    pipeline_parallel_size: int = Field(1, ge=1, description="vLLM's --pipeline-parallel-size")
    port: int | None = Field(None, ge=1, le=65535, description="its vLLM port on 127.0.0.1; default: the next free "
                             "one from base_port")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM's share of each GPU's memory (for "
                                          "device: cpu only passed when set: the CPU build reads it as host RAM)")
    device: Literal["cuda", "cpu"] = Field("cuda", description="cpu: the CPU build of vLLM, no GPUs")
    vllm_args: list[str] = Field(default_factory=list, description="more vLLM arguments, appended as given")
    env: dict[str, str] = Field(default_factory=dict, description="environment of the vLLM process; wins over "
                                "everything the supervisor sets")
    vram_tier: VramTier | None = Field(None, description="overrides the tier computed from its GPUs' memory")
    # "ray": the tensor x pipeline group may span nodes of a Ray cluster started beforehand with
    # `ray start`; ``gpus`` is then only this node's share of it.
    distributed_executor_backend: Literal["mp", "ray"] | None = Field(
        None, description="ray: the tensor × pipeline group may span the nodes of a Ray cluster (deploy/ray/README.md) "
        "and gpus is this node's share; mp: vLLM's single-node executor; null: vLLM chooses")
    # Instances may share a GPU only when each has one (fleetspec/sleep.py).
    sleep: SleepSection | None = Field(None, description="how it gives its memory back when idle, so that more "
                                       "models than memory can be served (the sleep section below)")

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
    gateway: GatewaySection = Field(default_factory=lambda: GatewaySection(),
                                    description="the gateway's listener, workers and routing (section below)")
    supervisor: SupervisorSection = Field(default_factory=lambda: SupervisorSection(),
                                          description="lifecycle knobs of the supervisor (section below)")
    vllm_command: list[str] = Field(default_factory=lambda: list(DEFAULT_VLLM_COMMAND), min_length=1,
                                    description="argv prefix of every instance; a leading python/python3 is the "
                                    "interpreter running vllm-fleet")
    base_port: int = Field(8001, ge=1, le=65535, description="instances without a port get the next free one "
                           "counting up from here")
    vram_tier: VramTier | None = Field(None, description="node tier override; default: the largest instance tier")
    # Lets tests and other gateways plug in.
    gateway_command: list[str] | None = Field(
        None, min_length=1, description="argv of the gateway child; {config} is replaced by the Infernet JSON path; "
        "null: [python, -m, gateway, -c, {config}]")
    swap: SwapSection = Field(default_factory=lambda: SwapSection(),
                              description="memory budget of instances with a sleep: block (section below)")
    instances: list[Instance] = Field(min_length=1, description="the vLLM servers to run (section below)")


def _where(i: int, inst: Instance, key: str) -> str:
    return f"instances[{i}] ({inst.name}).{key}"


def arg_value(args: list[str], *flags: str) -> str | None:
    """The value vLLM's parser would take for ``flags`` from ``args`` (``--flag v`` or ``--flag=v``;
    the last one given wins, as with argparse), or None when none is given."""
    value = None
    for i, a in enumerate(args):
        for flag in flags:
            if a.startswith(flag + "="):
                value = a.split("=", 1)[1]
            elif a == flag and i + 1 < len(args):
                value = args[i + 1]
    return value


def _api_server_problems(i: int, inst: Instance, command: list[str]) -> list[str]:
    """vLLM's `api_server` module runs one API server whatever --api-server-count says (0.24-0.32);
    only the `vllm serve` CLI starts more. Asking for more and silently getting one would hide the
    setting that lifts its CPU limit at high concurrency (README, Limits), so say so."""
    count = arg_value(inst.vllm_args, "--api-server-count", "-asc")
    if count is None or not count.isdigit() or int(count) <= 1 or \
            "vllm.entrypoints.openai.api_server" not in command:
        return []
    return [f"{_where(i, inst, 'vllm_args')}: --api-server-count {count} needs the `vllm serve` CLI; "
            "vllm.entrypoints.openai.api_server (the vllm_command) starts one API server whatever it is "
            "given; set vllm_command: [python, -m, vllm.entrypoints.cli.main, serve] or remove "
            "--api-server-count"]


def _ray_problems(i: int, inst: Instance) -> list[str]:
    """A Ray group is world size tp x pp over the whole cluster; this node holds part of it."""
    if inst.tensor_parallel_size is None:
        # The default (local GPUs / pp) is exactly what a group spanning nodes is not.
        return [f"{_where(i, inst, 'tensor_parallel_size')}: must be set for distributed_executor_backend: ray "
                "(the group spans nodes, so it cannot be derived from this node's gpus); set it to the group's "
                "tensor parallel size"]
    world = inst.tp * inst.pipeline_parallel_size
    if world < len(inst.gpus):
        return [f"{_where(i, inst, 'tensor_parallel_size')}: tensor_parallel_size ({inst.tp}) x "
                f"pipeline_parallel_size ({inst.pipeline_parallel_size}) = {world} is less than this node's "
                f"share of the group (gpus: {len(inst.gpus)}); raise the sizes or list fewer gpus"]
    return []


def check_fleet(fleet: FleetFile) -> list[str]:
    """Cross-instance rules; returns one message per violation, each naming instance and key."""
    problems: list[str] = []
    seen_names: dict[str, int] = {}
    gpu_owner: dict[int, str] = {}
    sleepers = {inst.name: inst.sleep is not None for inst in fleet.instances}
    for i, inst in enumerate(fleet.instances):
        if inst.name in seen_names:
            problems.append(f"{_where(i, inst, 'name')}: duplicate name, also instances[{seen_names[inst.name]}]; "
                            "give each instance its own name (replicas share served_model_names, not name)")
        seen_names.setdefault(inst.name, i)
        problems += _api_server_problems(i, inst, fleet.vllm_command)
        if inst.device == "cpu":
            if inst.uses_ray:
                problems.append(f"{_where(i, inst, 'distributed_executor_backend')}: ray needs device: cuda; "
                                "remove distributed_executor_backend or set device: cuda")
            if inst.gpus:
                problems.append(f"{_where(i, inst, 'gpus')}: must be empty for device: cpu; remove gpus or set "
                                "device: cuda")
            continue  # the CPU build may shard over sockets: its sizes are vLLM's business
        if not inst.gpus:
            problems.append(f"{_where(i, inst, 'gpus')}: device: cuda needs at least one GPU; list them "
                            "(gpus: [0]; `vllm-fleet gpus` shows the indices) or set device: cpu")
            continue
        if len(set(inst.gpus)) != len(inst.gpus):
            problems.append(f"{_where(i, inst, 'gpus')}: lists a GPU twice: {inst.gpus}; list each GPU once")
        for g in inst.gpus:
            if g < 0:
                problems.append(f"{_where(i, inst, 'gpus')}: GPU index {g} is negative; use the indices "
                                "`vllm-fleet gpus` shows")
            elif g in gpu_owner and gpu_owner[g] != inst.name and not (inst.sleep and sleepers[gpu_owner[g]]):
                problems.append(f"{_where(i, inst, 'gpus')}: GPU {g} is already used by instance '{gpu_owner[g]}' "
                                "(instances share a GPU only when each has a sleep: block); give it other gpus, or "
                                "both a sleep: block (docs/fleet-file.md)")
            gpu_owner.setdefault(g, inst.name)
        if inst.uses_ray:
            problems += _ray_problems(i, inst)
        elif inst.tp * inst.pipeline_parallel_size != len(inst.gpus):
            problems.append(
                f"{_where(i, inst, 'tensor_parallel_size')}: tensor_parallel_size ({inst.tp}) x "
                f"pipeline_parallel_size ({inst.pipeline_parallel_size}) must equal the number of gpus "
                f"({len(inst.gpus)}); change the sizes or the gpus, or leave tensor_parallel_size out to get "
                f"len(gpus) / pipeline_parallel_size"
            )
    served = {n for inst in fleet.instances for n in inst.names}
    for name in fleet.gateway.routing_policies:
        if name not in served:
            problems.append(f"gateway.routing_policies.{name}: no instance serves a model of that name "
                            f"(served: {', '.join(sorted(served))}); use one of those names or remove it")
    problems += budget_problems(fleet.instances, fleet.swap)
    if fleet.supervisor.metrics_port == 0:
        problems += [f"{_where(i, inst, 'sleep')}: needs the supervisor's endpoint (supervisor.metrics_port is 0): "
                     "the gateway asks it for wake-ups there; set supervisor.metrics_port (default 9400) or remove "
                     "the sleep: block" for i, inst in enumerate(fleet.instances) if inst.sleep]
    ports: dict[int, str] = {fleet.gateway.port: "gateway.port"}
    for i, inst in enumerate(fleet.instances):
        if inst.port is None:
            continue
        if inst.port in ports:
            problems.append(f"{_where(i, inst, 'port')}: port {inst.port} is already used by {ports[inst.port]}; "
                            "choose another, or leave port out to get the next free one from base_port")
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
        raise from_validation_error(source, e, FleetFile) from e
    problems = check_fleet(fleet)
    if problems:
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(f"  {p}" for p in problems))
    assign_ports(fleet)
    return fleet


def load_fleet(path: str | Path) -> FleetFile:
    return parse_fleet(load_document(path), str(path))

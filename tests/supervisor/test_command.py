"""Command lines, environments, backoff curve and state table: pure functions, no processes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_supervisor.command import gateway_spec, instance_spec, resolve_python
from fleet_supervisor.instance import backoff_delay
from fleet_supervisor.state import TRANSITIONS, State, TransitionError, check_transition
from fleetspec.fleetfile import SupervisorSection, parse_fleet


def fleet(**top: Any) -> Any:
    doc = {"instances": [
        {"name": "big", "model": "org/Big", "gpus": [2, 3], "served_model_names": ["big:1", "big"],
         "vllm_args": ["--max-model-len", "4096"], "env": {"CUDA_DEVICE_ORDER": "FASTEST_FIRST", "HF_HOME": "/m"}},
        {"name": "cpu", "model": "tiny", "device": "cpu"},
        {"name": "cpu2", "model": "tiny", "device": "cpu", "gpu_memory_utilization": 0.3,
         "env": {"VLLM_CPU_KVCACHE_SPACE": "4"}},
    ], **top}
    return parse_fleet(doc)


def test_cuda_instance_argv_and_env() -> None:
    f = fleet(vllm_command=["python3", "-m", "vllm.entrypoints.openai.api_server"])
    spec = instance_spec(f, f.instances[0], base_env={"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert spec.argv == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "org/Big",
                         "--served-model-name", "big:1", "big", "--tensor-parallel-size", "2",
                         "--pipeline-parallel-size", "1", "--host", "127.0.0.1", "--port", "8001",
                         "--gpu-memory-utilization", "0.9", "--max-model-len", "4096"]
    # The group replaces whatever the parent saw; the instance's own env wins over the supervisor's.
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert spec.env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    assert spec.env["HF_HOME"] == "/m" and spec.env["PATH"] == "/bin"
    assert spec.health_url == "http://127.0.0.1:8001/health"
    assert spec.log_path == Path("logs/big.log")


def test_cpu_instance_gets_the_cpu_build_settings() -> None:
    f = fleet()
    spec = instance_spec(f, f.instances[1], base_env={})
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "", "VLLM_CPU_KVCACHE_SPACE": "1",
                        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "3600"}
    assert "--gpu-memory-utilization" not in spec.argv  # on the CPU build it reserves host memory
    assert spec.argv[spec.argv.index("--tensor-parallel-size") + 1] == "1"
    explicit = instance_spec(f, f.instances[2], base_env={})
    assert explicit.env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert explicit.argv[explicit.argv.index("--gpu-memory-utilization") + 1] == "0.3"


def test_instances_keep_idle_connections_and_the_gateway_warms_them() -> None:
    f = fleet()
    assert instance_spec(f, f.instances[0], base_env={}).env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "3600"
    mine = instance_spec(f, f.instances[0], base_env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "30"})
    assert mine.env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "30"  # what the user exported wins
    assert gateway_spec(f, Path("/x.json"), base_env={}).env_overrides["FLEET_UPSTREAM_WARM"] == "true"
    off = gateway_spec(f, Path("/x.json"), base_env={"FLEET_UPSTREAM_WARM": "false"})
    assert off.env["FLEET_UPSTREAM_WARM"] == "false" and "FLEET_UPSTREAM_WARM" not in off.env_overrides


def test_python_is_this_interpreter_only_when_leading() -> None:
    assert resolve_python(["python", "-m", "x"]) == [sys.executable, "-m", "x"]
    assert resolve_python(["/usr/bin/python", "python"]) == ["/usr/bin/python", "python"]


def test_gateway_spec_env_and_config_path() -> None:
    f = fleet(gateway={"host": "0.0.0.0", "port": 9090})
    spec = gateway_spec(f, Path("/run/fleet/infernet.json"), base_env={"PATH": "/bin"})
    assert spec.argv == [sys.executable, "-m", "gateway", "-c", "/run/fleet/infernet.json"]
    assert spec.env["FLEET_HOST"] == "0.0.0.0" and spec.env["FLEET_PORT"] == "9090"
    assert spec.health_url == "http://127.0.0.1:9090/health"
    # What the user exported wins, and the probe follows it.
    user = gateway_spec(f, Path("/x.json"), base_env={"FLEET_PORT": "7070"})
    assert user.env["FLEET_PORT"] == "7070" and user.health_url.endswith(":7070/health")
    assert "FLEET_ROUTING_POLICY" not in spec.env  # unset in the file: the gateway's default applies
    routed = fleet(gateway={"routing_policy": "load_aware", "routing_policies": {"tiny": "prefix_aware"}})
    env = gateway_spec(routed, Path("/x.json"), base_env={"FLEET_ROUTING_POLICY": "round_robin"}).env
    assert env["FLEET_ROUTING_POLICY"] == "round_robin"  # the variable wins
    assert env["FLEET_ROUTING_POLICIES"] == '{"tiny": "prefix_aware"}'
    custom = gateway_spec(fleet(gateway_command=["my-gw", "--config={config}"]), Path("/c.json"), base_env={})
    assert custom.argv == ["my-gw", "--config=/c.json"]


def test_gateway_workers_travel_as_a_variable() -> None:
    assert "FLEET_WORKERS" not in gateway_spec(fleet(), Path("/x.json"), base_env={}).env_overrides
    spec = gateway_spec(fleet(gateway={"workers": 4}), Path("/x.json"), base_env={})
    assert spec.env_overrides["FLEET_WORKERS"] == "4" and spec.env["FLEET_WORKERS"] == "4"
    user = gateway_spec(fleet(gateway={"workers": 4}), Path("/x.json"), base_env={"FLEET_WORKERS": "2"})
    assert user.env["FLEET_WORKERS"] == "2" and "FLEET_WORKERS" not in user.env_overrides


def test_backoff_is_exponential_and_capped() -> None:
    cfg = SupervisorSection(backoff_initial_s=0.5, backoff_max_s=5)
    assert [backoff_delay(cfg, n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_state_table() -> None:
    check_transition(State.STARTING, State.RUNNING)
    with pytest.raises(TransitionError):
        check_transition(State.FATAL, State.STARTING)
    with pytest.raises(TransitionError):
        check_transition(State.RUNNING, State.BACKOFF)  # always through EXITED: the group is stopped first
    assert set(TRANSITIONS) == set(State)

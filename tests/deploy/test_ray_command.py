"""A Ray instance (distributed_executor_backend: ray): its validation, its command line and its
environment, as the supervisor builds them (fleet_supervisor.command), and the host check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_supervisor.command import instance_spec, vllm_argv
from fleet_supervisor.hostcheck import host_problems
from fleet_supervisor.plan import describe, make_plan
from fleetspec.errors import ConfigError
from fleetspec.fleetfile import load_fleet, parse_fleet
from fleetspec.gpus import Gpu
from tests.deploy.tools import DEPLOY, REPO
from tests.support.procs import free_port


def ray_doc(**inst: Any) -> dict[str, Any]:
    base = {"name": "big", "model": "org/Big", "gpus": [0, 1, 2, 3], "distributed_executor_backend": "ray",
            "tensor_parallel_size": 4, "pipeline_parallel_size": 2, "port": 8001}
    base.update(inst)
    return {"instances": [{k: v for k, v in base.items() if v is not None}]}


def test_group_may_span_nodes_and_the_argv_asks_vllm_for_ray() -> None:
    fleet = parse_fleet(ray_doc())
    inst = fleet.instances[0]
    argv = vllm_argv(fleet, inst)
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert argv.count("--distributed-executor-backend") == 1
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_ray_env_leaves_gpu_placement_to_ray_and_joins_the_running_cluster() -> None:
    fleet = parse_fleet(ray_doc(env={"NCCL_SOCKET_IFNAME": "eth0"}))
    spec = instance_spec(fleet, fleet.instances[0], base_env={"PATH": "/bin"})
    # The raylets own GPU placement (`CUDA_VISIBLE_DEVICES=... ray start`); the API server here
    # must not narrow its view, and an inherited value is passed through untouched.
    assert "CUDA_VISIBLE_DEVICES" not in spec.env_overrides
    assert spec.env == {"PATH": "/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "RAY_ADDRESS": "auto",
                        "NCCL_SOCKET_IFNAME": "eth0", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "3600"}
    inherited = instance_spec(fleet, fleet.instances[0], base_env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert inherited.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "CUDA_VISIBLE_DEVICES" not in inherited.env_overrides


def test_ray_address_from_the_environment_or_the_instance_wins() -> None:
    fleet = parse_fleet(ray_doc())
    spec = instance_spec(fleet, fleet.instances[0], base_env={"RAY_ADDRESS": "10.0.0.1:6379"})
    assert spec.env["RAY_ADDRESS"] == "10.0.0.1:6379" and "RAY_ADDRESS" not in spec.env_overrides
    fleet = parse_fleet(ray_doc(env={"RAY_ADDRESS": "ray://head:10001"}))
    spec = instance_spec(fleet, fleet.instances[0], base_env={"RAY_ADDRESS": "10.0.0.1:6379"})
    assert spec.env["RAY_ADDRESS"] == "ray://head:10001"


def test_mp_and_unset_backends() -> None:
    fleet = parse_fleet({"instances": [
        {"name": "a", "model": "m", "gpus": [0, 1], "distributed_executor_backend": "mp"},
        {"name": "b", "model": "m", "gpus": [2]},
    ]})
    a, b = (instance_spec(fleet, i, base_env={}) for i in fleet.instances)
    assert a.argv[a.argv.index("--distributed-executor-backend") + 1] == "mp"
    assert a.env["CUDA_VISIBLE_DEVICES"] == "0,1" and "RAY_ADDRESS" not in a.env
    assert "--distributed-executor-backend" not in b.argv and b.env["CUDA_VISIBLE_DEVICES"] == "2"


@pytest.mark.parametrize(("inst", "key", "words"), [
    ({"tensor_parallel_size": None}, "instances[0] (big).tensor_parallel_size", "must be set"),
    ({"tensor_parallel_size": 1, "pipeline_parallel_size": 2}, "instances[0] (big).tensor_parallel_size",
     "is less than this node's share"),
    ({"device": "cpu", "gpus": []}, "instances[0] (big).distributed_executor_backend", "needs device: cuda"),
    ({"gpus": []}, "instances[0] (big).gpus", "at least one GPU"),
    ({"distributed_executor_backend": "nccl"}, "instances[0].distributed_executor_backend", "'mp' or 'ray'"),
    # Without ray the old rule stands: the group is exactly the local GPUs.
    ({"distributed_executor_backend": "mp"}, "instances[0] (big).tensor_parallel_size", "must equal"),
])
def test_invalid_combinations_name_the_key(inst: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_fleet(ray_doc(**inst))
    assert key in str(err.value) and words in str(err.value), str(err.value)


def test_gpus_of_another_instance_are_still_refused() -> None:
    with pytest.raises(ConfigError, match=r"instances\[1\] \(small\)\.gpus: GPU 3 is already used by instance 'big'"):
        parse_fleet({"instances": [ray_doc()["instances"][0],
                                   {"name": "small", "model": "m", "gpus": [3], "port": 8002}]})


def test_cli_check_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(ray_doc(tensor_parallel_size=None)))
    done = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "check", "-c", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "instances[0] (big).tensor_parallel_size: must be set for distributed_executor_backend: ray" in done.stderr


def gpus(n: int) -> list[Gpu]:
    return [Gpu(i, "NVIDIA H100 80GB HBM3", f"GPU-{i}", 81559, 0) for i in range(n)]


def test_host_check_accepts_a_group_larger_than_this_node() -> None:
    doc = ray_doc(port=free_port())
    doc["gateway"] = {"host": "127.0.0.1", "port": free_port()}
    doc["supervisor"] = {"metrics_port": 0}
    fleet = parse_fleet(doc)
    assert host_problems(fleet, gpus(4), env={}) == []
    # This node's share must still exist here.
    assert host_problems(fleet, gpus(2), env={}) == [
        "instances[0] (big).gpus: GPU 2, 3 does not exist on this host (GPUs here: 0, 1); use those indices "
        "(`vllm-fleet gpus` lists them)"]


def test_the_shipped_example_resolves_to_the_documented_command() -> None:
    fleet = load_fleet(DEPLOY / "ray" / "fleet-ray.yaml")
    plan = make_plan(fleet, gpus(4), "fleet-ray.yaml", env={}, check=False)
    spec = plan.instances[0]
    assert fleet.instances[0].uses_ray
    text = describe(plan)
    assert "--tensor-parallel-size 4 --pipeline-parallel-size 2" in text
    assert "--distributed-executor-backend ray" in text
    assert spec.env_overrides["RAY_ADDRESS"] == "auto" and "CUDA_VISIBLE_DEVICES" not in spec.env_overrides
    assert plan.infernet["vram_tier"] == ">=48gb"
    guide = (DEPLOY / "ray" / "README.md").read_text()
    for step in ("ray start --head", "ray start --address", "ray status",
                 "vllm-fleet check -c deploy/ray/fleet-ray.yaml", "vllm-fleet up -c deploy/ray/fleet-ray.yaml"):
        assert step in guide, step

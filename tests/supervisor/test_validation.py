"""Every fleet-file violation exits 2 through the real CLI, with a message naming instance and key."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetspec.fleetfile import Instance, arg_value
from fleetspec.gpus import Gpu
from fleetspec.infernet import max_num_seqs
from tests.supervisor.conftest import fleet_doc, free_port
from vllm_fleet.cli import main

FOUR_GPUS = [Gpu(i, "NVIDIA H200", f"GPU-{i:04d}", 143771, 0) for i in range(4)]


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> list[Gpu]:
    """A host with four 140 GB GPUs, as far as the supervisor can tell."""
    found = list(FOUR_GPUS)
    monkeypatch.setattr("fleet_supervisor.commands.discover_gpus", lambda: found)
    return found


def write(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def run_check(tmp_path: Path, doc: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["check", "-c", write(tmp_path, doc)])
    out, err = capsys.readouterr()
    return code, out, err


def cuda(name: str, gpus: list[int], **kw: Any) -> dict[str, Any]:
    return {"name": name, "model": f"org/{name}", "device": "cuda", "gpus": gpus, **kw}


@pytest.mark.parametrize(("instances", "needle"), [
    ([cuda("a", [0]), cuda("a", [1])], "instances[1] (a).name: duplicate name"),
    ([cuda("a", [0, 1]), cuda("b", [1, 2])], "instances[1] (b).gpus: GPU 1 is already used by instance 'a'"),
    ([cuda("a", [0, 1], tensor_parallel_size=1)], "instances[0] (a).tensor_parallel_size"),
    ([cuda("a", [0, 1, 2], tensor_parallel_size=2, pipeline_parallel_size=2)], "(a).tensor_parallel_size"),
    ([cuda("a", [0], port=8101), cuda("b", [1], port=8101)], "instances[1] (b).port: port 8101 is already used"),
    ([cuda("a", [7])], "instances[0] (a).gpus: GPU 7 does not exist on this host"),
    ([{"name": "c", "model": "m", "device": "cpu", "gpus": [0]}],
     "instances[0] (c).gpus: must be empty for device: cpu"),
    ([cuda("gateway", [0])], "instances[0] (gateway).name"),
    ([cuda("a", [0], tensor_parallel_size=0)], "instances[0].tensor_parallel_size"),
    ([cuda("a", [0], colour="red")], "instances[0].colour"),
])
def test_violation_exits_2_naming_the_key(tmp_path: Path, gpus: list[Gpu], capsys: pytest.CaptureFixture[str],
                                          instances: list[dict[str, Any]], needle: str) -> None:
    doc = fleet_doc(tmp_path, [])
    doc["instances"] = [{"port": free_port(), **inst} for inst in instances]
    code, _, err = run_check(tmp_path, doc, capsys)
    assert code == 2, err
    assert needle in err


def test_api_server_count_runs_under_vllm_serve(tmp_path: Path, gpus: list[Gpu],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The `vllm serve` CLI starts --api-server-count API servers, so the same arguments pass
    there and reach vLLM's command line as given; one API server needs no CLI."""
    doc = fleet_doc(tmp_path, [cuda("a", [0], vllm_args=["--api-server-count", "2"]),
                               cuda("b", [1], vllm_args=["--api-server-count=1"]),
                               cuda("c", [2], vllm_args=["-asc=4"])])
    doc["vllm_command"] = ["python", "-m", "vllm.entrypoints.openai.api_server"]  # the default
    code, _, err = run_check(tmp_path, doc, capsys)
    assert code == 2
    assert "instances[0] (a).vllm_args: --api-server-count 2 needs the `vllm serve` CLI" in err
    assert "instances[2] (c).vllm_args: --api-server-count 4 needs" in err and "(b).vllm_args" not in err
    doc["vllm_command"] = ["python", "-m", "vllm.entrypoints.cli.main", "serve"]
    code, out, err = run_check(tmp_path, doc, capsys)
    assert code == 0, err
    assert "-m vllm.entrypoints.cli.main serve --model org/a" in out and "--api-server-count 2" in out


@pytest.mark.parametrize(("args", "value"), [
    ([], None), (["--api-server-count"], None), (["--api-server-count", "3"], "3"), (["-asc=2"], "2"),
    (["--api-server-count", "2", "--max-model-len", "9", "-asc", "5"], "5"),  # the last one, as argparse
    (["--api-server-counts", "2"], None),
])
def test_arg_value_reads_as_vllms_parser(args: list[str], value: str | None) -> None:
    assert arg_value(args, "--api-server-count", "-asc") == value


@pytest.mark.parametrize(("inst", "gpu_mib", "limit"), [
    (cuda("a", [0], vllm_args=["--max-num-seqs", "64"]), 143771, 64),
    (cuda("a", [0], vllm_args=["--max-num-seqs=64", "--max-num-seqs=32"]), 143771, 32),
    (cuda("a", [0], vllm_args=["--max-num-seqs=0"]), 143771, None),
    (cuda("a", [0]), 143771, 1024), (cuda("a", [0]), 40960, 256), (cuda("a", [0]), None, None),
    ({"name": "c", "model": "m", "device": "cpu"}, None, 128),
])
def test_max_num_seqs_as_vllm_reads_it(inst: dict[str, Any], gpu_mib: int | None, limit: int | None) -> None:
    """The limit `up` writes into the Infernet JSON for the gateway (its limiter and warm pool)."""
    assert max_num_seqs(Instance.model_validate(inst), gpu_mib) == limit


def test_port_in_use_exits_2(tmp_path: Path, gpus: list[Gpu], capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        doc = fleet_doc(tmp_path, [cuda("a", [0], port=port)])
        code, _, err = run_check(tmp_path, doc, capsys)
        assert code == 2
        assert f"instances[0] (a).port: port {port} on 127.0.0.1 is already in use" in err
        # The gateway and the supervisor's own endpoint are checked too.
        doc = fleet_doc(tmp_path, [cuda("a", [0])], metrics_port=port)
        doc["gateway"]["port"] = port
        code, _, err = run_check(tmp_path, doc, capsys)
        assert code == 2
        assert f"gateway.port: port {port} on 127.0.0.1 is already in use" in err
        assert "supervisor.metrics_port" in err


def test_up_refuses_before_starting_anything(tmp_path: Path, gpus: list[Gpu],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    doc = fleet_doc(tmp_path, [cuda("a", [5])])
    assert main(["up", "-c", write(tmp_path, doc)]) == 2
    assert "(a).gpus: GPU 5 does not exist" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


def test_no_gpu_host_names_the_gpu_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("fleet_supervisor.commands.discover_gpus", lambda: [])
    code, _, err = run_check(tmp_path, fleet_doc(tmp_path, [cuda("a", [0])]), capsys)
    assert code == 2
    assert "instances[0] (a).gpus: GPU 0 does not exist" in err and "no GPU found" in err


def test_check_prints_the_plan(tmp_path: Path, gpus: list[Gpu], capsys: pytest.CaptureFixture[str]) -> None:
    big = cuda("big", [0, 1], served_model_names=["big:1", "big"], vllm_args=["--max-model-len", "4096"])
    doc = fleet_doc(tmp_path, [big, {"name": "small", "model": "tiny", "device": "cpu"}])
    code, out, err = run_check(tmp_path, doc, capsys)
    assert code == 0, err
    big_port = doc["instances"][0]["port"]
    assert (f"--model org/big --served-model-name big:1 big --tensor-parallel-size 2 --pipeline-parallel-size 1 "
            f"--host 127.0.0.1 --port {big_port} --gpu-memory-utilization 0.9 --max-model-len 4096") in out
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1" in out
    assert "CUDA_VISIBLE_DEVICES='' VLLM_CPU_KVCACHE_SPACE=1" in out
    assert "vram tier: >=48gb" in out and "NVIDIA H200" in out
    assert f"FLEET_PORT={doc['gateway']['port']}" in out


def test_infernet_config_prints_json(tmp_path: Path, gpus: list[Gpu], capsys: pytest.CaptureFixture[str]) -> None:
    doc = fleet_doc(tmp_path, [cuda("a", [0], served_model_names=["qwen:7b"]),
                               {"name": "c", "model": "tiny", "device": "cpu"}])
    assert main(["infernet-config", "-c", write(tmp_path, doc)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "vllm" and data["served_models"] == ["qwen:7b", "tiny"]
    assert data["vram_tier"] == ">=48gb"
    assert [i["vram_tier"] for i in data["vllm_instances"]] == [">=48gb", "unknown"]


def test_gpus_lists_or_says_none(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("fleet_supervisor.commands.discover_gpus", lambda: [Gpu(0, "NVIDIA L4", "GPU-x", 23034, 512)])
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA L4" in out and "23034" in out and "512" in out and "16-24gb" in out
    monkeypatch.setattr("fleet_supervisor.commands.discover_gpus", lambda: [])
    assert main(["gpus"]) == 0
    assert "no GPU found" in capsys.readouterr().out


def test_a_negative_orphan_grace_exits_2_naming_the_key(tmp_path: Path, gpus: list[Gpu],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_check(tmp_path, fleet_doc(tmp_path, [cuda("a", [0])], orphan_grace_s=-1), capsys)
    assert code == 2 and "supervisor.orphan_grace_s" in err

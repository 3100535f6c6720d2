"""``vllm-fleet plan`` and ``vllm-fleet up --model`` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetspec.fleetfile import load_fleet, parse_fleet
from fleetspec.gpus import Gpu
from tests.planner import shapes
from vllm_fleet.cli import main

Capture = pytest.CaptureFixture[str]


def model_dir(tmp_path: Path, config: dict[str, Any], name: str = "qwen7") -> str:
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def run(argv: list[str], capsys: Capture) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def fake_cmd_up(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stands in for the supervisor's ``up``: records the fleet file it was given, starts nothing."""
    started: list[str] = []

    def cmd_up(path: str) -> int:
        started.append(path)
        return 0

    monkeypatch.setattr("fleet_supervisor.commands.cmd_up", cmd_up)
    return started


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet_planner.command.discover_gpus", lambda: [])


def test_plan_table_and_fleet_file(tmp_path: Path, capsys: Capture) -> None:
    code, out, _ = run(["plan", "--model", model_dir(tmp_path, shapes.QWEN25_7B), "--gpus", "4x80GB"], capsys)
    assert code == 0
    for needle in ("weights", "KV cache per token", "overhead (2 GiB × 1 GPU)", "total", "fit", "TP=1 × PP=1",
                   "replicas", "VRAM tier", ">=48gb", "843 tok/s", "fleet file:"):
        assert needle in out
    fleet_yaml = out.split("fleet file:\n", 1)[1]
    fleet = parse_fleet(yaml.safe_load(fleet_yaml))
    assert [i.gpus for i in fleet.instances] == [[0], [1], [2], [3]]
    assert {tuple(i.names) for i in fleet.instances} == {("qwen7",)}
    assert fleet.instances[0].vllm_args == ["--max-model-len", "8192", "--dtype", "bfloat16"]


def test_plan_json(tmp_path: Path, capsys: Capture) -> None:
    code, out, _ = run(["plan", "--model", model_dir(tmp_path, shapes.LLAMA31_70B) + "/config.json",
                        "--gpus", "8x80GB", "--context", "32768", "--seqs", "4", "--kv-dtype", "fp8", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["fits"] is True
    assert doc["memory"]["kv_cache_per_token"]["bytes"] == 2 * 80 * 8 * 128 * 1
    assert doc["precision"] == {"weights": "bf16", "compute_dtype": "bfloat16", "kv_cache": "fp8"}
    assert doc["fit"]["tensor_parallel_size"] * doc["fit"]["pipeline_parallel_size"] == doc["fit"]["gpus"]
    assert "--kv-cache-dtype" in doc["fit"]["vllm_args"]
    assert doc["vram_tier"] == ">=48gb"
    assert doc["model"]["path"] == str(tmp_path / "qwen7")  # a config.json path plans its directory
    parse_fleet(yaml.safe_load(doc["fleet_file"]))


def test_plan_from_shape_flags_and_fleet_file_out(tmp_path: Path, capsys: Capture) -> None:
    out_file = tmp_path / "out" / "fleet.yaml"
    code, out, _ = run(["plan", "--model", "Qwen/Qwen2.5-7B-Instruct", "--params", "7.6B", "--layers", "28",
                        "--hidden", "3584", "--heads", "28", "--kv-heads", "4", "--gpus", "2x24GB", "--seqs", "4",
                        "--served-name", "qwen2.5:7b", "--fleet-file", str(out_file), "--json"], capsys)
    assert code == 0
    assert json.loads(out)["model"]["params_counted_from_shape"] is False
    fleet = load_fleet(out_file)
    assert [i.model for i in fleet.instances] == ["Qwen/Qwen2.5-7B-Instruct"] * 2
    assert fleet.instances[0].names == ["qwen2.5:7b"] and fleet.instances[0].name == "qwen2.5-7b-0"


def test_plan_gpus_default_to_nvml(tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    found = [Gpu(i, "NVIDIA H100 80GB HBM3", f"GPU-{i}", 81559, 0) for i in (0, 1)]
    monkeypatch.setattr("fleet_planner.command.discover_gpus", lambda: found)
    code, out, _ = run(["plan", "--model", model_dir(tmp_path, shapes.QWEN25_7B), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["gpus"]["source"] == "NVML" and doc["gpus"]["memory_mib"] == 81559 and doc["replicas"] == 2


def test_plan_that_does_not_fit_exits_1(tmp_path: Path, capsys: Capture) -> None:
    code, out, _ = run(["plan", "--model", model_dir(tmp_path, shapes.LLAMA31_70B), "--gpus", "2x24GB"], capsys)
    assert code == 1
    assert "DOES NOT FIT" in out and "fleet file:" not in out


@pytest.mark.parametrize(("argv", "needle"), [
    (["--gpus", "eight"], "--gpus: cannot read 'eight'"),
    (["--gpus", "4x80GB", "--dtype", "fp7"], "--dtype: unknown precision 'fp7'"),
    (["--gpus", "4x80GB", "--kv-dtype", "int4"], "--kv-dtype"),
    (["--gpus", "4x80GB", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: must be in (0, 1]"),
    (["--gpus", "4x80GB", "--context", "0"], "--context: must be positive"),
    (["--gpus", "4x80GB", "--params", "lots"], "--params: cannot read 'lots'"),
    (["--gpus", "4x80GB", "--nodes", "0"], "--nodes: must be positive"),
    ([], "--gpus: no GPU found"),
])
def test_bad_input_exits_2_naming_the_flag(tmp_path: Path, capsys: Capture, no_nvml: None, argv: list[str],
                                           needle: str) -> None:
    code, _, err = run(["plan", "--model", model_dir(tmp_path, shapes.QWEN25_7B), *argv], capsys)
    assert code == 2
    assert needle in err


def test_model_id_without_shape_names_the_missing_flags(capsys: Capture) -> None:
    code, _, err = run(["plan", "--model", "org/unknown", "--gpus", "1x80GB"], capsys)
    assert code == 2
    assert "--layers, --hidden, --heads, --vocab, --intermediate" in err


def test_missing_path_and_bad_config(tmp_path: Path, capsys: Capture) -> None:
    code, _, err = run(["plan", "--model", str(tmp_path / "nope" / "config.json"), "--gpus", "1x80GB"], capsys)
    assert (code, "--model:" in err, "no such file" in err) == (2, True, True)
    broken = {k: v for k, v in shapes.QWEN25_7B.items() if k != "num_hidden_layers"}
    code, _, err = run(["plan", "--model", model_dir(tmp_path, broken, "broken"), "--gpus", "1x80GB"], capsys)
    assert code == 2 and "num_hidden_layers: missing" in err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    code, _, err = run(["plan", "--model", str(tmp_path / "bad"), "--gpus", "1x80GB"], capsys)
    assert code == 2 and "not valid JSON" in err


def test_argparse_type_errors_exit_2(capsys: Capture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan", "--model", "m", "--layers", "many"])
    assert e.value.code == 2
    assert "--layers" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "needle"), [
    (["up"], "exactly one of -c/--config"),
    (["up", "-c", "fleet.yaml", "--model", "m"], "exactly one of -c/--config"),
    (["up", "-c", "fleet.yaml", "--dry-run"], "--dry-run: only with --model"),
    (["up", "--model", "m", "--nodes", "2"], "--nodes: `up --model` starts this host only"),
])
def test_up_needs_exactly_one_of_config_and_model(capsys: Capture, argv: list[str], needle: str) -> None:
    code, _, err = run(argv, capsys)
    assert code == 2 and needle in err


def test_up_model_dry_run_prints_plan_and_fleet_file_and_starts_nothing(
        tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    started = fake_cmd_up(monkeypatch)
    code, out, _ = run(["up", "--model", model_dir(tmp_path, shapes.QWEN25_7B), "--gpus", "2x80GB", "--dry-run"],
                       capsys)
    assert code == 0 and started == []
    assert "dry run: not written to .fleet/planned-fleet.yaml" in out
    parse_fleet(yaml.safe_load(out.split("nothing started):\n", 1)[1]))
    assert not (tmp_path / ".fleet").exists()


def test_up_model_writes_the_planned_fleet_and_starts_it(
        tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    started = fake_cmd_up(monkeypatch)
    code, out, _ = run(["up", "--model", model_dir(tmp_path, shapes.QWEN25_7B), "--gpus", "2x80GB"], capsys)
    assert code == 0
    assert started == [str(Path(".fleet") / "planned-fleet.yaml")]
    fleet = load_fleet(tmp_path / ".fleet" / "planned-fleet.yaml")
    assert [i.gpus for i in fleet.instances] == [[0], [1]]
    assert "fleet file written to .fleet/planned-fleet.yaml" in out


def test_up_model_that_does_not_fit_starts_nothing(tmp_path: Path, capsys: Capture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["up", "--model", model_dir(tmp_path, shapes.LLAMA31_70B), "--gpus", "1x24GB"], capsys)
    assert code == 1 and "does not fit these GPUs; nothing started" in err
    assert not (tmp_path / ".fleet").exists()

"""Every exit-2 message names the file, the key and the fix: a representative bad input for each
source of ConfigError (fleet file schema and rules, host check, gateway settings, config reading,
Infernet JSON, capacity planner), run through the real CLI where one exists."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetspec.errors import ConfigError
from fleetspec.fleetfile import parse_fleet
from fleetspec.gpus import Gpu
from tests.support.procs import free_port
from vllm_fleet.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
TWO_GPUS = [Gpu(i, "NVIDIA H100 80GB HBM3", f"GPU-{i}", 81559, 0) for i in range(2)]


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet_supervisor.commands.discover_gpus", lambda: list(TWO_GPUS))
    monkeypatch.setattr("gateway.config.discover_gpus", lambda: list(TWO_GPUS))
    for var in ("FLEET_PORT", "FLEET_HOST", "FLEET_ROUTING_POLICIES"):
        monkeypatch.delenv(var, raising=False)


def fleet(**top: Any) -> dict[str, Any]:
    """A valid two-GPU fleet on free ports; ``top`` replaces top-level keys."""
    doc: dict[str, Any] = {
        "gateway": {"host": "127.0.0.1", "port": free_port()}, "supervisor": {"metrics_port": 0},
        "instances": [{"name": "qwen", "model": "m", "gpus": [0], "port": free_port()},
                      {"name": "llama", "model": "n", "gpus": [1], "port": free_port()}]}
    doc.update(top)
    return doc


def check(tmp_path: Path, doc: Any, capsys: pytest.CaptureFixture[str], name: str = "fleet.yaml") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc), encoding="utf-8")
    assert cli(["check", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def problem_lines(err: str) -> list[str]:
    return [ln.strip() for ln in err.splitlines()[1:] if ln.startswith("  ")]


def instance(**kw: Any) -> list[dict[str, Any]]:
    return [{"name": "qwen", "model": "m", "gpus": [0], "port": free_port(), **kw}]


# Each case: what is wrong, the key the message must name, and words of the fix it must give.
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("unknown key", fleet(instances=instance(gpu_ids=[0])), "instances[0].gpu_ids",
     "did you mean gpus? (keys here: name, model,"),
    ("unknown nested key", fleet(instances=instance(sleep={"idle": 5})), "instances[0].sleep.idle",
     "did you mean idle_s?"),
    ("unknown top-level key", {**fleet(), "instance": []}, "instance", "did you mean instances?"),
    ("wrong type", fleet(gateway={"port": "http"}), "gateway.port", "got 'http'"),
    ("bad choice", fleet(instances=instance(device="tpu")), "instances[0].device",
     "Input should be 'cuda' or 'cpu'; got 'tpu'"),
    ("missing key", fleet(instances=[{"name": "qwen", "gpus": [0]}]), "instances[0].model", "add this key"),
    ("sizes", fleet(instances=instance(gpus=[0, 1], tensor_parallel_size=1)),
     "instances[0] (qwen).tensor_parallel_size", "leave tensor_parallel_size out"),
    ("cpu with gpus", fleet(instances=instance(device="cpu")), "instances[0] (qwen).gpus",
     "remove gpus or set device: cuda"),
    ("routing policy for nobody", fleet(gateway={"routing_policies": {"gpt-4": "prefix_aware"}}),
     "gateway.routing_policies.gpt-4", "use one of those names or remove it"),
    ("GPU shared", fleet(instances=[*instance(), {"name": "b", "model": "n", "gpus": [0], "port": free_port()}]),
     "instances[1] (b).gpus", "give it other gpus, or both a sleep: block"),
    ("GPU missing here", fleet(instances=instance(gpus=[5])), "instances[0] (qwen).gpus",
     "(GPUs here: 0, 1); use those indices"),
    ("reserved name", fleet(instances=instance(name="gateway")), "instances[0] (gateway).name",
     "rename the instance"),
    ("API servers the command cannot start", fleet(instances=instance(vllm_args=["--api-server-count", "2"])),
     "instances[0] (qwen).vllm_args", "set vllm_command: [python, -m, vllm.entrypoints.cli.main, serve]"),
]


@pytest.mark.parametrize(("what", "doc", "key", "fix"), CASES, ids=[c[0] for c in CASES])
def test_fleet_file_message_names_file_key_and_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str,
                                                   doc: dict[str, Any], key: str, fix: str) -> None:
    err = check(tmp_path, doc, capsys)
    assert err.startswith(f"vllm-fleet: {tmp_path / 'fleet.yaml'}: "), err
    line = next((ln for ln in problem_lines(err) if ln.startswith(key + ":")), None)
    assert line is not None, f"no line starts with {key!r}:\n{err}"
    assert fix in line, line


def test_every_problem_line_carries_a_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Structure, not wording: 'KEY: what is wrong; what to do' on every line of every case."""
    for _, doc, _, _ in CASES:
        for line in problem_lines(check(tmp_path, doc, capsys)):
            assert re.match(r"^[\w.\[\]() -]+: .+; .+", line), f"no key or no fix: {line}"


def test_port_in_use_says_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy, socket.socket() as busy_too:
        for s in (busy, busy_too):
            s.bind(("127.0.0.1", 0))
            s.listen()
        port, gw = busy.getsockname()[1], busy_too.getsockname()[1]
        err = check(tmp_path, fleet(instances=instance(port=port), gateway={"host": "127.0.0.1", "port": gw}), capsys)
    assert f"instances[0] (qwen).port: port {port} on 127.0.0.1 is already in use; stop what listens there" in err
    assert f"gateway.port: port {gw} on 127.0.0.1 is already in use; stop what listens there, or change " \
           "gateway.port" in err


def test_documented_error_example_is_what_the_code_says() -> None:
    """docs/fleet-file.md shows one message verbatim; it must stay the code's."""
    doc = fleet(instances=[{"name": "qwen", "model": "m", "gpus": [0, 1]},
                           {"name": "llama", "model": "n", "gpus": [1]}])
    with pytest.raises(ConfigError) as err:
        parse_fleet(doc, "fleet.yaml")
    page = (ROOT / "docs" / "fleet-file.md").read_text(encoding="utf-8")
    shown = re.search(r"```\nvllm-fleet: (fleet\.yaml: invalid configuration\n.*?)\n```", page, re.S)
    assert shown is not None
    assert shown.group(1) in str(err.value), f"docs/fleet-file.md shows:\n{shown.group(1)}\ncode says:\n{err.value}"


def test_gateway_setting_from_the_environment_names_variable_file_and_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "infernet.json"
    path.write_text(json.dumps({"backend": "vllm", "vllm_host": "http://127.0.0.1:1"}), encoding="utf-8")
    monkeypatch.setenv("FLEET_MAX_IN_FLIGHT", "0")
    assert cli(["gateway", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"invalid gateway settings (FLEET_* variables over {path})" in err
    assert "FLEET_MAX_IN_FLIGHT (gateway.max_in_flight): Input should be greater than or equal to 1; got '0' " \
           "from the environment: fix or unset FLEET_MAX_IN_FLIGHT" in err


@pytest.mark.parametrize(("name", "text", "fix"), [
    ("absent.yaml", None, "cannot read config file: No such file or directory; check the path given to -c/--config"),
    ("list.yaml", "- a\n- b\n", "(top level): expected a mapping, got list; a fleet file maps instances:"),
    ("broken.yaml", "instances: [\n", "fix the syntax at the line shown"),
    ("twice.json", json.dumps({"vllm_instances": [{"host": "http://a:1"}, {"host": "http://a:1/"}]}),
     "vllm_instances[1].host: http://a:1 is listed twice; list each backend once"),
])
def test_config_reading_messages_name_the_file_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           name: str, text: str | None, fix: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text, encoding="utf-8")
    assert cli(["gateway", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: " in err and fix in err, err


def test_planner_names_the_model_config_key_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}),
                      encoding="utf-8")
    assert cli(["plan", "--model", str(config), "--gpus", "1x80GB"]) == 2
    err = capsys.readouterr().err
    assert f"{config}: num_hidden_layers: missing (also looked for n_layer, num_layers, n_layers); add it to this " \
           "config" in err, err

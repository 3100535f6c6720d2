"""Config shapes, precedence and bad-config exits (code 2, message naming the key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetspec.tiers import VramTier, largest_tier, tier_for_mib
from gateway.config import load_gateway_config
from gateway.main import build
from vllm_fleet.cli import main as cli


def _write(tmp: Path, name: str, doc: Any) -> Path:
    p = tmp / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


@pytest.mark.parametrize(("mib", "tier"), [
    (None, "unknown"), (0, "unknown"), (4096, "<8gb"), (8191, "<8gb"), (8192, "8-16gb"), (16384, "16-24gb"),
    (24575, "16-24gb"), (24576, "24-48gb"), (49151, "24-48gb"), (49152, ">=48gb"), (2 * 24576, ">=48gb"),
    (81920, ">=48gb"),
])
def test_tier_thresholds(mib: int | None, tier: str) -> None:
    assert tier_for_mib(mib).value == tier


def test_node_reports_largest_tier() -> None:
    assert largest_tier([VramTier.LT_8GB, VramTier.GB_24_48, VramTier.UNKNOWN]) == VramTier.GB_24_48
    assert largest_tier([]) == VramTier.UNKNOWN


def test_single_shape(tmp_path: Path) -> None:
    cfg = load_gateway_config(_write(tmp_path, "c.json", {
        "backend": "vllm", "vllm_host": "http://localhost:8000/", "vllm_model": "Qwen/Qwen2.5-72B-Instruct",
        "vram_tier": ">=48gb", "node_id": "daemon keys are ignored"}))
    [b] = cfg.backends
    assert (b.url, b.models, b.vram_tier) == ("http://localhost:8000", ["Qwen/Qwen2.5-72B-Instruct"], VramTier.GE_48GB)
    assert cfg.node_tier == VramTier.GE_48GB


def test_multi_shape_with_bare_host(tmp_path: Path) -> None:
    cfg = load_gateway_config(_write(tmp_path, "c.json", {
        "backend": "vllm",
        "vllm_instances": [{"host": "http://localhost:8000", "model": "qwen2.5:14b"},
                           {"host": "http://localhost:8001", "gpu_memory_mib": 24576}],
        "served_models": ["qwen2.5:14b", "llama3.1:8b"]}))
    assert [b.models for b in cfg.backends] == [["qwen2.5:14b"], []]  # [] = discover from /v1/models
    assert [b.vram_tier.value for b in cfg.backends] == ["unknown", "24-48gb"]


def test_fleet_file_as_gateway_config(tmp_path: Path) -> None:
    cfg = load_gateway_config(_write(tmp_path, "fleet.yaml", """
gateway: {host: 127.0.0.1, port: 9000}
instances:
  - {name: a, model: /m/tiny, served_model_names: [tiny-a], device: cpu, port: 8101}
  - {name: b, model: org/big, gpus: [0, 1], vram_tier: ">=48gb"}
"""))
    assert [(b.name, b.url, b.models) for b in cfg.backends] == [
        ("a", "http://127.0.0.1:8101", ["tiny-a"]), ("b", "http://127.0.0.1:8001", ["org/big"])]
    assert cfg.settings["port"] == 9000
    assert [b.vram_tier.value for b in cfg.backends] == ["unknown", ">=48gb"]


def test_env_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _write(tmp_path, "fleet.yaml", "gateway: {port: 9000}\ninstances: [{name: a, model: m, device: cpu}]\n")
    assert build(str(p)).settings.port == 9000
    monkeypatch.setenv("FLEET_PORT", "9100")
    monkeypatch.setenv("FLEET_HEALTH_FAILURES", "7")
    s = build(str(p)).settings
    assert (s.port, s.health_failures) == (9100, 7)


def test_routing_policies_from_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _write(tmp_path, "fleet.yaml", "gateway: {routing_policy: load_aware, routing_policies: {m: prefix_aware}}\n"
               "instances: [{name: a, model: m, device: cpu}, {name: b, model: n, device: cpu}]\n")
    s = build(str(p)).settings
    assert (s.policy_of("m"), s.policy_of("n"), s.scrapes_load) == ("prefix_aware", "load_aware", True)
    monkeypatch.setenv("FLEET_ROUTING_POLICY", "round_robin")
    monkeypatch.setenv("FLEET_ROUTING_POLICIES", '{"m": "least_in_flight"}')  # merged per model with the file's
    s = build(str(p)).settings
    assert (s.policy_of("m"), s.policy_of("n"), s.scrapes_load) == ("least_in_flight", "round_robin", False)


def test_bad_setting_variable_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "ok.json", {"backend": "vllm", "vllm_host": "http://x:1"})
    monkeypatch.setenv("FLEET_ROUTING_POLICIES", '{"m": "fastest"}')
    assert cli(["gateway", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "FLEET_ROUTING_POLICIES (gateway.routing_policies.m)" in err and "Traceback" not in err, err


@pytest.mark.parametrize(("doc", "key"), [
    ({"backend": "vllm"}, "needs either vllm_host or a non-empty vllm_instances"),
    ({"backend": "vllm", "vllm_host": "localhost:8000"}, "vllm_host"),
    ({"backend": "vllm", "vllm_host": "http://x:1", "vram_tier": "48gb"}, "vram_tier"),
    ({"backend": "vllm", "vllm_instances": [{"model": "m"}]}, "vllm_instances[0].host"),
    ({"backend": "vllm", "vllm_instances": [{"host": "http://a:1"}, {"host": "http://a:1/"}]},
     "vllm_instances[1].host"),
    ({"backend": "tgi", "vllm_host": "http://x:1"}, "backend"),
    ({"instances": [{"name": "a", "model": "m", "gpus": [0, 1], "tensor_parallel_size": 4}]},
     "instances[0] (a).tensor_parallel_size"),
    ({"instances": [{"name": "a", "model": "m", "device": "cpu", "gpus": [0]}]}, "instances[0] (a).gpus"),
    ({"instances": [{"name": "a", "model": "m", "gpus": [0]}, {"name": "a", "model": "n", "gpus": [1]}]},
     "instances[1] (a).name"),
    ({"instances": [{"name": "a", "model": "m", "gpus": [0, 1]}, {"name": "b", "model": "n", "gpus": [1]}]},
     "instances[1] (b).gpus"),
    ({"instances": [{"name": "a", "model": "m", "gpuz": [0]}]}, "instances[0].gpuz"),
    ({"instances": [{"name": "a", "model": "m", "device": "cpu", "port": 8080}]}, "instances[0] (a).port"),
    ({"gateway": {"routing_policy": "random"}, "instances": [{"name": "a", "model": "m", "device": "cpu"}]},
     "gateway.routing_policy"),
    ({"gateway": {"routing_policies": {"n": "prefix_aware"}},
      "instances": [{"name": "a", "model": "m", "device": "cpu"}]}, "gateway.routing_policies.n"),
    ("not: [valid", "not valid YAML"),
])
def test_bad_config_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any,
                                           key: str) -> None:
    path = _write(tmp_path, "bad.yaml" if isinstance(doc, str) else "bad.json", doc)
    assert cli(["gateway", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert key in err, err
    assert "Traceback" not in err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["gateway", "-c", str(tmp_path / "absent.json")]) == 2
    assert "cannot read config file" in capsys.readouterr().err

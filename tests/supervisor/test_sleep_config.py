"""The fleet file's sleep: block and swap: section through the real CLI: sharing a GPU needs a sleep:
block, the memory budget per device is checked (exit 2 naming the device, the instances and the
key), and `check` shows how each instance sleeps and why (mode, level)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet_supervisor.sleeplevel import sleep_levels
from fleetspec.fleetfile import parse_fleet
from tests.supervisor.test_validation import cuda, gpus, run_check  # noqa: F401 - gpus is a fixture
from tests.support.procs import free_port

pytestmark = pytest.mark.usefixtures("gpus")


def doc(instances: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {"gateway": {"port": free_port()}, "instances": instances, **top}


@pytest.mark.parametrize(("instances", "top", "needle"), [
    ([cuda("a", [0]), cuda("b", [0], sleep={})], {},
     "instances[1] (b).gpus: GPU 0 is already used by instance 'a' (instances share a GPU only when each has a "
     "sleep: block"),
    ([cuda("a", [0], sleep={"preload": True}, gpu_memory_utilization=0.5),
      cuda("b", [0], sleep={"preload": True}, gpu_memory_utilization=0.6)], {},
     "instances[1] (b).sleep.preload: GPU 0 cannot hold the preloaded instances a (0.5), b (0.6) = 1.1 within "
     "swap.budget (1)"),
    ([cuda("a", [0], sleep={"share": 0.9})], {"swap": {"budget": 0.8}},
     "instances[0] (a).sleep.share: its share 0.9 is more than swap.budget (0.8)"),
    ([cuda("a", [0], sleep={"level": 3})], {}, "instances[0].sleep.level: Input should be 'auto', 1 or 2"),
    ([cuda("a", [0], sleep={"idle": 5})], {}, "instances[0].sleep.idle: Extra inputs are not permitted"),
    ([cuda("a", [0], sleep={})], {"supervisor": {"metrics_port": 0}},
     "instances[0] (a).sleep: needs the supervisor's endpoint (supervisor.metrics_port is 0)"),
])
def test_bad_sleep_config_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 instances: list[dict[str, Any]], top: dict[str, Any],
                                                 needle: str) -> None:
    code, _, err = run_check(tmp_path, doc(instances, **top), capsys)
    assert code == 2, err
    assert needle in err, err


def test_three_models_share_one_gpu_and_check_says_how(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    instances = [cuda(n, [0], gpu_memory_utilization=0.45, sleep={"preload": n == "a", "idle_s": 300})
                 for n in ("a", "b", "c")]
    code, out, err = run_check(tmp_path, doc(instances), capsys)
    assert code == 0, err
    assert out.count("sleep:   vLLM sleep mode, level 1") == 3
    assert "share 0.45 of 0; sleeps after 300s idle; preloaded" in out
    assert "--enable-sleep-mode" in out and "VLLM_SERVER_DEV_MODE=1" in out
    # The CPU build has no sleep mode: cold.
    code, out, _ = run_check(tmp_path, doc([{"name": "x", "model": "m", "device": "cpu", "sleep": {}}]), capsys)
    assert code == 0 and "sleep:   cold" in out and "--enable-sleep-mode" not in out


def test_level_auto_takes_2_when_the_host_cannot_hold_the_weights(tmp_path: Path) -> None:
    models = []
    for n in ("a", "b"):
        d = tmp_path / n
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"\0" * 1000)
        models.append(str(d))
    fleet = parse_fleet(doc([cuda("a", [0], sleep={}) | {"model": models[0]},
                             cuda("b", [0], sleep={}) | {"model": models[1]}]))
    roomy = sleep_levels(fleet, fleet.instances, ram=10_000)
    assert roomy["a"][0] == 1 and roomy["b"][0] == 1
    tight = sleep_levels(fleet, fleet.instances, ram=2_000)  # 80 % of it holds one model's weights
    assert tight["a"][0] == 1 and tight["b"][0] == 2 and "do not fit" in tight["b"][1]
    pinned = parse_fleet(doc([cuda("a", [0], sleep={"level": 2}) | {"model": models[0]}]))
    assert sleep_levels(pinned, pinned.instances, ram=None)["a"] == (2, "set in the fleet file")

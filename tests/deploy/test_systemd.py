"""deploy/systemd/vllm-fleet.service: systemd-analyze accepts it, and its stop settings leave the
stopping order to the supervisor (KillMode=mixed) with time for it to finish."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

from fleetspec.fleetfile import SupervisorSection
from tests.deploy.tools import DEPLOY, tool

UNIT = DEPLOY / "systemd" / "vllm-fleet.service"


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify also checks that ExecStart's binary exists and the user resolves: point them at this
    # venv's vllm-fleet and root, and keep everything else as shipped.
    text = UNIT.read_text().replace("/opt/vllm-fleet/bin/vllm-fleet", str(Path(sys.executable).parent / "vllm-fleet"))
    text = text.replace("User=vllm-fleet", "User=root").replace("Group=vllm-fleet", "Group=root")
    unit = tmp_path / "vllm-fleet.service"
    unit.write_text(text)
    done = subprocess.run([tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if str(unit) in line]
    assert done.returncode == 0 and complaints == [], done.stdout + done.stderr


def test_stop_is_left_to_the_supervisor() -> None:
    svc = service()
    assert svc["KillMode"] == "mixed" and svc["KillSignal"] == "SIGTERM"
    # gateway first, then every instance's group for up to stop_grace_s, then the margin.
    assert int(svc["TimeoutStopSec"]) > 2 * SupervisorSection().stop_grace_s
    assert svc["ExecStart"].endswith("vllm-fleet up -c /etc/vllm-fleet/fleet.yaml")
    assert "vllm-fleet check" in svc["ExecStartPre"]
    assert svc["RestartPreventExitStatus"] == "2"  # a config error does not fix itself

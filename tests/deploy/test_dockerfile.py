"""The Dockerfile: hadolint clean, two targets with the documented entrypoints and health checks."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

from tests.deploy.tools import REPO, tool

DOCKERFILE = REPO / "Dockerfile"


def stages() -> dict[str, str]:
    """Stage name -> its instructions (text up to the next FROM)."""
    text = DOCKERFILE.read_text()
    parts = re.split(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_hadolint_is_clean() -> None:
    done = subprocess.run([tool("hadolint"), "--no-color", str(DOCKERFILE)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_catches_a_planted_mistake(tmp_path: object) -> None:
    # The linter really reads the file: an unpinned base and a shell-form ENTRYPOINT are flagged.
    bad = DOCKERFILE.read_text().replace("ARG PYTHON_IMAGE=python:3.11-slim-bookworm", "ARG PYTHON_IMAGE=python")
    bad += "\nFROM ubuntu\nENTRYPOINT vllm-fleet up\n"
    done = subprocess.run([tool("hadolint"), "--no-color", "-"], input=bad, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "DL3006" in done.stdout and "DL3025" in done.stdout


def entrypoint(stage: str) -> list[str]:
    found = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", stage, re.M)
    assert found is not None
    argv: list[str] = json.loads(found.group(1))
    return argv


def test_targets() -> None:
    s = stages()
    assert set(s) == {"fleet", "gateway", "fleet-cpu", "cpu-requirements", "gateway-build"}
    s.pop("cpu-requirements")  # build steps, not images
    build = s.pop("gateway-build")
    assert entrypoint(s["fleet-cpu"]) == entrypoint(s["fleet"])
    # The CPU build of vLLM links libnuma; no `# syntax=` line (BuildKit would pull a frontend).
    assert "libnuma1" in s["fleet-cpu"] and not DOCKERFILE.read_text().startswith("# syntax")
    assert entrypoint(s["fleet"]) == ["vllm-fleet", "up", "-c", "/etc/vllm-fleet/fleet.yaml"]
    assert entrypoint(s["gateway"]) == ["vllm-fleet", "gateway", "-c", "/etc/vllm-fleet/config.json"]
    for name, text in s.items():
        assert re.search(r"^HEALTHCHECK .*\n?.*/health", text, re.M), name
        user = re.findall(r"^USER\s+(\S+)", text, re.M)
        assert user and user[-1].split(":")[0] not in ("root", "0"), name
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v\d+\.\d+\.\d+$", DOCKERFILE.read_text(), re.M)
    # The fleet image adds vllm-fleet to vLLM's environment without changing any of vLLM's packages.
    assert "--constraint" in s["fleet"]
    # The gateway image is the package alone, no engine extra, its request path compiled by default.
    assert "COPY --from=gateway-build /opt/venv /opt/venv" in s["gateway"]
    assert re.search(r"pip wheel .* \.( \\)?$", build, re.M) and "[gpu]" not in build and "[cpu]" not in build
    assert re.search(r"^ARG VLLM_FLEET_COMPILE=1$", build, re.M) and "COPY setup.py" in build
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", DOCKERFILE.read_text(), re.M)


def test_every_stage_copies_every_package_the_distribution_ships() -> None:
    # A package left out of the image installs fine and fails only when its command runs.
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    for name, body in stages().items():
        if "pip install" not in body and "pip\" install" not in body and "install --constraint" not in body:
            continue
        if "COPY --from=gateway-build" in body:
            continue  # takes the environment that stage built from its copies
        copied = set(re.findall(r"^COPY\s+(\w+)\s+\./\1\s*$", body, re.M))
        assert packages <= copied, f"stage {name} misses {sorted(packages - copied)}"

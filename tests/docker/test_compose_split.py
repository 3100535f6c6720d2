"""Compose profile `split`, wired for real: the gateway-only image in front of one container per
model, on compose's network, found by service name as deploy/compose/infernet-split.json says.

The vLLM images need GPUs, so each vLLM service runs the fake vLLM server (tests/fakes) instead,
with the service's own command line (the fake reads vLLM's flags): same names, ports, model names.
Everything else is docker-compose.yml's own service definition.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.docker.compose import Project
from tests.docker.conftest import FIGURES
from tests.docker.engine import REPO, Engine, wait_http

pytestmark = pytest.mark.timeout(600)
GATEWAY_IMAGE = "vllm-fleet-gateway:0.1.0"
GATEWAY_LIMIT_MB = 200  # issue 16's target, on the stand-in base


def with_fakes(path: Path) -> Path:
    """docker-compose.yml's split services, each vLLM one running the fake from the gateway image
    (which has aiohttp, all the fake needs) with the tests/fakes directory mounted."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = {name: svc for name, svc in doc["services"].items() if svc.get("profiles") == ["split"]}
    for svc in services.values():
        if str(svc.get("image", "")).startswith("vllm/vllm-openai"):
            svc.pop("deploy")  # the GPU reservation: no GPUs here
            # init: the fake as PID 1 would ignore SIGTERM (no handler), and `down` would wait 20 s.
            svc.update(image=GATEWAY_IMAGE, entrypoint=["python3", "/fakes/fake_vllm.py"], user="10001",
                       volumes=[f"{REPO / 'tests' / 'fakes'}:/fakes:ro"], init=True)
    path.write_text(yaml.safe_dump({"services": services}))
    return path


@pytest.fixture(scope="module")
def split(engine: Engine, build_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    compose_file = with_fakes(tmp_path_factory.mktemp("split") / "docker-compose.split-fakes.yml")
    project = Project.create(engine, "fleettestsplit", build_env)
    project.files = ("--project-directory", str(REPO), "-f", str(compose_file))
    project.down()
    try:
        build = project.timed("--profile", "split", "build", "gateway-split", timeout=600)
        FIGURES["gateway image build (compose build)"] = f"{build:.0f} s"
        project.started = time.monotonic()
        project.compose("--profile", "split", "up", "-d", "--build", "gateway-split", timeout=300)
        wait_http(project.gateway + "/ready", timeout=120)
        FIGURES["split with fakes: up -> gateway /ready"] = f"{time.monotonic() - project.started:.0f} s"
        yield project
    except BaseException:
        print(project.logs())
        raise
    finally:
        project.down()


def test_gateway_image_is_small(engine: Engine, split: Project) -> None:
    size = engine.image_size_mb(GATEWAY_IMAGE)
    FIGURES["gateway image size"] = f"{size:.0f} MB"
    assert size <= GATEWAY_LIMIT_MB


def test_gateway_image_runs_its_request_path_compiled(engine: Engine, split: Project) -> None:
    # The gateway-build stage compiles the modules pyproject.toml names; each loads as an extension.
    names = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["vllm-fleet"]["compiled"]
    code = "import importlib, sys; print(*(importlib.import_module('gateway.' + n).__file__ for n in sys.argv[1:]))"
    files = engine.docker("run", "--rm", "--entrypoint", "python3", GATEWAY_IMAGE, "-c", code, *names).stdout.split()
    assert len(files) == len(names) and all(f.endswith(".so") for f in files), files
    assert "request path compiled with mypyc" in split.logs()


def test_gateway_routes_each_model_to_its_container(split: Project) -> None:
    c = openai.OpenAI(base_url=split.gateway + "/v1", api_key="unused", timeout=30, max_retries=0)
    deadline = time.monotonic() + 60  # both backends probed healthy (FLEET_HEALTH_INTERVAL_S 5)
    while sorted(m.id for m in c.models.list().data) != ["llama3.1:8b", "qwen2.5:14b"]:
        assert time.monotonic() < deadline, [m.id for m in c.models.list().data]
        time.sleep(1)
    for model in ("qwen2.5:14b", "llama3.1:8b"):
        done = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert done.model == model and done.choices[0].message.content
        stream = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices).split() == [
            "t0", "t1", "t2", "t3"]
    health = split.engine.docker("inspect", "-f", "{{.State.Health.Status}}", split.container("gateway-split"))
    assert health.stdout.strip() in ("starting", "healthy")


def test_down_leaves_nothing_of_the_split_project(split: Project) -> None:
    split.compose("--profile", "split", "down", "-v", "--timeout", "20", timeout=300)
    assert split.leftovers() == []

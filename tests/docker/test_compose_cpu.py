"""Compose profile `cpu`, for real: the fleet-cpu image built, the tiny model served by CPU vLLM
under the supervisor, the gateway on the published port, Prometheus scraping both, a crash
restarted by the restart policy, and ``down -v`` leaving nothing behind.

The tests run in file order on one project (module fixture); the last one takes it down.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.docker.compose import Project
from tests.docker.conftest import FIGURES
from tests.docker.engine import Engine, wait_http

pytestmark = pytest.mark.timeout(900)
SERVICES = ("fleet-cpu", "prometheus")


@pytest.fixture(scope="module")
def stack(engine: Engine, build_env: dict[str, str]) -> Iterator[Project]:
    project = Project.create(engine, "fleettestcpu", build_env)
    project.down()  # a previous run killed before its finalizer
    try:
        build = project.timed("--profile", "cpu", "build", "fleet-cpu", timeout=900)
        FIGURES["fleet-cpu build (compose build)"] = f"{build:.0f} s"
        FIGURES["fleet-cpu image size"] = f"{engine.image_size_mb('vllm-fleet-cpu:0.1.0'):.0f} MB"
        start = time.monotonic()
        project.compose("--profile", "cpu", "up", "-d", "--build", *SERVICES, timeout=600)
        project.started = start
        wait_http(project.gateway + "/ready", timeout=300)
        FIGURES["compose up -> gateway /ready"] = f"{time.monotonic() - start:.0f} s"
        yield project
    except BaseException:
        print(project.logs())
        raise
    finally:
        project.down()


def client(project: Project) -> openai.OpenAI:
    return openai.OpenAI(base_url=project.gateway + "/v1", api_key="unused", timeout=60, max_retries=0)


def chat(project: Project) -> None:
    c = client(project)
    done = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=8)
    assert done.choices[0].message.content is not None and done.usage is not None
    assert done.usage.completion_tokens == 8
    pieces = [chunk.choices[0].delta.content or "" for chunk in c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=8, stream=True)
        if chunk.choices]
    assert len(pieces) >= 2 and "".join(pieces)


def test_chat_through_the_gateway_with_the_openai_sdk(stack: Project) -> None:
    chat(stack)
    FIGURES["compose up -> first served chat"] = f"{time.monotonic() - stack.started:.0f} s"
    models = client(stack).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    health = stack.engine.docker("inspect", "-f", "{{.State.Health.Status}}", stack.container("fleet-cpu"))
    assert health.stdout.strip() in ("starting", "healthy")  # the HEALTHCHECK runs in the image
    # Its gateway runs the wheel of the Dockerfile's gateway-build stage, compiled with mypyc.
    code = "import gateway.main as m; print(m.request_path())"
    path = stack.engine.docker("exec", stack.container("fleet-cpu"), "python3", "-c", code).stdout.strip()
    assert path == "compiled with mypyc"


def query(project: Project, promql: str) -> list[dict[str, Any]]:
    r = httpx.get(project.prometheus + "/api/v1/query", params={"query": promql}, timeout=10)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def test_prometheus_scrapes_the_gateway_and_the_supervisor(stack: Project) -> None:
    deadline = time.monotonic() + 120
    health: dict[str, str] = {}
    errors: dict[str, str] = {}
    counted = 0.0
    running: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        r = httpx.get(stack.prometheus + "/api/v1/targets", timeout=10)
        if r.status_code == 200:
            targets = r.json()["data"]["activeTargets"]
            health = {t["labels"]["job"]: t["health"] for t in targets}
            errors = {t["scrapeUrl"]: t["lastError"] for t in targets if t["lastError"]}
            found = query(stack, 'sum(fleet_requests_total{model="tiny"})')
            counted = float(found[0]["value"][1]) if found else 0.0
            running = query(stack, 'fleet_instance_state{instance="tiny",state="RUNNING"} == 1')
            if set(health.values()) == {"up"} and len(health) == 3 and counted >= 2 and running:
                break
        time.sleep(2)
    # The gateway, the supervisor and vLLM itself (fleet-cpu:8001, inside the compose network).
    assert health == {"fleet-gateway": "up", "fleet-supervisor": "up", "vllm": "up"}, errors
    assert counted >= 2  # the two chats of the test before (more if it ran again)
    assert running, "the supervisor's fleet_instance_state does not show the instance RUNNING"


def test_a_crashed_fleet_container_is_restarted_and_serves_again(stack: Project) -> None:
    # A crash: SIGKILL of the container's main process from the host. (`docker kill` would not do:
    # Docker counts it as a manual stop, and `unless-stopped` then leaves the container down.)
    cid = stack.container("fleet-cpu")
    pid = int(stack.engine.docker("inspect", "-f", "{{.State.Pid}}", cid).stdout)
    assert pid > 0
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    deadline = start + 60
    while time.monotonic() < deadline:
        count = stack.engine.docker("inspect", "-f", "{{.RestartCount}}", cid).stdout.strip()
        if count != "0":
            break
        time.sleep(1)
    assert count != "0", "the restart policy did not restart the container"
    wait_http(stack.gateway + "/ready", timeout=300)
    chat(stack)
    FIGURES["crash -> restarted fleet serving again"] = f"{time.monotonic() - start:.0f} s"


def test_down_leaves_nothing_of_the_project(stack: Project) -> None:
    stop = stack.timed("--profile", "cpu", "down", "-v", "--timeout", "30", timeout=300)
    FIGURES["compose down -v"] = f"{stop:.0f} s"
    assert stack.leftovers() == []

"""A stream survives the death of its replica, on real vLLM (CPU build, the generated tiny model):
two replicas serve ``tiny`` behind the gateway; the openai SDK streams 4,000 tokens (``ignore_eos``);
the process group of the replica serving it (``x-fleet-backend``) is SIGKILLed mid-stream. The SDK
sees no exception, the text goes on, the stream ends with ``finish_reason`` and the usage of one
4,000-token answer. Prints what it measured (tokens before the kill, the gap at the splice)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from tests.support.procs import Gateway, free_port

if TYPE_CHECKING:
    from tests.support.real_vllm import RealVllm

pytest_plugins = ["tests.support.real_vllm"]
pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(600)]

# ≈ 5 s of generation: the kill lands mid-stream even when the client reads slowly. Two CI runs on a
# 2-core host (at 1,500 and at 4,000 tokens) counted no migration though the text went on: the victim
# had made its whole answer before the kill: under CPU load vLLM's API server fell behind its engine
# and sent nothing until the end. Reproduced with three busy loops beside the test: 7 of 7 runs failed
# (a warm-up request first did not help); with the engines at nice 19 (RealVllm.engine_nice), 7 of 7
# passed.
MAX_TOKENS = 4000
MESSAGES = [{"role": "user", "content": "Tell me a story about the sea."}]
KILL_AFTER = 5  # content chunks: early, since the tiny model makes thousands of tokens a second


@pytest.fixture(scope="module")
def replicas(tiny_model_dir: str) -> Iterator[list[RealVllm]]:
    from tests.support.real_vllm import start_real_vllm  # the plugin module: imported once, by pytest

    started: list[RealVllm] = []
    try:
        for _ in range(2):  # both load at once, then both are waited for
            started.append(start_real_vllm(tiny_model_dir, free_port(), ["tiny"], wait=False))
        for v in started:
            v.wait_healthy()  # which also puts the engines below the API server: RealVllm.engine_nice
        yield started
    finally:
        for v in started:
            v.stop(grace=5.0)


@pytest.fixture(scope="module")
def gw(replicas: list[RealVllm], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    config = {"backend": "vllm", "served_models": ["tiny"],
              "vllm_instances": [{"host": v.url, "models": ["tiny"], "name": f"vllm-{i}"}
                                 for i, v in enumerate(replicas)]}
    # Patient probes: two CPU vLLMs on two cores can keep /health waiting; this is about streams.
    g = Gateway(tmp_path_factory.mktemp("gw-migrate-real"), config,
                env={"FLEET_HEALTH_TIMEOUT_S": "10", "FLEET_HEALTH_FAILURES": "3"})
    try:
        yield g
    finally:
        g.stop()


def _sample(text: str, name: str) -> float:
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.split(" ")[0].split("{")[0] == name
               and not ln.startswith("#"))


def test_sigkill_mid_stream_the_sdk_sees_one_answer(replicas: list[RealVllm], gw: Gateway, tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES,
        max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    victim = replicas[int(raw.headers["x-fleet-backend"].removeprefix("vllm-"))]
    pieces: list[str] = []
    finish: list[str] = []
    ids: set[str] = set()
    usage = None
    killed_at = 0
    kill_s = 0.0
    t0 = time.monotonic()
    for chunk in raw.parse():  # the SDK raises on an error event: the test is that it does not
        ids.add(chunk.id)
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        if chunk.choices[0].delta.content is not None and chunk.choices[0].delta.role is None:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)
        if not killed_at and len(pieces) == KILL_AFTER:
            os.killpg(victim.pgid, signal.SIGKILL)  # API server, EngineCore and workers at once
            killed_at = len(pieces)
            kill_s = time.monotonic() - t0
    elapsed = time.monotonic() - t0
    assert killed_at
    # SIGKILL is not instant death: tearing down a big address space takes a moment under load.
    victim.proc.wait(30)
    assert finish == ["length"]
    assert len(ids) == 1  # one stream: the continuation's chunks carry the first replica's id
    assert "".join(pieces[killed_at:]), "no text after the kill"
    assert usage is not None and usage.completion_tokens == MAX_TOKENS  # the budget held across the splice
    metrics = httpx.get(gw.url + "/metrics").text
    assert _sample(metrics, "fleet_stream_migrations_total") == 1, (
        f"the kill did not land mid-stream: sent {kill_s:.2f} s into a {elapsed:.2f} s stream")
    # The original prompt's count as a replica makes it (tokencount.py), not the continuation's less
    # the text handed back, which re-tokenizing can put off (24 for 27 in one run).
    survivor = next(v for v in replicas if v is not victim)
    alone = httpx.post(survivor.url + "/v1/chat/completions", timeout=60,
                       json={"model": "tiny", "messages": MESSAGES, "max_tokens": 1}).json()
    assert usage.prompt_tokens == alone["usage"]["prompt_tokens"]
    gap_sum = _sample(metrics, "fleet_stream_splice_gap_seconds_sum")
    overhead = _sample(metrics, "fleet_stream_splice_overhead_seconds_sum")
    print(f"\nreal vLLM: {len(pieces)} content chunks in {elapsed:.2f} s, SIGKILL after {killed_at}; "
          f"splice gap {gap_sum * 1000:.1f} ms (gateway's share {overhead * 1000:.1f} ms); "
          f"usage {usage.prompt_tokens}+{usage.completion_tokens}")

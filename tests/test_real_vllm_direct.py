"""The real-vLLM harness itself: the CPU build serving the tiny model, spoken to directly with the
openai SDK. Gateway tests reuse the same session-wide ``real_vllm`` server."""

from __future__ import annotations

import urllib.request
from typing import TYPE_CHECKING

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

if TYPE_CHECKING:  # imported at run time by pytest_plugins, which also rewrites its asserts
    from tests.support.real_vllm import RealVllm

pytest_plugins = ["tests.support.real_vllm"]

pytestmark = pytest.mark.realvllm

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello! Tell me a story."}]


def _client(server: RealVllm) -> OpenAI:
    return OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0, timeout=60)


def test_models_lists_served_name(real_vllm: RealVllm) -> None:
    ids = [m.id for m in _client(real_vllm).models.list().data]
    assert ids == ["tiny-a"]


def test_chat_non_streaming(real_vllm: RealVllm) -> None:
    resp = _client(real_vllm).chat.completions.create(model="tiny-a", messages=MESSAGES, max_tokens=8)
    choice = resp.choices[0]
    assert choice.finish_reason in ("length", "stop")
    assert resp.usage is not None and resp.usage.completion_tokens >= 1


def test_chat_streaming(real_vllm: RealVllm) -> None:
    stream = _client(real_vllm).chat.completions.create(
        model="tiny-a",
        messages=MESSAGES,
        max_tokens=16,
        stream=True,
        # Without ignore_eos a random model may end after one token; the test wants several chunks.
        extra_body={"ignore_eos": True},
    )
    content: list[str] = []
    finish: list[str] = []
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert len(content) > 1
    assert finish == ["length"]


def test_completions(real_vllm: RealVllm) -> None:
    resp = _client(real_vllm).completions.create(model="tiny-a", prompt="Once upon a time", max_tokens=4)
    assert resp.choices[0].finish_reason in ("length", "stop")


def test_metrics_carry_load_signals(real_vllm: RealVllm) -> None:
    with urllib.request.urlopen(real_vllm.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "vllm:num_requests_running" in text
    assert "vllm:num_requests_waiting" in text

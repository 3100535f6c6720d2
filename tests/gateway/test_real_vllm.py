"""The gateway in front of real vLLM (CPU build, tiny generated model), spoken to with the SDK.

The gateway's config is the Infernet single shape with only ``vllm_host``: it must learn the
model's name from vLLM's /v1/models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from gateway.load import parse_load
from tests.support.procs import Gateway, wait_until
from tests.support.real_vllm import MAX_MODEL_LEN

if TYPE_CHECKING:
    from tests.support.real_vllm import RealVllm

pytest_plugins = ["tests.support.real_vllm"]
pytestmark = pytest.mark.realvllm


@pytest.fixture(scope="module")
def gw(real_vllm: RealVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = Gateway(tmp_path_factory.mktemp("gw-real"), {"backend": "vllm", "vllm_host": real_vllm.url})
    try:
        yield g
    finally:
        g.stop()


@pytest.fixture
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_discovered_from_vllm(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-a"]
    assert models[0].model_extra and models[0].model_extra.get("max_model_len") == MAX_MODEL_LEN  # vLLM's card


def test_chat(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny-a", messages=[{"role": "user", "content": "hello"}],
                                       max_tokens=8, extra_body={"ignore_eos": True})
    assert r.usage is not None and r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"


def test_chat_streaming(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="tiny-a", messages=[{"role": "user", "content": "hello"}], max_tokens=16, stream=True,
        extra_body={"ignore_eos": True}))
    assert len(chunks) > 8  # arrived as many events, not one buffered body
    assert chunks[-1].choices[0].finish_reason == "length" or chunks[-2].choices[0].finish_reason == "length"


def test_gateway_metrics_count_real_traffic(client: openai.OpenAI, gw: Gateway) -> None:
    client.completions.create(model="tiny-a", prompt="x", max_tokens=2)
    text = httpx.get(gw.url + "/metrics").text
    assert 'fleet_requests_total{backend="backend-0",code="200",model="tiny-a"}' in text
    assert 'fleet_time_to_first_byte_seconds_count{model="tiny-a"}' in text
    assert 'fleet_backend_healthy{backend="backend-0"} 1.0' in text


def test_unknown_model_lists_real_names(gw: Gateway) -> None:
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "gpt-4", "messages": []})
    assert r.status_code == 404
    assert "tiny-a" in r.json()["error"]["message"]


def test_vllm_metrics_reachable_beside(real_vllm: RealVllm) -> None:
    # The load signals later routing policies read; documented as vLLM's, not re-exported.
    assert "vllm:num_requests_running" in httpx.get(real_vllm.url + "/metrics").text


def test_tokenize_round_trip_through_the_gateway(gw: Gateway) -> None:
    """What `vllm bench serve` asks before a run (it warned "/tokenize unavailable" before)."""
    tok = httpx.post(gw.url + "/tokenize", json={"model": "tiny-a", "prompt": "hello world",
                                                 "add_special_tokens": False}, timeout=30)
    assert tok.status_code == 200, tok.text
    tokens = tok.json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    detok = httpx.post(gw.url + "/detokenize", json={"model": "tiny-a", "tokens": tokens}, timeout=30)
    assert detok.status_code == 200 and detok.json()["prompt"] == "hello world"



def test_load_aware_and_prefix_aware_read_real_vllm_metrics(real_vllm: RealVllm, tmp_path: Path) -> None:
    """vLLM 0.32's own exposition feeds the load scraper: the series routing reads exist under
    the names it expects, and the prefix cache counters move with a repeated prompt."""
    g = Gateway(tmp_path, {"backend": "vllm", "vllm_host": real_vllm.url},
                {"FLEET_ROUTING_POLICY": "prefix_aware", "FLEET_LOAD_SCRAPE_INTERVAL_S": "0.2"})
    try:
        client = openai.OpenAI(base_url=g.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        before = parse_load(httpx.get(real_vllm.url + "/metrics").content)
        for _ in range(2):
            client.chat.completions.create(model="tiny-a", max_tokens=2, messages=[
                {"role": "system", "content": "You are a helpful assistant. " * 60}, {"role": "user", "content": "hi"}])
        after = parse_load(httpx.get(real_vllm.url + "/metrics").content)
        assert after.prefix_queries > before.prefix_queries and after.prefix_hits > before.prefix_hits
        # The token counters a stalled scrape is judged by (load.settle) exist and move with traffic.
        assert before.tokens is not None and after.tokens is not None and after.tokens > before.tokens
        # A scrape taken after the chats: before them a fresh vLLM has no prefix queries (no hit rate).
        assert wait_until(lambda: (httpx.get(g.url + "/fleet").json()["backends"][0]["load"] or {})
                          .get("prefix_cache_hit_rate") is not None)
        load = httpx.get(g.url + "/fleet").json()["backends"][0]["load"]
        assert 0 <= load["kv_cache_usage"] <= 1 and load["stalled"] is False
        metrics = httpx.get(g.url + "/metrics").text
        assert ('fleet_routing_decisions_total{model="tiny-a",policy="prefix_aware",reason="prefix_match"} 1.0'
                in metrics)
    finally:
        g.stop()

"""The real openai SDK through the gateway, against fake vLLM servers (real processes, sockets)."""

from __future__ import annotations

import openai
import pytest

from tests.support.procs import Gateway


@pytest.fixture
def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_chat(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="m2", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.choices[0].message.content == "t0 t1 t2"
    assert r.model == "m2"


def test_chat_streaming_arrives_in_chunks(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=5, stream=True)
    chunks = list(stream)
    assert [c.choices[0].delta.content for c in chunks] == ["", "t0 ", "t1 ", "t2 ", "t3 ", "t4 "]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "length"


def test_completions_and_embeddings(client: openai.OpenAI) -> None:
    c = client.completions.create(model="m2-alias", prompt="x", max_tokens=2)
    assert c.choices[0].text == "t0 t1"
    e = client.embeddings.create(model="m2", input="x")
    assert e.data[0].embedding == [0.1, 0.2, 0.3]


def test_models_is_union_of_healthy_backends(client: openai.OpenAI) -> None:
    assert sorted(m.id for m in client.models.list()) == ["m1", "m2", "m2-alias"]


def test_unknown_model_is_404_listing_served(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    err = e.value.body
    assert isinstance(err, dict)
    assert err["code"] == "model_not_found"
    assert "m1" in err["message"] and "m2" in err["message"]


def test_upstream_error_passes_through_with_status(client: openai.OpenAI, fakes: list) -> None:  # type: ignore[type-arg]
    fakes[2].configure(status=422)
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(model="m2", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 422
    assert isinstance(e.value.body, dict) and e.value.body["message"] == "injected failure"

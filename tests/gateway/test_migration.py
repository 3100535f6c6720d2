"""A stream survives the death of its replica (docs/stream-failover.md), against fake vLLM servers.

Two fakes serve ``m1``. A test starts a stream, reads ``x-fleet-backend`` from the response head and
sets ``drop_after`` on that replica (a live knob: its connection is aborted before its next token),
so the stream breaks after a few tokens on whichever replica got it. The fake's tokens are
"t0 ", "t1 ", ... and a fake asked to continue goes on after the last one it was given, so a stream
that continued correctly reads as one answer; each chunk's ``system_fingerprint`` names the replica
that made it (the gateway does not rewrite it), so the test knows where the splice was.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.procs import FakeVllm, Gateway, instances

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MESSAGES = [{"role": "user", "content": "hello there"}]


def _by_name(fakes: list[FakeVllm], name: str) -> FakeVllm:
    return next(f for f in fakes if f"fake-{f.port}" == name)


def _last_body(fake: FakeVllm) -> dict[str, Any]:
    return dict(httpx.get(fake.url + "/_fake/last_body", timeout=5).json())


def _read(gw: Gateway, path: str, body: dict[str, Any],
          on_head: Callable[[httpx.Headers], None] | None = None) -> tuple[list[str], bool]:
    """The stream's events (``data:`` payloads) and whether it ended cleanly (no dropped connection)."""
    lines: list[str] = []
    clean = True
    try:
        with httpx.stream("POST", gw.url + path, json=body, timeout=20) as r:
            assert r.status_code == 200, r.read()
            if on_head is not None:
                on_head(r.headers)
            lines.extend(r.iter_lines())
    except httpx.RemoteProtocolError:
        clean = False
    return [ln[6:] for ln in lines if ln.startswith("data: ")], clean


def _cut_after(fakes: list[FakeVllm], n: int) -> Callable[[httpx.Headers], None]:
    """Break the stream on the replica that took it, before its token ``n`` (or the next one)."""
    return lambda head: _by_name(fakes, head["x-fleet-backend"]).configure(drop_after=n)


def _chunks(events: list[str]) -> list[dict[str, Any]]:
    return [json.loads(e) for e in events if e != "[DONE]"]


def _text(chunks: list[dict[str, Any]], chat: bool = True) -> str:
    key = (lambda c: c["choices"][0]["delta"].get("content") or "") if chat else (lambda c: c["choices"][0]["text"])
    return "".join(key(c) for c in chunks if c["choices"])


def _answer(n: int) -> str:
    return "".join(f"t{i} " for i in range(n))


def _metric(gw: Gateway, name: str) -> float:
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.split()[-1])
    return 0.0


def _outcome(gw: Gateway, outcome: str, model: str = "m1") -> float:
    return _metric(gw, f'fleet_stream_migrations_total{{model="{model}",outcome="{outcome}"}}')


@pytest.fixture(autouse=True)
def _slow_tokens(fakes: list[FakeVllm]) -> None:
    for f in fakes:  # time to read the head and set drop_after before the break
        f.configure(token_delay=0.05)


def test_chat_stream_continues_on_the_other_replica(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    migrated = _outcome(gateway, "migrated")
    body = {"model": "m1", "stream": True, "max_tokens": 12, "temperature": 0.7, "seed": 5, "messages": MESSAGES}
    events, clean = _read(gateway, CHAT, body, _cut_after(fakes, 3))
    assert clean and events[-1] == "[DONE]", events
    chunks = _chunks(events)
    assert _text(chunks) == _answer(12)  # one answer, nothing lost or repeated at the splice
    assert [c["choices"][0]["delta"].get("role") for c in chunks].count("assistant") == 1
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1  # the first replica's id
    assert chunks[0]["id"].startswith("chatcmpl-") and chunks[0]["model"] == "m1"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    made_by = [c["system_fingerprint"] for c in chunks]
    first, second = made_by[0], made_by[-1]
    assert first != second and made_by == sorted(made_by, key=[first, second].index)
    given = made_by.count(first) - 1  # its tokens: all but the role chunk
    sent = _last_body(_by_name(fakes, second))
    assert sent["max_tokens"] == 12 - given
    assert sent["messages"] == [*MESSAGES, {"role": "assistant", "content": _answer(given)}]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert (sent["temperature"], sent["seed"], sent["stream"]) == (0.7, 5, True)
    assert _outcome(gateway, "migrated") == migrated + 1
    assert _metric(gateway, 'fleet_stream_splice_gap_seconds_count{model="m1"}') >= 1


def test_text_completion_stream_continues_on_the_other_replica(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    body = {"model": "m1", "stream": True, "max_tokens": 10, "prompt": "once upon a time"}
    events, clean = _read(gateway, COMPLETIONS, body, _cut_after(fakes, 4))
    assert clean and events[-1] == "[DONE]", events
    chunks = _chunks(events)
    assert _text(chunks, chat=False) == _answer(10)
    assert len({c["id"] for c in chunks}) == 1 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    second = chunks[-1]["system_fingerprint"]
    given = sum(c["system_fingerprint"] != second for c in chunks)
    sent = _last_body(_by_name(fakes, second))
    assert sent["prompt"] == "once upon a time" + _answer(given) and sent["max_tokens"] == 10 - given


def test_tokens_merged_into_one_event_are_counted_by_the_replica(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    """vLLM v1 merges the deltas of a request when its API server falls behind (a busy process, a
    slow client): events then undercount tokens, and the budget comes from the replica's /tokenize."""
    for f in fakes[:2]:
        f.configure(merge=2)  # two tokens per event
    body = {"model": "m1", "stream": True, "max_tokens": 12, "messages": MESSAGES}
    events, clean = _read(gateway, CHAT, body, _cut_after(fakes, 4))
    assert clean and events[-1] == "[DONE]"
    chunks = _chunks(events)
    assert _text(chunks) == _answer(12)  # not 12 + what the events missed
    second = chunks[-1]["system_fingerprint"]
    given = _text([c for c in chunks if c["system_fingerprint"] != second]).split()
    assert _last_body(_by_name(fakes, second))["max_tokens"] == 12 - len(given)


def test_usage_is_summed_when_asked_for(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    body = {"model": "m1", "stream": True, "max_tokens": 9, "messages": MESSAGES,
            "stream_options": {"include_usage": True}}
    events, clean = _read(gateway, CHAT, body, _cut_after(fakes, 3))
    assert clean and events[-1] == "[DONE]"
    chunks = _chunks(events)
    assert _text(chunks) == _answer(9)
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["id"] == chunks[0]["id"]
    # As if one replica had answered: 9 tokens generated for a prompt of 2 (the fake counts words).
    assert usage == {"prompt_tokens": 2, "completion_tokens": 9, "total_tokens": 11}


def test_prompt_tokens_are_the_replicas_count_of_the_original_prompt(gateway: Gateway,
                                                                     fakes: list[FakeVllm]) -> None:
    """No usage came before the break: the replica taking the continuation counts the original
    request's prompt, rendered with the request's template options, and usage reports that."""
    kwargs = {"enable_thinking": False}
    body = {"model": "m1", "stream": True, "max_tokens": 9, "messages": MESSAGES, "chat_template_kwargs": kwargs,
            "stream_options": {"include_usage": True}}
    events, clean = _read(gateway, CHAT, body, _cut_after(fakes, 3))
    assert clean and events[-1] == "[DONE]"
    chunks = _chunks(events)
    second = _by_name(fakes, chunks[-1]["system_fingerprint"])
    asked = httpx.get(second.url + "/_fake/tokenized", timeout=5).json()
    assert {"model": "m1", "messages": MESSAGES, "chat_template_kwargs": kwargs} in asked
    assert chunks[-1]["usage"]["prompt_tokens"] == 2


def test_the_openai_sdk_sees_one_stream(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="m1", messages=MESSAGES, max_tokens=8, stream=True)
    _by_name(fakes, raw.headers["x-fleet-backend"]).configure(drop_after=2)
    chunks = list(raw.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == _answer(8)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_second_break_never_goes_back_to_a_failed_replica(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    before = _outcome(gateway, "no_replica")
    for f in fakes[:2]:
        f.configure(drop_after=3)  # both break: the continuation too
    events, clean = _read(gateway, CHAT, {"model": "m1", "stream": True, "max_tokens": 12, "messages": MESSAGES})
    assert not clean and "[DONE]" not in events
    chunks = _chunks(events[:-1])
    assert _text(chunks) == _answer(6)  # 3 from each replica, then nowhere left to go
    error = json.loads(events[-1])["error"]
    assert error["code"] == 502 and "no other replica" in error["message"]
    assert _outcome(gateway, "no_replica") == before + 1


# Each case where a stream does not continue: the request (or what was streamed), the outcome
# label it is counted under, and words of the error event's message.
REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    ("n", {"n": 2}, "n", "several choices"),
    ("logprobs", {"logprobs": True, "top_logprobs": 2}, "logprobs", "logprobs"),
    ("echo", {"echo": True}, "unsupported", "echo"),
    ("structured", {"response_format": {"type": "json_object"}}, "unsupported", "structured output"),
    ("tool_call", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                   "tool_choice": "required"}, "tool_call", "tool call"),
    ("reasoning", {"fake_reasoning": True}, "reasoning", "reasoning"),
]


@pytest.mark.parametrize(("extra", "outcome", "words"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_streams_that_cannot_continue_end_with_the_error_event(gateway: Gateway, fakes: list[FakeVllm],
                                                               extra: dict[str, Any], outcome: str,
                                                               words: str) -> None:
    before = _outcome(gateway, outcome)
    body = {"model": "m1", "stream": True, "max_tokens": 12, "messages": MESSAGES, **extra}
    events, clean = _read(gateway, CHAT, body, _cut_after(fakes, 3))
    assert not clean and "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["type"] == "upstream_error" and error["code"] == 502
    assert "not continued on another replica" in error["message"] and words in error["message"], error
    assert _outcome(gateway, outcome) == before + 1


def test_a_lone_replica_ends_with_the_error_event(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    before = _outcome(gateway, "no_replica", "m2")
    events, clean = _read(gateway, CHAT, {"model": "m2", "stream": True, "max_tokens": 12, "messages": MESSAGES},
                          _cut_after(fakes, 3))
    assert not clean and "no other replica" in json.loads(events[-1])["error"]["message"]
    assert _outcome(gateway, "no_replica", "m2") == before + 1


@pytest.fixture(scope="module")
def gateways(tmp_mod: Path, fakes: list[FakeVllm]) -> Iterator[Callable[..., Gateway]]:
    """Gateways on the same fakes with other settings, one per set of settings."""
    made: dict[tuple[tuple[str, str], ...], Gateway] = {}

    def make(**env: str) -> Gateway:
        key = tuple(sorted(env.items()))
        if key not in made:
            made[key] = Gateway(tmp_mod, instances(*fakes), env=env)
        return made[key]

    try:
        yield make
    finally:
        for gw in made.values():
            gw.stop()


def test_migrations_are_bounded(gateways: Callable[..., Gateway], fakes: list[FakeVllm]) -> None:
    gw = gateways(FLEET_MAX_MIGRATIONS="1")
    for f in fakes[:2]:
        f.configure(drop_after=3)
    events, clean = _read(gw, CHAT, {"model": "m1", "stream": True, "max_tokens": 12, "messages": MESSAGES})
    assert not clean and _text(_chunks(events[:-1])) == _answer(6)
    assert "continued 1 times already" in json.loads(events[-1])["error"]["message"]
    assert _outcome(gw, "exhausted") == 1 and _outcome(gw, "migrated") == 1


def test_migration_can_be_turned_off(gateways: Callable[..., Gateway], fakes: list[FakeVllm]) -> None:
    gw = gateways(FLEET_MAX_MIGRATIONS="0")
    events, clean = _read(gw, CHAT, {"model": "m1", "stream": True, "max_tokens": 12, "messages": MESSAGES},
                          _cut_after(fakes, 3))
    assert not clean and "FLEET_MAX_MIGRATIONS=0" in json.loads(events[-1])["error"]["message"]
    assert _outcome(gw, "disabled") == 1


def test_no_continuation_once_the_total_timeout_has_passed(gateways: Callable[..., Gateway],
                                                           fakes: list[FakeVllm]) -> None:
    gw = gateways(FLEET_TOTAL_TIMEOUT_S="1")
    events, clean = _read(gw, CHAT, {"model": "m1", "stream": True, "max_tokens": 100, "messages": MESSAGES})
    assert not clean and "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["code"] == 504 and "total timeout" in error["message"]
    assert _outcome(gw, "deadline") == 1


def test_a_break_after_the_last_token_closes_the_stream(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    """The replica died after the finish reason but before [DONE]: the client has the whole answer."""
    before = _outcome(gateway, "finished")
    for f in fakes[:2]:
        f.configure(drop_after=4)  # after its 4th and last token, before [DONE]
    events, clean = _read(gateway, CHAT, {"model": "m1", "stream": True, "max_tokens": 4, "messages": MESSAGES})
    assert clean and events[-1] == "[DONE]"
    chunks = _chunks(events)
    assert _text(chunks) == _answer(4) and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert _outcome(gateway, "finished") == before + 1

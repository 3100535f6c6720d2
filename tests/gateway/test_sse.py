"""The pieces of stream migration without sockets: what a client was sent (sse.Transcript), the relay
that keeps it (relay.StreamRelay), the rewriting of a continuation (sse.Splice), and the requests
(migration.py). docs/stream-failover.md."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway import migration
from gateway.relay import StreamRelay
from gateway.sse import COMPACT_BYTES, Splice, Transcript, split_events


def ev(doc: dict[str, Any] | str) -> bytes:
    """An event serialized as vLLM does (pydantic's compact JSON)."""
    data = doc.encode() if isinstance(doc, str) else json.dumps(doc, separators=(",", ":")).encode()
    return b"data: " + data + b"\n\n"


def chat(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    return ev({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})


def text(t: str, finish: str | None = None) -> bytes:
    return ev({"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m",
               "choices": [{"index": 0, "text": t, "finish_reason": finish}]})


def transcript(chat_: bool, *events: bytes) -> Transcript:
    t = Transcript(chat_)
    t.kept.extend(events)
    t.compact()
    return t


def test_tokens_are_counted_as_vllm_emits_them() -> None:
    # The role chunk is no token; a token whose text is empty (half a UTF-8 sequence) is one.
    t = transcript(True, chat({"role": "assistant", "content": ""}), chat({"content": "a"}), chat({"content": ""}),
                   chat({"content": "b"}, "length"))
    assert (t.tokens, t.text, t.role_sent, t.finish_reason, t.done) == (3, "ab", True, "length", False)
    assert (t.id, t.created, t.model) == ("chatcmpl-1", 7, "m") and t.ended
    t = transcript(False, text("x"), text("y"), ev("[DONE]"))
    assert (t.tokens, t.text, t.done, t.role_sent) == (2, "xy", True, False)


def test_usage_in_the_stream_is_exact() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
    t = transcript(True, chat({"content": "a"}, usage=usage))
    assert (t.tokens, t.prompt_tokens) == (9, 5)


def test_what_rules_a_continuation_out_is_seen_in_the_stream() -> None:
    call = {"tool_calls": [{"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}]}
    assert migration.refusal_after(transcript(True, chat(call))) == (migration.TOOL_CALL,
                                                                     "a tool call was being streamed")
    assert migration.refusal_after(transcript(True, chat({"reasoning": "hm"})))[0] == migration.REASONING  # type: ignore[index]
    assert migration.refusal_after(transcript(True, chat({"content": "a"}))) is None


async def test_relay_sends_whole_events_and_keeps_them() -> None:
    sent: list[bytes] = []

    async def send(message: Any) -> None:
        sent.append(message["body"])

    t = Transcript(True)
    relay = StreamRelay(send, lambda: None, t)
    first, second = chat({"content": "a"}), chat({"content": "b"})
    assert relay(first + second[:10])  # an event cut by a read: its start is held back
    assert sent == [first] and t.kept == [first]
    assert relay(second[10:])
    assert sent == [first, second]
    assert relay(b"data: no blank line at the end") and relay.tail() == b"data: no blank line at the end"


async def test_relay_compacts_what_it_kept_past_the_bound() -> None:
    async def send(message: Any) -> None:
        pass

    t = Transcript(True)
    relay = StreamRelay(send, lambda: None, t)
    one = chat({"content": "x" * 100})
    n = COMPACT_BYTES // len(one) + 2
    for _ in range(n):
        relay(one)
    assert sum(map(len, t.kept)) <= COMPACT_BYTES and len(t.kept) < n  # parsed and dropped, not held as SSE
    t.compact()
    assert t.tokens == n and t.text == "x" * 100 * n


def test_plain_tokens_are_read_without_a_parse_and_the_rest_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fast path and the full parse must agree, escapes and all; anything unusual takes the parse.
    tricky = 'a "quoted" \\ \n \u00e9 😀 "content":"x"'
    events = [chat({"role": "assistant", "content": ""}), chat({"content": tricky}), chat({"content": ""}),
              chat({"content": "b", "reasoning": None}), chat({"content": "c"}, usage={"completion_tokens": 9}),
              chat({"content": "d"}, "stop")]
    parsed: list[bytes] = []
    loads = json.loads
    # Counted at json.loads, which the full parse calls and the fast path does not: a seam that a
    # build compiled with mypyc keeps (its calls within a module do not look the function up).
    monkeypatch.setattr(json, "loads", lambda p, **kw: parsed.append(p) or loads(p, **kw))
    fast = transcript(True, *events)
    assert len(parsed) == 4  # the role chunk, the delta with more than content, usage, the finish reason
    slow = Transcript(True)
    for e in events:
        slow.absorb(loads(e[6:]))
    assert (fast.text, fast.tokens, fast.finish_reason) == (slow.text, slow.tokens, slow.finish_reason)
    assert fast.text == tricky + "bcd" and fast.tokens == 10
    # A later batch of plain tokens only is read in one pass; the same text and count.
    batch = [chat({"content": tricky}), chat({"content": ""}), chat({"content": "e"})]
    fast.kept.extend(batch)
    parsed.clear()
    fast.compact()
    assert parsed == [] and fast.text == tricky + "bcd" + tricky + "e" and fast.tokens == 13
    fast.kept.extend([chat({"content": "f"}), chat({"content": "g"}, "length")])  # the last: parsed
    fast.compact()
    assert len(parsed) == 1 and fast.text.endswith("efg") and fast.finish_reason == "length"
    assert transcript(False, text("x"), text("é\n")).text == "xé\n"


def test_split_events_keeps_the_rest() -> None:
    assert split_events(b"data: a\n\ndata: b\r\n\r\ndata: c") == ([b"data: a\n\n", b"data: b\n\n"], b"data: c")


def test_splice_rewrites_a_continuation_into_the_clients_stream() -> None:
    t = transcript(True, chat({"role": "assistant", "content": ""}), chat({"content": "a"}), chat({"content": "b"}))
    splice = Splice(t)
    cont = {"id": "chatcmpl-2", "created": 99, "model": "m", "object": "chat.completion.chunk"}
    out = splice.feed(ev({**cont, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                "finish_reason": None}]}))
    assert out == b""  # the continuation's role chunk: the client had one
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    body = ev({**cont, "choices": [{"index": 0, "delta": {"content": "c"}, "finish_reason": "length"}]}) \
        + ev({**cont, "choices": [], "usage": usage}) + ev("[DONE]")
    out = splice.feed(body[:30]) + splice.feed(body[30:])
    events, rest = split_events(out)
    assert rest == b"" and events[-1] == b"data: [DONE]\n\n"
    docs = [json.loads(e[6:]) for e in events[:-1]]
    assert all((d["id"], d["created"]) == ("chatcmpl-1", 7) for d in docs)
    assert docs[0]["choices"][0]["delta"] == {"content": "c"}
    # Usage as if one replica answered: 2 tokens before the splice + 3 after; the continuation's prompt
    # held the 2 tokens given back, so the original prompt was 10.
    assert docs[1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert t.text == "abc" and t.done and t.finish_reason == "length"


def test_splice_passes_error_events_through() -> None:
    t = transcript(True, chat({"role": "assistant", "content": ""}))
    err = b'data: {"error": {"message": "x", "code": 500}}\n\n'
    assert Splice(t).feed(err) == err


def test_closing_a_complete_answer() -> None:
    t = transcript(True, chat({"content": "a"}, "stop"))
    assert t.closing() == b"data: [DONE]\n\n"
    t = transcript(False, text("a"))
    closing = t.closing()
    assert b'"finish_reason":"length"' in closing and closing.endswith(b"data: [DONE]\n\n")


MSGS = [{"role": "user", "content": "q"}]


@pytest.mark.parametrize(("path", "doc", "refusal"), [
    ("/v1/chat/completions", {"messages": MSGS}, None),
    ("/v1/completions", {"prompt": ["p"]}, None),
    ("/v1/chat/completions", {"messages": MSGS, "n": 3}, migration.N),
    ("/v1/completions", {"prompt": "p", "best_of": 2}, migration.N),
    ("/v1/chat/completions", {"messages": MSGS, "logprobs": True}, migration.LOGPROBS),
    ("/v1/completions", {"prompt": "p", "logprobs": 0}, migration.LOGPROBS),
    ("/v1/completions", {"prompt": [1, 2, 3]}, migration.UNSUPPORTED),
    ("/v1/completions", {"prompt": ["a", "b"]}, migration.UNSUPPORTED),
    ("/v1/chat/completions", {"messages": MSGS, "response_format": {"type": "json_schema"}}, migration.UNSUPPORTED),
    ("/v1/chat/completions", {"messages": MSGS, "structured_outputs": {"regex": "a+"}}, migration.UNSUPPORTED),
    ("/v1/chat/completions", {"messages": MSGS, "response_format": {"type": "text"}}, None),
])
def test_plans(path: str, doc: dict[str, Any], refusal: str | None) -> None:
    plan = migration.plan_for(path, {**doc, "stream": True}, 2)
    assert plan is not None and plan.refusal == refusal
    assert migration.plan_for(path, doc, 2) is None  # not streamed: nothing to continue
    assert migration.plan_for("/v1/embeddings", {**doc, "stream": True}, 2) is None
    assert migration.plan_for(path, {**doc, "stream": True}, 0).refusal == migration.DISABLED  # type: ignore[union-attr]


def _plan(doc: dict[str, Any], path: str = "/v1/chat/completions") -> migration.Plan:
    plan = migration.plan_for(path, {**doc, "stream": True}, 2)
    assert plan is not None and plan.migratable
    return plan


def test_continuation_of_a_chat() -> None:
    plan = _plan({"messages": MSGS, "max_completion_tokens": 10, "min_tokens": 4, "temperature": 0.3})
    body = json.loads(migration.continuation(plan, "so far", 6) or b"")
    assert body["messages"] == [*MSGS, {"role": "assistant", "content": "so far"}]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert (body["max_completion_tokens"], body["min_tokens"], body["temperature"]) == (4, 0, 0.3)
    assert plan.doc == {"messages": MSGS, "max_completion_tokens": 10, "min_tokens": 4, "temperature": 0.3,
                        "stream": True}  # the request itself is untouched


def test_continuation_of_a_continued_assistant_message() -> None:
    plan = _plan({"messages": [*MSGS, {"role": "assistant", "content": "Once"}], "continue_final_message": True,
                  "add_generation_prompt": False})
    body = json.loads(migration.continuation(plan, " upon", 1) or b"")
    assert body["messages"][-1] == {"role": "assistant", "content": "Once upon"} and len(body["messages"]) == 2


def test_continuation_of_a_text_completion_and_the_budget() -> None:
    plan = _plan({"prompt": ["Once"], "max_tokens": 5}, "/v1/completions")
    body = json.loads(migration.continuation(plan, " upon", 2) or b"")
    assert (body["prompt"], body["max_tokens"]) == ("Once upon", 3)
    assert migration.continuation(plan, " upon a time", 5) is None  # nothing left to generate


def test_continuation_with_no_text_yet_is_the_request_again() -> None:
    plan = _plan({"messages": MSGS, "max_tokens": 5})
    assert json.loads(migration.continuation(plan, "", 0) or b"") == {**plan.doc}

"""OpenAI completion streams as server-sent events: what a client has been sent (``Transcript``), and
a continuation's events rewritten into that client's stream (``Splice``). docs/stream-failover.md.

Nothing here runs per event on a stream that never breaks. The relay (relay.py ``StreamRelay``)
only appends each chunk it sends to ``Transcript.kept``: a list append and an addition. The chunks
are parsed (``compact``) when they pass ``COMPACT_BYTES`` or when the stream breaks. Keeping raw
chunks bounds nothing (a 32k-token stream is ≈6 MB of SSE), parsing every event would put a JSON
parse on the hot path, and parsing in 64 KiB batches does neither: a stream that stays short and
never breaks is never parsed, and a long one holds about its text rather than its SSE framing.

Tokens are counted as vLLM emits them: with its default ``--stream-interval 1`` every choice event
(after the chat role chunk) carries one generated token, its text possibly empty (part of a UTF-8
sequence, a special token). Where the stream carries usage (``continuous_usage_stats``, or vLLM's
``--enable-force-include-usage``) its ``completion_tokens`` is used instead, exactly. With a stream
interval above 1 the count is low by that factor (the continuation may then run past the client's
``max_tokens`` by the difference): counting needs nothing but the events, where a re-tokenization
of the text (``/tokenize``) would add a round trip to every splice and still not be exact, since
generated tokens need not be what the tokenizer would make of their text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

COMPACT_BYTES = 64 * 1024
DONE = b"[DONE]"
# The common event, one token of plain text: a chat delta that holds nothing but its content, or a
# completion's text. Read by a regex and, where it has escapes, json's string scanner (Transcript._token);
# any other event (role, tool calls, reasoning, usage, a finish reason) is parsed in full.
_PLAIN_CHAT = re.compile(rb'"delta":\{"content":"((?:[^"\\]|\\.)*)"\}')
_PLAIN_TEXT = re.compile(rb'"text":"((?:[^"\\]|\\.)*)"')


def event_end(chunk: bytes) -> int:
    """Where the last complete event in ``chunk`` ends (0: none does)."""
    return max(chunk.rfind(b"\n\n") + 2 if b"\n\n" in chunk else 0,
               chunk.rfind(b"\r\n\r\n") + 4 if b"\r\n\r\n" in chunk else 0)


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """The complete events in ``buf`` (each with its blank line) and what follows the last one."""
    end = event_end(buf)
    if not end:
        return [], buf
    whole = buf[:end].replace(b"\r\n", b"\n")
    return [e + b"\n\n" for e in whole.split(b"\n\n") if e], buf[end:]


def data_of(event: bytes) -> bytes | None:
    """An event's data (its ``data:`` lines joined), or None for one without (a comment)."""
    lines = [ln[5:].removeprefix(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def payloads(buf: bytes) -> Iterator[bytes]:
    """The data of every complete event in ``buf`` (which holds whole events only)."""
    if b"\r" in buf:
        buf = buf.replace(b"\r\n", b"\n")
    for block in buf.split(b"\n\n"):
        if block.startswith(b"data: ") and b"\n" not in block:
            yield block[6:]  # vLLM's events: one data line each
        elif block and (data := data_of(block)) is not None:
            yield data


def _doc(payload: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


class Transcript:
    """What one client has been sent of one choice (``n`` is 1), in the client's own terms: its
    stream's ``id``, ``created`` and ``model``, the text, the tokens, and how far the answer got."""

    __slots__ = ("_plain", "_text", "chat", "created", "done", "finish_reason", "id", "kept", "model",
                 "prompt_tokens", "reasoning", "role_sent", "tokens", "tool_call")

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.kept: list[bytes] = []  # chunks sent and not yet parsed: whole events only (relay.py appends)
        self._plain = _PLAIN_CHAT if chat else _PLAIN_TEXT
        self._text: list[str] = []
        self.tokens = 0
        self.prompt_tokens: int | None = None  # from usage the stream carried, or /tokenize at a splice
        self.id: Any = None
        self.created: Any = None
        self.model: Any = None
        self.role_sent = False
        self.finish_reason: str | None = None
        self.done = False  # [DONE] was sent
        self.tool_call = False
        self.reasoning = False

    @property
    def text(self) -> str:
        if len(self._text) > 1:
            self._text = ["".join(self._text)]
        return self._text[0] if self._text else ""

    @property
    def ended(self) -> bool:
        """The client has the whole answer: what is missing is at most usage and ``[DONE]``."""
        return self.done or self.finish_reason is not None

    def counter(self) -> Callable[[], int | None]:
        """For a stream that is over: its token count, worked out only when something asks (the
        console's Activity). Parsing the unparsed tail of every stream as it ended cost 1.5-4 µs per
        relayed event (bench/compare). The text is dropped now, so what stays until then is the
        tail's bytes, under relay.COMPACT_BYTES."""
        self._text = []

        def count() -> int | None:
            if self.kept:
                self.compact()
                self._text = []
            return self.tokens
        return count

    def compact(self) -> None:
        """Parse what was kept into text and counts, and drop the bytes."""
        data = b"".join(self.kept)
        self.kept.clear()  # the same list: the relay holds it
        if self.id is not None and self._plain_batch(data):
            return
        for payload in payloads(data):
            if payload == DONE:
                self.done = True
            elif not self._token(payload) and (doc := _doc(payload)) is not None:
                self.absorb(doc)
        self.text  # noqa: B018 - join the pieces now, while they are warm, not at the splice

    def _plain_batch(self, data: bytes) -> bool:
        """Account for a batch in which every event is one plain token that is not the last (how a
        long answer's batches after the first look), in one regex pass over the batch, about half
        the cost of event by event. False, having changed nothing, for any other batch."""
        events = data.count(b"\n\n")
        if b'"usage"' in data or data.count(b'"finish_reason":null') != events:
            return False
        found = self._plain.findall(data)
        if len(found) != events:
            return False  # some event is not a plain delta: a role, a tool call, reasoning, [DONE]
        raw = b"".join(found)
        try:
            text = scanstring(raw.decode() + '"', 0)[0] if b"\\" in raw else raw.decode()
        except (ValueError, UnicodeDecodeError):
            return False
        self._text.append(text)
        self.tokens += events
        return True

    def _token(self, payload: bytes) -> bool:
        """Account for the common event, one token of plain text that is not the last, without a
        JSON parse (about half the cost of one). False: parse it in full."""
        m = self._plain.search(payload)
        if m is None or self.id is None or b'"finish_reason":null' not in payload or b'"usage"' in payload:
            return False
        raw = m.group(1)
        try:
            text = scanstring(raw.decode() + '"', 0)[0] if b"\\" in raw else raw.decode()
        except (ValueError, UnicodeDecodeError):
            return False
        if text:
            self._text.append(text)
        self.tokens += 1
        return True

    def absorb(self, doc: dict[str, Any]) -> None:
        """Account for one event as the client received it."""
        if self.id is None and "id" in doc:
            self.id, self.created, self.model = doc.get("id"), doc.get("created"), doc.get("model")
        choices = doc.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            self._choice(choices[0])
        usage = doc.get("usage")
        if isinstance(usage, dict):
            if (ct := _int(usage.get("completion_tokens"))) is not None:
                self.tokens = ct
            if (pt := _int(usage.get("prompt_tokens"))) is not None:
                self.prompt_tokens = pt

    def _choice(self, c: dict[str, Any]) -> None:
        if self.chat:
            delta = c.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            content = delta.get("content")
            if delta.get("tool_calls"):
                self.tool_call = True
            if delta.get("reasoning") or delta.get("reasoning_content"):
                self.reasoning = True
            role = "role" in delta
            self.role_sent = self.role_sent or role
            token = not role or bool(content)  # vLLM's role chunk ({"role", "content": ""}) is no token
        else:
            content = c.get("text")
            token = True
        if isinstance(content, str) and content:
            self._text.append(content)
        if token:
            self.tokens += 1
        if c.get("finish_reason") is not None:
            self.finish_reason = str(c["finish_reason"])

    def closing(self) -> bytes:
        """The end of a stream whose answer is complete but whose replica broke before ``[DONE]``
        (or whose ``max_tokens`` was used up): a final chunk if none was sent, then ``[DONE]``.
        Usage is not made up: without the replica's own count there is no prompt token count."""
        out = b""
        if self.finish_reason is None:
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            if self.chat:
                choice["delta"] = {}
            else:
                choice["text"] = ""
            doc = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                   "created": self.created, "model": self.model, "choices": [choice]}
            out = _event(doc)
            self.finish_reason = "length"
        return out + (b"" if self.done else b"data: [DONE]\n\n")


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


class Splice:
    """Rewrites one continuation's events into the client's stream, as if one replica had answered:
    the client's ``id``, ``created`` and ``model``; no second role chunk; usage in the client's terms
    (completion tokens: all the client got; prompt tokens: the original prompt's, as counted by a
    replica that saw it, else the continuation's prompt less the tokens it was given back). Error
    events and ``[DONE]`` pass unchanged. Runs only after a break, so it may parse every event."""

    __slots__ = ("_rest", "offset", "t")

    def __init__(self, transcript: Transcript) -> None:
        self.t = transcript
        self.offset = transcript.tokens  # what the client had before this leg
        self._rest = b""

    @property
    def pending(self) -> bool:
        """Part of an event is waiting for its end."""
        return bool(self._rest)

    def feed(self, chunk: bytes) -> bytes:
        """What to send the client for ``chunk`` of the continuation (complete events only)."""
        events, self._rest = split_events(self._rest + chunk if self._rest else chunk)
        return b"".join(self._event(e) for e in events)

    def _event(self, event: bytes) -> bytes:
        payload = data_of(event)
        if payload == DONE:
            self.t.done = True
            return event
        doc = _doc(payload) if payload is not None else None
        if doc is None or "error" in doc:
            return event
        t = self.t
        if t.id is not None:
            doc["id"], doc["created"], doc["model"] = t.id, t.created, t.model
        choices = doc.get("choices")
        if t.chat and t.role_sent and isinstance(choices, list) and choices and isinstance(choices[0], dict):
            c = choices[0]
            delta = c.get("delta")
            if isinstance(delta, dict) and "role" in delta:
                del delta["role"]
                if set(delta) <= {"content"} and not delta.get("content") and c.get("finish_reason") is None:
                    return b""  # the continuation's role chunk: the client has had its own
        usage = doc.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
        t.absorb(doc)
        return _event(doc)

    def _usage(self, u: dict[str, Any]) -> None:
        ct, pt = _int(u.get("completion_tokens")), _int(u.get("prompt_tokens"))
        if ct is not None:
            u["completion_tokens"] = ct = ct + self.offset
        if pt is not None:
            u["prompt_tokens"] = pt = self.t.prompt_tokens if self.t.prompt_tokens is not None \
                else max(0, pt - self.offset)
        if ct is not None and pt is not None:
            u["total_tokens"] = ct + pt

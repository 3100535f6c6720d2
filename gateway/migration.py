"""Whether a broken stream may continue on another replica, and the request that continues it
(docs/stream-failover.md has the whole contract).

A continuation asks another replica for the rest of the same answer: for chat, the original messages
plus an assistant message holding the text the client already has, with ``continue_final_message``
and without a generation prompt; for completions, the prompt followed by that text. Everything else
in the request stays as the client sent it (sampling parameters, stop sequences, tools, seed), except
``max_tokens`` / ``max_completion_tokens`` (and ``min_tokens``), which lose what was already produced.

Some requests cannot be continued that way, and are known from the request alone; the rest is known
only from the stream (sse.Transcript: a tool call or reasoning already under way). Each case is an
``outcome`` label of ``fleet_stream_migrations_total``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.sse import Transcript

# Outcomes of a break (the metric's label values; a bounded set).
MIGRATED = "migrated"  # continued on another replica
FINISHED = "finished"  # the client already had the whole answer: the stream was closed normally
# ... and those that end with the error event:
N = "n"  # n > 1 (or best_of > 1): several choices interleave in one stream
LOGPROBS = "logprobs"  # logprobs, top_logprobs or prompt_logprobs were asked for
UNSUPPORTED = "unsupported"  # echo, token or batched prompts, structured output, return_token_ids
TOOL_CALL = "tool_call"  # a tool call was being streamed
REASONING = "reasoning"  # reasoning text was being streamed
DEADLINE = "deadline"  # the request's total timeout has passed
EXHAUSTED = "exhausted"  # FLEET_MAX_MIGRATIONS continuations were already made
NO_REPLICA = "no_replica"  # no replica in rotation that has not failed this request
BUSY = "busy"  # the other replicas are full and their queue would not take it in time
FAILED = "failed"  # the continuation itself failed before its first byte (an error status, a timeout)
DISABLED = "disabled"  # FLEET_MAX_MIGRATIONS=0

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
_STRUCTURED = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
               "guided_decoding_backend")
# A request with none of these fields is judged without looking further.
_SHAPE_FIELDS = frozenset({"n", "best_of", "logprobs", "top_logprobs", "prompt_logprobs", "echo", "return_token_ids",
                           "response_format", "continue_final_message", *_STRUCTURED})


@dataclass(frozen=True, slots=True)
class Plan:
    """What is known from the request: its kind, and whether its shape rules a continuation out."""

    chat: bool
    doc: dict[str, Any]  # the request as parsed once by the proxy; never changed here
    refusal: str | None = None  # an outcome label, when the request cannot be continued
    why: str = ""  # the reason, for the client's error event

    @property
    def migratable(self) -> bool:
        return self.refusal is None


def stream_tokens(path: str, body: bytes) -> int | None:
    """Completion tokens of a whole completion stream that arrived with its head (a short answer),
    counted as a continuation would count them; None for any other path."""
    if path not in (CHAT_PATH, COMPLETIONS_PATH):
        return None
    t = Transcript(path == CHAT_PATH)
    t.kept.append(body)
    t.compact()
    return t.tokens


def plan_for(path: str, doc: dict[str, Any], max_migrations: int) -> Plan | None:
    """None for anything but a streamed chat or text completion (there is nothing to count)."""
    if doc.get("stream") is not True or path not in (CHAT_PATH, COMPLETIONS_PATH):
        return None
    chat = path == CHAT_PATH
    refusal = _refusal(doc, chat, max_migrations)
    if refusal is None:
        return Plan(chat, doc)
    return Plan(chat, doc, *refusal)


def _refusal(doc: dict[str, Any], chat: bool, max_migrations: int) -> tuple[str, str] | None:
    if max_migrations == 0:
        return DISABLED, "migration is off (FLEET_MAX_MIGRATIONS=0)"
    if chat:
        if not isinstance(doc.get("messages"), list):
            return UNSUPPORTED, "the request's messages are not a list"
    elif one_prompt(doc.get("prompt")) is None:
        return UNSUPPORTED, "the prompt is not one string"
    if doc.keys().isdisjoint(_SHAPE_FIELDS):
        return None  # the usual request: one look at its keys
    if doc.get("n") not in (None, 1) or doc.get("best_of") not in (None, 1):
        return N, "the request asked for several choices (n > 1)"
    if (doc.get("logprobs") if chat else doc.get("logprobs") is not None) or doc.get("top_logprobs") \
            or doc.get("prompt_logprobs") is not None:
        return LOGPROBS, "the request asked for logprobs"
    for field in ("echo", "return_token_ids"):
        if doc.get(field):
            return UNSUPPORTED, f"the request sets {field}"
    fmt = doc.get("response_format")
    if any(doc.get(k) for k in _STRUCTURED) or (isinstance(fmt, dict) and fmt.get("type") not in (None, "text")):
        return UNSUPPORTED, "the request constrains its output (structured output restarts with a new request)"
    if chat and doc.get("continue_final_message"):
        last = doc["messages"][-1] if doc["messages"] else None
        if not isinstance(last, dict) or not isinstance(last.get("content"), str):
            return UNSUPPORTED, "the assistant message being continued has no plain text content"
    return None


def one_prompt(p: object) -> str | None:
    """A text completion's prompt when it is one string (alone or in a list of one), else None."""
    if isinstance(p, str):
        return p
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        return p[0]
    return None


def refusal_after(t: Transcript) -> tuple[str, str] | None:
    """What the stream so far rules out: text the replica meant for a tool call or for its reasoning
    cannot be handed back as the assistant's answer."""
    if t.tool_call:
        return TOOL_CALL, "a tool call was being streamed"
    if t.reasoning:
        return REASONING, "reasoning was being streamed"
    return None


def continuation(plan: Plan, text: str, tokens: int) -> bytes | None:
    """The body that asks for the rest of the answer after ``text`` (``tokens`` tokens of it), or None
    when the client's token budget is already spent (nothing is left to generate)."""
    body = dict(plan.doc)
    for key in ("max_tokens", "max_completion_tokens"):
        limit = body.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - tokens < 1:
                return None
            body[key] = limit - tokens
    least = body.get("min_tokens")
    if isinstance(least, int) and not isinstance(least, bool):
        body["min_tokens"] = max(0, least - tokens)
    if not text:
        # Nothing to hand back. An empty assistant message would not do: the chat template would
        # close it, and the replica would answer after an empty turn.
        return json.dumps(body).encode()
    if plan.chat:
        messages = list(body["messages"])
        last = messages[-1] if messages else None
        if body.get("continue_final_message") and isinstance(last, dict) and last.get("role") == "assistant":
            messages[-1] = {**last, "content": last["content"] + text}  # the client was continuing it already
        else:
            messages.append({"role": "assistant", "content": text})
        body["messages"] = messages
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    else:
        body["prompt"] = (one_prompt(body.get("prompt")) or "") + text
    return json.dumps(body).encode()

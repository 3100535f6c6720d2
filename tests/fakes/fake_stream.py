"""The SSE events of the fake vLLM's streamed answers (fake_vllm.py documents their shape), and how
it reads a request that continues an earlier answer."""

from __future__ import annotations

import json
import re
from typing import Any

_WORD = re.compile(r"\bt(\d+)\b")


def continue_problem(body: dict[str, Any]) -> str | None:
    """vLLM's checks of a request that continues an assistant message."""
    if not body.get("continue_final_message"):
        return None
    if body.get("add_generation_prompt", True):
        return "Cannot set both `continue_final_message` and `add_generation_prompt`."
    messages = body.get("messages") or []
    if not messages or messages[-1].get("role") != "assistant":
        return "continue_final_message needs a final assistant message"
    return None


def continued_from(body: dict[str, Any]) -> int:
    """Where the answer goes on: the fake's tokens are "t0 t1 ...", so a continuation (an assistant
    message continued, or a prompt that already holds some) starts after the last one it was given."""
    if body.get("continue_final_message"):
        text = str(body["messages"][-1].get("content") or "")
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        return 0
    found = _WORD.findall(text)
    return int(found[-1]) + 1 if found else 0


def prompt_words(body: dict[str, Any]) -> int:
    """The fake's prompt token count: one per word of the prompt or of every message."""
    if "messages" in body:
        return sum(len(str(m.get("content") or "").split()) for m in body["messages"] if isinstance(m, dict))
    return len(str(body.get("prompt") or "").split())


class Events:
    """The SSE events of one streamed answer, shaped as vLLM's (role chunk first for chat, the finish
    reason on the last token's chunk, a usage chunk when asked; one choice per ``n``)."""

    def __init__(self, fingerprint: str, ident: str, created: int, body: dict[str, Any], chat: bool) -> None:
        self.fingerprint, self.body, self.chat = fingerprint, body, chat
        self.finish = "length" if body.get("max_tokens") is not None else "stop"
        self.n = int(body.get("n") or 1)
        self.tool = chat and bool(body.get("tools")) and body.get("tool_choice") == "required"
        # Distinct per request and per replica, so that a test sees whether the gateway rewrote them.
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{ident}"
        self.created = created

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.body["model"], "system_fingerprint": self.fingerprint,
                 "choices": choices, **extra}
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    def role(self) -> bytes:
        return self._event([{"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None} for k in range(self.n)])

    def tokens(self, i: int, k: int, last: bool) -> bytes:
        """The event of tokens ``i`` .. ``i + k - 1``."""
        finish = ("tool_calls" if self.tool else self.finish) if last else None
        words = "".join(f"t{j} " for j in range(i, i + k))
        choices = []
        for n in range(self.n):
            if self.tool:
                call: dict[str, Any] = {"index": 0, "function": {"arguments": f"{{\"t\":{i}}}" if i else ""}}
                if i == 0:
                    call.update(id="call-0", type="function", function={"name": "f", "arguments": ""})
                delta: dict[str, Any] = {"tool_calls": [call]}
            elif self.body.get("fake_reasoning"):
                delta = {"reasoning": words.replace("t", "r")}
            else:
                delta = {"content": words}
            choice = {"index": n, "delta": delta} if self.chat else {"index": n, "text": words}
            choices.append({**choice, "logprobs": None, "finish_reason": finish})
        return self._event(choices)

    def usage(self, n: int) -> bytes:
        prompt = prompt_words(self.body)
        return self._event([], usage={"prompt_tokens": prompt, "completion_tokens": n * self.n,
                                      "total_tokens": prompt + n * self.n})

"""The routing benchmark's workload: conversations with long shared system prompts and a long
document pasted in the first turn, then short follow-ups after a pause (the user reading and
typing, so other conversations' requests come in between, as in real chat traffic);
deterministic from a seed, so every policy sees the same requests in the same order.

``uniform``: the conversations spread evenly over the system prompts.
``skewed``: one hot system prompt carries ``hot_share`` of the conversations, which arrive first,
so a cache-aware policy is tempted to pile them onto one replica.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Words the tiny model's tokenizer was trained on (vllm_fleet/tinymodel.py), so text tokenizes
# into real multi-character tokens rather than single bytes.
_TEXT = ("the quick brown fox jumps over lazy dog fleet of servers sits behind one gateway each instance "
          "owns group gpus and listens on its own port supervisor starts watches restarts stops every "
          "process hello how can help you today tell me story about sea once upon time there was small "
          "model that answered question system user assistant helpful please reply briefly streaming "
          "responses arrive as events chunk prometheus scrapes metrics clients send chat completions")
_WORDS = _TEXT.split()


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


@dataclass
class Conversation:
    system: str
    document: str
    followups: list[str]
    think_s: list[float]  # the user's pause after each answer before the next turn
    messages: list[dict[str, str]] = field(default_factory=list)

    def turns(self) -> int:
        return 1 + len(self.followups)

    def next_user(self, turn: int) -> str:
        if turn == 0:
            return f"Read this document and answer briefly.\n\n{self.document}\n\nWhat is it about?"
        return self.followups[turn - 1]


def build(kind: str, conversations: int, turns: int, system_prompts: int, system_chars: int,
          document_chars: int, hot_share: float, think_s: float, seed: int) -> list[Conversation]:
    rng = random.Random(seed)
    systems = [f"You are assistant {i}. " + _text(rng, system_chars) for i in range(system_prompts)]
    convs: list[Conversation] = []
    for i in range(conversations):
        if kind == "skewed":
            s = 0 if rng.random() < hot_share else 1 + i % (system_prompts - 1)
        else:
            s = i % system_prompts
        followups = [f"Follow-up {t}: " + _text(rng, 80) for t in range(turns - 1)]
        think = [rng.uniform(0.5, 1.5) * think_s for _ in range(turns - 1)]
        convs.append(Conversation(systems[s], _text(rng, document_chars), followups, think))
    if kind == "skewed":
        convs.sort(key=lambda c: c.system != systems[0])  # the hot prompt's conversations come first
    return convs

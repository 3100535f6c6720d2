"""The pieces of cache-aware routing: what a request's prompt prefix is, which replica has seen it,
and a consistent-hash ring with bounded loads for session keys.

Prefix: the prompt as vLLM will see it, approximately: every message's role and text in order
(the whole list, not only the first message), tools first when present. It is cut into blocks of
``BLOCK_CHARS`` characters and each block's hash chains the previous one, so block *i*'s hash
names the whole prefix up to it, as vLLM's own prefix cache names its KV blocks. The index maps
those hashes to the replicas that were sent them (an approximate prefix tree: the deepest known
hash is the longest shared prefix), least recently used first out.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from gateway.backend import Backend

BLOCK_CHARS = 128  # ≈ 32 tokens of English; vLLM's blocks are 16 tokens
MAX_BLOCKS = 2048  # prompts longer than 256k characters match on their first 256k only


def prompt_text(doc: dict[str, Any]) -> str:
    """The routing view of a chat or completions request's prompt; "" when there is none."""
    parts: list[str] = []
    tools = doc.get("tools")
    if tools:
        parts.append(json.dumps(tools, sort_keys=True, separators=(",", ":")))
    messages = doc.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                parts.append(f"\x1e{m.get('role', '')}\x1f")
                parts.append(_content_text(m.get("content")))
        return "".join(parts)
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0] if isinstance(prompt[0], str | list) else prompt  # a batch: its first prompt
    if isinstance(prompt, str):
        parts.append(prompt)
    elif isinstance(prompt, list):  # token ids
        parts.append(",".join(str(t) for t in prompt))
    return "".join(parts)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text as is, anything else (images) by its JSON
        return "".join(p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str)
                       else json.dumps(p, sort_keys=True) for p in content)
    return "" if content is None else str(content)


def block_hashes(text: str) -> list[int]:
    """Chained hashes of the full blocks of ``text`` (a partial last block is left out: no later
    request can share it as a whole block). Python's str hash: fast; the same in every gateway
    worker because they share one PYTHONHASHSEED (workers.py, prefixshare.py)."""
    out: list[int] = []
    h = 0
    for i in range(0, min(len(text), BLOCK_CHARS * MAX_BLOCKS) - BLOCK_CHARS + 1, BLOCK_CHARS):
        h = hash((h, text[i:i + BLOCK_CHARS]))
        out.append(h)
    return out


class Index(Protocol):
    """What routing asks of a prefix index: this process's own (below), or the workers' shared one
    (prefixshare.py)."""

    def __len__(self) -> int: ...

    def deepest(self, hashes: Sequence[int], usable: Sequence[Backend]) -> tuple[int, list[Backend]]: ...

    def record(self, hashes: Iterable[int], b: Backend) -> None: ...

    def forget(self, b: Backend) -> None: ...


class PrefixIndex:
    """Block hash → the replicas sent that prefix, most recent last; bounded, LRU."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._map: OrderedDict[int, list[Backend]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._map)

    def deepest(self, hashes: Sequence[int], usable: Sequence[Backend]) -> tuple[int, list[Backend]]:
        """How many blocks matched, and the replicas among ``usable`` holding that longest prefix.

        Walks from the longest prefix down, so a replica that holds more of it wins over one
        that holds less; (0, []) when no usable replica holds even the first block."""
        ids = {id(b) for b in usable}
        for depth in range(len(hashes), 0, -1):
            holders = self._map.get(hashes[depth - 1])
            if holders:
                found = [b for b in holders if id(b) in ids]
                if found:
                    return depth, found
        return 0, []

    def record(self, hashes: Iterable[int], b: Backend) -> None:
        m = self._map
        for h in hashes:
            holders = m.get(h)
            if holders is None:
                m[h] = [b]
            else:
                m.move_to_end(h)
                if holders[-1] is not b:
                    if b in holders:
                        holders.remove(b)
                    holders.append(b)
        while len(m) > self.capacity:
            m.popitem(last=False)

    def forget(self, b: Backend) -> None:
        """``b`` lost its cache (it left rotation: restarted or dead)."""
        for h in [h for h, holders in self._map.items() if b in holders]:
            holders = self._map[h]
            holders.remove(b)
            if not holders:
                del self._map[h]


def stable_hash(key: str) -> int:
    """64 bits, the same across processes and restarts (unlike hash()), so every gateway worker agrees."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing with bounded loads (Mirrokni et al.): a key goes to the first replica
    clockwise from its point whose load is within the bound; a full one passes it on."""

    VNODES = 64

    def __init__(self, backends: Sequence[Backend]) -> None:
        points = sorted((stable_hash(f"{b.name}#{v}"), i) for i, b in enumerate(backends) for v in range(self.VNODES))
        self._keys = [p for p, _ in points]
        self._owners = [backends[i] for _, i in points]

    def walk(self, key: str) -> Iterable[Backend]:
        """Replicas in ring order from ``key``'s point, each once."""
        n = len(self._keys)
        if not n:
            return
        start = bisect.bisect(self._keys, stable_hash(key))
        seen: set[int] = set()
        for j in range(n):
            b = self._owners[(start + j) % n]
            if id(b) not in seen:
                seen.add(id(b))
                yield b

"""The recent log lines of every child and of the supervisor itself, for the web console.

The supervisor already writes every line it says (``[fleet] ...``) and every line a child prints
(``[NAME] ...``, process.py's pump) to one console stream. ``LogBook`` sits in front of that stream:
it passes everything through unchanged and keeps the last lines of each source in a ring buffer,
so no caller changes and the files under ``log_dir`` stay the complete record. Each line gets a
sequence number; a reader asks for what came after the last number it saw (``GET /logs?after=N``),
so a polling console receives each line once and a slow one only loses lines older than the ring.
"""

from __future__ import annotations

import io
import time
from collections import deque
from typing import Any, TextIO

SUPERVISOR = "supervisor"  # the source name of the supervisor's own "[fleet] ..." lines
_PER_SOURCE = 500  # lines kept per source: a few screens of a vLLM start-up, a few KiB each child
_MAX_LINE = 2000  # characters kept of one line: a traceback line, not a tokenizer dump


class LogBook(io.TextIOBase):
    """A write-through console that remembers recent lines per source."""

    def __init__(self, out: TextIO, per_source: int = _PER_SOURCE) -> None:
        self._out = out
        self._per_source = per_source
        self._rings: dict[str, deque[tuple[int, float, str]]] = {}
        self._seq = 0
        self._partial = ""

    def write(self, text: str) -> int:
        self._out.write(text)
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()  # an unfinished line waits for its end
        for line in lines:
            self._add(line)
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def _add(self, line: str) -> None:
        source, text = SUPERVISOR, line
        if line.startswith("[") and "] " in line:
            tag, _, rest = line[1:].partition("] ")
            source, text = (SUPERVISOR if tag == "fleet" else tag), rest
        ring = self._rings.get(source)
        if ring is None:
            ring = self._rings[source] = deque(maxlen=self._per_source)
        self._seq += 1
        ring.append((self._seq, time.time(), text[:_MAX_LINE]))

    def sources(self) -> list[str]:
        return sorted(self._rings)

    def since(self, after: int = 0, source: str | None = None, limit: int = 500) -> dict[str, Any]:
        """Lines numbered above ``after`` (of one source, or all), oldest first, at most ``limit``
        (the newest ones); ``last`` is the cursor for the next call."""
        names = [source] if source else list(self._rings)
        picked = [(seq, ts, name, text) for name in names for seq, ts, text in self._rings.get(name, ())
                  if seq > after]
        picked.sort()
        picked = picked[-limit:]
        return {"last": self._seq, "sources": self.sources(),
                "lines": [{"seq": s, "time": round(t, 3), "source": n, "text": x} for s, t, n, x in picked]}

"""Generated blocks in markdown files: find them, render them, tell which are stale, rewrite them.

A block is the text between ``<!-- generated:NAME -->`` and the next ``<!-- /generated -->``, each
marker alone on its line. Everything outside the markers is prose and is never touched.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

START = re.compile(r"^<!-- generated:(?P<name>[A-Za-z0-9:._-]+) -->$")
END = "<!-- /generated -->"
COMMAND = "python -m vllm_fleet.docgen --write"
NOTE = f"<!-- made from the code by `{COMMAND}`: edit the code (Field descriptions, help texts), not this table -->"


def doc_files(root: Path) -> list[Path]:
    """The markdown a reader of the repository follows: the README, docs/, bench/ and deploy/ guides."""
    found = [root / "README.md", root / "bench" / "README.md"]
    found += sorted((root / "docs").glob("**/*.md")) + sorted((root / "deploy").glob("**/README.md"))
    return [p for p in found if p.is_file()]


class BlockError(ValueError):
    """A marker without its end, or nested markers: the file cannot be rewritten safely."""


@dataclass(frozen=True)
class Block:
    name: str
    line: int  # 1-based line of the start marker
    end: int  # 1-based line of the end marker
    body: str  # the lines between the markers, joined with newlines


def blocks(text: str, where: str) -> Iterator[Block]:
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = START.match(lines[i].strip())
        if m is None:
            if lines[i].strip() == END:
                raise BlockError(f"{where}:{i + 1}: {END} without a start marker")
            i += 1
            continue
        for j in range(i + 1, len(lines)):
            if START.match(lines[j].strip()):
                raise BlockError(f"{where}:{j + 1}: a start marker inside the block opened on line {i + 1}")
            if lines[j].strip() == END:
                yield Block(m["name"], i + 1, j + 1, "\n".join(lines[i + 1:j]))
                i = j + 1
                break
        else:
            raise BlockError(f"{where}:{i + 1}: <!-- generated:{m['name']} --> has no {END}")


def block_body(rendered: str) -> str:
    return f"{NOTE}\n{rendered}"


def rewrite(text: str, where: str, render: Callable[[str], str]) -> str:
    """``text`` with every block's body replaced by ``render(name)``."""
    out: list[str] = []
    lines = text.split("\n")
    starts = {b.line - 1: b for b in blocks(text, where)}
    i = 0
    while i < len(lines):
        out.append(lines[i])
        block = starts.get(i)
        if block is None:
            i += 1
            continue
        out.append(block_body(render(block.name)))
        i = block.end - 1  # the old body is dropped; the end marker is copied next
    return "\n".join(out)


@dataclass(frozen=True)
class Stale:
    file: Path
    block: Block
    expected: str

    def message(self, root: Path) -> str:
        return (f"{self.file.relative_to(root)}:{self.block.line}: the table '{self.block.name}' differs from "
                f"the code; run `{COMMAND}`")


def stale_blocks(root: Path, render: Callable[[str], str]) -> list[Stale]:
    out = []
    for path in doc_files(root):
        for b in blocks(path.read_text(encoding="utf-8"), str(path.relative_to(root))):
            expected = block_body(render(b.name))
            if b.body != expected:
                out.append(Stale(path, b, expected))
    return out


def write_blocks(root: Path, render: Callable[[str], str]) -> list[Path]:
    """Rewrite every doc with blocks; return the files that changed."""
    changed = []
    for path in doc_files(root):
        old = path.read_text(encoding="utf-8")
        new = rewrite(old, str(path.relative_to(root)), render)
        if new != old:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def names_in_docs(root: Path) -> dict[str, list[str]]:
    """Each block name used, with where (``file:line``)."""
    found: dict[str, list[str]] = {}
    for path in doc_files(root):
        rel = str(path.relative_to(root))
        for b in blocks(path.read_text(encoding="utf-8"), rel):
            found.setdefault(b.name, []).append(f"{rel}:{b.line}")
    return found

"""Markdown table cells: escaping and code spans, so generated text cannot break a table."""

from __future__ import annotations

from collections.abc import Sequence


def cell(text: str) -> str:
    # GitHub splits table cells on '|' even inside code spans; a newline ends the row.
    return " ".join(text.split()).replace("|", "\\|")


def code(text: str) -> str:
    """``text`` as a code span; a backtick inside gets a longer fence."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)

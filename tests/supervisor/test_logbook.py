"""LogBook (the console's log tail): write-through, lines split by source, numbered, bounded."""

from __future__ import annotations

import io

from fleet_supervisor.logbook import SUPERVISOR, LogBook


def test_lines_pass_through_and_are_kept_by_source() -> None:
    out = io.StringIO()
    book = LogBook(out, per_source=3)
    book.write("[fleet] wrote .fleet/infernet.json\n[alpha] INFO loading")
    assert out.getvalue() == "[fleet] wrote .fleet/infernet.json\n[alpha] INFO loading"  # unchanged
    first = book.since()
    assert [(x["source"], x["text"]) for x in first["lines"]] == [(SUPERVISOR, "wrote .fleet/infernet.json")]
    book.write(" weights\n[beta] <img src=x onerror=alert(1)>\nno tag at all\n")
    got = book.since(first["last"])
    assert [(x["source"], x["text"]) for x in got["lines"]] == [
        ("alpha", "INFO loading weights"), ("beta", "<img src=x onerror=alert(1)>"), (SUPERVISOR, "no tag at all")]
    assert got["sources"] == ["alpha", "beta", SUPERVISOR]
    assert book.since(got["last"])["lines"] == []
    assert [x["text"] for x in book.since(0, "beta")["lines"]] == ["<img src=x onerror=alert(1)>"]


def test_each_source_keeps_its_last_lines_and_a_limit_keeps_the_newest() -> None:
    book = LogBook(io.StringIO(), per_source=3)
    for i in range(10):
        book.write(f"[a] line {i}\n")
    book.write("[b] only\n")
    assert [x["text"] for x in book.since(0, "a")["lines"]] == ["line 7", "line 8", "line 9"]
    assert [x["text"] for x in book.since(0, limit=2)["lines"]] == ["line 9", "only"]

"""Every link in the README, docs/, bench/README.md and deploy/**/README.md resolves: relative
files exist (and are not gitignored), #anchors match a heading as GitHub slugs it, and http(s)
links are well formed. Offline: no link is fetched."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.docgen import blocks, links

ROOT = Path(__file__).resolve().parents[1]


def test_every_link_in_the_docs_resolves() -> None:
    published = links.published_files(ROOT)
    broken = [p for path in blocks.doc_files(ROOT) for p in links.problems(path, ROOT, published)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_docs_checked_include_every_guide() -> None:
    checked = {str(p.relative_to(ROOT)) for p in blocks.doc_files(ROOT)}
    assert {"README.md", "bench/README.md", "docs/fleet-file.md", "deploy/ray/README.md"} <= checked


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Quick start", "quick-start"),
    ("The `supervisor:` section", "the-supervisor-section"),
    ("Routing, health and failure semantics", "routing-health-and-failure-semantics"),
    ("`bench/compare/` — the gateway against direct (issue #5)", "benchcompare--the-gateway-against-direct-issue-5"),
    ("3. The control channel (`fleetspec/control.py`)", "3-the-control-channel-fleetspeccontrolpy"),
    ("`instances[].sleep:`", "instancessleep"),
    ("Results: `vllm bench serve` on the CPU build", "results-vllm-bench-serve-on-the-cpu-build"),
    ("A [linked](x.md) **bold** heading", "a-linked-bold-heading"),
])
def test_slugs_follow_github(heading: str, anchor: str) -> None:
    assert links.slug(heading) == anchor


def test_repeated_headings_get_numbered_anchors() -> None:
    assert {"results", "results-1", "results-2"} <= links.anchors("## Results\n## Results\n### Results\n")


BROKEN = """\
# Title

## Section two

[ok](#section-two) [ok file](other.md) [ok anchor](other.md#deep-part) [dir](sub/) ![img](sub/pic.png)
[no anchor](#section-three)
[no file](missing.md)
[no anchor there](other.md#nowhere)
[outside](../../etc/passwd)
[bad host](https://exa_mple..com/x) [bad port](http://example.com:99999/) [no host](https:///path)
[ok url](https://github.com/vllm-project/vllm#readme) <https://docs.vllm.ai/en/latest/>
[weird scheme](ftp://example.com/x)
[ref]: missing-ref.md

```
[in a code block](missing-in-code.md)
```
and `[inline code](missing-inline.md)` is not a link either.
"""


def test_the_checker_reports_each_kind_of_broken_link(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs" / "sub").mkdir(parents=True)
    (root / "docs" / "sub" / "pic.png").write_bytes(b"")
    (root / "docs" / "other.md").write_text("# Other\n\n## Deep part\n", encoding="utf-8")
    page = root / "docs" / "page.md"
    page.write_text(BROKEN, encoding="utf-8")
    found = links.problems(page, root)
    assert [f.split(": ", 1)[0] for f in found] == [
        "docs/page.md:6", "docs/page.md:7", "docs/page.md:8", "docs/page.md:9",
        "docs/page.md:10", "docs/page.md:10", "docs/page.md:10", "docs/page.md:12", "docs/page.md:13"]
    text = "\n".join(found)
    for why in ("#section-three: no heading in this file", "missing.md: no such file",
                "other.md#nowhere: other.md has no heading with the anchor #nowhere",
                "../../etc/passwd: points outside the repository",
                "https://exa_mple..com/x: malformed host exa_mple..com",
                "http://example.com:99999/: malformed port", "https:///path: malformed URL",
                "ftp://example.com/x: scheme ftp", "missing-ref.md: no such file"):
        assert why in text, text
    assert "in-code" not in text and "inline" not in text


def test_a_link_to_an_ignored_file_is_broken_for_readers(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text("{}", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text("[results](results.json)\n", encoding="utf-8")
    assert links.problems(page, tmp_path, published={"README.md"}) == [
        "README.md:1: results.json: exists here but git ignores it, so readers of the repository will not have it"]
    assert links.problems(page, tmp_path, published={"README.md", "results.json"}) == []

"""Links in the docs must resolve: relative targets exist, ``#anchors`` match a heading as GitHub
slugs it, and external ``http(s)`` links are well formed (checked offline: no network here or in CI).

Code (fenced blocks and inline spans) is skipped: a ``[x](y)`` in an example is not a link.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](src); one level of nested brackets in the text.
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^\s()<>]*(?:\([^\s()]*\))?[^\s()<>]*)>?"
                          r"(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_AUTOLINK = re.compile(r"<(https?://[^>\s]+)>")
_HTML_ATTR = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
_HOST = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*$")
_HTML_ANCHOR = re.compile(r"""<a\s+(?:[^>]*\s)?(?:id|name)\s*=\s*["']([^"']+)["']""")


@dataclass(frozen=True)
class Link:
    line: int
    target: str


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fence: str | None = None
    for n, line in enumerate(text.split("\n"), 1):
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            continue
        yield n, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, punctuation dropped, spaces to
    hyphens (github-slugger). Code spans keep their text; link and emphasis markup goes."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a markdown file offers: heading slugs (repeats get -1, -2, ...) and <a id/name>."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(text):
        m = _HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
        out.update(_HTML_ANCHOR.findall(line))
    return out


def links(text: str) -> list[Link]:
    out: list[Link] = []
    for n, line in _prose_lines(text):
        prose = _INLINE_CODE.sub("", line)
        found = _INLINE_LINK.findall(prose) + _AUTOLINK.findall(prose) + _HTML_ATTR.findall(prose)
        ref = _REFERENCE.match(prose)
        if ref:
            found.append(ref.group(1))
        out += [Link(n, t) for t in found]
    return out


def _external_problem(target: str) -> str | None:
    parts = urlsplit(target)
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return "malformed port"
    host = parts.hostname
    if not host or " " in target:
        return "malformed URL"
    if ":" not in host and not _HOST.match(host):  # an IPv6 literal has colons; anything else is DNS
        return f"malformed host {host}"
    return None


def published_files(root: Path) -> set[str] | None:
    """Repository-relative paths git would publish (tracked, or new and not ignored); None without
    git. A link to an ignored file (bench/results/) works here and is broken for every reader."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {p for p in out.decode().split("\0") if p}


def problems(path: Path, root: Path, published: set[str] | None = None) -> list[str]:
    """One message per broken link in ``path``, as ``file:line: target: why``."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(root)
    out: list[str] = []
    own = anchors(text)
    for link in links(text):
        why = _problem(link.target, path, root, own, published)
        if why:
            out.append(f"{rel}:{link.line}: {link.target}: {why}")
    return out


def _problem(target: str, path: Path, root: Path, own: set[str], published: set[str] | None) -> str | None:
    if not target:
        return "empty link"
    scheme = urlsplit(target).scheme
    if scheme in ("http", "https"):
        return _external_problem(target)
    if scheme == "mailto":
        return None
    if scheme:
        return f"scheme {scheme}: is not checked; use a relative link or http(s)"
    file_part, _, anchor = target.partition("#")
    file_part = unquote(file_part.split("?", 1)[0])
    if not file_part:
        return None if anchor in own else f"no heading in this file has the anchor #{anchor}"
    dest = (path.parent / file_part).resolve()
    if not dest.is_relative_to(root.resolve()):
        return "points outside the repository"
    if not dest.exists():
        return "no such file or directory"
    if published is not None and not _is_published(dest.relative_to(root.resolve()).as_posix(), published):
        return "exists here but git ignores it, so readers of the repository will not have it"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
        return f"{file_part} has no heading with the anchor #{anchor}"
    return None


def _is_published(rel: str, published: set[str]) -> bool:
    if rel in published or rel == ".":
        return True
    return any(p.startswith(rel + "/") for p in published)

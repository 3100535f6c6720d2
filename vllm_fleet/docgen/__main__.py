"""``python -m vllm_fleet.docgen``: check (default) or ``--write`` the generated tables of the docs.

Run from the repository root (or give ``--root``). The check exits 1 listing each stale table, each
table the code offers that no doc shows, each key without a description and each broken link.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_fleet.docgen import blocks, links, sources


def problems(root: Path) -> list[str]:
    """Everything ``--write`` cannot fix by itself comes after what it can."""
    out = [s.message(root) for s in blocks.stale_blocks(root, sources.render)]
    used = blocks.names_in_docs(root)
    out += [f"docs: no page shows the table '{name}'; add `<!-- generated:{name} -->` and `<!-- /generated -->` "
            f"lines where it belongs (docs/fleet-file.md, docs/gateway.md, docs/metrics.md), then run "
            f"`{blocks.COMMAND}`" for name in sources.all_names() if name not in used]
    out += [f"code: {key} has no description; give its field Field(description=...) so its docs row is not blank"
            for key in sources.undescribed()]
    published = links.published_files(root)
    for path in blocks.doc_files(root):
        out += links.problems(path, root, published)
    return out


def _repo_root(start: Path) -> Path:
    """The nearest directory up from ``start`` with a pyproject.toml: the docs live beside it."""
    for d in (start, *start.parents):
        if (d / "pyproject.toml").is_file():
            return d
    return start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vllm_fleet.docgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="examples:\n  python -m vllm_fleet.docgen --write\n"
                                       "  python -m vllm_fleet.docgen --print fleet-file:supervisor")
    p.add_argument("--write", action="store_true", help="rewrite every generated table in place")
    p.add_argument("--print", metavar="NAME", help="print one table (e.g. gateway-settings) and exit")
    p.add_argument("--root", type=Path, default=None,
                   help="the repository root (default: the nearest directory up with a pyproject.toml)")
    args = p.parse_args(argv)
    root = (args.root or _repo_root(Path.cwd())).resolve()
    if args.print:
        print(sources.render(args.print))
        return 0
    if args.write:
        for path in blocks.write_blocks(root, sources.render):
            print(f"rewrote {path.relative_to(root)}")
    found = problems(root)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

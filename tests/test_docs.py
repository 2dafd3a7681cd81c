"""The docs' links land: every `file.md#anchor` (or `#anchor`) link in README.md, docs/ and
bindings/ names a heading of its target, as GitHub slugs headings; BENCHMARKS.md opens with the
table of current figures, each row linking to its section."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "bindings" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6}\s+(.*)$", line)
        if heading:
            name = slug(heading.group(1))
            found.add(name if name not in seen else f"{name}-{seen[name]}")
            seen[name] = seen.get(name, 0) + 1
    return found


def test_every_anchor_link_lands_on_a_heading():
    broken = []
    for doc in DOCS:
        for target, anchor in LINK.findall(doc.read_text(encoding="utf-8")):
            path = (doc.parent / target).resolve() if target else doc
            if not path.is_file() or anchor not in anchors(path):
                broken.append(f"{doc.relative_to(REPO)}: {target}#{anchor}")
    assert broken == []


def test_benchmarks_open_with_the_current_figures_each_linking_to_its_section():
    text = (REPO / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    first = re.search(r"^## (.*)$", text, re.M)
    assert first is not None and first.group(1) == "Current figures"
    table = text[first.end():].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| [")]
    assert len(rows) >= 10
    own = anchors(REPO / "docs" / "BENCHMARKS.md")
    for row in rows:
        link = re.match(r"\| \[[^\]]+\]\(#([^)]+)\)", row)
        assert link is not None and link.group(1) in own, row[:80]


def test_the_slug_is_github_s():
    assert slug("Run 11 — the three targets: the `fast` preset (fourth session)") == \
        "run-11--the-three-targets-the-fast-preset-fourth-session"
    assert slug("Cross-session batching (`--batch`)") == "cross-session-batching---batch"

"""Every relative link in the README and the docs leads to a file that exists, and to a heading in it.

Sections move between the README and docs/ (status, reference, benchmarks);
a link left pointing at the old place is a dead end for the reader who
follows it, and nothing else would notice.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = (
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "helm" / "README.md",
    *sorted(ROOT.glob("examples/*/README.md")),
)
_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#+ +(.+?) *$", re.MULTILINE)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {slug(h) for h in _HEADING.findall(_FENCE.sub("", doc.read_text(encoding="utf-8")))}


def broken_links(doc: Path) -> list[str]:
    """The relative links of ``doc`` (outside code blocks) whose file or heading is missing."""
    broken = []
    for target in _LINK.findall(_FENCE.sub("", doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path) if path else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading")
    return broken


def test_slug_follows_github() -> None:
    assert slug("How it is tested") == "how-it-is-tested"
    assert slug("Event schema v1 (msgpack)") == "event-schema-v1-msgpack"
    assert slug("Auth and abuse (`serving.auth_token_file`)") == "auth-and-abuse-servingauth_token_file"


def test_broken_links_are_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n## Known limitations\n", encoding="utf-8")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md#known-limitations) [gone](c.md) [moved](a.md#status) [web](https://x.org/y)\n"
        "```\n[in code](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(doc) == ["c.md: no such file", "a.md#status: no such heading"]


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    broken = [f"{doc.relative_to(ROOT)}: {link}" for doc in DOCS for link in broken_links(doc)]
    assert not broken, "\n".join(broken)

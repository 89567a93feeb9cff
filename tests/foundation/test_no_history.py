"""Python files say why, never when: no ``issue <n>`` or ``stop <n>`` reference in any of them.

A work-item number means nothing to a reader of the code and rots as soon as the
tracker moves; the history and the measured figures behind a choice live in
docs/performance.md and the changelog. Every tracked (or new, not ignored)
``.py`` file is checked, tests included.
"""

from __future__ import annotations

import re
from pathlib import Path

from .source_files import python_files

ROOT = Path(__file__).resolve().parents[2]
HISTORY = re.compile(r"\b(?:issue|stop)\s+#?\d+\b", re.IGNORECASE)


def history_references(path: Path) -> list[str]:
    """``file:line: text`` of each line of ``path`` that cites a work item by number."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for n, line in enumerate(lines, start=1)
        if HISTORY.search(line)
    ]


def test_the_pattern_catches_references_and_spares_ordinary_words() -> None:
    # Built from parts, so this file does not cite anything itself.
    for word, rest in (("(issue", " 14)"), ("Stop", " 24: where"), ("see issue", " #7"), ("ISSUE", "  3")):
        assert HISTORY.search(word + rest), word + rest
    for plain in ("an issue with 3 shards", "stop 2s later", "stop_24", "issue17-secret", "nonstop 3"):
        assert not HISTORY.search(plain), plain


def test_the_file_list_covers_code_and_tests() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in python_files(ROOT)}
    assert {
        "store/redis/_wire/packing.py",
        "tests/conftest.py",
        "tests/foundation/test_no_history.py",
    } <= files
    assert not any(name.startswith((".venv/", "build/")) for name in files)


def test_no_python_file_cites_an_issue_or_stop_number() -> None:
    found = [hit for path in python_files(ROOT) for hit in history_references(path)]
    assert not found, "cite the reason, not the work item:\n" + "\n".join(found)

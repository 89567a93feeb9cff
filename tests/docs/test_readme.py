"""The README opens with the two commands, and CI runs exactly the one it calls the test command.

A person deciding to use Kelp reads the first screen; CI (``.ci/run``) is
promised to run "exactly the README's test command". Both break silently when
the README is rewritten, so both are checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 300  # the README is for deciding; the reference lives in docs/


def _first_code_block(text: str) -> list[str]:
    block = re.search(r"^```\w*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    assert block is not None, "the README has no code block"
    return [line.split("#", 1)[0].strip() for line in block[1].splitlines()]


def test_the_readme_opens_with_the_demo_and_test_commands() -> None:
    assert _first_code_block(README.read_text(encoding="utf-8")) == ["make demo", "make test"]


def test_ci_runs_the_readmes_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [
        line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands[-1] == _first_code_block(README.read_text(encoding="utf-8"))[1]


def test_the_readme_stays_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < MAX_LINES, f"README.md has {lines} lines: move reference material to docs/"

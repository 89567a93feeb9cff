"""The repository's own Python files, for the checks that read every one of them (history, doctests)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SKIPPED = {".git", ".venv", "build", "node_modules", "__pycache__"}
"""Folders a walk outside a git checkout passes over: environments, builds, caches."""


def python_files(folder: Path) -> list[Path]:
    """Tracked and new (not ignored) ``.py`` files under ``folder``: ``git ls-files`` in a checkout
    (CI clones one), else a walk that skips :data:`SKIPPED`."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.py"],
            cwd=folder,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        found = [folder / name for name in listed]
    except (OSError, subprocess.CalledProcessError):
        found = [p for p in folder.rglob("*.py") if not SKIPPED & set(p.relative_to(folder).parts)]
    return sorted(p for p in found if p.is_file())

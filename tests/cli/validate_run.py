"""`kelp config validate` as a user runs it: a file on disk, a fresh process, no `KELP_` overrides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_validate(
    tmp_path: Path, text: str, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Write ``text`` to ``tmp_path/kelp.yaml`` and validate it in a subprocess (exit code and output).

    ``pythonpath``: a folder put first on the child's import path (plug-in models)."""
    path = tmp_path / "kelp.yaml"
    path.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", "config", "validate", str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )

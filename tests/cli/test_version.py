"""``kelp --version``: what a bug report needs, from the real packages and the real device."""

from __future__ import annotations

import subprocess
import sys

import kafka
import pytest
import redis
import torch

from kelp import __version__
from kelp.cli.main import main, version_report


def _expected_device() -> str:
    return "cuda (" if torch.cuda.is_available() else "cpu"


def test_version_names_kelp_its_libraries_and_the_device(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == [
        f"kelp {__version__}",
        f"torch {torch.__version__}",
        f"redis-py {redis.__version__}",
        f"kafka-python {kafka.__version__}",
    ]
    assert lines[4].startswith(f"device {_expected_device()}")
    assert len(lines) == 5


def test_version_needs_no_sub_command_and_no_config() -> None:
    """The installed entry point answers before anything else is parsed (exit 0, nothing on stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout == version_report() + "\n"

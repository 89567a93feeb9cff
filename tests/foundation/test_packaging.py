"""The distribution maps every top-level folder into the `kelp` namespace."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_required_layout_exists() -> None:
    for entry in ("daemon", "consumers", "store", "helm", "tests", "Dockerfile", "pyproject.toml"):
        assert (ROOT / entry).exists(), entry


@pytest.mark.slow
def test_plain_wheel_contains_each_room_under_kelp(tmp_path: Path) -> None:
    """`pip install .` (non-editable) builds this wheel; each folder must land under kelp/."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    wheel = next(tmp_path.glob("kelp-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "kelp/__init__.py",
        "kelp/errors.py",
        "kelp/config/root.py",
        "kelp/consumers/__init__.py",
        "kelp/store/__init__.py",
        "kelp/store/redis/_wire/packing.py",  # sub-packages are listed in pyproject.toml one by one
        "kelp/store/hot/tier.py",
        "kelp/cli/main.py",
        "kelp/cli/commands/config_cmd.py",
        "kelp/demo/run.py",
        "kelp/examples/criteo-kaggle.yaml",
        "kelp/examples/data/criteo-kaggle-8k/train.tsv.gz",  # the demo's data: no ../shared needed
        "kelp/examples/data/criteo-attribution/train.csv.gz",  # criteo-attribution.yaml's data
        "kelp/examples/data/README.md",
        "kelp/examples/criteo-synth.yaml",
        "kelp/harness/redis_server.py",
        "kelp/bench/runner.py",
    ):
        assert module in names, module
    assert not any(n.startswith(("tests/", "store/", "daemon/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "kelp = kelp.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_console_script_runs() -> None:
    kelp = Path(sys.executable).parent / "kelp"
    result = subprocess.run([str(kelp), "--version"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert result.stdout.startswith("kelp ")

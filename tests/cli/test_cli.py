"""CLI error handling: people get one line, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kelp.harness import free_port


def test_operational_error_is_one_line_with_exit_1() -> None:
    """Nothing listens on the broker port: after the bootstrap timeout, one line naming it and exit 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kelp.cli",
            "produce",
            "--bootstrap",
            f"127.0.0.1:{free_port()}",
            "--topic",
            "t",
            "--synth",
            "criteo",
            "--samples",
            "10",
            "--startup-timeout-s",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("kelp: error:")
    assert "bootstrap" in last and "within 2s (--startup-timeout-s)" in last


def test_a_group_on_a_file_source_is_refused_before_any_rank_starts() -> None:
    """``kelp train --nproc 2`` on the shipped (file-source) example: one line, exit 2, no torchrun."""
    from kelp.examples import example_path

    config = str(example_path("criteo-kaggle.yaml"))
    result = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "train", "--config", config, "--nproc", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("kelp: error:")
    assert "--nproc 2 needs source.kind: kafka" in result.stderr


def test_report_on_a_run_without_a_record_is_one_line_with_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"kelp: error: {tmp_path}: no progress.jsonl there (kelp train writes it into trainer.checkpoint_dir)"
    ]

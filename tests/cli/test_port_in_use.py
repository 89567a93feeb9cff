"""Operator mistakes through the real CLI: one line naming the setting, exit 2, never a traceback.

A port another process listens on (``metrics.port`` for ``kelp train``,
``serving.port`` for ``kelp serve``), a config file that is not text, and a
bad ``--max-steps`` used to end in an ``OSError``/``UnicodeDecodeError``/
pydantic traceback (or uvicorn's log line and status 3).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kelp.harness import free_port


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another process (this one) listens on."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", free_port()))
        sock.listen()
        yield sock.getsockname()[1]


def _config(tmp_path: Path, port: int) -> Path:
    source = tmp_path / "events.msgpack"
    source.write_bytes(b"")
    doc = {
        "version": 2,
        "deployment": "ports",
        "source": {"kind": "file", "path": str(source), "format": "msgpack"},
        "features": {"sparse": [{"name": "C1"}], "tables": [{"name": "C1", "dim": 4}]},
        "store": {"backend": "memory"},
        "publisher": {"channel": "filesystem", "path": str(tmp_path / "snapshots")},
        "trainer": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "metrics": {"host": "127.0.0.1", "port": port},
        "serving": {"host": "127.0.0.1", "port": port},
    }
    path = tmp_path / "kelp.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _kelp(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _one_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("kelp: error: "), result.stderr
    for word in words:
        assert word in last, last


@pytest.mark.parametrize("command,setting", [("train", "metrics.port"), ("serve", "serving.port")])
def test_a_port_in_use_names_the_setting(tmp_path: Path, held_port: int, command: str, setting: str) -> None:
    result = _kelp(command, "--config", str(_config(tmp_path, held_port)))
    _one_line(result, setting, f"127.0.0.1:{held_port}", "already in use")


def test_a_config_that_is_not_text(tmp_path: Path) -> None:
    path = tmp_path / "kelp.yaml"
    path.write_bytes(b"\xff\xfe\x00binary")
    _one_line(_kelp("train", "--config", str(path)), str(path), "UTF-8")


def test_a_negative_max_steps(tmp_path: Path) -> None:
    _one_line(
        _kelp("train", "--config", str(_config(tmp_path, free_port())), "--max-steps", "-1"), "--max-steps"
    )

"""Every long-running Kelp process logs its effective config once at start, secrets redacted.

A cluster that trains differently from the config validated locally is found by comparing this
record with ``kelp config show``: it holds the same data, with the environment overrides and Kelp's
defaults in it.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kelp.cli.startup_config import MESSAGE, apply_config_logging, log_effective_config
from kelp.config import effective_config
from kelp.config.loader import parse_config
from kelp.harness import free_port
from kelp.logs import configure_logging

URL_SECRET = "url-secret-pw"
FIELD_SECRET = "field-secret-pw"


def _doc(port: int) -> dict[str, Any]:
    """A config every process accepts offline: nothing answers on its endpoints, so each stops early."""
    return {
        "version": 2,
        "deployment": "startup",
        "source": {"kind": "kafka", "bootstrap_servers": ["127.0.0.1:1"], "topics": ["events"]},
        "features": {"label": {"name": "click", "kind": "binary"}, "sparse": [{"name": "C1"}]},
        "store": {"backend": "redis", "urls": [f"redis://:{URL_SECRET}@127.0.0.1:1"]},
        "trainer": {"startup_timeout_s": 0.2},
        "metrics": {"host": "127.0.0.1", "port": port},
        "serving": {"host": "127.0.0.1", "port": port},
        "join": {
            "host": "127.0.0.1",
            "port": port,
            "actions": [{"topic": "clicks", "task": "click", "window_s": 60}],
        },
    }


@pytest.fixture
def root_logging() -> Iterator[None]:
    """configure_logging replaces the root handler: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def _logged(fmt: str) -> list[str]:
    cfg = parse_config(_doc(9400), "kelp.yaml", {"KELP_STORE__PASSWORD": FIELD_SECRET})
    stream = io.StringIO()
    configure_logging("info", fmt, stream=stream)  # type: ignore[arg-type]
    log_effective_config(cfg, "kelp.yaml", "train")
    return stream.getvalue().splitlines()


def test_json_logging_gets_one_structured_record_with_secrets_redacted(root_logging: None) -> None:
    (line,) = _logged("json")
    record = json.loads(line)
    cfg = parse_config(_doc(9400), "kelp.yaml", {"KELP_STORE__PASSWORD": FIELD_SECRET})
    assert record["msg"] == MESSAGE
    assert (record["event"], record["role"]) == ("effective_config", "train")
    assert record["config_file"] == "kelp.yaml"
    assert record["config"] == effective_config(cfg)  # what `kelp config show` prints, defaults included
    assert record["config"]["trainer"]["drain_timeout_s"] == 30  # a default the file did not set
    assert record["config"]["store"]["password"] != FIELD_SECRET
    assert URL_SECRET not in line and FIELD_SECRET not in line


def test_text_logging_prints_the_config_as_json(root_logging: None) -> None:
    (line,) = _logged("text")
    assert MESSAGE in line and URL_SECRET not in line and FIELD_SECRET not in line
    shown = json.loads(line.split(" config=", 1)[1])
    assert shown["deployment"] == "startup" and shown["store"]["urls"][0].startswith("redis://")


@pytest.mark.parametrize("command", ["train", "serve", "join"])
def test_every_process_logs_its_effective_config_before_anything_can_fail(
    tmp_path: Path, command: str
) -> None:
    """Each process here stops at once (an unreachable store, a port in use): the record came first."""
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        path = tmp_path / "kelp.yaml"
        path.write_text(yaml.safe_dump(_doc(held.getsockname()[1])), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
        env["KELP_STORE__PASSWORD"] = FIELD_SECRET
        result = subprocess.run(
            [sys.executable, "-m", "kelp.cli", "--log-format", "json", command, "--config", str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
            check=False,
        )
    assert result.returncode in (1, 2), result.stderr  # one line naming the endpoint or the port
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    started = [r for r in records if r.get("event") == "effective_config"]
    assert len(started) == 1, result.stderr
    assert started[0]["role"] == command and started[0]["config"]["deployment"] == "startup"
    assert URL_SECRET not in result.stderr and FIELD_SECRET not in result.stderr


@pytest.mark.parametrize(
    ("flags", "expected"),
    [((None, None), ("warning", "json")), (("debug", "text"), ("debug", "text"))],
)
def test_the_configs_logging_applies_unless_a_flag_says_otherwise(
    root_logging: None, flags: tuple[str | None, str | None], expected: tuple[str, str]
) -> None:
    """The config's ``logging`` section used to be validated and then ignored: the flags' defaults
    decided, so a config (the chart's included) asking for JSON logs got text."""
    doc = {**_doc(9400), "logging": {"level": "warning", "format": "json"}}
    cfg = parse_config(doc, "kelp.yaml", {})
    args = argparse.Namespace(log_level=flags[0], log_format=flags[1])
    apply_config_logging(args, cfg)
    assert (args.log_level, args.log_format) == expected
    root = logging.getLogger()
    assert root.level == getattr(logging, expected[0].upper())
    record = logging.LogRecord("kelp.test", logging.WARNING, __file__, 1, "hello", None, None)
    line = root.handlers[0].format(record)
    assert (line.startswith("{") and json.loads(line)["msg"] == "hello") == (expected[1] == "json")

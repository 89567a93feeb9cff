"""Progress bars appear only for a person at a terminal: the policy, and the three places that use it.

A real pseudo-terminal (``os.openpty``) stands in for the person's terminal;
a pipe or a ``StringIO`` for CI and log collectors. ``kelp produce`` runs as
the real CLI against the real Tansu broker; file replay uses the real
:class:`FileSource`; the bench runner runs a suite registered for the test.
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import re
import struct
import subprocess
import sys
import termios
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

import kelp.examples as kelp_examples
from kelp import progress
from kelp.bench import runner
from kelp.config import FileSourceConfig
from kelp.consumers import criteo_feature_spec
from kelp.consumers.errors import SourceClosedError
from kelp.consumers.file_source import FileSource
from kelp.harness import KafkaBroker

DATA = Path(__file__).resolve().parents[1] / "consumers" / "data"
TSV = DATA / "criteo_sample.tsv"


class Terminal:
    """A pseudo-terminal: ``stream`` is the program's side (a tty), ``text()`` what the screen received."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
        self.stream = os.fdopen(self.slave, "w", buffering=1, closefd=False)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        # Read as it is written, so a full pty buffer can never block the writer.
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the slave side is closed
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    def text(self) -> str:
        """Everything written so far (closes the terminal)."""
        self.stream.flush()
        os.close(self.slave)
        self._reader.join(timeout=10)
        os.close(self.master)
        return b"".join(self._chunks).decode("utf-8", "replace")


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    yield Terminal()


@pytest.fixture(autouse=True)
def _text_logs() -> Iterator[None]:
    """Each test starts with the default policy (text logs) and leaves it so."""
    progress.configure("text")
    yield
    progress.configure("text")


# ------------------------------------------------------------------ the policy


def test_a_terminal_gets_a_bar(terminal: Terminal) -> None:
    assert progress.enabled(terminal.stream)
    with progress.bar(total=3, desc="rows", stream=terminal.stream) as shown:
        shown.update(3)
    assert not shown.disabled
    screen = terminal.text()
    assert "rows" in screen and "3/3" in screen and "100%" in screen


def test_not_a_terminal_gets_no_bar() -> None:
    out = io.StringIO()
    assert not progress.enabled(out)
    with progress.bar(total=3, desc="rows", stream=out) as shown:
        shown.update(3)
    assert shown.disabled
    assert out.getvalue() == ""


def test_json_logs_get_no_bar_even_on_a_terminal(terminal: Terminal) -> None:
    progress.configure("json")
    assert not progress.enabled(terminal.stream)
    with progress.bar(total=3, desc="rows", stream=terminal.stream) as shown:
        shown.update(3)
    assert shown.disabled
    assert terminal.text() == ""


def test_a_caller_that_is_quiet_gets_no_bar(terminal: Terminal) -> None:
    with progress.bar(total=3, desc="rows", stream=terminal.stream, wanted=False) as shown:
        shown.update(3)
    assert terminal.text() == ""


def test_log_lines_go_above_the_bar_and_handlers_come_back(terminal: Terminal) -> None:
    root = logging.getLogger()
    saved = root.handlers[:]
    console = logging.StreamHandler(terminal.stream)
    console.setFormatter(logging.Formatter("LOG %(message)s"))
    root.handlers = [console]
    try:
        with progress.bar(total=2, desc="rows", stream=terminal.stream) as shown:
            shown.update(1)
            assert console not in root.handlers  # replaced while the bar lives
            logging.getLogger("kelp.test").warning("halfway")
            shown.update(1)
        assert root.handlers == [console]
    finally:
        root.handlers = saved
    screen = terminal.text()
    # tqdm.write clears the bar line, prints the log line on its own line, then redraws the bar.
    assert any(line.strip().endswith("LOG halfway") for line in screen.replace("\r", "\n").splitlines())


# ------------------------------------------------------------------ file replay (kelp train)


def _replay(cfg: FileSourceConfig) -> int:
    source = FileSource(cfg, criteo_feature_spec(), registry=CollectorRegistry())
    samples = 0
    try:
        while True:
            samples += source.poll().size
    except SourceClosedError:
        pass
    source.close()
    return samples


def test_file_replay_draws_rows_read_on_a_terminal(
    terminal: Terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    assert _replay(FileSourceConfig(kind="file", path=TSV, format="criteo_tsv")) > 0
    screen = terminal.text()
    rows = len(TSV.read_text().splitlines())
    # Drawn with the file's row count as its total, then cleared when the file ends (leave=False).
    assert TSV.name in screen and f"/{rows:.1f}" in screen and "rows" in screen, screen
    assert screen.endswith("\r") and screen.rstrip("\r").split("\r")[-1].strip() == "", screen


def test_file_replay_is_silent_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert _replay(FileSourceConfig(kind="file", path=TSV, format="criteo_tsv")) > 0
    assert TSV.name not in capsys.readouterr().err


# ------------------------------------------------------------------ kelp bench


@pytest.fixture
def phased_suite(monkeypatch: pytest.MonkeyPatch) -> str:
    """A suite named ``phased`` that reports two phases, as the real suites do."""
    module = types.ModuleType("kelp.bench.phased")

    def run(quick: bool) -> dict[str, object]:
        runner.progress("warming up")
        runner.progress("measuring")
        return {"value": 1}

    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kelp.bench.phased", module)
    monkeypatch.setitem(runner.SUITES, "phased", "a suite for this test")
    return "phased"


def test_bench_suite_bar_on_a_terminal(
    phased_suite: str, terminal: Terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    assert runner.run_suite(phased_suite, quick=True)["value"] == 1
    screen = terminal.text()
    assert "bench phased" in screen and "phase 2" in screen
    assert "] warming up" in screen and "] measuring" in screen  # the stamped lines stay, above the bar


def test_bench_suite_prints_plain_lines_without_a_terminal(
    phased_suite: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runner.run_suite(phased_suite, quick=True)
    err = capsys.readouterr().err
    assert "\r" not in err and "bench phased" not in err
    assert [line.split("] ", 1)[1] for line in err.splitlines()] == ["warming up", "measuring"]


# ------------------------------------------------------------------ kelp produce (the real CLI)


def _produce_on(stderr: int, bootstrap: str, topic: str, *flags: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "kelp.cli", *flags, "produce"),
            *("--bootstrap", bootstrap, "--topic", topic),
            *("--synth", "criteo", "--samples", "3000", "--batch-size", "500"),
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        check=False,
        timeout=120,
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("flags", "drawn"), [((), True), (("--log-format", "json"), False)], ids=["text", "json"]
)
def test_kelp_produce_on_a_terminal(
    kafka_broker: KafkaBroker, unique_topic: str, terminal: Terminal, flags: tuple[str, ...], drawn: bool
) -> None:
    kafka_broker.create_topic(unique_topic)
    proc = _produce_on(terminal.slave, kafka_broker.bootstrap, unique_topic, *flags)
    screen = terminal.text()
    assert proc.returncode == 0, screen
    assert b'"records": 3000' in proc.stdout
    assert ("3.00k/3.00k" in screen) is drawn, screen
    # A bar redraws its line with a bare carriage return (the terminal turns each newline into "\r\n").
    assert bool(re.search("\r(?!\n)", screen)) is drawn, screen


@pytest.mark.integration
def test_kelp_produce_piped_stderr_has_no_bar(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    kafka_broker.create_topic(unique_topic)
    proc = _produce_on(subprocess.PIPE, kafka_broker.bootstrap, unique_topic)
    assert proc.returncode == 0, proc.stderr
    assert b"\r" not in proc.stderr and b"3.00k" not in proc.stderr


# ------------------------------------------------------------------ kelp train replaying a file (real CLI)


def _train_on(stderr: int, tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    """One step of ``kelp train`` on the shipped Criteo example, its outputs under ``tmp_path``."""
    example = Path(kelp_examples.__file__).parent / "criteo-kaggle.yaml"
    cfg = yaml.safe_load(example.read_text(encoding="utf-8"))
    cfg["source"]["path"] = str(example.parent / cfg["source"]["path"])
    cfg["trainer"]["checkpoint_dir"] = str(tmp_path / "checkpoints")
    cfg["publisher"]["path"] = str(tmp_path / "snapshots")
    cfg["metrics"]["enabled"] = False
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", "train", "--config", str(config), "--max-steps", "1"],
        stdout=subprocess.PIPE,
        stderr=stderr,
        check=False,
        timeout=180,
    )


def test_kelp_train_file_replay_on_a_terminal(terminal: Terminal, tmp_path: Path) -> None:
    """The bar comes from the source the CLI builds; piped stderr is covered by the FileSource test above."""
    proc = _train_on(terminal.slave, tmp_path)
    screen = terminal.text()
    assert proc.returncode == 0, screen
    assert "train.tsv.gz:" in screen and "/7.20k" in screen, screen  # the bar over the file's rows
    assert "kelp.train:" in screen  # log lines still reach the terminal, above the bar

"""``kelp train`` as a real process: SIGTERM drains and exits 0; kill -9 and a restart lose nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kelp.config import load_config
from kelp.daemon.train import TrainDaemon, TrainReport
from kelp.harness import KafkaBroker

from .conftest import CRITEO_ROWS, Running, base_config, group_offsets, on_kafka, wait_for, write_config

pytestmark = pytest.mark.integration


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kelp.cli", "train", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _scrape(port: int, name: str) -> float:
    """A sample's value from the process's /metrics; 0 while it does not answer yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


def _checkpoint_pointer(directory: Path) -> dict | None:
    latest = directory / "latest"
    return json.loads(latest.read_text()) if latest.exists() else None


def _finish_in_process(config: Path, expected_samples: int) -> TrainReport:
    """Restart the trainer (in-process, same config) and let it train the rest of the topic."""
    running = Running(TrainDaemon(load_config(config)))
    daemon = running.daemon
    wait_for(
        lambda: daemon.report.samples >= expected_samples or not running.thread.is_alive(), 120, "the rest"
    )
    time.sleep(0.5)  # anything beyond the expected count would show up as extra samples
    return running.stop()


def _config(tmp_path: Path, kafka_broker: KafkaBroker, topic: str, redis_url: str) -> Path:
    cfg = on_kafka(base_config(tmp_path, checkpoint_every_steps=3), kafka_broker, topic, redis_url)
    cfg.batching.batch_size = 16  # many small steps, so signals land mid-stream
    return write_config(cfg, tmp_path / "kelp.yaml")


def test_sigterm_drains_commits_checkpoints_and_exits_0(
    tmp_path: Path, kafka_broker: KafkaBroker, criteo_topic: str, redis_url: str
) -> None:
    config = _config(tmp_path, kafka_broker, criteo_topic, redis_url)
    cfg = load_config(config)
    proc = _start(config, tmp_path / "run1.log")
    try:
        wait_for(lambda: _scrape(cfg.metrics.port, "kelp_trainer_steps_total") >= 5, 120, "5 steps")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=cfg.trainer.drain_timeout_s + 15) == 0
    finally:
        proc.kill()
    log = (tmp_path / "run1.log").read_text()
    assert "stopped by SIGTERM" in log, log[-2000:]

    committed = group_offsets(kafka_broker, cfg.source.group_id, criteo_topic)
    pointer = _checkpoint_pointer(cfg.trainer.checkpoint_dir)
    assert pointer is not None
    from kelp.trainer.checkpoint import read_checkpoint

    _, meta = read_checkpoint(cfg.trainer.checkpoint_dir / pointer["file"])
    # The drain pushed and committed every trained batch, then checkpointed that same position.
    trained = {o["partition"]: o["offset"] for o in meta["offsets"]}
    assert committed == [trained.get(p, 0) for p in range(len(committed))]
    assert 0 < sum(committed) < CRITEO_ROWS, "SIGTERM should land mid-stream"

    # Nothing acknowledged is lost, nothing committed is trained twice: a restart trains exactly the rest.
    rest = _finish_in_process(config, CRITEO_ROWS - sum(committed))
    assert rest.resumed_from is not None and rest.first_step == pointer["step"]
    assert rest.samples == CRITEO_ROWS - sum(committed)
    assert sum(group_offsets(kafka_broker, cfg.source.group_id, criteo_topic)) == CRITEO_ROWS


def test_kill_9_then_restart_resumes_with_every_record_trained(
    tmp_path: Path, kafka_broker: KafkaBroker, criteo_topic: str, redis_url: str
) -> None:
    config = _config(tmp_path, kafka_broker, criteo_topic, redis_url)
    cfg = load_config(config)
    proc = _start(config, tmp_path / "run1.log")
    try:
        wait_for(lambda: _checkpoint_pointer(cfg.trainer.checkpoint_dir), 120, "a first checkpoint")
        wait_for(lambda: _scrape(cfg.metrics.port, "kelp_trainer_steps_total") >= 8, 60, "8 steps")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    committed = group_offsets(kafka_broker, cfg.source.group_id, criteo_topic)
    assert sum(committed) < CRITEO_ROWS, "kill -9 should land mid-stream"
    pointer = _checkpoint_pointer(cfg.trainer.checkpoint_dir)
    assert pointer is not None

    rest = _finish_in_process(config, CRITEO_ROWS - sum(committed))
    assert rest.resumed_from is not None and rest.first_step == pointer["step"]
    # Committed records were trained by the first run; every other record by the second.
    assert rest.samples == CRITEO_ROWS - sum(committed)
    assert sum(group_offsets(kafka_broker, cfg.source.group_id, criteo_topic)) == CRITEO_ROWS


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_run_ends_with_a_summary_a_user_can_read(tmp_path: Path, log_format: str) -> None:
    """Samples, speed, AUC with its bound, log loss, rows stored per table and rejections, as text or JSON."""
    config = write_config(base_config(tmp_path), tmp_path / "kelp.yaml")
    result = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "--log-format", log_format, "train", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    if log_format == "json":
        line = next(x for x in result.stdout.splitlines() if '"train_summary"' in x)
        summary = json.loads(line)
        assert summary["samples"] == CRITEO_ROWS and summary["stopped_by"] == "source exhausted"
        assert 0.0 < summary["auc"] < 1.0 and summary["auc_error_bound"] >= 0.0
        assert summary["log_loss"] > 0.0
        assert sum(summary["rows"].values()) > 0 and set(summary["rows"]) >= {"C1", "C26"}
        assert isinstance(summary["rejected"], dict)
    else:
        out = result.stdout
        assert f"trained {CRITEO_ROWS:,} samples" in out
        assert "progressive AUC" in out and "binning" in out and "log loss" in out
        assert "rows stored:" in out and "records rejected:" in out
        # A 2-second run still shows learning: a progress line at every 5% of the file, not every 10 s.
        assert result.stderr.count("of the file)") >= 5, result.stderr[-2000:]
        _assert_report_draws_the_run(out, tmp_path)


def _assert_report_draws_the_run(summary: str, tmp_path: Path) -> None:
    """The summary names the run's progress record; ``kelp report`` draws it into a PNG."""
    record = Path(summary.split("learning curve: kelp report ", 1)[1].split(maxsplit=1)[0])
    points = [json.loads(x) for x in record.read_text().splitlines()]
    samples = [p["samples"] for p in points]
    # a point at every 1% of the file, at most one per step: each of this run's 8 steps
    assert len(points) >= 5 and samples == sorted(set(samples)), samples
    assert points[-1]["samples"] == CRITEO_ROWS and 0.0 < points[-1]["auc"] < 1.0
    png = tmp_path / "learning.png"
    report = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "report", str(record.parent), "--out", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert f"wrote {png}" in report.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

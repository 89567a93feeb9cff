"""A trainer restarted on a topic it has read to the end exports its AUC and its lag from the start.

Nothing arrives after the restart, so no batch ever sets a gauge: the AUC must
come back from the run's record, and each assigned partition's lag from the
consumer's first fetch. On real Kafka and redis-server.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from kelp.daemon.progress_log import PROGRESS_FILE, read_progress
from kelp.daemon.train import TrainDaemon
from kelp.harness import KafkaBroker, free_port

from .conftest import CRITEO_ROWS, PARTITIONS, Running, base_config, on_kafka, wait_for

pytestmark = pytest.mark.integration


def _exported(port: int, series: str) -> str | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return found.group(1) if found else None


def test_a_restart_on_a_quiet_topic_exports_the_last_auc_and_each_partitions_lag(
    tmp_path: Path, kafka_broker: KafkaBroker, criteo_topic: str, redis_url: str
) -> None:
    cfg = on_kafka(base_config(tmp_path), kafka_broker, criteo_topic, redis_url)
    first = Running(TrainDaemon(cfg))
    wait_for(lambda: first.daemon.report.samples >= CRITEO_ROWS, 120, "the topic trained")
    first.stop()  # the drain checkpoints, commits and records the last point
    [*_, last] = list(read_progress(cfg.trainer.checkpoint_dir / PROGRESS_FILE).values())[-1]

    cfg.metrics.port = free_port()
    daemon = TrainDaemon(cfg)
    running = Running(daemon)
    try:
        wait_for(lambda: daemon.readiness() == (True, "ready"), 120, "the restarted trainer ready")
        assert daemon.report.resumed_from is not None
        for window, key in (("window", "auc_window"), ("cumulative", "auc")):
            got = _exported(cfg.metrics.port, f'kelp_trainer_auc{{rank="0",window="{window}"}}')
            assert got is not None and float(got) == pytest.approx(last[key]), window
        for partition in range(PARTITIONS):
            series = f'kelp_consumer_lag_records{{partition="{partition}",rank="0",topic="{criteo_topic}"}}'
            lag = wait_for(lambda s=series: _exported(cfg.metrics.port, s), 60, f"{series} exported")
            assert float(lag) == 0.0
        assert daemon.report.samples == 0  # nothing was trained: the gauges came from no batch
    finally:
        running.stop()

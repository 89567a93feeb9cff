"""A dead worker's metric files: its counts are kept, its gauges leave, its files go.

The files are written as prometheus-client writes them (``MmapedDict``) for a
process that has exited; :func:`reap_dead_workers` runs as a replica's keeper
runs it, and the directory is read back as ``/metrics`` reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from kelp.serving.metrics import reap_dead_workers


def _exited_pid() -> int:
    """The pid of a process that has exited (and been waited for): nothing answers to it now."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write(path: Path, metric: str, sample: str, value: float, labels: dict[str, str] | None = None) -> None:
    values = MmapedDict(str(path))
    try:
        values.write_value(json.dumps([metric, sample, labels or {}, "help"], sort_keys=True), value, 0.0)
    finally:
        values.close()


def _scraped(directory: Path) -> dict[str, float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return {s.name: s.value for family in registry.collect() for s in family.samples}


def test_a_dead_workers_counts_are_kept_and_its_gauges_and_files_go(tmp_path: Path) -> None:
    dead, alive = _exited_pid(), os.getpid()
    _write(tmp_path / "counter_dead.db", "requests", "requests_total", 5.0)  # an earlier dead worker
    _write(tmp_path / f"counter_{dead}.db", "requests", "requests_total", 7.0)
    _write(tmp_path / f"counter_{alive}.db", "requests", "requests_total", 11.0)
    _write(tmp_path / f"gauge_livesum_{dead}.db", "inflight", "inflight", 13.0)
    _write(tmp_path / f"gauge_livesum_{alive}.db", "inflight", "inflight", 1.0)
    _write(tmp_path / f"gauge_livemin_{dead}.db", "ready", "ready", 0.0)
    _write(tmp_path / f"gauge_livemin_{alive}.db", "ready", "ready", 1.0)
    _write(tmp_path / f"gauge_all_{dead}.db", "conns", "conns", 3.0)
    assert _scraped(tmp_path)["inflight"] == 14.0

    assert reap_dead_workers(str(tmp_path)) == [dead]

    assert not list(tmp_path.glob(f"*_{dead}.db"))
    assert not list(tmp_path.glob("*.tmp"))
    scraped = _scraped(tmp_path)
    assert scraped["requests_total"] == 5.0 + 7.0 + 11.0  # nothing answered is lost
    assert scraped["inflight"] == 1.0 and scraped["ready"] == 1.0
    assert "conns" not in scraped
    assert reap_dead_workers(str(tmp_path)) == []  # nothing left to do: the live worker is never reaped

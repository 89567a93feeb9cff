"""``kelp train`` and ``kelp serve`` as real child processes for the chaos bench, and their /metrics.

Each :class:`KelpProcess` is one command line run as many times as the bench
restarts it (each run an *incarnation*, with its own log file). Readiness is
the process's own ``/readyz``; its counters come from its own ``/metrics``,
parsed with prometheus-client's parser, so the bench sees what Prometheus
would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["KelpProcess", "Metrics", "http_status", "proc_figures", "scrape", "total"]

Metrics = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""``{(sample name, frozenset(labels)): value}`` of one scrape."""


def http_status(url: str, timeout_s: float = 2.0) -> int:
    """The status of a GET, 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def scrape(port: int, timeout_s: float = 2.0) -> Metrics:
    """Every sample of ``http://127.0.0.1:port/metrics``; empty when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def total(metrics: Metrics, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in metrics.items() if n == name and want <= lab)


def proc_figures(pid: int) -> dict[str, float]:
    """RSS (MB), open file descriptors and threads of a live process, from /proc."""
    figures: dict[str, float] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key == "VmRSS":
                figures["rss_mb"] = round(int(value.split()[0]) / 1024, 1)
            elif key == "Threads":
                figures["threads"] = int(value)
    figures["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return figures


class KelpProcess:
    """One ``kelp`` command, started, killed and restarted; logs under ``workdir/<name>-<n>.log``.

    ``http_port`` serves its ``/readyz`` and ``/metrics`` (the trainer's
    ``metrics.port``, the replica's ``serving.port``).
    """

    def __init__(self, name: str, args: Iterable[str], http_port: int, workdir: Path) -> None:
        self.name = name
        self.argv = [sys.executable, "-m", "kelp.cli", *args]
        self.http_port = http_port
        self.workdir = workdir
        self.incarnations = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log

    def start(self) -> None:
        self.incarnations += 1
        self._log = self.workdir / f"{self.name}-{self.incarnations}.log"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        with self._log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def ready(self) -> bool:
        return self.alive() and http_status(f"http://127.0.0.1:{self.http_port}/readyz") == 200

    def wait_ready(self, timeout_s: float) -> float | None:
        """Seconds until ``/readyz`` answered 200; None when it did not in time or the process exited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if not self.alive():
                return None
            if self.ready():
                return time.monotonic() - started
            time.sleep(0.2)
        return None

    def metrics(self) -> Metrics:
        return scrape(self.http_port) if self.alive() else {}

    def kill9(self) -> None:
        """SIGKILL and reap: no drain, no final commit, no checkpoint."""
        if self.proc is not None and self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (the drain), then SIGKILL after ``timeout_s``; the exit status."""
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        return self.proc.returncode

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self._log.read_text(errors="replace")[-chars:] if self._log else ""
        except OSError:
            return ""

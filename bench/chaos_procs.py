"""``kelp train`` and ``kelp serve`` as real child processes for the chaos bench, and their /metrics.

Each :class:`KelpProcess` is one command line run as many times as the bench
restarts it (each run an *incarnation*, with its own log file). Readiness is
the process's own ``/readyz``; its counters come from its own ``/metrics``,
parsed with prometheus-client's parser, so the bench sees what Prometheus
would.

:class:`JoinWatch` watches ``kelp join``. Any exit the bench did not ask for is
restarted (with a doubling back-off, as Kubernetes would) and counted; an
exit while the bench has the joiner's Redis away (a kill, a stall), or
shortly after, is the documented behaviour (exit 1, the restart reads again
what was not committed) and counted apart. Every other exit is a *crash*:
the ``join_crash_loops`` invariant.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kelp.bench.runner import progress

__all__ = [
    "JoinExit",
    "JoinWatch",
    "KelpProcess",
    "Metrics",
    "http_status",
    "proc_figures",
    "scrape",
    "total",
]

OUTAGE_GRACE_S = 15.0
"""An exit this long after a Redis fault ended still counts as the fault's (Redis replaying its file)."""
RESTART_BACKOFF_S = (1.0, 10.0)
"""The first and the longest wait before restarting an exited joiner (doubling in between)."""
STABLE_S = 30.0
"""A joiner that ran this long before exiting restarts after the first back-off again."""

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


def scrape(port: int, timeout_s: float = 2.0, host: str = "127.0.0.1") -> Metrics:
    """Every sample of ``http://host:port/metrics``; empty when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as resp:
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
    ``metrics.port``, the replica's ``serving.port``) on ``http_host``. ``wrap`` turns the command
    line into the one to run (a rig host's ``ip netns exec``: the process on its own host).
    """

    def __init__(
        self,
        name: str,
        args: Iterable[str],
        http_port: int,
        workdir: Path,
        *,
        http_host: str = "127.0.0.1",
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        self.name = name
        argv = [sys.executable, "-m", "kelp.cli", *args]
        self.argv = wrap(argv) if wrap is not None else argv
        self.http_host = http_host
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
        return self.alive() and http_status(f"http://{self.http_host}:{self.http_port}/readyz") == 200

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
        return scrape(self.http_port, host=self.http_host) if self.alive() else {}

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


@dataclass(frozen=True)
class JoinExit:
    """One exit of the joiner the bench did not ask for; ``at_s`` counts from the bench's start of it."""

    at_s: float
    code: int | None
    during_store_outage: bool
    last_line: str


class JoinWatch(threading.Thread):
    """Restarts the joiner whenever it exits by itself and counts each exit (see the module docstring).

    Stop it (:meth:`finish`) before stopping the process: an exit after that is the bench's.
    """

    def __init__(
        self,
        process: KelpProcess,
        interval_s: float = 0.2,
        grace_s: float = OUTAGE_GRACE_S,
        backoff_s: tuple[float, float] = RESTART_BACKOFF_S,
    ) -> None:
        super().__init__(name="chaos-join-watch", daemon=True)
        self.process = process
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.backoff_s = backoff_s
        self.exits: list[JoinExit] = []
        self._t0 = time.monotonic()
        self._outages: list[tuple[float, float]] = []
        self._open_outages = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()

    @property
    def crash_loops(self) -> int:
        """Exits outside every Redis outage: the joiner died of its input or of itself."""
        with self._lock:
            return sum(1 for e in self.exits if not e.during_store_outage)

    @property
    def store_outage_exits(self) -> int:
        with self._lock:
            return sum(1 for e in self.exits if e.during_store_outage)

    @contextlib.contextmanager
    def store_outage(self) -> Iterator[None]:
        """The block takes the joiner's Redis away: an exit inside it (or ``grace_s`` after) is expected."""
        begin = self._now()
        with self._lock:
            self._open_outages += 1
        try:
            yield
        finally:
            with self._lock:
                self._open_outages -= 1
                self._outages.append((begin, self._now()))

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _in_outage(self, t: float) -> bool:
        with self._lock:
            return self._open_outages > 0 or any(b <= t <= e + self.grace_s for b, e in self._outages)

    def run(self) -> None:
        failures = 0
        up_since = self._now()
        while not self._halt.wait(self.interval_s):
            if self.process.alive():
                continue
            at = self._now()
            tail = self.process.log_tail(600).strip().splitlines()
            record = JoinExit(
                round(at, 2), self.process.exit_code(), self._in_outage(at), tail[-1] if tail else ""
            )
            with self._lock:
                self.exits.append(record)
            if not record.during_store_outage:
                progress(f"kelp join exited by itself ({record.code}): {record.last_line[:300]}")
            failures = 0 if at - up_since >= STABLE_S else failures + 1
            wait = min(self.backoff_s[0] * 2 ** max(failures - 1, 0), self.backoff_s[1])
            if self._halt.wait(wait):
                return
            self.process.start()
            up_since = self._now()

    def finish(self) -> None:
        self._halt.set()
        if self.ident is not None:  # started: a rig that failed to start stops it unstarted
            self.join(30)

"""Scrapes of a ``/metrics`` endpoint as Prometheus would take them: text, target labels, a timestamp.

A :class:`Scrape` keeps the exposition text as the process served it, so a
recording can be saved, trimmed to the families a dashboard needs and
evaluated later (``kelp dashboard preview --from-scrapes``, the deploy test's
fixture). :func:`samples` parses it with prometheus_client's own parser and
adds the target labels a Prometheus server attaches (``job``, ``instance``),
which the dashboard groups by.
"""

from __future__ import annotations

import gzip
import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kelp.errors import UserError

__all__ = [
    "Sample",
    "Scrape",
    "Scraper",
    "Target",
    "load_scrapes",
    "samples",
    "save_scrapes",
    "scrape_interval",
    "trim",
]


@dataclass(frozen=True)
class Target:
    """One ``/metrics`` URL and the target labels its samples get (``job``, ``instance``)."""

    job: str
    instance: str
    url: str


@dataclass(frozen=True)
class Scrape:
    """What one target answered at ``at`` (Unix seconds, taken when the request was sent)."""

    job: str
    instance: str
    at: float
    text: str


@dataclass(frozen=True)
class Sample:
    """One sample of a scrape: series name, labels (target labels included, sorted) and value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def samples(scrape: Scrape) -> Iterator[Sample]:
    """The scrape's samples with ``job`` and ``instance`` added, as a Prometheus server stores them."""
    target = {"job": scrape.job, "instance": scrape.instance}
    for family in text_string_to_metric_families(scrape.text):
        for s in family.samples:
            labels = {**s.labels, **target}
            yield Sample(s.name, tuple(sorted(labels.items())), float(s.value))


def trim(scrape: Scrape, names: Iterable[str]) -> Scrape:
    """The scrape with only the sample lines of ``names`` (HELP/TYPE lines dropped): a small fixture."""
    keep = set(names)
    lines = [
        line
        for line in scrape.text.splitlines()
        if line and not line.startswith("#") and line.split("{", 1)[0].split(" ", 1)[0] in keep
    ]
    return Scrape(scrape.job, scrape.instance, scrape.at, "\n".join(lines) + "\n")


def scrape_interval(scrapes: Iterable[Scrape]) -> float:
    """The interval a recording was taken at: the median gap between one target's scrapes, to 0.1 s."""
    by_target: dict[tuple[str, str], list[float]] = {}
    for s in scrapes:
        by_target.setdefault((s.job, s.instance), []).append(s.at)
    gaps = sorted(b - a for times in map(sorted, by_target.values()) for a, b in itertools.pairwise(times))
    if not gaps:
        raise UserError("a recording needs at least two scrapes of one target")
    return max(0.1, round(gaps[len(gaps) // 2], 1))


def save_scrapes(scrapes: Iterable[Scrape], path: Path) -> Path:
    """One JSON object per scrape; gzip-compressed when ``path`` ends in ``.gz``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps(s.__dict__) + "\n" for s in scrapes).encode()
    path.write_bytes(gzip.compress(body, mtime=0) if path.suffix == ".gz" else body)
    return path


def load_scrapes(path: Path) -> list[Scrape]:
    """What :func:`save_scrapes` wrote; a one-line error for a missing or foreign file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()
        return [Scrape(**json.loads(line)) for line in text.splitlines() if line.strip()]
    except FileNotFoundError:
        raise UserError(f"no scrape recording at {path}") from None
    except (OSError, ValueError, TypeError) as exc:
        raise UserError(f"{path} is not a scrape recording ({exc})") from None


class Scraper:
    """Scrapes every target each ``interval_s`` from a background thread, like a Prometheus server.

    Targets can be added while it runs (a serving replica comes up after the
    trainer). A target that does not answer is skipped for that round, as
    Prometheus records ``up == 0`` and no samples.
    """

    def __init__(self, interval_s: float, timeout_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.scrapes: list[Scrape] = []
        self.failures = 0
        self._targets: list[Target] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kelp-scraper", daemon=True)

    def add(self, target: Target) -> None:
        with self._lock:
            self._targets.append(target)

    def start(self) -> Scraper:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> list[Scrape]:
        self._stop.set()
        self._thread.join()
        with self._lock:
            return list(self.scrapes)

    def rounds(self) -> int:
        with self._lock:
            return len({round(s.at / self.interval_s) for s in self.scrapes})

    def _run(self) -> None:
        next_at = time.time()
        while not self._stop.is_set():
            with self._lock:
                targets = list(self._targets)
            for target in targets:
                got = self._scrape(target)
                with self._lock:
                    if got is None:
                        self.failures += 1
                    else:
                        self.scrapes.append(got)
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.time()))

    def _scrape(self, target: Target) -> Scrape | None:
        at = time.time()
        try:
            with urllib.request.urlopen(target.url, timeout=self.timeout_s) as resp:
                text = resp.read().decode()
        except (OSError, urllib.error.URLError):
            return None
        return Scrape(target.job, target.instance, at, text)

"""The workload behind ``kelp dashboard preview``: a short real deployment, scraped like Prometheus would.

Runs on free loopback ports, every part a real process:

1. redis-server and a Kafka broker (:mod:`kelp.harness`: Apache Kafka where
   Java runs, Tansu otherwise);
2. ``kelp train`` on the shipped Criteo example moved onto Kafka and Redis
   (the demo's production path), with its ``/metrics`` on a free port;
3. a producer replaying the Criteo sample into the topic in waves at a set
   rate, each wave followed by the demo's three malformed records (so the
   dead-letter panel has something to show);
4. ``kelp serve`` on the same Redis: probed on ``/readyz`` every 2 s as a
   kubelet would, and once ready sent a few score requests a second, one in
   ten of them malformed (a client's 4xx);
5. a :class:`~kelp.plots.scrape.Scraper` taking both ``/metrics`` every
   ``interval_s`` for ``seconds`` once the trainer answers.

Everything is stopped (SIGTERM, then the services) before the scrapes are
returned; a process that died early is an error with the tail of its log.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kelp.config import FileSourceConfig, KelpConfig, load_config
from kelp.errors import KelpError, UserError
from kelp.plots.scrape import Scrape, Scraper, Target

__all__ = ["Recording", "record_deployment"]

Printer = Callable[[str], None]
TOPIC = "criteo-preview"


@dataclass
class Recording:
    """The scrapes of one run and what drove it (for the command's summary)."""

    scrapes: list[Scrape]
    interval_s: float
    produced_samples: int
    requests: dict[str, int]
    scrape_failures: int


def _http(url: str, body: Any = None, timeout: float = 5.0) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)
    except OSError:
        return 0


def _write_config(cfg: KelpConfig, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)), encoding="utf-8")
    return path


def _configs(
    base: KelpConfig, bootstrap: str, redis_url: str, workdir: Path, *, fetch_sessions: bool
) -> tuple[Path, Path, int, int]:
    """(train config, serve config, trainer metrics port, serving port) on the real services."""
    from kelp.demo.run import _stream_config
    from kelp.harness import free_port

    cfg = _stream_config(base, bootstrap, TOPIC, redis_url, fetch_sessions=fetch_sessions)
    cfg.trainer.checkpoint_dir = workdir / "checkpoints"
    cfg.trainer.eval_window_batches = 8
    cfg.metrics.host = "127.0.0.1"
    cfg.metrics.port = free_port()
    cfg.serving.host = "127.0.0.1"
    cfg.serving.port = free_port()
    cfg.serving.poll_interval_s = 1.0
    return (
        _write_config(cfg, workdir / "train.yaml"),
        _write_config(cfg, workdir / "serve.yaml"),
        cfg.metrics.port,
        cfg.serving.port,
    )


class _Producer(threading.Thread):
    """Replays the sample file into the topic at ``rate`` samples/s, wave after wave, until stopped."""

    def __init__(self, bootstrap: str, source: FileSourceConfig, rate: float) -> None:
        super().__init__(name="kelp-preview-producer", daemon=True)
        self.bootstrap, self.source, self.rate = bootstrap, source, rate
        self.samples = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def _messages(self) -> Iterator[tuple[bytes, int]]:
        from kelp.consumers.produce import file_messages

        for value, n in file_messages(self.source.path, self.source.format, batch_size=64):
            if self.stop.is_set():
                return
            yield value, n

    def run(self) -> None:
        from kafka import KafkaProducer

        from kelp.consumers.produce import produce
        from kelp.demo.run import _poison_records

        try:
            while not self.stop.is_set():
                sent = produce({"bootstrap_servers": self.bootstrap}, TOPIC, self._messages(),
                               rate=self.rate, quiet=True)  # fmt: skip
                self.samples += sent.records
                poison = KafkaProducer(bootstrap_servers=self.bootstrap)
                for value in _poison_records():
                    poison.send(TOPIC, value)
                poison.flush()
                poison.close()
        except BaseException as exc:  # reported by record_deployment, not lost in a thread
            self.error = exc


class _Client(threading.Thread):
    """A kubelet's readiness probe every 2 s, and score requests at ``rate``/s once ready."""

    def __init__(self, url: str, samples: list[dict[str, Any]], rate: float) -> None:
        super().__init__(name="kelp-preview-client", daemon=True)
        self.url, self.samples, self.rate = url, samples, rate
        self.counts: dict[str, int] = {}
        self.stop = threading.Event()

    def _count(self, what: str, status: int) -> None:
        key = f"{what} {status}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def _request(self, n: int) -> None:
        user = {"dense": self.samples[0]["dense"], "sparse": dict(self.samples[0]["sparse"])}
        if n % 10 == 9:  # a client bug: a sample without its features
            self._count("score", _http(f"{self.url}/v1/score", {"samples": [{"dense": "oops"}]}))
        elif n % 4 == 3:
            candidates = [{"sparse": {"C1": s["sparse"]["C1"]}} for s in self.samples[1:6]]
            status = _http(f"{self.url}/v1/score/candidates", {"user": user, "candidates": candidates})
            self._count("candidates", status)
        else:
            start = n % (len(self.samples) - 3)
            status = _http(f"{self.url}/v1/score", {"samples": self.samples[start : start + 3]})
            self._count("score", status)

    def run(self) -> None:
        ready, next_probe = False, 0.0
        for n in itertools.count():
            if self.stop.is_set():
                return
            now = time.monotonic()
            if now >= next_probe:
                ready = _http(f"{self.url}/readyz") == 200
                next_probe = now + 2.0
            if ready:
                self._request(n)
            self.stop.wait(1.0 / self.rate)


def _wait_http(url: str, proc: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise KelpError(f"{proc.name} exited before answering {url}:\n{proc.log_tail(30)}")
        if _http(url, timeout=2.0) == 200:
            return
        time.sleep(0.2)
    raise KelpError(f"{proc.name} did not answer {url} within {timeout_s:.0f}s:\n{proc.log_tail(30)}")


def record_deployment(
    config_path: Path,
    *,
    seconds: float = 30.0,
    interval_s: float = 1.0,
    produce_rate: float = 2000.0,
    request_rate: float = 8.0,
    out: Printer = print,
) -> Recording:
    """Run the workload of the module docstring and return its scrapes (``seconds`` of them)."""
    from kelp.demo.serving import _samples
    from kelp.harness import RedisServer, make_broker
    from kelp.harness.process import ManagedProcess

    base = load_config(config_path)
    source = base.source
    if not isinstance(source, FileSourceConfig) or source.format != "criteo_tsv":
        raise UserError(f"{config_path}: the preview replays a criteo_tsv file source (like kelp demo)")
    if not source.path.is_file():
        raise UserError(f"{config_path}: the sample {source.path} is missing")
    workdir = Path(tempfile.mkdtemp(prefix="kelp-dashboard-"))
    samples = _samples(source.path, 40)
    with RedisServer() as redis_srv, make_broker() as broker:
        broker.create_topic(TOPIC, partitions=2)
        broker.create_topic(f"{TOPIC}-dead-letter", partitions=1)
        train_yaml, serve_yaml, metrics_port, serving_port = _configs(
            base, broker.bootstrap, redis_srv.url, workdir, fetch_sessions=broker.fetch_sessions_work
        )
        out(f"  redis-server {redis_srv.url}   {broker.label} {broker.bootstrap}   workdir {workdir}")
        cli = [sys.executable, "-m", "kelp.cli"]
        trainer = ManagedProcess([*cli, "train", "--config", str(train_yaml)], "train", workdir)
        serving = ManagedProcess([*cli, "serve", "--config", str(serve_yaml)], "serve", workdir)
        producer = _Producer(broker.bootstrap, source, produce_rate)
        client = _Client(f"http://127.0.0.1:{serving_port}", samples, request_rate)
        scraper = Scraper(interval_s)
        trainer.start()
        serving.start()
        try:
            trainer_url = f"http://127.0.0.1:{metrics_port}"
            _wait_http(f"{trainer_url}/healthz", trainer, 120)
            producer.start()
            scraper.add(Target("kelp-trainer", "trainer-0", f"{trainer_url}/metrics"))
            scraper.start()
            out(f"  kelp train up (metrics {trainer_url}); producing {produce_rate:.0f} samples/s")
            _wait_http(f"http://127.0.0.1:{serving_port}/healthz", serving, 120)
            scraper.add(Target("kelp-serving", "serving-0", f"http://127.0.0.1:{serving_port}/metrics"))
            client.start()
            out(f"  kelp serve up on :{serving_port}; scraping every {interval_s:g}s for {seconds:g}s")
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for proc in (trainer, serving):
                    if not proc.alive():
                        raise KelpError(f"{proc.name} exited during the run:\n{proc.log_tail(30)}")
                if producer.error is not None:
                    raise KelpError(f"producing failed: {producer.error}")
                time.sleep(0.5)
        finally:
            scrapes = scraper.stop() if scraper.running else []
            producer.stop.set()
            client.stop.set()
            serving.stop(timeout_s=30)
            trainer.stop(timeout_s=60)
            for thread, wait_s in ((producer, 30), (client, 10)):
                if thread.is_alive():
                    thread.join(timeout=wait_s)
    out(
        f"  {len(scrapes)} scrapes, {scraper.failures} failed; requests {dict(sorted(client.counts.items()))}"
    )
    return Recording(scrapes, interval_s, producer.samples, dict(client.counts), scraper.failures)

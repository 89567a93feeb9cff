"""``kelp demo --loop``: the online-learning loop closed on real services, with simulated users.

1. starts redis-server and a Kafka broker on free loopback ports;
2. seeds the training topic with a small labelled history (every user and
   item with uniform clicks), starts ``kelp train``, and waits for its first
   snapshot;
3. starts ``kelp serve`` (with ``serving.request_log`` on) and ``kelp join``,
   each a child process on the one config;
4. runs the loop for ``seconds``: a load generator asks the replica to rank
   ``CANDIDATES`` items for a random user (``/v1/score/candidates``); simulated
   users click each shown item with the probability of its kind (``GOOD_CTR``
   for one item in ``GOOD_EVERY``, ``BAD_CTR`` for the rest), a moment later,
   on a clicks topic; ``kelp join`` labels what was served with those clicks;
   ``kelp train`` learns from the labelled events and publishes; the replica
   hot-swaps the new models;
5. reports, per period, the replica's mean score for good and for bad items,
   the model version it served and the AUC of its scores against the clicks
   that followed; and what each process counted (``/metrics``). Then it stops
   all three with SIGTERM and checks each exits 0.

The seeded history carries no preference, so the gap between good and bad
items' scores is learned from the loop alone.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml

from kelp.errors import KelpError
from kelp.harness import KafkaBroker

__all__ = ["LoopReport", "run_loop"]

Printer = Callable[[str], None]

USERS = 50
ITEMS = 200
CANDIDATES = 20
GOOD_EVERY = 10
GOOD_CTR = 0.5
BAD_CTR = 0.03
CLICK_WINDOW_S = 3.0
REQUESTS_PER_S = 15.0


@dataclass
class Period:
    """What the replica served in one period of the loop."""

    started_s: float
    requests: int = 0
    good: list[float] = field(default_factory=list)
    bad: list[float] = field(default_factory=list)
    clicked: list[tuple[float, int]] = field(default_factory=list)
    versions: set[int] = field(default_factory=set)

    @property
    def gap(self) -> float:
        return float(np.mean(self.good) - np.mean(self.bad)) if self.good and self.bad else float("nan")

    @property
    def auc(self) -> float:
        from kelp.trainer.evaluation import exact_auc

        if not self.clicked:
            return float("nan")
        scores, labels = zip(*self.clicked, strict=True)
        return float(exact_auc(np.array(labels, dtype=np.float32), np.array(scores, dtype=np.float64)))


@dataclass
class LoopReport:
    periods: list[Period]
    requests: int = 0
    clicks: int = 0
    joined: dict[str, float] = field(default_factory=dict)
    trained_samples: float = 0.0
    versions: list[int] = field(default_factory=list)
    exits: dict[str, int] = field(default_factory=dict)


def _config(bootstrap: str, redis_url: str, workdir: Path, ports: dict[str, int]) -> dict[str, Any]:
    return {
        "deployment": "loop",
        "features": {
            "label": {"name": "click"},
            "dense": [{"name": "position", "default": 0.0}],
            "sparse": [{"name": "user"}, {"name": "item"}],
            "table_defaults": {"dim": 16},
        },
        "source": {
            "kind": "kafka",
            "bootstrap_servers": [bootstrap],
            "topics": ["loop-events"],
            "group_id": "loop-trainer",
            "dead_letter_topic": "loop-events-dead-letter",
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
            "max_poll_interval_ms": 10000,
        },
        "batching": {"batch_size": 256, "max_batch_delay_ms": 500},
        "store": {"backend": "redis", "urls": [redis_url]},
        "trainer": {
            "model": "deepfm",
            "checkpoint_dir": str(workdir / "checkpoints"),
            "checkpoint_every_s": 30,
            "log_every_s": 3600,
            "eval_window_batches": 8,
        },
        "publisher": {"channel": "redis", "interval_s": 2.0, "keep_versions": 3},
        "serving": {
            "host": "127.0.0.1",
            "port": ports["serve"],
            "poll_interval_s": 0.5,
            "request_log": {"enabled": True, "topic": "loop-requests", "linger_ms": 5},
        },
        "join": {
            "impressions_topic": "loop-requests",
            "item_feature": "item",
            "actions": [
                {"topic": "loop-clicks", "task": "click", "window_s": CLICK_WINDOW_S, "item_field": "item"}
            ],
            "allowed_lateness_s": 0.5,
            "idle_partition_s": 1.0,
            "dead_letter_topic": "loop-join-dead-letter",
            "host": "127.0.0.1",
            "port": ports["join"],
        },
        "metrics": {"host": "127.0.0.1", "port": ports["train"]},
    }


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def _metric(url: str, name: str, **labels: str) -> float:
    """The sum of the ``name`` samples carrying ``labels``, from a /metrics page (NaN: no page)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = _get(url)
    if status != 200:
        return float("nan")
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def _wait(
    check: Callable[[], bool],
    timeout_s: float,
    what: str,
    procs: dict[str, subprocess.Popen[bytes]],
    logs: dict[str, Path],
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise KelpError(
                    f"kelp {name} exited with {proc.returncode}:\n{logs[name].read_text()[-2000:]}"
                )
        if check():
            return
        time.sleep(0.2)
    raise KelpError(f"the loop demo timed out waiting for {what}")


def _seed(bootstrap: str) -> None:
    """Yesterday's log: every user and item, clicks at a uniform rate (no preference to learn from)."""
    from kafka import KafkaProducer

    from kelp.consumers.codec import encode_columns

    rng = np.random.default_rng(0)
    n = 4096
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        labels = (rng.random(n) < 0.08).astype(np.float32)
        sparse = {
            "user": rng.integers(0, USERS, n).astype(np.uint64),
            "item": rng.integers(0, ITEMS, n).astype(np.uint64),
        }
        producer.send(
            "loop-events",
            encode_columns(
                labels, dense=np.zeros((n, 1), np.float32), sparse=sparse, task_labels={"click": labels}
            ),
        )
        producer.flush(30)
    finally:
        producer.close()


class _Users:
    """Sends ranking requests and clicks like users would, and keeps what was served per period."""

    def __init__(self, serve_url: str, bootstrap: str, period_s: float) -> None:
        from kafka import KafkaProducer

        self.url = serve_url + "/v1/score/candidates"
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        self.period_s = period_s
        self.rng = random.Random(0)
        self.periods: list[Period] = []
        self.clicks = 0
        self._pending: list[tuple[float, bytes]] = []

    def run(self, seconds: float) -> None:
        start = time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - start) < seconds:
            if not self.periods or elapsed - self.periods[-1].started_s >= self.period_s:
                self.periods.append(Period(started_s=elapsed))
            if sent < elapsed * REQUESTS_PER_S:
                self._request(self.periods[-1])
                sent += 1
            self._send_due()
            time.sleep(0.002)
        self._send_due(every=True)
        self.producer.flush(30)
        self.producer.close()

    def _request(self, period: Period) -> None:
        user = self.rng.randrange(USERS)
        items = self.rng.sample(range(ITEMS), CANDIDATES)
        body = {"user": {"sparse": {"user": user}}, "candidates": [{"sparse": {"item": i}} for i in items]}
        reply = _post(self.url, body)
        period.requests += 1
        period.versions.add(int(reply["model_version"]))
        for item, score in zip(items, reply["scores"], strict=True):
            good = item % GOOD_EVERY == 0
            (period.good if good else period.bad).append(score)
            clicked = self.rng.random() < (GOOD_CTR if good else BAD_CTR)
            period.clicked.append((score, int(clicked)))
            if clicked:
                at = time.time() + self.rng.uniform(0.2, CLICK_WINDOW_S * 0.6)
                event = {"request_id": reply["request_id"], "item": item, "ts": at}
                self._pending.append((at, orjson.dumps(event)))

    def _send_due(self, every: bool = False) -> None:
        now = time.time()
        keep = []
        for at, value in self._pending:
            if every or at <= now:
                self.producer.send("loop-clicks", value=value)
                self.clicks += 1
            else:
                keep.append((at, value))
        self._pending = keep


def run_loop(
    out: Printer = print,
    seconds: float = 60.0,
    period_s: float = 10.0,
    services: tuple[KafkaBroker, str] | None = None,
) -> LoopReport:
    """Steps 1-5 of the module docstring.

    ``services``: a running broker and the URL of an empty Redis to use instead of starting both
    (the loop's topics must not exist on that broker yet).
    """
    from kelp.harness import RedisServer, make_broker

    if services is not None:
        return _loop(out, seconds, period_s, *services)
    broker = make_broker()
    out(f"starting {broker.label} and redis-server")
    with broker, RedisServer() as redis:
        return _loop(out, seconds, period_s, broker, redis.url)


def _loop(out: Printer, seconds: float, period_s: float, broker: KafkaBroker, redis_url: str) -> LoopReport:
    from kelp.harness import free_port

    workdir = Path(tempfile.mkdtemp(prefix="kelp-loop-"))
    ports = {"serve": free_port(), "join": free_port(), "train": free_port()}
    for topic in ("loop-events", "loop-requests", "loop-clicks"):
        broker.create_topic(topic)
    config = workdir / "loop.yaml"
    config.write_text(yaml.safe_dump(_config(broker.bootstrap, redis_url, workdir, ports)))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}

    def launch(name: str) -> None:
        logs[name] = workdir / f"{name}.log"
        with logs[name].open("wb") as sink:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "kelp.cli", name, "--config", str(config)],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

    serve, join, train = (f"http://127.0.0.1:{ports[p]}" for p in ("serve", "join", "train"))
    report = LoopReport(periods=[])
    try:
        out("seeding the training topic with a history that prefers nothing; starting kelp train")
        _seed(broker.bootstrap)
        launch("train")
        _wait(
            lambda: _metric(train + "/metrics", "kelp_publisher_version") >= 1,
            120,
            "a first snapshot",
            procs,
            logs,
        )
        out("first snapshot published; starting kelp serve (request log on) and kelp join")
        launch("serve")
        launch("join")
        _wait(
            lambda: _get(serve + "/readyz")[0] == 200 and _get(join + "/readyz")[0] == 200,
            120,
            "serve and join ready",
            procs,
            logs,
        )
        users = _Users(serve, broker.bootstrap, period_s)
        out(f"the loop runs for {seconds:g}s: {REQUESTS_PER_S:g} requests/s of {CANDIDATES} candidates")
        runner = threading.Thread(target=users.run, args=(seconds,), daemon=True)
        runner.start()
        shown = 0
        while runner.is_alive():
            runner.join(0.5)
            while len(users.periods) - 1 > shown:  # a period is done once the next began
                _print_period(out, users.periods[shown])
                shown += 1
        for period in users.periods[shown:]:
            _print_period(out, period)
        time.sleep(CLICK_WINDOW_S + 2.0)  # the last windows close and their labels go out
        report.periods = users.periods
        report.requests = sum(p.requests for p in users.periods)
        report.clicks = users.clicks
        report.joined = {
            label: _metric(join + "/metrics", "kelp_join_samples_total", label=label)
            for label in ("positive", "negative")
        }
        report.trained_samples = _metric(train + "/metrics", "kelp_trainer_samples_total")
        report.versions = sorted({v for p in users.periods for v in p.versions})
        out(
            f"requests {report.requests}, clicks {report.clicks}; joined {report.joined['positive']:.0f} "
            f"positives and {report.joined['negative']:.0f} negatives; trainer trained "
            f"{report.trained_samples:.0f} samples; the replica served versions {_span(report.versions)}"
        )
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in procs.items():
            try:
                report.exits[name] = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                report.exits[name] = proc.wait()
    out("stopped with SIGTERM: " + ", ".join(f"kelp {n} exit {c}" for n, c in report.exits.items()))
    return report


def _span(versions: list[int]) -> str:
    return f"v{versions[0]}..v{versions[-1]}" if versions else "none"


def _print_period(out: Printer, p: Period) -> None:
    out(
        f"  t={p.started_s:>5.1f}s  requests {p.requests:>4}  served {_span(sorted(p.versions))}  "
        f"mean score good items {np.mean(p.good):.3f}  bad items {np.mean(p.bad):.3f}  "
        f"(gap {p.gap:+.3f})  AUC vs clicks {p.auc:.3f}"
    )

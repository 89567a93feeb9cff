"""The whole path with a model Kelp did not write: JSON clicks on Kafka -> ``kelp train`` -> ``kelp serve``.

``examples/two-tower`` holds a two-tower model outside the kelp package, a
generator of nested JSON click events and the config. Both processes run as a
user runs them, with that folder on ``PYTHONPATH``, on a real broker and Redis.
The replica scores one user against candidates by string ids; then clicks for
one user-item pair are produced, and the same running replica's score for that
item changes, on the same model version: fresh embeddings, no restart.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from kelp.config import KafkaSourceConfig, KelpConfig, load_config
from kelp.harness import KafkaBroker, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "two-tower"
FIRST_EVENTS = 2000
CLICKS = 600


@pytest.fixture
def kafka_broker(isolated_kafka_broker: KafkaBroker) -> KafkaBroker:
    """The trainer may pause partitions; on Tansu that state must not leak into later groups."""
    return isolated_kafka_broker


def _generator() -> Any:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import generate
    finally:
        sys.path.remove(str(EXAMPLE))
    return generate


def produce_json(bootstrap: str, topic: str, events: Iterable[dict[str, Any]]) -> int:
    """One JSON object per record, as the example's README produces them."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    sent = 0
    for event in events:
        producer.send(topic, json.dumps(event).encode())
        sent += 1
    producer.flush()
    producer.close()
    return sent


def _config(tmp_path: Path, broker: KafkaBroker, topic: str, redis_url: str) -> tuple[KelpConfig, Path]:
    """The example's config, moved onto the test's broker, topic, Redis and ports."""
    cfg = load_config(EXAMPLE / "two-tower.yaml")
    assert isinstance(cfg.source, KafkaSourceConfig)
    cfg.source.bootstrap_servers = [broker.bootstrap]
    cfg.source.topics = [topic]
    cfg.source.group_id = f"trainer-{topic}"
    cfg.source.dead_letter_topic = None
    cfg.source.session_timeout_ms = 6000
    cfg.source.heartbeat_interval_ms = 1000
    cfg.source.max_poll_interval_ms = 5000
    cfg.source.incremental_fetch_sessions = broker.fetch_sessions_work
    cfg.batching.max_batch_delay_ms = 200
    cfg.store.urls = [redis_url]
    # Rows reach Redis after every push, so the replica reads them as soon as they are trained.
    cfg.store.hot_cache.writeback_every_steps = 1
    cfg.store.hot_cache.writeback_interval_s = 0.2
    # One snapshot (the first call publishes), then none for the test's length: a score that
    # changes on the same model version can only come from the embeddings.
    cfg.publisher.interval_s = 3600
    cfg.serving.host = "127.0.0.1"
    cfg.serving.port = free_port()
    cfg.serving.poll_interval_s = 0.5
    cfg.metrics.port = free_port()
    cfg.trainer.checkpoint_dir = tmp_path / "checkpoints"
    cfg.trainer.log_every_s = 1.0
    cfg.trainer.device = "cpu"
    path = tmp_path / "two-tower.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True, by_alias=True)))
    return load_config(path), path


def _start(command: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")])),
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kelp.cli", command, "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=config.parent,
        )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in reversed(started):
        proc.terminate()
    for proc in reversed(started):
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _metric(port: int, name: str) -> float:
    """A sample's value from the trainer's /metrics; 0 while it does not answer yet."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


def _wait(
    predicate: Callable[[], Any], what: str, procs: list[subprocess.Popen[bytes]], logs: list[Path]
) -> Any:
    """Poll until truthy; a bound on waiting (not a timing check), failing early if a process died."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is not None:
                raise AssertionError(f"{log.name} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for log in logs)
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def _candidates(events: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The first ``n`` distinct items of ``events``: ``{"id", "category"}`` each."""
    items: dict[int, dict[str, Any]] = {}
    for event in events:
        items.setdefault(event["item"]["id"], event["item"])
    return list(items.values())[:n]


def _score(client: httpx.Client, user: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """One user against ``items``, every id sent as a string (item ids as digit strings)."""
    reply = client.post(
        "/v1/score/candidates",
        json={
            "user": {"dense": {"hour": 13}, "sparse": {"user": user["id"], "country": user["country"]}},
            "candidates": [
                {"sparse": {"item": str(item["id"]), "category": item["category"]}} for item in items
            ],
        },
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert len(body["scores"]) == len(items)
    assert all(math.isfinite(s) and 0.0 < s < 1.0 for s in body["scores"]), body
    return body


def test_json_clicks_train_a_user_model_and_a_running_replica_scores_fresh_embeddings(
    tmp_path: Path,
    kafka_broker: KafkaBroker,
    unique_topic: str,
    redis_url: str,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    events = list(_generator().events(FIRST_EVENTS, seed=3))
    user, items = events[0]["user"], _candidates(events, 5)
    target = 2  # the candidate whose clicks are produced in the second round
    kafka_broker.create_topic(unique_topic, partitions=1)
    assert produce_json(kafka_broker.bootstrap, unique_topic, events) == FIRST_EVENTS
    cfg, config = _config(tmp_path, kafka_broker, unique_topic, redis_url)
    logs = [tmp_path / "train.log", tmp_path / "serve.log"]
    processes.append(_start("train", config, logs[0]))
    processes.append(_start("serve", config, logs[1]))
    running = (processes, logs)

    def trained() -> float:
        return _metric(cfg.metrics.port, "kelp_trainer_samples_total")

    _wait(lambda: trained() >= FIRST_EVENTS, "the trainer to train the first events", *running)
    with httpx.Client(base_url=f"http://127.0.0.1:{cfg.serving.port}", timeout=30) as client:

        def ready() -> bool:
            try:
                return client.get("/readyz").status_code == 200
            except httpx.HTTPError:
                return False

        _wait(ready, "the replica to load the trainer's snapshot", *running)
        model = client.get("/v1/model").json()
        assert model["model"]["reference"] == "two_tower:two_tower"
        before = _score(client, user, items)
        assert before["default_row_rate"] == 0.0  # every id was trained: all rows are the stored ones
        _check_vectors_explain_the_scores(client, user, items, before["scores"])

        # Many clicks of one user on one item: the item's row (and the user's) move.
        clicks = [
            {"user": user, "item": items[target], "ctx": {"hour": 13}, "clicked": 1, "ts": time.time()}
            for _ in range(CLICKS)
        ]
        produce_json(kafka_broker.bootstrap, unique_topic, clicks)
        _wait(lambda: trained() >= FIRST_EVENTS + CLICKS, "the trainer to train the clicks", *running)

        def moved() -> dict[str, Any] | None:
            now = _score(client, user, items)
            return now if now["scores"][target] != pytest.approx(before["scores"][target], abs=1e-4) else None

        after = _wait(moved, "the replica's score for the clicked item to change", *running)
    # Same process, same snapshot: the change came from the rows the trainer wrote back.
    assert after["model_version"] == before["model_version"]
    assert after["scores"][target] > before["scores"][target]
    assert processes[1].poll() is None


def _check_vectors_explain_the_scores(
    client: httpx.Client, user: dict[str, Any], items: list[dict[str, Any]], scores: list[float]
) -> None:
    """``/v1/embeddings``: the model's tower vectors give the scores' logits up to the bias, and the
    items' stored rows are there to index."""
    samples = [
        {
            "dense": {"hour": 13},
            "sparse": {
                "user": user["id"],
                "country": user["country"],
                "item": str(item["id"]),
                "category": item["category"],
            },
        }
        for item in items
    ]
    reply = client.post("/v1/embeddings", json={"samples": samples})
    assert reply.status_code == 200, reply.text
    vectors = reply.json()["vectors"]
    dots = [
        sum(u * v for u, v in zip(us, vs, strict=True))
        for us, vs in zip(vectors["user"], vectors["item"], strict=True)
    ]
    logits = [math.log(s / (1 - s)) for s in scores]
    bias = logits[0] - dots[0]
    assert [d + bias for d in dots] == pytest.approx(logits, abs=1e-3)

    rows = client.post("/v1/embeddings", json={"feature": "item", "ids": [str(i["id"]) for i in items]})
    assert rows.status_code == 200, rows.text
    assert (
        rows.json()["stored"] == [True] * len(items) and len(rows.json()["vectors"][0]) == rows.json()["dim"]
    )


def test_the_shipped_config_validates_with_the_example_on_the_python_path() -> None:
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE)}
    done = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "config", "validate", str(EXAMPLE / "two-tower.yaml")],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "model two_tower:two_tower ok" in done.stdout


@pytest.mark.parametrize(
    ("user", "item", "message"),
    [
        (["user", "country", "hour"], ["item"], "['category'] are in neither"),
        (["user", "country", "hour", "item"], ["item", "category"], "['item'] are in both"),
        (["user", "country", "hour", "page"], ["item", "category"], "user_features ['page'] are not"),
    ],
)
def test_each_feature_belongs_to_exactly_one_tower(user: list[str], item: list[str], message: str) -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from two_tower import two_tower
    finally:
        sys.path.remove(str(EXAMPLE))
    from kelp.trainer import ModelSpec

    spec = ModelSpec(dense=("hour",), sparse={"user": 16, "country": 16, "item": 16, "category": 16})
    with pytest.raises(ValueError, match=re.escape(message)):
        two_tower(spec, user_features=user, item_features=item)


def _two_tower_module() -> Any:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import two_tower
    finally:
        sys.path.remove(str(EXAMPLE))
    return two_tower


def _spec_and_batch(tasks: tuple[str, ...]) -> tuple[Any, Any]:
    import torch

    from kelp.trainer import ModelInput, ModelSpec

    spec = ModelSpec(
        dense=("hour",), sparse={"user": 16, "country": 16, "item": 16, "category": 16}, tasks=tasks
    )
    g = torch.Generator().manual_seed(0)
    batch = ModelInput(
        dense=torch.randn(8, 1, generator=g),
        sparse={name: torch.randn(8, 16, generator=g) for name in spec.sparse},
    )
    return spec, batch


SPLIT = {"user_features": ["user", "country", "hour"], "item_features": ["item", "category"]}


def test_one_label_builds_the_one_task_model_as_before() -> None:
    import torch

    from kelp.trainer.model_api import to_logits

    spec, batch = _spec_and_batch(("clicked",))
    torch.manual_seed(3)
    model = _two_tower_module().two_tower(spec, **SPLIT)
    # the parameter names a one-task snapshot holds: towers of Linear-ReLU-Linear and one scalar bias
    assert sorted(n for n, _ in model.named_parameters()) == [
        "bias",
        *(f"{t}_tower.{i}.{p}" for t in ("item", "user") for i in (0, 2) for p in ("bias", "weight")),
    ]
    out = model(batch)
    assert isinstance(out, torch.Tensor) and out.shape == (8,)
    user = model.user_tower(torch.cat([batch.dense, batch.sparse["user"], batch.sparse["country"]], dim=1))
    item = model.item_tower(torch.cat([batch.sparse["item"], batch.sparse["category"]], dim=1))
    assert torch.allclose(out, (user * item).sum(dim=1) + model.bias)
    assert torch.equal(to_logits(out, spec, 8), out)


def test_two_labels_give_one_logit_per_task_from_shared_hidden_layers() -> None:
    import torch

    from kelp.trainer.step import task_logits

    spec, batch = _spec_and_batch(("clicked", "bought"))
    torch.manual_seed(3)
    model = _two_tower_module().two_tower(spec, **SPLIT)
    out = model(batch)
    assert isinstance(out, dict) and list(out) == ["clicked", "bought"]
    assert all(v.shape == (8,) and v.dtype == torch.float32 for v in out.values())
    assert not torch.allclose(out["clicked"], out["bought"])  # each task has its own last layers
    logits = task_logits(out, spec, 8)  # what the trainer reads: f32[B, T] in spec.tasks order
    assert torch.equal(logits[:, 1], out["bought"])
    # one task's loss trains the shared layers and that task's heads only
    out["bought"].sum().backward()
    assert model.user_tower[0].weight.grad is not None and model.item_tower[0].weight.grad is not None
    assert model.user_heads[0].weight.grad is None and model.user_heads[1].weight.grad is not None
    assert model.bias.grad is not None and model.bias.grad.tolist() == [0.0, 8.0]

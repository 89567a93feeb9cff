"""A replica serves a model that reads a sequence feature: each score is the model's own forward on the rows.

The DIN-style plug-in of the trainer tests (``tests/trainer/seq_models/din.py``)
attends with the candidate item over the user's history (``pooling: none``).
Rows are pushed to a real Redis; the expected score is the model's forward on
a :class:`~kelp.trainer.ModelInput` built by hand from the same rows, so the
replica's dedup, gather and offsets must give what the trainer gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig
from kelp.publish import build_snapshot
from kelp.serving import ServingReplica
from kelp.store import build_store
from kelp.trainer import ModelInput, SequenceInput, build_model

from .helpers import LiveServer, publisher_for, small_config, wait_until

pytestmark = pytest.mark.integration

MODELS = Path(__file__).resolve().parents[1] / "trainer" / "seq_models"
DIM = 4


@pytest.fixture
def models_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(MODELS))
    yield


def din_config(redis_url: str, tmp_path: Path) -> KelpConfig:
    return small_config(
        redis_url,
        tmp_path,
        features={
            "dense": [{"name": "d0"}],
            "sparse": [
                {"name": "user"},
                {"name": "item", "table": "items"},
                {"name": "history", "table": "items", "max_ids": 6, "pooling": "none"},
            ],
            "tables": [{"name": "user", "dim": DIM}, {"name": "items", "dim": DIM}],
        },
        trainer={"model": "din:din", "model_args": {"history": "history", "candidate": "item"}},
        serving={"max_ids_per_feature": 6},
    )


def expected_scores(
    model: torch.nn.Module, rows: dict[str, dict[int, np.ndarray]], samples: list[dict[str, Any]]
) -> list[float]:
    """sigmoid(forward) on a ModelInput built sample by sample from ``rows`` (an unknown id reads zeros)."""

    def row(table: str, key: int) -> torch.Tensor:
        return torch.from_numpy(rows[table].get(key, np.zeros(DIM, np.float32)))

    def one(table: str, name: str) -> torch.Tensor:
        return torch.stack(
            [row(table, s["sparse"][name]) if name in s["sparse"] else torch.zeros(DIM) for s in samples]
        )

    histories = [s["sparse"].get("history", []) for s in samples]
    values = [row("items", h) for hist in histories for h in hist]
    offsets = torch.tensor(np.cumsum([0, *map(len, histories)]), dtype=torch.int64)
    batch = ModelInput(
        dense=torch.tensor([[s.get("dense", {}).get("d0", 0.0)] for s in samples], dtype=torch.float32),
        sparse={"user": one("user", "user"), "item": one("items", "item")},
        sequences={"history": SequenceInput(torch.stack(values) if values else torch.zeros(0, DIM), offsets)},
    )
    with torch.no_grad():
        return torch.sigmoid(model(batch)).tolist()


def test_served_scores_equal_the_models_forward_on_the_same_rows(
    redis_url: str, tmp_path: Path, models_on_path: None
) -> None:
    cfg = din_config(redis_url, tmp_path)
    torch.manual_seed(3)
    model = build_model(cfg.features, cfg.trainer).eval()
    rng = np.random.default_rng(3)
    rows = {
        "user": {k: rng.normal(size=DIM).astype(np.float32) for k in (1, 2)},
        # Id 109 is never pushed: it reads the default row (zeros), in serving and here.
        "items": {k: rng.normal(size=DIM).astype(np.float32) for k in (3, 4, 5, 101, 102, 103)},
    }
    store = build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry())
    for table, by_id in rows.items():
        ids = np.array(sorted(by_id), np.uint64)
        store.push(table, ids, np.stack([by_id[int(k)] for k in ids]), np.zeros(ids.size, np.float32))
    samples = [
        {"dense": {"d0": 0.5}, "sparse": {"user": 1, "item": 3, "history": [101, 102, 3, 109]}},
        {"sparse": {"user": 2, "item": 4, "history": []}},  # an empty history
        {"dense": {"d0": -1.0}, "sparse": {"item": 5, "history": [103]}},
        {"dense": {"d0": 0.5}, "sparse": {"user": 1, "item": 3}},  # sample 0 with no history at all
        {"sparse": {"user": 2, "item": 4, "history": [103, 103, 101]}},  # a repeated id
    ]
    publisher = publisher_for(cfg)
    replica = ServingReplica(cfg, CollectorRegistry())
    try:
        version = publisher.channel.next_version()
        publisher.channel.write(
            build_snapshot(model, cfg.features, cfg.trainer, version=version, step=1, offsets={})
        )
        with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            wait_until(lambda: client.get("/v1/model").json().get("version") == version, what="v1 served")
            reply = client.post("/v1/score", json={"samples": samples})
            assert reply.status_code == 200, reply.text
            got = reply.json()["scores"]
            want = expected_scores(model, rows, samples)
            assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
            assert got[0] != pytest.approx(got[3], abs=1e-6)  # the history changes the score

            # Candidates: the user's history is shared by every candidate item.
            user = {"dense": {"d0": 0.5}, "sparse": {"user": 1, "history": [101, 102, 3]}}
            items = [3, 4, 5, 101]
            reply = client.post(
                "/v1/score/candidates",
                json={"user": user, "candidates": [{"sparse": {"item": i}} for i in items]},
            )
            assert reply.status_code == 200, reply.text
            per_item = [{"dense": user["dense"], "sparse": {**user["sparse"], "item": i}} for i in items]
            assert reply.json()["scores"] == pytest.approx(
                expected_scores(model, rows, per_item), rel=1e-5, abs=1e-7
            )
    finally:
        publisher.close()
        store.close()

"""The trainer daemon trains a DIN-style plug-in on JSON events whose history is a sequence feature.

The real path: the file source decodes JSON events (the history a list of
ids), the daemon batches, pulls rows from the in-memory store, steps and
pushes. History ids (100 and up) never appear as the candidate item, so their
rows can only move through the sequence's gradients.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from kelp.config import KelpConfig, parse_config
from kelp.daemon.train import TrainDaemon
from kelp.store.policy.initial_rows import init_rows

MODELS = Path(__file__).parent / "seq_models"
ROWS = 600
MAX_LEN = 6


def write_events(path: Path) -> Path:
    """Click when the item's parity is the majority parity of the history; a third have no history."""
    rng = np.random.default_rng(5)
    with path.open("wb") as f:
        for i in range(ROWS):
            item = int(rng.integers(0, 20))
            history = [int(x) for x in rng.integers(100, 140, size=int(rng.integers(1, MAX_LEN + 1)))]
            if i % 3 == 0:
                history = []
            even = sum(1 for h in history if h % 2 == 0)
            click = int((item % 2 == 0) == (2 * even >= len(history)))
            event = {"click": click, "user": int(rng.integers(0, 30)), "item": item, "history": history}
            f.write(orjson.dumps(event) + b"\n")
    return path


def din_config(tmp_path: Path) -> KelpConfig:
    return parse_config(
        {
            "deployment": "seq",
            "source": {
                "kind": "file",
                "path": str(write_events(tmp_path / "events.jsonl")),
                "format": "json",
                "json": {"label_field": "click", "sparse_fields": ["user", "item", "history"]},
            },
            "features": {
                "label": {"name": "click"},
                "sparse": [
                    {"name": "user"},
                    {"name": "item", "table": "items"},
                    {"name": "history", "table": "items", "max_ids": MAX_LEN, "pooling": "none"},
                ],
                "tables": [{"name": "user", "dim": 4}, {"name": "items", "dim": 4}],
            },
            "batching": {"batch_size": 64},
            "trainer": {
                "model": "din:din",
                "model_args": {"history": "history", "candidate": "item", "max_len": MAX_LEN},
                "device": "cpu",
                "checkpoint_dir": str(tmp_path / "checkpoints"),
            },
            "publisher": {"enabled": False},
        },
        origin="test_sequence_daemon",
    )


def test_the_daemon_trains_a_din_model_and_its_history_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(MODELS))
    cfg = din_config(tmp_path)
    stores: list[Any] = []
    history_lengths: list[int] = []

    def keep_store(store: Any) -> Any:
        stores.append(store)
        return store

    def on_step(_step: int, batch: Any, result: Any) -> None:
        assert result.skipped is None and math.isfinite(result.loss)
        history_lengths.extend(batch.sparse["history"].lengths().tolist())

    report = TrainDaemon(cfg, http=False, publish=False, on_step=on_step, wrap_store=keep_store).run()
    assert report.samples == ROWS
    assert report.losses and all(math.isfinite(x) for x in report.losses)
    assert 0 in history_lengths and max(history_lengths) > 1  # empty and multi-id histories both trained

    ids = np.arange(100, 140, dtype=np.uint64)
    table = cfg.features.table("items")
    pulled = stores[0].pull("items", ids, count=False)
    assert pulled.admitted.all()  # every history id was trained and pushed
    moved = np.abs(pulled.rows - init_rows(table.init, "items", ids, table.dim)).max(axis=1) > 0
    assert moved.all()
    assert (pulled.state > 0).all()  # the row-wise Adagrad saw a non-zero gradient for each

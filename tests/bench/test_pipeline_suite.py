"""``kelp bench pipeline``'s FeedOnlyStep moves what a real step moves and learns nothing.

Both steps run in the real daemon on the Criteo fixture (file source, memory
store): the same batches give the same pushes (tables, ids, row shapes), and
after the feed-only run every stored row is still its initial row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from kelp.bench.pipeline import FeedOnlyStep
from kelp.config import FileSourceConfig, KelpConfig, StoreConfig, load_config
from kelp.daemon.train import TrainDaemon
from kelp.store.policy.initial_rows import init_rows
from kelp.trainer.step import TrainStep

ROOT = Path(__file__).resolve().parents[2]
CRITEO = ROOT / "tests" / "daemon" / "data" / "criteo-2000.tsv"


def _config(tmp_path: Path) -> KelpConfig:
    cfg = load_config(ROOT / "examples" / "criteo-kaggle.yaml")
    assert isinstance(cfg.source, FileSourceConfig)
    cfg.source.path = CRITEO
    cfg.store = StoreConfig(backend="memory")
    cfg.batching.batch_size = 250
    cfg.trainer.checkpoint_dir = tmp_path / "checkpoints"
    cfg.publisher.enabled = False
    return cfg


def _run(cfg: KelpConfig, step_class: type[TrainStep]) -> tuple[list[dict[str, Any]], Any]:
    pushes: list[dict[str, Any]] = []
    stores: list[Any] = []

    def on_step(_step: int, _batch: Any, result: Any) -> None:
        pushes.append({t: (u.ids.copy(), u.rows.copy()) for t, u in result.updates.items()})

    def keep(store: Any) -> Any:
        stores.append(store)
        return store

    torch.manual_seed(0)
    daemon = TrainDaemon(
        cfg,
        registry=CollectorRegistry(),
        http=False,
        publish=False,
        on_step=on_step,
        wrap_store=keep,
        step_class=step_class,
    )
    report = daemon.run()
    assert report.samples == 2000
    return pushes, stores[0]


def test_the_feed_only_step_pushes_what_a_real_step_pushes_and_learns_nothing(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    real, _ = _run(cfg, TrainStep)
    cfg.trainer.checkpoint_dir = tmp_path / "feed-checkpoints"
    feed, store = _run(cfg, FeedOnlyStep)
    assert len(feed) == len(real) == 8
    pushed_ids = 0
    for real_step, feed_step in zip(real, feed, strict=True):
        assert feed_step.keys() == real_step.keys()
        for table, (ids, rows) in feed_step.items():
            real_ids, real_rows = real_step[table]
            np.testing.assert_array_equal(ids, real_ids)
            assert rows.shape == real_rows.shape
            pushed_ids += len(ids)
    assert pushed_ids > 0, "nothing was admitted: the comparison proves nothing"
    for table in cfg.features.tables:
        ids = np.unique(np.concatenate([step[table.name][0] for step in feed if table.name in step]))
        if not len(ids):
            continue
        stored = store.pull(table.name, ids, count=False)
        assert stored.admitted.all()
        np.testing.assert_array_equal(stored.rows, init_rows(table.init, table.name, ids, table.dim))

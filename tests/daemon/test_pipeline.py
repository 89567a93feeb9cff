"""TrainPipeline.progress: one call trains one batch, joins a group step without one, or does nothing.

The source is the file source on the Criteo fixture and the store the memory
backend (both real); the group's ``dense_sync`` is a recorder, as a lone rank's would be.
With row owners on a world of one, the group's sparse path (exchange, owner's
Adagrad step) must store what the plain path stores.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from kelp.config import DistributedConfig, KelpConfig, StoreConfig
from kelp.consumers import build_source
from kelp.daemon.group import TrainingGroup, launched_world
from kelp.daemon.outage import OutageGuard
from kelp.daemon.pipeline import TrainPipeline
from kelp.daemon.row_owners import RowOwners, SentRows
from kelp.store import EmbeddingStore, build_store
from kelp.trainer import TrainStep, build_model
from kelp.trainer.metrics import TrainerMetrics
from kelp.trainer.optim import SparseUpdate

from .conftest import CRITEO_ROWS, base_config


class SyncRecorder:
    """A lone rank's ``dense_sync``: records each call's sample count and always applies."""

    def __init__(self) -> None:
        self.samples: list[int] = []

    def __call__(self, samples: int) -> bool:
        self.samples.append(samples)
        return True


def _config(tmp_path: Path, prefetch: int) -> KelpConfig:
    cfg = base_config(tmp_path, prefetch_batches=prefetch, push_queue_batches=2)
    cfg.store = StoreConfig(backend="memory")
    cfg.batching.batch_size = 500
    return cfg


@contextmanager
def started_pipeline(
    tmp_path: Path, prefetch: int, *, owned: bool = False, stores: list[EmbeddingStore] | None = None
) -> Iterator[TrainPipeline]:
    """A started pipeline over the fixture's file source and a memory store, both closed afterwards.

    ``owned``: with row owners on a world of one; ``stores`` receives the store.
    """
    cfg = _config(tmp_path, prefetch)
    with (
        build_source(cfg.source, cfg.features, cfg.batching, CollectorRegistry()) as source,
        build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry()) as store,
    ):
        torch.manual_seed(0)
        metrics = TrainerMetrics(CollectorRegistry())
        model = build_model(cfg.features, cfg.trainer)
        step = TrainStep(model, cfg.features, cfg.trainer, torch.device("cpu"))
        owners = None
        if owned:
            group = TrainingGroup(launched_world({}), DistributedConfig(), metrics)
            owners = RowOwners(group, {t.name: t.dim for t in cfg.features.store_tables()})
        pipeline = TrainPipeline(
            source,
            store,
            step,
            cfg.trainer,
            guard=OutageGuard(5.0, metrics),
            metrics=metrics,
            acked=0,
            owners=owners,
        )
        pipeline.start()
        if stores is not None:
            stores.append(store)
        yield pipeline


@pytest.mark.parametrize("prefetch", [0, 2])
def test_each_call_trains_the_next_batch_until_the_source_ends(tmp_path: Path, prefetch: int) -> None:
    with started_pipeline(tmp_path, prefetch) as pipeline:
        steps: list[int] = []
        samples = 0
        step_no = 0
        for _ in range(50):
            sync = SyncRecorder()
            done = pipeline.progress(step_no, sync, wait_s=5.0)
            if done.trained is None:
                assert done.exhausted
                assert sync.samples == [0]  # an exhausted source still takes part in the step
                break
            step_no = done.trained.step
            steps.append(step_no)
            samples += done.trained.batch.size
            assert sync.samples == [done.trained.batch.size]  # one group exchange per trained step
        assert steps == list(range(1, len(steps) + 1))
        assert samples == CRITEO_ROWS
        assert pipeline.drain(30.0)
        assert pipeline.committed_step == steps[-1]
        later = SyncRecorder()
        assert pipeline.progress(step_no, later, wait_s=0.1).trained is None
        assert later.samples == [0]


def test_without_a_batch_only_a_joined_call_takes_part_in_the_step(tmp_path: Path) -> None:
    """``fetch=False`` (a stop) takes no batch; ``join`` decides whether the group hears of it."""
    with started_pipeline(tmp_path, 0) as pipeline:
        alone = SyncRecorder()
        done = pipeline.progress(0, alone, wait_s=1.0, fetch=False)
        assert done.trained is None and not done.exhausted and alone.samples == []
        joined = SyncRecorder()
        done = pipeline.progress(0, joined, wait_s=1.0, fetch=False, join=True)
        assert done.trained is None and joined.samples == [0]
        assert pipeline.drain(30.0) and pipeline.committed_step == 0


def _trained_rows(tmp_path: Path, *, owned: bool) -> dict[str, np.ndarray]:
    """Train the whole fixture (prefetch 2); every stored row and state afterwards, per table."""
    stores: list[EmbeddingStore] = []
    with started_pipeline(tmp_path, 2, owned=owned, stores=stores) as pipeline:
        step_no = 0
        ids: dict[str, list[np.ndarray]] = {}
        while True:
            done = pipeline.progress(step_no, SyncRecorder(), wait_s=5.0)
            if done.trained is None:
                break
            step_no = done.trained.step
            for table, update in done.trained.result.updates.items():
                ids.setdefault(table, []).append(update.ids)
        assert pipeline.drain(30.0)
        store = stores[0]
        out = {}
        for table, parts in ids.items():
            unique = np.unique(np.concatenate(parts))
            got = store.pull(table, unique, count=False)
            out[table] = np.concatenate([got.rows, got.state[:, None]], axis=1)
        return out


def test_row_owners_of_a_world_of_one_store_what_the_plain_step_stores(tmp_path: Path) -> None:
    """Exchange, owner's sum and owner's Adagrad step on a world of one: the same rows, to rounding."""
    plain = _trained_rows(tmp_path / "plain", owned=False)
    owned = _trained_rows(tmp_path / "owned", owned=True)
    assert plain.keys() == owned.keys() and plain
    for table in plain:
        np.testing.assert_allclose(owned[table], plain[table], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("written_before", [False, True])
def test_an_owner_steps_a_row_once_per_ranks_gradient_from_an_exact_copy(
    tmp_path: Path, written_before: bool
) -> None:
    """Two ranks' gradients of one row: two Adagrad steps in rank order. A row this rank trained
    starts from its own copy. One only the other rank trained starts from that rank's copy if this
    rank never wrote it (the store still holds what the sender read), else from a read of the store."""
    stores: list[EmbeddingStore] = []
    with started_pipeline(tmp_path, 0, owned=True, stores=stores) as pipeline:
        store, table = stores[0], "C1"
        dim = store.tables[table].dim
        while not store.pull(table, np.array([7], np.uint64)).admitted.all():  # as another rank's pulls do
            pass
        store.push(
            table, np.array([7], np.uint64), np.full((1, dim), 2.0, np.float32), np.ones(1, np.float32)
        )
        if written_before:
            pipeline._written.add(table, np.array([7], np.uint64))  # type: ignore[union-attr]
        own = SparseUpdate(
            np.array([5], np.uint64), np.full((1, dim), 1.0, np.float32), np.zeros(1, np.float32)
        )
        g0, g1 = np.full((1, dim), 0.5, np.float32), np.full((1, dim), -0.25, np.float32)
        theirs = np.full((2, dim), 3.0, np.float32)  # the other rank's copies of rows 5 and 7
        mine = {
            table: [
                SentRows(np.array([5], np.uint64), g0, own.rows, own.state),
                SentRows(
                    np.array([5, 7], np.uint64), np.concatenate([g1, g1]), theirs, np.full(2, 4.0, np.float32)
                ),
            ]
        }
        reads = pipeline.metrics.owned_rows_read._value.get()
        got = pipeline._owned_updates(mine, {table: own})[table]
        adagrad = pipeline.step.sparse_optimizer
        row, state = torch.ones(1, dim), torch.zeros(1)
        for g in (g0, g1):
            row, state = adagrad.step(row, state, torch.from_numpy(g))
        start_row, start_state = (2.0, 1.0) if written_before else (3.0, 4.0)
        other_row, other_state = adagrad.step(
            torch.full((1, dim), start_row), torch.full((1,), start_state), torch.from_numpy(g1)
        )
        assert got.ids.tolist() == [5, 7]
        np.testing.assert_allclose(got.rows, torch.cat([row, other_row]).numpy(), rtol=1e-6)
        np.testing.assert_allclose(got.state, torch.cat([state, other_state]).numpy(), rtol=1e-6)
        assert pipeline.metrics.owned_rows_read._value.get() - reads == (1 if written_before else 0)
        assert pipeline._written.maybe(table, np.array([5, 7], np.uint64)).all()  # type: ignore[union-attr]
        assert pipeline.drain(30.0)

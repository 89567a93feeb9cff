"""Fallback rows: ids not admitted yet read and train a shared bucket row, stored like any row."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from kelp.config import DenseFeature, FeatureSpec, SparseFeature, TableSpec, TrainerConfig
from kelp.consumers.batch import MicroBatch
from kelp.serving.embeddings import RowFetcher
from kelp.serving.metrics import ServingMetrics
from kelp.store.memory import MemoryStore
from kelp.store.policy.fallback import Fallback
from kelp.store.policy.initial_rows import init_rows
from kelp.trainer.models import build_model
from kelp.trainer.step import StepResult, TrainStep

CPU = torch.device("cpu")
INIT = {"kind": "normal", "std": 0.3, "seed": 1}


def _spec(buckets: int, min_count: int = 3, warm: bool = False) -> FeatureSpec:
    admission = {"min_count": min_count, "fallback_buckets": buckets, "fallback_warm_start": warm}
    return FeatureSpec(
        dense=[DenseFeature(name="d")],
        sparse=[SparseFeature(name="user"), SparseFeature(name="item")],
        tables=[
            TableSpec(name="user", dim=4, init=INIT, admission=admission),
            TableSpec(name="item", dim=4, init=INIT),
        ],
    )


def _config(**overrides: object) -> TrainerConfig:
    return TrainerConfig(bottom_mlp=[4, 4], top_mlp=[8], device="cpu", **overrides)  # type: ignore[arg-type]


def _batch(spec: FeatureSpec, users: list[int], items: list[int]) -> MicroBatch:
    n = len(users)
    return MicroBatch.from_columns(
        spec,
        labels=np.arange(n, dtype=np.float32) % 2,
        dense=np.linspace(-1, 1, n, dtype=np.float32)[:, None],
        sparse={"user": np.array(users, np.uint64), "item": np.array(items, np.uint64)},
    )


def _train(step: TrainStep, store: MemoryStore, batch: MicroBatch) -> tuple[dict, StepResult]:
    plan = step.pull_plan(batch)
    occurrences = {t: np.bincount(x.inverse, minlength=len(x.unique_ids)) for t, x in batch.tables.items()}
    pulled = store.pull_many(plan.ids, occurrences=occurrences)
    result = step(batch, pulled)
    store.push_many(result.updates)
    return pulled, result


def test_plan_adds_each_tables_unique_buckets_and_compose_reads_them() -> None:
    fallback = Fallback(_spec(buckets=4).tables)
    ids = np.array([7, 12, 40, 91, 300], np.uint64)
    plan = fallback.expand({"user": ids, "item": ids})
    assert set(plan.ids) == {"user", "item", "user__fallback"}  # item has no fallback
    buckets = plan.ids["user__fallback"]
    assert len(set(buckets.tolist())) == len(buckets) and buckets.max() < 4
    np.testing.assert_array_equal(buckets[plan.position["user"]], fallback.tables["user"].of(ids))
    own = np.arange(20, dtype=np.float32).reshape(5, 4)
    bucket_rows = -np.arange(4 * len(buckets), dtype=np.float32).reshape(-1, 4)
    admitted = np.array([True, False, True, False, False])
    rows = fallback.compose(
        {"user": own, "user__fallback": bucket_rows, "item": own},
        {"user": admitted, "user__fallback": np.ones(len(buckets), bool), "item": admitted},
        plan,
    )
    assert set(rows) == {"user", "item"}
    np.testing.assert_array_equal(rows["user"][admitted], own[admitted])
    np.testing.assert_array_equal(rows["user"][~admitted], bucket_rows[plan.position["user"][~admitted]])
    np.testing.assert_array_equal(rows["item"], own)  # no fallback: the default row stays


def test_ids_waiting_for_admission_train_their_bucket_and_only_used_buckets_are_pushed() -> None:
    spec = _spec(buckets=64)
    store = MemoryStore(spec.store_tables())
    step = TrainStep(build_model(spec, _config()), spec, _config(), CPU)
    batch = _batch(spec, users=[1, 2, 3], items=[5, 5, 5])
    pulled, result = _train(step, store, batch)
    assert not pulled["user"].admitted.any()  # one occurrence each: not admitted
    assert len(result.updates["user"].ids) == 0  # their own rows are never written
    used = np.unique(Fallback(spec.tables).tables["user"].of(np.array([1, 2, 3], np.uint64)))
    bucket_update = result.updates["user__fallback"]
    np.testing.assert_array_equal(np.sort(bucket_update.ids), used)  # 3 of 64 buckets touched, 3 pushed
    before = init_rows(spec.table("user").init, "user__fallback", bucket_update.ids, 4)
    assert not np.allclose(bucket_update.rows, before)  # trained
    assert (bucket_update.state > 0).all()
    stored = store.pull("user__fallback", bucket_update.ids, count=False)
    np.testing.assert_array_equal(stored.rows, bucket_update.rows)
    assert store.stats().rows["user__fallback"] == len(used)  # bucket rows count as stored rows


def test_waiting_ids_that_share_a_bucket_add_their_gradients() -> None:
    """One bucket, two waiting ids: its gradient is the sum of what their own rows would get."""
    spec = _spec(buckets=1)
    batch = _batch(spec, users=[1, 2, 1, 2], items=[5, 6, 7, 8])

    waiting = TrainStep(build_model(spec, _config()), spec, _config(), CPU)
    waiting.sparse_optimizer = dataclasses.replace(waiting.sparse_optimizer, keep_grads=True)
    store = MemoryStore(spec.store_tables())
    bucket_row = store.pull("user__fallback", np.array([0], np.uint64)).rows[0]
    _, result = _train(waiting, store, batch)
    bucket_grad = result.grads["user__fallback"][0]

    admitted_spec = _spec(buckets=1, min_count=1)
    own = TrainStep(build_model(admitted_spec, _config()), admitted_spec, _config(), CPU)
    own.sparse_optimizer = dataclasses.replace(own.sparse_optimizer, keep_grads=True)
    both = MemoryStore(admitted_spec.store_tables())
    both.push(
        "user", np.array([1, 2], np.uint64), np.stack([bucket_row, bucket_row]), np.zeros(2, np.float32)
    )
    _, admitted = _train(own, both, batch)
    np.testing.assert_allclose(bucket_grad, admitted.grads["user"].sum(axis=0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(result.logits, admitted.logits, rtol=1e-6)


def test_warm_start_begins_an_admitted_id_at_its_buckets_row() -> None:
    tiny_lr = _config(sparse_optimizer={"lr": 1e-9})
    for warm in (False, True):
        spec = _spec(buckets=8, min_count=2, warm=warm)
        store = MemoryStore(spec.store_tables())
        step = TrainStep(build_model(spec, tiny_lr), spec, tiny_lr, CPU)
        _train(step, store, _batch(spec, users=[9], items=[1]))  # first occurrence: waits, trains its bucket
        pulled, result = _train(step, store, _batch(spec, users=[9], items=[2]))  # second: admitted now
        assert pulled["user"].admitted_now is not None and pulled["user"].admitted_now.tolist() == [True]
        bucket = pulled["user__fallback"].rows[0]
        pushed = result.updates["user"].rows[0]
        init = init_rows(spec.table("user").init, "user", np.array([9], np.uint64), 4)[0]
        np.testing.assert_allclose(pushed, bucket if warm else init, atol=1e-6)


def test_serving_reads_the_bucket_row_for_an_id_without_its_own() -> None:
    spec = _spec(buckets=4)
    store = MemoryStore(spec.store_tables())
    fallback = Fallback(spec.tables)
    waiting, stored = np.uint64(11), np.uint64(12)
    bucket = fallback.tables["user"].of(np.array([waiting]))
    store.push("user__fallback", bucket, np.full((1, 4), 7.0, np.float32), np.ones(1, np.float32))
    for _ in range(3):
        store.pull("user", np.array([stored]))  # admitted at the third sighting
    store.push("user", np.array([stored]), np.full((1, 4), 2.0, np.float32), np.ones(1, np.float32))
    fetcher = RowFetcher(store, ServingMetrics(CollectorRegistry()))
    got = fetcher.fetch({"user": np.array([waiting, stored]), "item": np.array([1], np.uint64)})
    assert set(got.rows) == {"user", "item"}
    np.testing.assert_array_equal(got.rows["user"][:, 0], [7.0, 2.0])
    assert got.stored == 1 and got.default == 2  # the waiting user and the unknown item have no own row

"""Sequence features (``pooling: none``): the model gets every id's row and the offsets, and trains them.

A DIN-style plug-in (``seq_models/din.py``) reads a history sequence next to a
pooled candidate from the same table; its gradients must reach the table's
leaf rows as the pooled features' do, and the built-in models must refuse a
sequence they would otherwise pool or drop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kelp.bench.baseline import spec_init
from kelp.config import DenseFeature, FeatureSpec, SparseFeature, TableSpec
from kelp.consumers.batch import JaggedIds, MicroBatch
from kelp.errors import UserError
from kelp.store.memory import MemoryStore
from kelp.trainer import ModelInput, ModelSpec, SequenceInput, build_model
from kelp.trainer.embedding import BatchTensors, gather_sequences, model_input, pool_features, rows_to_leaf
from kelp.trainer.model_check import check_model
from kelp.trainer.step import TrainStep

from .conftest import DictStore, random_batch, small_config, small_spec

CPU = torch.device("cpu")
MODELS = Path(__file__).parent / "seq_models"
DIM = 4
MAX_LEN = 5


@pytest.fixture(autouse=True)
def models_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(MODELS))


def din_spec() -> FeatureSpec:
    """A user (pooled), a candidate item (pooled) and the user's history over the same item table."""
    return FeatureSpec(
        dense=[DenseFeature(name="d0")],
        sparse=[
            SparseFeature(name="user", table="users"),
            SparseFeature(name="item", table="items"),
            SparseFeature(name="history", table="items", max_ids=MAX_LEN, pooling="none"),
        ],
        tables=[TableSpec(name="users", dim=DIM), TableSpec(name="items", dim=DIM)],
    )


def din_config(**args):  # type: ignore[no-untyped-def]
    return small_config(model="din:din", model_args={"history": "history", "candidate": "item", **args})


def din_batch(spec: FeatureSpec, b: int, rng: np.random.Generator) -> MicroBatch:
    """Histories of 0..MAX_LEN ids (some empty); the label says whether the item's parity is the history's."""
    lengths = rng.integers(0, MAX_LEN + 1, size=b)
    lengths[0] = 0  # at least one empty history in every batch
    history = rng.integers(100, 140, size=int(lengths.sum())).astype(np.uint64)
    items = rng.integers(0, 20, size=b).astype(np.uint64)
    owner = np.repeat(np.arange(b), lengths)
    even = np.bincount(owner, weights=(history % 2 == 0).astype(float), minlength=b)
    labels = ((items % 2 == 0) == (even * 2 >= lengths)).astype(np.float32)
    sparse = {
        "user": JaggedIds.one_hot(rng.integers(0, 10, size=b).astype(np.uint64)),
        "item": JaggedIds.one_hot(items),
        "history": JaggedIds.from_lengths(history, lengths),
    }
    dense = rng.normal(size=(b, 1)).astype(np.float32)
    return MicroBatch.from_columns(spec, labels=labels, dense=dense, sparse=sparse)


def sequence(lengths: list[int], dim: int = 3) -> SequenceInput:
    """Rows numbered 1..N (row k is all k), so a padded row says which row it is."""
    n = sum(lengths)
    values = torch.arange(1, n + 1, dtype=torch.float32).unsqueeze(1).repeat(1, dim)
    offsets = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int64)
    return SequenceInput(values.requires_grad_(True), offsets)


# ---------------------------------------------------------------- config and spec


def test_pooling_none_splits_the_model_spec_and_keeps_sum_the_default() -> None:
    assert SparseFeature(name="x").pooling == "sum"
    spec = ModelSpec.from_features(din_spec())
    assert dict(spec.sparse) == {"user": DIM, "item": DIM}
    assert dict(spec.sequences) == {"history": DIM}
    assert dict(ModelSpec.from_features(small_spec()).sequences) == {}
    assert dict(ModelSpec(dense=(), sparse={}).sequences) == {}
    with pytest.raises(ValueError, match="pooling"):
        SparseFeature(name="x", pooling="max")  # type: ignore[arg-type]


# ---------------------------------------------------------------- SequenceInput helpers


def test_lengths_segment_ids_and_padding() -> None:
    seq = sequence([2, 0, 3])
    assert seq.size == 3 and seq.dim == 3
    assert seq.lengths().tolist() == [2, 0, 3]
    assert seq.segment_ids().tolist() == [0, 0, 2, 2, 2]
    rows, mask = seq.padded()
    assert rows.shape == (3, 3, 3) and mask.dtype == torch.bool
    assert mask.tolist() == [[True, True, False], [False, False, False], [True, True, True]]
    assert rows[:, :, 0].tolist() == [[1, 2, 0], [0, 0, 0], [3, 4, 5]]


def test_padding_to_max_len_truncates_first_or_last_and_pads_beyond() -> None:
    seq = sequence([4, 1])
    first, mask = seq.padded(2)
    assert first[:, :, 0].tolist() == [[1, 2], [5, 0]] and mask.tolist() == [[True, True], [True, False]]
    last, _ = seq.padded(2, keep="last")
    assert last[:, :, 0].tolist() == [[3, 4], [5, 0]]
    wide, wide_mask = seq.padded(6)
    assert wide.shape == (2, 6, 3) and wide_mask.sum().item() == 5
    none, none_mask = seq.padded(0)
    assert none.shape == (2, 0, 3) and none_mask.shape == (2, 0)
    with pytest.raises(ValueError, match="keep"):
        seq.padded(2, keep="middle")


def test_all_empty_sequences_pad_to_nothing() -> None:
    seq = SequenceInput(torch.zeros(0, 3), torch.zeros(3, dtype=torch.int64))
    assert seq.lengths().tolist() == [0, 0]
    rows, mask = seq.padded()
    assert rows.shape == (2, 0, 3) and mask.shape == (2, 0)
    fixed, fixed_mask = seq.padded(4)
    assert torch.equal(fixed, torch.zeros(2, 4, 3)) and not fixed_mask.any()
    assert seq.segment_ids().tolist() == []


def test_padding_passes_gradients_to_the_rows_it_keeps_only() -> None:
    seq = sequence([3, 1])
    rows, _ = seq.padded(2)  # sample 0 keeps rows 1 and 2, drops row 3
    weights = torch.arange(1.0, 1.0 + rows.numel()).reshape(rows.shape)
    (rows * weights).sum().backward()
    grad = seq.values.grad
    assert grad is not None
    assert torch.equal(grad[0], weights[0, 0]) and torch.equal(grad[1], weights[0, 1])
    assert torch.equal(grad[2], torch.zeros(3))  # truncated
    assert torch.equal(grad[3], weights[1, 0])


# ---------------------------------------------------------------- training path


def test_batch_tensors_gather_each_ids_row_with_the_batchs_offsets(rng: np.random.Generator) -> None:
    spec = din_spec()
    batch = din_batch(spec, 16, rng)
    bt = BatchTensors.from_batch(batch, spec, CPU)
    assert [b.name for b in bt.bags] == ["user", "item"] and [b.name for b in bt.sequences] == ["history"]
    unique = {t: ids.unique_ids for t, ids in batch.tables.items()}
    arrays = {t: rng.normal(size=(ids.size, DIM)).astype(np.float32) for t, ids in unique.items()}
    got = gather_sequences(bt, {t: torch.from_numpy(a) for t, a in arrays.items()})["history"]
    history = batch.sparse["history"]
    assert torch.equal(got.offsets, torch.from_numpy(history.offsets.astype(np.int64)))
    want = arrays["items"][np.searchsorted(unique["items"], history.values)]
    assert torch.equal(got.values, torch.from_numpy(want))


def test_a_spec_without_sequences_has_no_sequence_bags(rng: np.random.Generator) -> None:
    spec = small_spec()
    bt = BatchTensors.from_batch(random_batch(spec, 8, rng), spec, CPU)
    assert bt.sequences == () and [b.name for b in bt.bags] == ["f0", "f1", "f2"]
    assert gather_sequences(bt, {}) == {}
    assert dict(model_input(bt, [torch.zeros(8, 4)] * 3).sequences) == {}


def test_row_gradients_sum_the_sequence_and_the_pooled_features(rng: np.random.Generator) -> None:
    """The history's gradient per id plus the candidate's lands in the one ``items`` leaf."""
    spec = din_spec()
    batch = din_batch(spec, 12, rng)
    bt = BatchTensors.from_batch(batch, spec, CPU)
    unique = {t: ids.unique_ids for t, ids in batch.tables.items()}
    leaves = {
        t: rows_to_leaf(rng.normal(size=(ids.size, DIM)).astype(np.float32), CPU) for t, ids in unique.items()
    }
    history, items = batch.sparse["history"], batch.sparse["item"]
    w_hist = torch.from_numpy(rng.normal(size=(history.values.size, DIM)).astype(np.float32))
    w_item = torch.from_numpy(rng.normal(size=(batch.size, DIM)).astype(np.float32))
    inputs = model_input(bt, pool_features(bt, leaves), gather_sequences(bt, leaves))
    ((inputs.sequences["history"].values * w_hist).sum() + (inputs.sparse["item"] * w_item).sum()).backward()
    want = np.zeros((unique["items"].size, DIM), dtype=np.float32)
    np.add.at(want, np.searchsorted(unique["items"], history.values), w_hist.numpy())
    np.add.at(want, np.searchsorted(unique["items"], items.values), w_item.numpy())
    grad = leaves["items"].grad
    assert grad is not None
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6, atol=1e-6)


def test_a_din_model_trains_its_params_and_the_history_rows(rng: np.random.Generator) -> None:
    spec = din_spec()
    config = din_config(max_len=MAX_LEN)
    model = build_model(spec, config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    init = spec_init(spec)
    store = DictStore(init)
    step = TrainStep(model, spec, config, CPU)
    for _ in range(6):
        batch = din_batch(spec, 32, rng)
        result = step(batch, store.pull_many(batch))
        assert result.skipped is None and np.isfinite(result.loss)
        for table, update in result.updates.items():
            store.push(table, *update)
    assert all(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    history_ids = np.array(sorted(k for k in store.rows["items"] if k >= 100), dtype=np.uint64)
    assert history_ids.size  # ids 100.. only ever appear in histories
    stored = np.stack([store.rows["items"][int(k)][0] for k in history_ids])
    moved = np.abs(stored - init("items", history_ids)).max(axis=1) > 0
    assert moved.all()


def test_history_ids_not_admitted_yet_train_their_fallback_buckets(rng: np.random.Generator) -> None:
    """Admission and fallback buckets see a sequence's ids like any other: a waiting id trains its bucket."""
    admission = {"min_count": 1000, "fallback_buckets": 4}
    spec = din_spec()
    spec = FeatureSpec(
        dense=spec.dense,
        sparse=spec.sparse,
        tables=[TableSpec(name="users", dim=DIM), TableSpec(name="items", dim=DIM, admission=admission)],
    )
    config = din_config()
    step = TrainStep(build_model(spec, config), spec, config, CPU)
    store = MemoryStore(spec.store_tables())
    batch = din_batch(spec, 32, rng)
    pulled = store.pull_many(step.pull_plan(batch).ids)
    assert not pulled["items"].admitted.any()
    result = step(batch, pulled)
    assert result.skipped is None
    assert result.updates["items"].ids.size == 0  # nothing admitted, nothing of its own pushed
    buckets = result.updates["items__fallback"]
    assert buckets.ids.size > 0
    pulled_at = {int(k): i for i, k in enumerate(step.pull_plan(batch).ids["items__fallback"])}
    before = pulled["items__fallback"].rows[[pulled_at[int(k)] for k in buckets.ids]]
    assert (np.abs(buckets.rows - before).max(axis=1) > 0).all()


def test_model_input_has_no_sequences_by_default() -> None:
    """A model input built as before sequence features existed has an empty ``sequences``."""
    batch = ModelInput(torch.zeros(2, 1), {"x": torch.zeros(2, 4)})
    assert dict(batch.sequences) == {}


# ---------------------------------------------------------------- validate and built-ins


def test_validate_runs_a_sequence_model_on_a_two_and_an_empty_sequence() -> None:
    import din  # type: ignore[import-not-found]

    din.SEEN_LENGTHS.clear()
    check = check_model(din_spec(), small_config(model="din:LengthsProbe"))
    assert check.reference == "din:LengthsProbe"
    assert din.SEEN_LENGTHS == [[2, 0]]
    assert check_model(din_spec(), din_config()).parameters > 0


@pytest.mark.parametrize("builtin", ["dlrm-small", "dcn-v2", "deepfm"])
def test_a_builtin_refuses_a_sequence_feature_in_one_line(builtin: str) -> None:
    with pytest.raises(UserError) as info:
        check_model(din_spec(), small_config(model=builtin, bottom_mlp=[8, DIM]))
    message = str(info.value)
    assert "'history'" in message and "needs a model plug-in that reads batch.sequences" in message
    assert builtin in message and "\n" not in message
    assert check_model(small_spec(dims=(4, 4, 4)), small_config(model=builtin, bottom_mlp=[8, 4]))

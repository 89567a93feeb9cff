from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from kelp.bench.baseline import InMemoryBaseline, spec_init
from kelp.bench.synth import CriteoSynth
from kelp.config import InitSpec
from kelp.consumers.criteo import criteo_feature_spec
from kelp.trainer.evaluation import ProgressiveValidator
from kelp.trainer.models import build_model
from kelp.trainer.step import STAGES, TrainStep

from .conftest import DictStore, random_batch, small_config, small_spec

CPU = torch.device("cpu")


def test_learns_criteo_synth() -> None:
    """dlrm-small on a small-vocabulary criteo-synth stream: loss falls, progressive AUC > 0.6."""
    torch.manual_seed(0)
    spec = criteo_feature_spec()
    config = small_config(bottom_mlp=[64, 16], top_mlp=[256, 64])
    store = DictStore(spec_init(spec))
    validator = ProgressiveValidator(window_batches=10)
    step = TrainStep(build_model(spec, config), spec, config, CPU, validator=validator)
    synth = CriteoSynth(seed=1, n_ids=300)
    losses = []
    for _ in range(40):
        batch = synth.microbatch(512, spec)
        result = step(batch, store.pull_many(batch))
        for table, update in result.updates.items():
            store.push(table, *update)
        losses.append(result.loss)
    assert np.mean(losses[-10:]) < np.mean(losses[:3]) - 0.02
    assert validator.windowed().auc > 0.6
    assert set(result.timings) == set(STAGES)
    assert all(v >= 0 for v in result.timings.values())


def test_matches_in_memory_baseline() -> None:
    """The no-lost-updates oracle: TrainStep through a dict store == the in-memory baseline."""
    spec = small_spec()
    config = small_config(model="dcn-v2")
    torch.manual_seed(3)
    model = build_model(spec, config)
    init = spec_init(spec, InitSpec(std=0.1))
    store = DictStore(init)
    step = TrainStep(copy.deepcopy(model), spec, config, CPU)
    baseline = InMemoryBaseline(copy.deepcopy(model), spec, config, CPU, init_fn=init, initial_capacity=4)
    rng = np.random.default_rng(7)
    for _ in range(15):
        batch = random_batch(spec, 64, rng)
        got = step(batch, store.pull_many(batch))
        for table, update in got.updates.items():
            store.push(table, *update)
        want = baseline.step(batch)
        np.testing.assert_allclose(got.logits, want.logits, rtol=1e-5, atol=1e-6)
        assert got.loss == pytest.approx(want.loss, rel=1e-5)
    for table, rows in store.rows.items():
        ids = np.array(sorted(rows), dtype=np.uint64)
        want_rows, want_state = baseline.lookup(table, ids)
        np.testing.assert_allclose(
            np.stack([rows[k][0] for k in ids.tolist()]), want_rows, rtol=1e-5, atol=1e-7
        )
        np.testing.assert_allclose([rows[k][1] for k in ids.tolist()], want_state, rtol=1e-5)
    for p, q in zip(step.model.parameters(), baseline.model.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def test_not_admitted_ids_are_never_pushed(rng: np.random.Generator) -> None:
    spec = small_spec()
    config = small_config()
    store = DictStore(spec_init(spec), admit=lambda table, key: key % 3 != 0)
    step = TrainStep(build_model(spec, config), spec, config, CPU)
    for _ in range(3):
        batch = random_batch(spec, 32, rng)
        pulled = store.pull_many(batch)
        result = step(batch, pulled)
        for table, update in result.updates.items():
            assert not (update.ids % 3 == 0).any()
            assert update.ids.tolist() == batch.tables[table].unique_ids[pulled[table].admitted].tolist()
            store.push(table, *update)  # DictStore asserts admission too


def test_pulled_rows_must_match_unique_ids(rng: np.random.Generator) -> None:
    spec = small_spec()
    config = small_config()
    step = TrainStep(build_model(spec, config), spec, config, CPU)
    batch = random_batch(spec, 8, rng)
    pulled = DictStore(spec_init(spec)).pull_many(batch)
    table = next(iter(pulled))
    bad = dict(pulled)
    bad[table] = type(pulled[table])(
        pulled[table].rows[:-1], pulled[table].state[:-1], pulled[table].admitted[:-1]
    )
    with pytest.raises(ValueError, match="do not match"):
        step(batch, bad)
    del bad[table]
    with pytest.raises(KeyError):
        step(batch, bad)


def test_eval_uses_pre_update_predictions(rng: np.random.Generator) -> None:
    spec = small_spec()
    config = small_config()
    torch.manual_seed(0)
    model = build_model(spec, config)
    store = DictStore(spec_init(spec))
    batch = random_batch(spec, 16, rng)
    pulled = store.pull_many(batch)
    frozen = copy.deepcopy(model)
    result = TrainStep(model, spec, config, CPU)(batch, pulled)
    from kelp.trainer.embedding import BatchTensors, model_input, pool_features, rows_to_leaf

    bt = BatchTensors.from_batch(batch, spec, CPU)
    with torch.no_grad():
        before = frozen(
            model_input(bt, pool_features(bt, {t: rows_to_leaf(p.rows, CPU) for t, p in pulled.items()}))
        )
    np.testing.assert_allclose(result.logits, before.numpy(), rtol=1e-6)

from __future__ import annotations

import numpy as np
import pytest
import torch

from kelp.config import DenseOptimizerSpec
from kelp.trainer.optim import RowWiseAdagrad, build_dense_optimizer


def _reference(rows, state, grad, lr, eps):  # type: ignore[no-untyped-def]
    rows, state, grad = (np.asarray(x, dtype=np.float64) for x in (rows, state, grad))
    new_state = state + (grad**2).mean(axis=1)
    return rows - lr * grad / (np.sqrt(new_state) + eps)[:, None], new_state


def test_hand_computed_row() -> None:
    opt = RowWiseAdagrad(lr=0.1, eps=0.0)
    rows = torch.tensor([[1.0, 2.0]])
    grad = torch.tensor([[3.0, 4.0]])
    new_rows, new_state = opt.step(rows, torch.tensor([0.5]), grad)
    # s = 0.5 + (9 + 16) / 2 = 13; row -= 0.1 * g / sqrt(13)
    assert new_state.item() == pytest.approx(13.0)
    np.testing.assert_allclose(new_rows.numpy(), [[1 - 0.3 / 13**0.5, 2 - 0.4 / 13**0.5]], rtol=1e-6)


def test_matches_numpy_reference_and_keeps_inputs(rng: np.random.Generator) -> None:
    rows = rng.normal(size=(7, 5)).astype(np.float32)
    state = rng.random(7).astype(np.float32)
    grad = rng.normal(size=(7, 5)).astype(np.float32)
    grad[3] = 0.0
    opt = RowWiseAdagrad(lr=0.05, eps=1e-8)
    rows_t, state_t = torch.from_numpy(rows.copy()), torch.from_numpy(state.copy())
    new_rows, new_state = opt.step(rows_t, state_t, torch.from_numpy(grad))
    want_rows, want_state = _reference(rows, state, grad, 0.05, 1e-8)
    np.testing.assert_allclose(new_rows.numpy(), want_rows, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(new_state.numpy(), want_state, rtol=1e-6)
    np.testing.assert_array_equal(new_rows[3].numpy(), rows[3])  # zero gradient: unchanged
    np.testing.assert_array_equal(rows_t.numpy(), rows)  # inputs untouched


def test_update_returns_only_admitted(rng: np.random.Generator) -> None:
    ids = np.array([10, 11, 12, 13], dtype=np.uint64)
    rows = rng.normal(size=(4, 3)).astype(np.float32)
    state = np.zeros(4, dtype=np.float32)
    grad = rng.normal(size=(4, 3)).astype(np.float32)
    admitted = np.array([True, False, True, False])
    update = RowWiseAdagrad(lr=0.1).update(
        ids, torch.from_numpy(rows), torch.from_numpy(state), torch.from_numpy(grad), admitted
    )
    assert update.ids.tolist() == [10, 12]
    want_rows, want_state = _reference(rows[admitted], state[admitted], grad[admitted], 0.1, 1e-8)
    np.testing.assert_allclose(update.rows, want_rows, rtol=1e-5)
    np.testing.assert_allclose(update.state, want_state, rtol=1e-6)
    assert update.rows.dtype == np.float32 and update.state.dtype == np.float32


def test_update_without_gradient_returns_rows_unchanged() -> None:
    ids = np.array([1, 2], dtype=np.uint64)
    rows = torch.ones(2, 3)
    update = RowWiseAdagrad().update(ids, rows, torch.zeros(2), None, np.array([True, False]))
    assert update.ids.tolist() == [1]
    np.testing.assert_array_equal(update.rows, np.ones((1, 3)))


@pytest.mark.parametrize(
    ("kind", "cls"), [("adam", torch.optim.Adam), ("adagrad", torch.optim.Adagrad), ("sgd", torch.optim.SGD)]
)
def test_dense_optimizer_factory(kind: str, cls: type) -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    opt = build_dense_optimizer([param], DenseOptimizerSpec(kind=kind, lr=0.01, weight_decay=0.1))
    assert isinstance(opt, cls)
    assert opt.param_groups[0]["lr"] == 0.01 and opt.param_groups[0]["weight_decay"] == 0.1

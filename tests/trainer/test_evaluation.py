from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kelp.trainer.evaluation import BinnedAuc, ProgressiveValidator, exact_auc, log_loss_from_logits


def _pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (pos.size * neg.size)


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 1), min_size=2, max_size=60),
    data=st.data(),
)
def test_exact_auc_matches_pairwise_with_ties(labels: list[int], data: st.DataObject) -> None:
    y = np.array(labels)
    scores = np.array(data.draw(st.lists(st.integers(0, 5), min_size=y.size, max_size=y.size)), dtype=float)
    if y.min() == y.max():
        assert math.isnan(exact_auc(y, scores))
    else:
        assert exact_auc(y, scores) == pytest.approx(_pairwise_auc(y, scores))


@pytest.mark.parametrize("seed", range(5))
def test_binned_auc_within_its_bound_of_exact(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 20_000
    labels = (rng.random(n) < 0.25).astype(np.float32)
    logits = rng.normal(size=n) + labels * rng.uniform(0.2, 2.0) - 1.0
    validator = ProgressiveValidator(window_batches=10)
    for lo in range(0, n, 4096):
        validator.update(labels[lo : lo + 4096], logits[lo : lo + 4096])
    result = validator.cumulative()
    exact = exact_auc(labels, logits)
    assert abs(result.auc - exact) <= result.auc_error_bound + 1e-12
    assert result.auc_error_bound < 1e-3
    assert result.samples == n and result.positives == int(labels.sum())


def test_bound_is_tight_when_all_scores_share_a_bin() -> None:
    auc = BinnedAuc(n_bins=4)
    labels = np.array([0, 1, 0, 1], dtype=np.float32)
    auc.add(auc.bins(np.array([0.1, 0.11, 0.12, 0.13])), labels, 0.0)
    result = auc.result()
    assert result.auc == 0.5 and result.auc_error_bound == 0.5


def test_one_class_window_is_nan_not_a_crash() -> None:
    validator = ProgressiveValidator(window_batches=1)
    validator.update(np.array([0, 1], dtype=np.float32), np.array([-1.0, 1.0]))
    validator.update(np.zeros(3, dtype=np.float32), np.zeros(3))
    assert math.isnan(validator.windowed().auc)
    assert validator.windowed().log_loss == pytest.approx(math.log(2))
    assert validator.cumulative().auc == pytest.approx(1.0)
    empty = ProgressiveValidator().cumulative()
    assert math.isnan(empty.auc) and math.isnan(empty.log_loss) and empty.samples == 0


def test_log_loss_is_stable_and_correct() -> None:
    labels = np.array([1, 0, 1, 0], dtype=np.float32)
    logits = np.array([2.0, -1.0, -800.0, 800.0])
    p = 1 / (1 + np.exp(-logits[:2]))
    want = [-math.log(p[0]), -math.log(1 - p[1]), 800.0, 800.0]
    np.testing.assert_allclose(log_loss_from_logits(labels, logits), want, rtol=1e-12)


def test_window_keeps_only_the_last_batches(rng: np.random.Generator) -> None:
    batches = [((rng.random(100) < 0.3).astype(np.float32), rng.normal(size=100) * (i + 1)) for i in range(7)]
    rolling = ProgressiveValidator(window_batches=3)
    for labels, logits in batches:
        rolling.update(labels, logits)
    fresh = ProgressiveValidator(window_batches=3)
    for labels, logits in batches[-3:]:
        fresh.update(labels, logits)
    assert rolling.windowed() == fresh.cumulative()
    assert rolling.cumulative().samples == 700

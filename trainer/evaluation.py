"""Progressive validation: score each batch *before* training on it.

In online learning every batch is first a test set, then a training set, so
the running metrics measure generalisation with no held-out split. The
trainer feeds the logits of its forward pass (which precedes the update) to
:class:`ProgressiveValidator`, which keeps two views:

* cumulative: every sample since start;
* windowed: the last ``window_batches`` batches (``trainer.eval_window_batches``).

Memory is bounded: AUC uses score histograms, not stored scores.

Binned AUC and its error bound
------------------------------
Probabilities ``p = sigmoid(logit)`` fall into ``n_bins`` equal-width bins on
[0, 1]. With ``pos_i``/``neg_i`` the label counts of bin *i*, ``P``/``N`` the
totals::

    AUC_binned = sum_i pos_i * (neg_0 + .. + neg_{i-1} + neg_i / 2) / (P * N)

Pairs in different bins are ordered exactly as by the raw scores; only pairs
within one bin are counted as ties (1/2). So::

    |AUC_binned - AUC_exact| <= bound = sum_i pos_i * neg_i / (2 * P * N)

which :class:`AucResult` reports with every value (typically < 1e-4 with the
default 16384 bins). When a view holds a single class, AUC is undefined and
reported as NaN.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kelp.consumers.batch import MicroBatch

__all__ = [
    "AucResult",
    "BinnedAuc",
    "ProgressiveValidator",
    "TaskValidators",
    "exact_auc",
    "log_loss_from_logits",
]

DEFAULT_BINS = 16_384


def exact_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC by the rank-sum (Mann-Whitney U) formula; tied scores get average ranks.

    NaN when ``labels`` holds a single class. O(n log n); for tests and offline checks.

    >>> exact_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
    0.75
    """
    labels = np.asarray(labels).astype(bool)
    scores = np.asarray(scores, dtype=np.float64)
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Average 1-based rank of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], sorted_scores.size]
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(scores.size, dtype=np.float64)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    u = ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def log_loss_from_logits(labels: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """Per-sample binary cross-entropy f64[n], computed stably from logits (no clipping needed)."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    return np.maximum(z, 0.0) - z * y + np.log1p(np.exp(-np.abs(z)))


@dataclass(frozen=True)
class AucResult:
    """One view's metrics. ``auc`` and ``log_loss`` are NaN when undefined (no samples, one class)."""

    auc: float
    auc_error_bound: float
    log_loss: float
    samples: int
    positives: int


class BinnedAuc:
    """Label histograms over ``n_bins`` probability bins; add and subtract batches in O(batch + bins)."""

    def __init__(self, n_bins: int = DEFAULT_BINS) -> None:
        if n_bins < 2:
            raise ValueError(f"n_bins must be >= 2, got {n_bins}")
        self.n_bins = n_bins
        self.pos = np.zeros(n_bins, dtype=np.int64)
        self.neg = np.zeros(n_bins, dtype=np.int64)
        self.loss_sum = 0.0

    def bins(self, probs: np.ndarray) -> np.ndarray:
        """int64[n] bin of each probability in [0, 1]."""
        return np.clip(
            (np.asarray(probs, dtype=np.float64) * self.n_bins).astype(np.int64), 0, self.n_bins - 1
        )

    def add(self, bins: np.ndarray, labels: np.ndarray, loss_sum: float, sign: int = 1) -> None:
        """Add (``sign=1``) or remove (``sign=-1``) samples already binned by :meth:`bins`."""
        positive = labels > 0.5
        self.pos += sign * np.bincount(bins[positive], minlength=self.n_bins)
        self.neg += sign * np.bincount(bins[~positive], minlength=self.n_bins)
        self.loss_sum += sign * loss_sum

    def result(self) -> AucResult:
        n_pos, n_neg = int(self.pos.sum()), int(self.neg.sum())
        samples = n_pos + n_neg
        log_loss = self.loss_sum / samples if samples else float("nan")
        if n_pos == 0 or n_neg == 0:
            return AucResult(float("nan"), float("nan"), log_loss, samples, n_pos)
        pos = self.pos.astype(np.float64)
        neg = self.neg.astype(np.float64)
        neg_below = np.cumsum(neg) - neg
        pairs = float(n_pos) * float(n_neg)
        auc = float((pos * (neg_below + 0.5 * neg)).sum() / pairs)
        bound = float((pos * neg).sum() / (2.0 * pairs))
        return AucResult(auc, bound, log_loss, samples, n_pos)


class ProgressiveValidator:
    """Cumulative and windowed AUC / log loss over batches scored before training.

    Memory: two histograms of ``n_bins`` plus, for the window, each of the last
    ``window_batches`` batches' bin indices and labels (to subtract them when
    they leave the window).
    """

    def __init__(self, window_batches: int = 50, n_bins: int = DEFAULT_BINS) -> None:
        if window_batches < 1:
            raise ValueError(f"window_batches must be >= 1, got {window_batches}")
        self.window_batches = window_batches
        self._cumulative = BinnedAuc(n_bins)
        self._window = BinnedAuc(n_bins)
        self._recent: deque[tuple[np.ndarray, np.ndarray, float]] = deque()
        self.batches = 0

    def update(self, labels: np.ndarray, logits: np.ndarray) -> None:
        """Record one batch: ``labels`` f32[B] in {0, 1}, ``logits`` f32[B] from the pre-update forward."""
        labels = np.asarray(labels, dtype=np.float32)
        logits = np.asarray(logits, dtype=np.float64)
        probs = 1.0 / (1.0 + np.exp(-logits))
        bins = self._cumulative.bins(probs)
        loss_sum = float(log_loss_from_logits(labels, logits).sum())
        self._cumulative.add(bins, labels, loss_sum)
        self._window.add(bins, labels, loss_sum)
        self._recent.append((bins, labels, loss_sum))
        if len(self._recent) > self.window_batches:
            old_bins, old_labels, old_loss = self._recent.popleft()
            self._window.add(old_bins, old_labels, old_loss, sign=-1)
        self.batches += 1

    def cumulative(self) -> AucResult:
        """Metrics over every sample seen so far."""
        return self._cumulative.result()

    def windowed(self) -> AucResult:
        """Metrics over the last ``window_batches`` batches."""
        result = self._window.result()
        # Re-sum the window's loss from the kept batches: add/subtract cycles would drift in float.
        loss = math.fsum(item[2] for item in self._recent)
        log_loss = loss / result.samples if result.samples else float("nan")
        return AucResult(result.auc, result.auc_error_bound, log_loss, result.samples, result.positives)


class TaskValidators:
    """One :class:`ProgressiveValidator` per task (label), the first being the trainer's own.

    The first task's validator is the one the trainer always had (its metrics
    keep their names); the others score the batch's ``extra_labels`` with the
    same window and bins. Metrics are unweighted: a sample's weight shapes the
    loss it trains with, not how it is scored.
    """

    def __init__(self, validators: Mapping[str, ProgressiveValidator]) -> None:
        self.validators = dict(validators)
        self.names: tuple[str, ...] = tuple(self.validators)

    @classmethod
    def beside(cls, first: ProgressiveValidator, tasks: Sequence[str]) -> TaskValidators:
        """``first`` for ``tasks[0]``, a fresh validator like it for each other task."""
        n_bins = first._cumulative.n_bins
        others = {t: ProgressiveValidator(first.window_batches, n_bins) for t in tasks[1:]}
        return cls({tasks[0]: first, **others})

    def update(self, batch: MicroBatch, logits: Mapping[str, np.ndarray]) -> None:
        """Score every task but the first (its validator is fed by the trainer as before)."""
        for name in self.names[1:]:
            self.validators[name].update(batch.extra_labels[name], logits[name])

    def results(self) -> dict[str, tuple[AucResult, AucResult]]:
        """task -> ``(cumulative, windowed)`` metrics, in task order."""
        return {name: (v.cumulative(), v.windowed()) for name, v in self.validators.items()}

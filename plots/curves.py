"""Learning curves: progressive AUC and log loss, windowed and cumulative, against samples seen."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kelp.trainer.evaluation import exact_auc, log_loss_from_logits

__all__ = ["Curve", "curve_from_logits"]


@dataclass
class Curve:
    """One run's curve; every list has one value per point, NaN where undefined (one class)."""

    label: str
    samples: list[int] = field(default_factory=list)
    auc_window: list[float] = field(default_factory=list)
    auc_cumulative: list[float] = field(default_factory=list)
    log_loss_window: list[float] = field(default_factory=list)
    log_loss_cumulative: list[float] = field(default_factory=list)

    def add(
        self, samples: int, auc_window: float, auc_cumulative: float, ll_window: float, ll_cum: float
    ) -> None:
        self.samples.append(samples)
        self.auc_window.append(auc_window)
        self.auc_cumulative.append(auc_cumulative)
        self.log_loss_window.append(ll_window)
        self.log_loss_cumulative.append(ll_cum)


def curve_from_logits(
    label: str, labels: np.ndarray, logits: np.ndarray, window: int, points: int = 100
) -> Curve:
    """Exact AUC and log loss at ``points`` evenly spaced positions: over the last ``window`` samples
    and over everything so far (the same views as the trainer's progressive validator, unbinned)."""
    labels = np.asarray(labels, dtype=np.float64)
    loss = log_loss_from_logits(labels, logits)
    cumulative_loss = np.cumsum(loss)
    curve = Curve(label)
    n = len(labels)
    for end in np.unique(np.linspace(0, n, points + 1, dtype=np.int64)[1:]):
        start = max(0, end - window)
        curve.add(
            int(end),
            exact_auc(labels[start:end], logits[start:end]),
            exact_auc(labels[:end], logits[:end]),
            float(loss[start:end].mean()),
            float(cumulative_loss[end - 1] / end),
        )
    return curve

"""Scoring one batch: fetch rows (one store call), pool them as the trainer does, forward, sigmoid.

Dedup and pooling use :class:`~kelp.serving.pooling.PoolPlan` (one sort and
one gather per request instead of one per table and feature); the pooled
inputs, and the rows of sequence features (``pooling: none``), are the trainer's.

Everything here is synchronous and CPU-bound or blocking on Redis, so the app
runs it in a worker thread (never on the event loop). The model is read from
the slot once per request: the scores and the reported version always belong
to the same snapshot.

A score is never NaN (JSON ``null``): the replica refuses snapshots with
non-finite weights, but a non-finite embedding row (or any other way a NaN or
an infinity reaches the forward pass) would still make one. Such a request is
answered ``422 nonfinite_score`` naming the first affected item, and the
affected scores are counted in ``kelp_serving_nonfinite_scores_total``.

With several labels (``features.labels``) the model answers ``{task: logits}``:
``scores`` stays the first task's (clients of a one-task model read only it)
and ``scores_by_task`` holds every task's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from kelp.config import FeatureSpec
from kelp.consumers.batch import MicroBatch
from kelp.serving.embeddings import RowFetcher
from kelp.serving.errors import NoModelError, RequestError
from kelp.serving.metrics import ServingMetrics
from kelp.serving.model import ModelSlot, ServedModel
from kelp.serving.pooling import PoolPlan
from kelp.trainer.model_api import ModelInput, ModelSpec, to_logits

__all__ = ["NonFiniteScoreError", "ScoreResult", "Scorer"]


class NonFiniteScoreError(RequestError):
    """The model's output for an item is NaN or infinite; 422 with reason ``nonfinite_score``.

    Not a 5xx: the replica and the store work, and retrying elsewhere gives the
    same answer for the same ids. ``detail`` names the first item (its index in
    request order) and the model version, so the client can report the ids.
    """

    status = 422

    def __init__(self, served: ServedModel, logits: np.ndarray) -> None:
        bad = np.flatnonzero(~np.isfinite(logits))
        first = int(bad[0])
        super().__init__(
            "nonfinite_score",
            f"the score of item {first} (samples[{first}] or candidates[{first}], request order) is not "
            f"finite: model v{served.version} computed {float(logits[first])!r} from its features and "
            f"embedding rows; {bad.size} of {logits.size} items affected",
        )
        self.count = int(bad.size)


@dataclass(frozen=True)
class ScoreResult:
    """What the score endpoints return (see :class:`~kelp.serving.schemas.ScoreResponse`)."""

    scores: list[float]
    model_version: int
    model_created_at: float
    model_age_s: float
    embedding_age_max_s: float | None
    embedding_age_mean_s: float | None
    default_row_rate: float
    scores_by_task: dict[str, list[float]] | None = None
    """Every task's scores (several labels only; None for a one-task model)."""

    def to_json(self) -> dict[str, object]:
        extra = {} if self.scores_by_task is None else {"scores_by_task": self.scores_by_task}
        return {
            "scores": self.scores,
            "model_version": self.model_version,
            "model_created_at": self.model_created_at,
            "model_age_s": self.model_age_s,
            "embedding_age_s": {"max": self.embedding_age_max_s, "mean": self.embedding_age_mean_s},
            "default_row_rate": self.default_row_rate,
            **extra,
        }


class Scorer:
    """Scores micro-batches with the slot's current model and rows from the fetcher."""

    def __init__(
        self, spec: FeatureSpec, slot: ModelSlot, fetcher: RowFetcher, metrics: ServingMetrics | None = None
    ) -> None:
        self.spec = spec
        self.slot = slot
        self.fetcher = fetcher
        self.plan = PoolPlan(spec)
        self.model_spec = ModelSpec.from_features(spec)
        self._names = tuple(self.model_spec.sparse)
        self._nonfinite = metrics.nonfinite_scores if metrics is not None else None

    def score(self, batch: MicroBatch) -> ScoreResult:
        served = self.slot.current  # read once: this request uses this version throughout
        if served is None:
            raise NoModelError()
        ids = self.plan.dedup(batch)
        fetched = self.fetcher.fetch(ids.unique)
        with torch.inference_mode():
            pooled = self.plan.pool(batch, ids, fetched.rows)
            sparse = dict(zip(self._names, pooled, strict=True))
            sequences = self.plan.sequences(batch, ids, fetched.rows)
            output = served.module(ModelInput(torch.from_numpy(batch.dense), sparse, sequences))
            by_task = self._task_logits(output, batch.size)
            for logits in by_task.values():
                if not bool(torch.isfinite(logits).all()):
                    error = NonFiniteScoreError(served, logits.numpy())
                    if self._nonfinite is not None:
                        self._nonfinite.inc(error.count)
                    raise error
            scored = {task: torch.sigmoid(logits).tolist() for task, logits in by_task.items()}
            scores = scored[self.model_spec.tasks[0]]
        ages = fetched.ages_s
        return ScoreResult(
            scores=scores,
            model_version=served.version,
            model_created_at=served.created_at,
            model_age_s=served.age_s(),
            embedding_age_max_s=float(ages.max()) if ages.size else None,
            embedding_age_mean_s=float(np.mean(ages)) if ages.size else None,
            default_row_rate=fetched.default_rate,
            scores_by_task=scored if len(scored) > 1 else None,
        )

    def _task_logits(self, output: object, batch_size: int) -> dict[str, torch.Tensor]:
        """task -> logits f32[B], each checked against the model contract, in task order."""
        first = to_logits(output, self.model_spec, batch_size)  # checks a mapping's keys too
        out = {self.model_spec.tasks[0]: first}
        for task in self.model_spec.tasks[1:]:
            one = replace(self.model_spec, tasks=(task,))
            out[task] = to_logits({task: output[task]}, one, batch_size)  # type: ignore[index]
        return out

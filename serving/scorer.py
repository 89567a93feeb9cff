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

A plug-in model that raises on a request (the replica ran it once on a
synthetic batch before serving it, so this is input-dependent code) is answered
``500 model_error`` naming the model and the exception, counted in
``kelp_serving_model_errors_total`` and logged at most once per
:data:`MODEL_ERROR_LOG_EVERY_S`: the fault is the model's, not the client's,
and no other model would answer the request better.

With several labels (``features.labels``) the model answers ``{task: logits}``:
``scores`` stays the first task's (clients of a one-task model read only it)
and ``scores_by_task`` holds every task's.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from kelp.config import FeatureSpec
from kelp.consumers.batch import JaggedIds, MicroBatch
from kelp.consumers.transforms import defaults_of
from kelp.serving.embeddings import FetchedRows, RowFetcher
from kelp.serving.errors import NoModelError, RequestError
from kelp.serving.metrics import ServingMetrics
from kelp.serving.model import ModelSlot, ServedModel
from kelp.serving.pooling import PoolPlan
from kelp.trainer.model_api import ModelInput, ModelSpec, one_line, to_logits

__all__ = ["MODEL_ERROR_LOG_EVERY_S", "ModelFailedError", "NonFiniteScoreError", "ScoreResult", "Scorer"]

log = logging.getLogger("kelp.serving")

MODEL_ERROR_LOG_EVERY_S = 10.0
"""At most one warning per this many seconds for model errors (each one is counted)."""


class ModelFailedError(RequestError):
    """The served model raised, or broke its output contract, on this request; 500 ``model_error``."""

    status = 500

    def __init__(self, served: ServedModel, exc: BaseException) -> None:
        reference = served.manifest.model.get("reference") or "a built-in model"
        super().__init__("model_error", f"model v{served.version} ({reference}) failed: {one_line(exc)}")


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

    def scores_of(self, tasks: tuple[str, ...]) -> dict[str, list[float]]:
        """Every task's scores by name (``tasks``: the model's, the first one's being ``scores``)."""
        return self.scores_by_task or {tasks[0]: self.scores}

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
        self._model_errors = metrics.model_errors if metrics is not None else None
        self._error_lock = threading.Lock()
        self._last_error_log = -float("inf")
        self._warm_up_batch = MicroBatch.from_columns(
            spec,
            labels=np.zeros(1, np.float32),
            dense=defaults_of(spec.dense).astype(np.float32).reshape(1, -1),
            sparse={f.name: JaggedIds.one_hot(np.zeros(1, np.uint64)) for f in spec.sparse},
        )

    def score(self, batch: MicroBatch, version: int | None = None) -> ScoreResult:
        """Scores with the current model; with ``version``, only if that is the one loaded (else 404)."""
        served = self.slot.current  # read once: this request uses this version throughout
        if served is None:
            raise NoModelError()
        if version is not None and served.version != version:
            raise RequestError(
                "version_not_loaded",
                f"model version {version} is not loaded; this replica serves version {served.version}",
                status=404,
            )
        return self._score_with(served, batch)

    def warm_up(self, served: ServedModel) -> None:
        """Score one synthetic sample (every dense default, id 0 per sparse feature) with ``served``.

        Runs before ``served`` takes requests: the first call of a freshly loaded
        module, the first pooling of each table and the first store round trip
        of a process are slower than the rest, and a real request should not
        pay for them. The store read is the scoring path's, read-only.
        """
        self._score_with(served, self._warm_up_batch)

    def model_input(self, batch: MicroBatch) -> ModelInput:
        """What the model's forward (or another hook of it) takes for ``batch``: rows fetched and pooled."""
        return self._inputs(batch)[0]

    def _inputs(self, batch: MicroBatch) -> tuple[ModelInput, FetchedRows]:
        ids = self.plan.dedup(batch)
        fetched = self.fetcher.fetch(ids.unique)
        with torch.inference_mode():
            pooled = self.plan.pool(batch, ids, fetched.rows)
            sparse = dict(zip(self._names, pooled, strict=True))
            sequences = self.plan.sequences(batch, ids, fetched.rows)
        return ModelInput(torch.from_numpy(batch.dense), sparse, sequences), fetched

    def _score_with(self, served: ServedModel, batch: MicroBatch) -> ScoreResult:
        model_input, fetched = self._inputs(batch)
        with torch.inference_mode():
            try:
                output = served.module(model_input)
                by_task = self._task_logits(output, batch.size)
            except Exception as exc:  # user model code may raise anything
                raise self._model_failed(served, exc, batch.size) from exc
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

    def _model_failed(self, served: ServedModel, exc: Exception, batch_size: int) -> ModelFailedError:
        """Count the failure, warn (rate-limited) and give the request's error."""
        error = ModelFailedError(served, exc)
        if self._model_errors is not None:
            self._model_errors.inc()
        now = time.monotonic()
        with self._error_lock:
            due = now - self._last_error_log >= MODEL_ERROR_LOG_EVERY_S
            if due:
                self._last_error_log = now
        if due:
            log.warning("%s (a batch of %d)", error, batch_size)
        return error

    def _task_logits(self, output: object, batch_size: int) -> dict[str, torch.Tensor]:
        """task -> logits f32[B], each checked against the model contract, in task order."""
        first = to_logits(output, self.model_spec, batch_size)  # checks a mapping's keys too
        out = {self.model_spec.tasks[0]: first}
        for task in self.model_spec.tasks[1:]:
            one = replace(self.model_spec, tasks=(task,))
            out[task] = to_logits({task: output[task]}, one, batch_size)  # type: ignore[index]
        return out

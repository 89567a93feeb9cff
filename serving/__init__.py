"""The serving replica: score requests with the latest published model and rows from the shared store.

Build one with :class:`ServingReplica` (store, snapshot channel, watcher,
scorer) and serve it with :func:`create_app` (FastAPI); ``kelp serve`` does
both under uvicorn. Modules, one job each:

* :mod:`~kelp.serving.schemas`: request/response models generated from the feature spec;
* :mod:`~kelp.serving.features`: validated requests -> a MicroBatch;
* :mod:`~kelp.serving.pooling`: one dedup for all tables, pooled inputs with few numpy/torch calls;
* :mod:`~kelp.serving.embeddings`: one read-only store call per request, optional TTL cache;
* :mod:`~kelp.serving.model`: the served model and its atomic slot;
* :mod:`~kelp.serving.watcher`: notifications, polling, verification, hot swap;
* :mod:`~kelp.serving.scorer`: rows + model -> scores;
* :mod:`~kelp.serving.replica`: lifecycle and readiness;
* :mod:`~kelp.serving.app`, :mod:`~kelp.serving.middleware`: the HTTP layer;
* :mod:`~kelp.serving.protocol`: uvicorn's HTTP/1.1 protocol with bounded request heads;
* :mod:`~kelp.serving.dispatch`: the score routes' own ASGI handler (the hot path) and scoring thread;
* :mod:`~kelp.serving.metrics`: ``kelp_serving_*``.

Names are resolved on first use (:mod:`kelp.lazy`): the scorer imports torch,
and ``kelp probe`` only needs :mod:`~kelp.serving.auth`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kelp.lazy import lazy_exports

if TYPE_CHECKING:
    from kelp.serving.app import create_app
    from kelp.serving.metrics import ServingMetrics
    from kelp.serving.model import ModelSlot, ServedModel
    from kelp.serving.replica import ServingReplica
    from kelp.serving.scorer import Scorer, ScoreResult

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "kelp.serving.app": ("create_app",),
        "kelp.serving.metrics": ("ServingMetrics",),
        "kelp.serving.model": ("ModelSlot", "ServedModel"),
        "kelp.serving.replica": ("ServingReplica",),
        "kelp.serving.scorer": ("Scorer", "ScoreResult"),
    },
)

__all__ = [
    "ModelSlot",
    "ScoreResult",
    "Scorer",
    "ServedModel",
    "ServingMetrics",
    "ServingReplica",
    "create_app",
]

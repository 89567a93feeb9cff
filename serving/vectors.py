"""``POST /v1/embeddings``: vectors for retrieval, so an ANN index can be refreshed from Kelp.

Two-tower users retrieve candidates by nearest neighbour over item vectors, in
an index Kelp does not own (FAISS, ScaNN, a vector database). Two kinds of
vector come from one endpoint:

* **stored rows**, ``{"table": T, "ids": [...]}`` (or ``"feature": F``, its
  table): each id's embedding row as the store holds it, read-only (never
  counted, never admitted). ``stored`` says which ids have a row; the others
  get the row a pull returns for them (the table's init row when the id is
  admitted, else zeros), not a fallback bucket's;
* **model vectors**, ``{"samples": [...]}`` (the ``/v1/score`` body): the
  served model's ``encode(ModelInput)`` output for each sample, when the model
  defines that hook (docs/models.md): ``{name: f32[B, d]}``, for example
  ``{"user": ..., "item": ...}`` of a two-tower model. A model without it
  answers 422 ``no_encode_hook``.

Ids follow the one id rule (integers, or strings read as in training). A
request holds at most ``max_samples_per_request * max_ids_per_feature`` ids
(413 ``too_many_ids``); a repeated id is read once and listed at each of its
positions. An answer holds at most ``serving.max_vector_values`` floats (ids x
dim, or the encode hook's outputs together), checked on counts and shapes before
anything is read or converted (413 ``answer_too_large``): the answer's size and
the scoring thread's time on it stay bounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from kelp.serving.errors import BadRequestError, NoModelError, RequestError
from kelp.serving.features import RequestParser, ids_of
from kelp.serving.scorer import Scorer
from kelp.store.base import EmbeddingStore

__all__ = ["ENCODE_HOOK", "VectorLookup"]

ENCODE_HOOK = "encode"


class VectorLookup:
    """Answers ``/v1/embeddings`` bodies (already decoded) on the scoring thread."""

    def __init__(
        self,
        store: EmbeddingStore,
        parser: RequestParser,
        scorer: Scorer,
        max_ids: int,
        max_values: int,
    ) -> None:
        self.store = store
        self.parser = parser
        self.scorer = scorer
        self.max_ids = max_ids
        self.max_values = max_values
        spec = parser.spec
        self.table_of = {f.name: f.table_name for f in spec.sparse}
        self.dims = {t.name: t.dim for t in spec.tables}

    def answer(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise BadRequestError("invalid_request", f"the body is {type(body).__name__}, expected an object")
        if "samples" in body:
            return self.encode(body)
        return self.rows(body)

    def rows(self, body: Mapping[str, Any]) -> dict[str, Any]:
        extra = sorted(set(body) - {"table", "feature", "ids"})
        if extra or "ids" not in body or ("table" in body) == ("feature" in body):
            raise BadRequestError(
                "invalid_request",
                'expected {"table": T, "ids": [...]}, {"feature": F, "ids": [...]} or {"samples": [...]}'
                + (f"; unknown field(s) {extra}" if extra else ""),
            )
        named = body.get("table", body.get("feature"))
        if not isinstance(named, str):
            message = f"'table' or 'feature' must be a name, not {named!r:.40}"
            raise BadRequestError("invalid_request", message)
        table = named if "table" in body else self.table_of.get(named)
        if table is None:
            raise BadRequestError("unknown_feature", f"{named!r} is not a sparse feature")
        if table not in self.dims:
            raise BadRequestError("unknown_table", f"{table!r} is not a table (tables: {sorted(self.dims)})")
        raw = body["ids"]
        if not isinstance(raw, list) or not raw:
            raise BadRequestError("invalid_request", "'ids' must be a non-empty list")
        if len(raw) > self.max_ids:
            raise RequestError("too_many_ids", f"{len(raw)} ids, at most {self.max_ids}", status=413)
        self._check_size(len(raw) * self.dims[table], f"{len(raw)} ids x dim {self.dims[table]}")
        ids = ids_of(raw, "ids")
        unique, inverse = np.unique(ids, return_inverse=True)  # a repeated id is read once
        pulled = self.store.pull_many({table: unique}, count=False)[table]
        stored = pulled.admitted if pulled.updated_s is None else pulled.updated_s > 0
        return {
            "table": table,
            "dim": self.dims[table],
            "ids": ids.tolist(),
            "stored": stored[inverse].tolist(),
            "vectors": pulled.rows[inverse].tolist(),
        }

    def encode(self, body: Mapping[str, Any]) -> dict[str, Any]:
        served = self.scorer.slot.current
        if served is None:
            raise NoModelError()
        hook = getattr(served.module, ENCODE_HOOK, None)
        if not callable(hook):
            raise BadRequestError(
                "no_encode_hook",
                f"model v{served.version} defines no {ENCODE_HOOK}(batch) hook, so it has no vectors to give "
                '(docs/models.md); stored rows come from {"table": T, "ids": [...]}',
            )
        batch = self.parser.samples(body)
        model_input = self.scorer.model_input(batch)
        try:
            with torch.inference_mode():
                out = hook(model_input)
        except Exception as exc:  # user model code may raise anything
            raise RequestError("model_error", f"model v{served.version}: encode raised {exc!r}", 500) from exc
        vectors = out if isinstance(out, Mapping) else {"vector": out}
        for name, tensor in vectors.items():
            if not isinstance(tensor, torch.Tensor) or tensor.ndim != 2 or tensor.shape[0] != batch.size:
                shape = getattr(tensor, "shape", type(tensor).__name__)
                raise RequestError(
                    "model_error",
                    f"model v{served.version}: encode gave {name!r} as {shape}, expected a tensor "
                    f"[{batch.size}, d]",
                    500,
                )
        # On shapes, before any copy or conversion: turning a huge output into lists is what costs.
        shapes = ", ".join(f"{name!r} {list(t.shape)}" for name, t in vectors.items())
        self._check_size(sum(t.numel() for t in vectors.values()), f"model v{served.version}: {shapes}")
        answer: dict[str, Any] = {}
        for name, tensor in vectors.items():
            values = tensor.detach().float().cpu()
            if not bool(torch.isfinite(values).all()):
                raise BadRequestError("nonfinite_vector", f"model v{served.version}: {name!r} is not finite")
            answer[str(name)] = values.tolist()
        return {"vectors": answer, "model_version": served.version}

    def _check_size(self, values: int, what: str) -> None:
        """Refuse an answer of more than ``max_values`` floats before it is built (413)."""
        if values > self.max_values:
            raise RequestError(
                "answer_too_large",
                f"{what}: {values} values, at most serving.max_vector_values ({self.max_values}); "
                "ask for fewer ids or samples per request",
                status=413,
            )

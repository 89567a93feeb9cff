"""The one model a replica serves, as the Open Inference Protocol sees it, for REST and gRPC alike.

Its name is the config's ``deployment``; its one listed version is the
snapshot the replica has loaded. Inference runs on the replica's scoring
thread (:meth:`~kelp.serving.dispatch.ScoreRoutes.run`), with the scorer,
rows and request log ``/v1`` uses, so every protocol gives the same floats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kelp.serving.dispatch import ScoreRoutes
from kelp.serving.errors import RequestError
from kelp.serving.oip.inputs import TensorInputs
from kelp.serving.oip.tensors import InferRequest
from kelp.serving.replica import ServingReplica
from kelp.serving.scorer import ScoreResult

__all__ = ["LOGGED_ID_PARAMETER", "Inferred", "OipModel", "version_number"]

PLATFORM = "kelp_pytorch"


def version_number(version: str) -> int | None:
    """A version path segment as a number (None: not one)."""
    return int(version) if version.isascii() and version.isdigit() and len(version) < 19 else None


LOGGED_ID_PARAMETER = "kelp_request_id"
"""The response parameter (REST and gRPC) with the id the request was logged under; REST also sends it
as the ``kelp-request-id`` header. Absent while ``serving.request_log`` is off."""


@dataclass(frozen=True)
class Inferred:
    """One inference: the scores, the outputs asked for as ``(task, FP32 [B], binary)``, the request's ids.

    ``request_id`` is the client's own (the protocol echoes it as the response's ``id``); ``logged_as``
    the id the request log gave it, which the client's actions must carry for ``kelp join`` to match them.
    """

    result: ScoreResult
    outputs: list[tuple[str, np.ndarray, bool]]
    request_id: str | None
    logged_as: str | None = None

    def parameters(self) -> dict[str, Any]:
        """What ``/v1/score`` adds to its scores, as the response's parameters."""
        r = self.result
        return {
            "model_created_at": r.model_created_at,
            "model_age_s": r.model_age_s,
            "embedding_age_max_s": r.embedding_age_max_s,
            "embedding_age_mean_s": r.embedding_age_mean_s,
            "default_row_rate": r.default_row_rate,
        }


class OipModel:
    """Metadata, readiness and inference of the served model; see the module docstring."""

    def __init__(self, replica: ServingReplica, routes: ScoreRoutes) -> None:
        self.name = replica.cfg.deployment
        self.replica = replica
        self.routes = routes
        self.inputs = TensorInputs(replica.parser)
        self.tasks = replica.scorer.model_spec.tasks

    def loaded_version(self) -> int | None:
        current = self.replica.slot.current
        return None if current is None else current.version

    def problem(self, name: str, version: str | None = None) -> RequestError | None:
        """The 404 for another model's name, or a version this replica has not loaded; None when it fits."""
        if name != self.name:
            return RequestError(
                "unknown_model", f"this replica serves model {self.name!r}, not {name!r}", status=404
            )
        if version is None:
            return None
        loaded = self.loaded_version()
        if version_number(version) != loaded or loaded is None:
            shown = "no version yet" if loaded is None else f"version {loaded}"
            return RequestError(
                "version_not_loaded", f"version {version!r} is not loaded; it serves {shown}", status=404
            )
        return None

    def requested_version(self, name: str, version: str | None) -> int | None:
        """The version an inference names (None: whichever is loaded); a 404 for another model or a path
        segment that is no version number. Whether that version is loaded is the scorer's check, made
        with the model it scores with."""
        problem = self.problem(name)
        if problem is not None:
            raise problem
        if version is None:
            return None
        pinned = version_number(version)
        if pinned is None:
            raise RequestError("version_not_loaded", f"version {version!r} is not a version number", 404)
        return pinned

    def metadata(self) -> dict[str, Any]:
        loaded = self.loaded_version()
        return {
            "name": self.name,
            "versions": [] if loaded is None else [str(loaded)],
            "platform": PLATFORM,
            "inputs": self.inputs.metadata(),
            "outputs": [{"name": task, "datatype": "FP32", "shape": [-1]} for task in self.tasks],
        }

    def infer(
        self, request: InferRequest, version: int | None, client_id: str | None, synthetic: bool = False
    ) -> Inferred:
        """Score ``request`` (on the scoring thread); with ``version``, only if that one is loaded.
        A ``synthetic`` request (``X-Kelp-Synthetic``) is scored alike and kept out of the request log."""
        batch = self.inputs.batch(request.inputs)
        result = self.replica.scorer.score(batch, version)
        by_task = result.scores_of(self.tasks)
        if request.outputs is None:
            outputs = [
                (task, np.asarray(by_task[task], np.float32), request.binary_output) for task in self.tasks
            ]
        else:
            outputs = []
            for wanted in request.outputs:
                if wanted.name not in by_task:
                    message = f"output {wanted.name!r} is not one of {list(self.tasks)}"
                    raise RequestError("unknown_output", message, status=400)
                outputs.append((wanted.name, np.asarray(by_task[wanted.name], np.float32), wanted.binary))
        logged_as = self.routes.log(request.id or client_id, batch, result, synthetic=synthetic)
        return Inferred(result, outputs, request.id, logged_as)

"""Request and response models of the HTTP API, built from the replica's feature spec.

The request models are generated per config (pydantic ``create_model``), so the
OpenAPI spec lists the real feature names and limits. They are the contract,
not the validator: requests are checked by :mod:`kelp.serving.features`
without building model objects (a test keeps the two in agreement). The rules:

* ``dense``: feature name -> finite number or null (null or absent = the
  feature's ``default``, as in event schema v1); booleans, strings, NaN and
  infinities are rejected;
* ``sparse``: feature name -> one id or a list of ids, each an integer in
  ``[0, 2**64)`` or a string (absent, null or ``[]`` = no ids, pooled to zeros);
  a list may hold at most ``min(feature.max_ids, serving.max_ids_per_feature)``;
* unknown feature names are rejected (event schema: ``unknown_feature``);
* ``samples`` / ``candidates`` hold 1 to ``serving.max_samples_per_request`` items.

A string id is read by the rule training applies to events and files
(:mod:`kelp.consumers.ids`): ASCII digits with a value below ``2**64`` are
that integer (``"258029"`` and ``258029`` score the same row), any other
string is the xxh3-64 hash of its UTF-8 bytes (``"alice"``). Clients send
ids the way producers wrote them and never hash anything themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from kelp.config import FeatureSpec, ServingConfig

__all__ = [
    "EmbeddingAge",
    "EncodeResponse",
    "ErrorResponse",
    "ModelInfo",
    "ReadyResponse",
    "RequestModels",
    "RowsRequest",
    "RowsResponse",
    "ScoreResponse",
    "build_request_models",
]

U64_MAX = 2**64 - 1
Id = (
    Annotated[int, Field(strict=True, ge=0, le=U64_MAX)]
    | Annotated[str, Field(strict=True, description="digits: that integer; any other text: its xxh3-64 hash")]
)
Dense = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False)


@dataclass(frozen=True)
class RequestModels:
    """The generated models; ``dense_fields[j]`` / ``sparse_fields[f]`` are attribute names in spec order."""

    features: type[BaseModel]
    score: type[BaseModel]
    candidates: type[BaseModel]
    dense_fields: tuple[str, ...]
    sparse_fields: tuple[str, ...]


def build_request_models(spec: FeatureSpec, serving: ServingConfig) -> RequestModels:
    """Request models for ``spec``; field names are ``d<j>``/``s<f>`` with the feature name as alias."""
    dense_fields = tuple(f"d{j}" for j in range(len(spec.dense)))
    sparse_fields = tuple(f"s{i}" for i in range(len(spec.sparse)))
    dense_defs: dict[str, Any] = {
        name: (Dense | None, Field(None, alias=f.name, description=f"default {f.default}"))
        for name, f in zip(dense_fields, spec.dense, strict=True)
    }
    sparse_defs: dict[str, Any] = {}
    for name, f in zip(sparse_fields, spec.sparse, strict=True):
        limit = min(f.max_ids, serving.max_ids_per_feature)
        ids = Annotated[list[Id], Field(max_length=limit)]
        sparse_defs[name] = (
            Id | ids | None,
            Field(None, alias=f.name, description=f"table {f.table_name}, at most {limit} ids"),
        )
    dense_model = create_model("DenseFeatures", __base__=_Strict, **dense_defs)
    sparse_model = create_model("SparseFeatures", __base__=_Strict, **sparse_defs)
    features = create_model(
        "Features",
        __base__=_Strict,
        dense=(dense_model, Field(default_factory=dense_model, description="absent features use defaults")),
        sparse=(sparse_model, Field(default_factory=sparse_model, description="absent features have no ids")),
    )
    limit = serving.max_samples_per_request
    score = create_model(
        "ScoreRequest",
        __base__=_Strict,
        samples=(list[features], Field(min_length=1, max_length=limit)),  # type: ignore[valid-type]
    )
    columnar = _columnar_candidates(spec, serving, dense_fields, sparse_fields)
    candidates = create_model(
        "CandidatesRequest",
        __base__=_Strict,
        user=(features, Field(default_factory=features, description="shared by every candidate")),
        candidates=(
            Annotated[list[features], Field(min_length=1, max_length=limit)] | columnar,  # type: ignore[valid-type]
            Field(
                description="a list (per feature, a candidate's non-null value overrides the user's), "
                "or columns of `count` values per feature (a column replaces the user's feature)"
            ),
        ),
    )
    return RequestModels(features, score, candidates, dense_fields, sparse_fields)


def _jagged_column(limit: int) -> type[BaseModel]:
    """Several ids per candidate: candidate *i* has the next ``lengths[i]`` (<= ``limit``) ``values``."""
    return create_model(
        f"JaggedColumnUpTo{limit}",
        __base__=_Strict,
        values=(list[Id], Field(description="every candidate's ids, in order (msgpack: or u64 bytes)")),
        lengths=(
            list[Annotated[int, Field(strict=True, ge=0, le=limit)]],
            Field(description="ids per candidate, `count` of them (msgpack: or i32 bytes)"),
        ),
    )


def _columnar_candidates(
    spec: FeatureSpec, serving: ServingConfig, dense_fields: tuple[str, ...], sparse_fields: tuple[str, ...]
) -> type[BaseModel]:
    """The compact candidates form: one column per feature instead of one object per candidate."""
    dense = create_model(
        "DenseColumns",
        __base__=_Strict,
        **{
            name: (
                list[Dense] | None,
                Field(None, alias=f.name, description="count values (msgpack: or f32 bytes)"),
            )
            for name, f in zip(dense_fields, spec.dense, strict=True)
        },
    )
    sparse = create_model(
        "SparseColumns",
        __base__=_Strict,
        **{
            name: (
                list[Id] | _jagged_column(min(f.max_ids, serving.max_ids_per_feature)) | None,
                Field(
                    None, alias=f.name, description="one id per candidate (msgpack: or u64 bytes), or jagged"
                ),
            )
            for name, f in zip(sparse_fields, spec.sparse, strict=True)
        },
    )
    return create_model(
        "ColumnarCandidates",
        __base__=_Strict,
        count=(int, Field(ge=1, le=serving.max_samples_per_request, description="number of candidates")),
        dense=(dense, Field(default_factory=dense)),
        sparse=(sparse, Field(default_factory=sparse)),
    )


class EmbeddingAge(BaseModel):
    """Seconds since the last update of the stored rows a request used (null: none was stored)."""

    max: float | None
    mean: float | None


class ScoreResponse(BaseModel):
    scores: list[float] = Field(
        description="sigmoid(logit) per sample or candidate, in request order (the first task's with "
        "several labels)"
    )
    scores_by_task: dict[str, list[float]] | None = Field(
        None, description="with several labels (features.labels): task -> its scores, in request order"
    )
    model_version: int
    model_created_at: float = Field(description="unix seconds the snapshot was created by the trainer")
    model_age_s: float
    embedding_age_s: EmbeddingAge
    default_row_rate: float = Field(
        description="share of the request's unique (table, id) pairs that read the default row"
    )
    request_id: str | None = Field(
        None,
        description="with serving.request_log on: the id the request was logged under (the client's "
        "X-Request-Id when it is 1-128 printable ASCII characters, else a new one)",
    )


class RowsRequest(_Strict):
    """Stored rows of some ids of one table (``table``, or a sparse ``feature``'s table)."""

    table: str | None = Field(None, description="a table of features.tables")
    feature: str | None = Field(None, description="or a sparse feature: its table")
    ids: list[Id] = Field(min_length=1, description="integer ids, or strings read by the one id rule")


class RowsResponse(BaseModel):
    table: str
    dim: int
    ids: list[int] = Field(description="the ids as integers, in request order")
    stored: list[bool] = Field(description="per id: whether the store holds a row for it")
    vectors: list[list[float]] = Field(description="per id: its row (stored: false, the row a pull returns)")


class EncodeResponse(BaseModel):
    vectors: dict[str, list[list[float]]] = Field(
        description="the model's encode(batch) output, name -> [B, d]"
    )
    model_version: int


class ModelInfo(BaseModel):
    version: int
    created_at: float
    step: int
    offsets: list[dict[str, Any]]
    checksum: str
    config_hash: str
    model: dict[str, Any]


class ReadyResponse(BaseModel):
    status: str
    reason: str | None = None
    model_version: int | None = None


class ErrorResponse(BaseModel):
    error: str = Field(description="machine-readable reason, e.g. too_many_samples, body_too_large")
    detail: Any = Field(description="human-readable explanation, or the list of validation errors")

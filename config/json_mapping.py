"""``json``: where each field of a JSON object (``format: json``) or a plug-in decoder's sample is.

Shared by the trainer's sources (:mod:`kelp.config.sources`) and read by
:class:`kelp.consumers.json_events.MappedDecoder`.
"""

from __future__ import annotations

import re
from typing import Any, Self

from pydantic import Field, field_validator, model_validator

from kelp.config.base import StrictModel

__all__ = ["JsonMapping"]


_FIELD_PATH = re.compile(r"^[^.]+(\.[^.]+)*$")


def _field_path(value: str) -> str:
    if not _FIELD_PATH.match(value):
        raise ValueError(f"{value!r} is not a dotted path (keys joined by '.', none empty: user.id)")
    return value


def _named_paths(value: Any) -> Any:
    """A list of names means each path is the name itself (``[price]`` == ``{price: price}``)."""
    if isinstance(value, list):
        if len(set(value)) != len(value):
            raise ValueError("a feature is listed twice")
        return {name: name for name in value}
    return value


class JsonMapping(StrictModel):
    """Maps JSON objects (``format: json``) or a plug-in decoder's samples onto the feature spec.

    Each field is a dotted path into nested objects: ``user.id`` reads
    ``{"user": {"id": 7}}``. ``dense_fields`` and ``sparse_fields`` map a
    feature name to its path, or list names whose path is the name itself.
    A sparse field holds one id or a list of ids, read by the one id rule
    (:mod:`kelp.consumers.ids`). A missing path or ``null`` is a missing
    feature (dense: the feature's default; sparse: no id); a missing label
    rejects the record (``missing_label``).
    """

    label_field: str = Field(
        description="Path of the label (a number; 0/1 for a binary label); with features.labels, the first's."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="features.labels: each task after the first -> the path of its label.",
    )
    weight_field: str | None = Field(
        None, description="Path of the sample weight (a finite number >= 0); None or missing: 1."
    )
    dense_fields: dict[str, str] = Field(
        default_factory=dict, description="dense feature name -> path (or a list of names: path == name)."
    )
    sparse_fields: dict[str, str] = Field(
        default_factory=dict, description="sparse feature name -> path (or a list of names: path == name)."
    )
    event_time_field: str | None = Field(
        None, description="Path of the event's unix time in seconds (the sample's ts); None: no ts."
    )

    _lists = field_validator("dense_fields", "sparse_fields", mode="before")(_named_paths)

    @field_validator("label_field", "event_time_field", "weight_field")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return None if value is None else _field_path(value)

    @field_validator("dense_fields", "sparse_fields", "labels")
    @classmethod
    def _paths(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            try:
                _field_path(path)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_kind_per_feature(self) -> Self:
        both = sorted(set(self.dense_fields) & set(self.sparse_fields))
        if both:
            raise ValueError(f"feature(s) {', '.join(both)} in both dense_fields and sparse_fields")
        return self

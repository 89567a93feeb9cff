"""``json``: where each field of a JSON object (``format: json``) or a plug-in decoder's sample is.

Shared by the trainer's sources (:mod:`kelp.config.sources`) and read by
:class:`kelp.consumers.json_events.MappedDecoder`.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Self, get_args

from pydantic import Field, field_validator, model_validator

from kelp.config.base import StrictModel

__all__ = ["TIME_CASTS", "Cast", "JsonMapping", "TimeCast"]

TimeCast = Literal["seconds", "milliseconds", "iso8601", "iso8601_utc"]
"""How an event time is written: epoch seconds or milliseconds (a number or a numeric string), or an
ISO-8601 string; ``iso8601`` needs a zone (``Z``, ``+02:00``), ``iso8601_utc`` reads a time without
one as UTC. A zone-less time is refused under ``iso8601``: guessing its zone would shift every
event by hours without a word."""

Cast = Literal["bool", "number", "seconds", "milliseconds", "iso8601", "iso8601_utc"]
"""A declared conversion of one mapped field (``casts``): ``bool`` reads true/false as 1/0,
``number`` a numeric string as its number, and the time casts as in :data:`TimeCast`."""

TIME_CASTS: tuple[str, ...] = get_args(TimeCast)

# Which casts each kind of mapped field takes (sparse ids take strings and integers as they are).
_ALLOWED: dict[str, tuple[str, ...]] = {
    "label": ("bool", "number"),
    "weight": ("number",),
    "dense": ("bool", "number"),
    "event time": TIME_CASTS,
    "sparse": (),
}


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

    Values are strict unless ``casts`` declares a conversion for their path:
    ``{clicked: bool, ts: iso8601, price: number}`` reads ``true`` as 1,
    ``"2024-05-01T12:00:00Z"`` as epoch seconds and ``"9.5"`` as 9.5. A value
    its cast cannot read rejects the record (``bad_type``).
    """

    label_field: str = Field(
        description="Path of the label (a number, or as casts declares; 0/1 for a binary label); with "
        "features.labels, the first's."
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
        None,
        description="Path of the event's time (the sample's ts): unix seconds, or as casts declares; "
        "None: no ts.",
    )

    casts: dict[str, Cast] = Field(
        default_factory=dict,
        description="path -> how to read its value when it is not a plain number: bool (true/false -> "
        "1/0; labels and dense), number (a numeric string; labels, weight, dense), and for event_time_field "
        "seconds or milliseconds (epoch, a number or numeric string), iso8601 (a string with a zone: Z or "
        "+hh:mm) or iso8601_utc (a zone-less time read as UTC). A path with no cast takes numbers only.",
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

    @model_validator(mode="after")
    def _casts_fit_their_fields(self) -> Self:
        """Each cast names a mapped path, and every use of that path takes the cast."""
        uses = self._uses()
        for path, cast in self.casts.items():
            kinds = uses.get(path)
            if not kinds:
                raise ValueError(
                    f"casts.{path}: {path!r} is not a mapped path (label_field, labels, weight_field, "
                    "dense_fields or event_time_field)"
                )
            for kind in sorted(kinds):
                if cast not in _ALLOWED[kind]:
                    allowed = ", ".join(_ALLOWED[kind]) or "none, ids are read as they are"
                    raise ValueError(
                        f"casts.{path}: {cast} does not apply to {kind} fields (allowed: {allowed})"
                    )
        return self

    def _uses(self) -> dict[str, set[str]]:
        """Mapped path -> the kinds of field it is read as."""
        uses: dict[str, set[str]] = {}
        named = [("label", self.label_field), *(("label", p) for p in self.labels.values())]
        named += [("weight", self.weight_field), ("event time", self.event_time_field)]
        named += [("dense", p) for p in self.dense_fields.values()]
        named += [("sparse", p) for p in self.sparse_fields.values()]
        for kind, path in named:
            if path is not None:
                uses.setdefault(path, set()).add(kind)
        return uses

"""What a sample looks like: label, dense and sparse features, and the embedding tables they use.

This slice is shared by almost every room: the consumers decode samples with
it, the store builds one table per :class:`TableSpec`, the trainer sizes its
model from it and serving validates requests against it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from kelp.config.base import StrictModel, identifier

FALLBACK_SUFFIX = "__fallback"
"""``<table>__fallback`` holds a table's fallback rows (``admission.fallback_buckets``); reserved."""

__all__ = [
    "FALLBACK_SUFFIX",
    "AdmissionSpec",
    "ClipTransform",
    "DenseFeature",
    "DenseTransform",
    "EvictionSpec",
    "FeatureSpec",
    "InitSpec",
    "LabelSpec",
    "Log1pTransform",
    "SparseFeature",
    "StandardizeTransform",
    "TableDefaults",
    "TableSpec",
]


class InitSpec(StrictModel):
    """How a newly admitted row is initialised. Seeded from (seed, table, id), so reproducible."""

    kind: Literal["normal", "uniform", "zeros"] = Field("normal", description="Distribution of a new row.")
    std: float = Field(0.01, gt=0, description="Standard deviation for kind=normal.")
    scale: float = Field(0.05, gt=0, description="Half-width of the interval for kind=uniform.")
    seed: int = Field(0, ge=0, description="Mixed with the table name and id to seed each row.")


class AdmissionSpec(StrictModel):
    """When an id earns a stored row (Kraken/Monolith): until then it reads the default row."""

    min_count: int = Field(
        1,
        ge=1,
        description="Sightings (across all trainers, approximate) before an id is admitted; 1 = always.",
    )
    probability: float = Field(
        1.0, gt=0, le=1, description="Alternatively admit each sighting with this probability; 1 = off."
    )
    counter_ttl_s: float = Field(
        86_400.0,
        gt=0,
        description="Seconds a not-yet-admitted id's sighting counter lives (bounds counter memory).",
    )
    fallback_buckets: int = Field(
        0,
        ge=0,
        le=1 << 20,
        description="Ids not admitted yet read and train one of this many shared rows (the id's hash picks "
        "it) instead of an untrained default row, so a new id's first samples still carry signal. The "
        "rows live in table <name>__fallback and count as stored rows. 0 = off (the default row).",
    )
    fallback_warm_start: bool = Field(
        False,
        description="An id admitted while fallback_buckets is on starts from its bucket's row (what it "
        "learned while waiting) instead of a random init row. Measured on MovieLens: pays only with "
        "about as many buckets as ids waiting for admission; with fewer, a bucket carries other ids' "
        "updates and AUC drops.",
    )
    count: Literal["occurrences", "pulls"] = Field(
        "occurrences",
        description="What min_count counts. occurrences: every occurrence of the id in the trained "
        "samples (an id in 3 samples of one batch counts 3); pulls: one per micro-batch that contains "
        "it (bursty ids, e.g. a user rating 50 films in one session, count once per batch).",
    )

    @model_validator(mode="after")
    def _one_rule(self) -> Self:
        if self.min_count > 1 and self.probability < 1:
            raise ValueError("admission: set min_count > 1 or probability < 1, not both")
        if self.fallback_warm_start and not self.fallback_buckets:
            raise ValueError("admission.fallback_warm_start needs fallback_buckets > 0")
        return self


class EvictionSpec(StrictModel):
    """When stored rows go away. Evicted rows read as not admitted again."""

    ttl_s: float | None = Field(
        None,
        gt=0,
        description="Rows not updated for this many seconds expire. None = never. Hazard: too short "
        "forgets slow-moving ids between visits.",
    )
    max_rows: int | None = Field(
        None,
        gt=0,
        description="Capacity cap per table; least-frequently-used rows go first. None = unbounded.",
    )


class TableSpec(StrictModel):
    """One embedding table: rows of ``dim`` floats keyed by 64-bit id."""

    name: str
    dim: int = Field(16, ge=1, le=4096, description="Embedding width.")
    dtype: Literal["float32", "float16"] = Field(
        "float32",
        description="Storage type of the embedding in the store; float16 halves memory at ~1e-3 error.",
    )
    init: InitSpec = Field(default_factory=InitSpec)
    default_row: Literal["zeros", "init"] = Field(
        "zeros", description="What a not-admitted id reads: zeros, or its deterministic init row."
    )
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec)
    eviction: EvictionSpec = Field(default_factory=EvictionSpec)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v.endswith(FALLBACK_SUFFIX):
            raise ValueError(f"table names ending in {FALLBACK_SUFFIX!r} are reserved for fallback rows")
        return identifier(v, "table name")

    def fallback_table(self) -> TableSpec | None:
        """The table of this table's fallback rows (``admission.fallback_buckets`` of them), or None.

        Same width, storage type, init and TTL; every bucket is admitted on sight
        (it must be trainable at once) and no ``max_rows`` (it holds at most
        ``fallback_buckets`` rows).
        """
        if not self.admission.fallback_buckets:
            return None
        return TableSpec.model_construct(
            name=self.name + FALLBACK_SUFFIX,
            dim=self.dim,
            dtype=self.dtype,
            init=self.init,
            default_row=self.default_row,
            admission=AdmissionSpec(),
            eviction=EvictionSpec(ttl_s=self.eviction.ttl_s),
        )


class TableDefaults(StrictModel):
    """Template for tables that sparse features name but ``tables`` does not list."""

    dim: int = Field(16, ge=1, le=4096)
    dtype: Literal["float32", "float16"] = "float32"
    init: InitSpec = Field(default_factory=InitSpec)
    default_row: Literal["zeros", "init"] = "zeros"
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec)
    eviction: EvictionSpec = Field(default_factory=EvictionSpec)


class SparseFeature(StrictModel):
    """A categorical feature: one id (one-hot) or up to ``max_ids`` ids (multi-hot) per sample.

    ``pooling: none`` makes it a sequence feature: its ids keep their order and
    their own rows (see ``kelp.trainer.SequenceInput``), for models that weigh
    each id, such as attention over a history.
    """

    name: str
    table: str | None = Field(
        None, description="Embedding table; defaults to the feature name. Tables may be shared."
    )
    max_ids: int = Field(
        1, ge=1, le=65_536, description="Cap on ids per sample; more is rejected as too_many_ids."
    )
    pooling: Literal["sum", "mean", "none"] = Field(
        "sum",
        description="How a multi-hot feature's rows are combined. none: a sequence feature, not pooled; "
        "the model gets every id's row and the offsets (batch.sequences), which only a model plug-in "
        "that reads them can use (e.g. target attention over a user's history).",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return identifier(v, "feature name")

    @property
    def table_name(self) -> str:
        return self.table or self.name


class Log1pTransform(StrictModel):
    kind: Literal["log1p"] = "log1p"


class ClipTransform(StrictModel):
    kind: Literal["clip"] = "clip"
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"clip min ({self.min}) must be <= max ({self.max})")
        return self


class StandardizeTransform(StrictModel):
    kind: Literal["standardize"] = "standardize"
    mean: float = 0.0
    std: float = Field(1.0, gt=0)


DenseTransform = Annotated[Log1pTransform | ClipTransform | StandardizeTransform, Field(discriminator="kind")]


class DenseFeature(StrictModel):
    """A numeric feature. Transforms apply in order, after missing values are replaced by ``default``."""

    name: str
    default: float = Field(0.0, description="Value used when the feature is missing from a sample.")
    transforms: list[DenseTransform] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return identifier(v, "feature name")

    @field_validator("transforms", mode="before")
    @classmethod
    def _shorthand(cls, v: object) -> object:
        # Allow `transforms: [log1p]` as well as `[{kind: log1p}]`.
        if isinstance(v, list):
            return [{"kind": t} if isinstance(t, str) else t for t in v]
        return v


EVENT_FIELDS = frozenset({"v", "batch", "labels", "weight", "ts", "dense", "sparse"})
"""The event schema's own top-level fields: a label (task) of one of these names would read them."""


class LabelSpec(StrictModel):
    """One training target (a task): where its label is, what values it takes, how much its loss counts."""

    name: str = Field("label", description="Field (or column) holding the label; also the task's name.")
    kind: Literal["binary", "float"] = Field(
        "binary", description="binary: 0/1 clicks; float: any finite value (a soft BCE target)."
    )
    loss_weight: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="Factor of this task's loss in the summed loss."
    )

    @field_validator("name")
    @classmethod
    def _not_an_event_field(cls, v: str) -> str:
        if v in EVENT_FIELDS:
            raise ValueError(
                f"label name {v!r} is a field of the event schema ({', '.join(sorted(EVENT_FIELDS))}): "
                "a message would read that field as the label; pick another name"
            )
        return v

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A default loss_weight is left out: a one-label spec dumps (and hashes, in checkpoints
        # and snapshots) as it did before labels had weights.
        out = handler(self)
        if self.loss_weight == 1.0:
            out.pop("loss_weight", None)
        return out


class FeatureSpec(StrictModel):
    """What a sample looks like: one or more labels, dense features and sparse features over tables."""

    label: LabelSpec = Field(
        default_factory=LabelSpec, description="The one label (a one-task model); sugar for labels: [label]."
    )
    labels: list[LabelSpec] | None = Field(
        None,
        description="Several labels, one task each (e.g. click and purchase); excludes label. "
        "None: the one label.",
    )
    dense: list[DenseFeature] = Field(default_factory=list)
    sparse: list[SparseFeature] = Field(default_factory=list)
    tables: list[TableSpec] = Field(default_factory=list)
    table_defaults: TableDefaults = Field(
        default_factory=TableDefaults,
        description="Used for tables named by a sparse feature but not listed under tables.",
    )
    _from_defaults: set[str] = PrivateAttr(default_factory=set)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # No labels list: left out, so a one-label spec dumps as it did before labels existed.
        out = handler(self)
        if self.labels is None:
            out.pop("labels", None)
        return out

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        self._one_label_field()
        for kind, names in (
            ("dense feature", [f.name for f in self.dense]),
            ("sparse feature", [f.name for f in self.sparse]),
            ("table", [t.name for t in self.tables]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"duplicate {kind} name(s): {', '.join(dupes)}")
        overlap = {f.name for f in self.dense} & {f.name for f in self.sparse}
        if overlap:
            raise ValueError(f"feature(s) both dense and sparse: {', '.join(sorted(overlap))}")
        listed = {t.name for t in self.tables}
        for feature in self.sparse:
            if feature.table_name not in listed:
                spec = TableSpec(name=feature.table_name, **self.table_defaults.model_dump())
                self.tables.append(spec)
                listed.add(spec.name)
                self._from_defaults.add(spec.name)
        return self

    def _one_label_field(self) -> None:
        """``labels`` replaces ``label``; ``label`` then mirrors ``labels[0]`` (a dump re-reads as is)."""
        if self.labels is None:
            return
        if not self.labels:
            raise ValueError("features.labels: needs at least one label")
        names = [t.name for t in self.labels]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"features.labels: duplicate label name(s): {', '.join(dupes)}")
        if "label" in self.model_fields_set and self.label != self.labels[0]:
            raise ValueError("features.label and features.labels are exclusive: set one of them")
        self.__dict__["label"] = self.labels[0]  # not an assignment: that would re-run this validator

    @property
    def tasks(self) -> list[LabelSpec]:
        """Every label, in config order (one task per label); ``[label]`` when ``labels`` is not set."""
        return list(self.labels) if self.labels is not None else [self.label]

    def task_names(self) -> tuple[str, ...]:
        """The task (label) names, in config order: what a model's mapping output is keyed by."""
        return tuple(t.name for t in self.tasks)

    def store_tables(self) -> list[TableSpec]:
        """Every table the store holds: each embedding table, then each one's fallback table (if any)."""
        fallbacks = [f for t in self.tables if (f := t.fallback_table()) is not None]
        return [*self.tables, *fallbacks]

    def defaulted_tables(self) -> frozenset[str]:
        """Tables built from ``table_defaults`` (named by a sparse feature, not listed under ``tables``).

        They are appended to ``tables`` at load, so an error about one should
        point at ``table_defaults``, which is what the person wrote.
        """
        return frozenset(self._from_defaults)

    def sparse_table(self, feature: str) -> str:
        """Name of the table a sparse feature looks its ids up in."""
        for f in self.sparse:
            if f.name == feature:
                return f.table_name
        raise KeyError(feature)

    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

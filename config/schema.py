"""The whole Kelp configuration as one pydantic model tree.

Every model forbids unknown keys (a typo is an error, never a silent default)
and documents each field's unit, default and hazard in its description; those
descriptions feed ``kelp config show --explain`` and the README's reference.
Cross-field rules (a sparse feature must name a known table, a Kafka source
needs brokers...) are checked here, at load time, so a daemon never starts on a
config that would fail later.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = [
    "AdmissionSpec",
    "BatchingConfig",
    "ClipTransform",
    "CsvMapping",
    "DenseFeature",
    "DenseOptimizerSpec",
    "EvictionSpec",
    "FeatureSpec",
    "FileSourceConfig",
    "HotCacheConfig",
    "InitSpec",
    "KafkaConfig",
    "KafkaSecurity",
    "KelpConfig",
    "LabelSpec",
    "Log1pTransform",
    "LoggingConfig",
    "MetricsConfig",
    "PublisherConfig",
    "RedisTls",
    "RetrySpec",
    "ServingConfig",
    "SourceConfig",
    "SparseFeature",
    "SparseOptimizerSpec",
    "StandardizeTransform",
    "StoreConfig",
    "TableSpec",
    "TrainerConfig",
]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
_DEPLOYMENT = re.compile(r"^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$")


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors; assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)


def _identifier(value: str, what: str) -> str:
    if not _IDENT.match(value):
        raise ValueError(
            f"{what} must start with a letter or '_' and use letters, digits, '_', '.', '-' only"
        )
    return value


def _split_csv(value: object) -> object:
    """Allow ``"a:9092,b:9092"`` (handy in env overrides) where a list is expected."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# --------------------------------------------------------------------------- features


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

    @model_validator(mode="after")
    def _one_rule(self) -> Self:
        if self.min_count > 1 and self.probability < 1:
            raise ValueError("admission: set min_count > 1 or probability < 1, not both")
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
        return _identifier(v, "table name")


class TableDefaults(StrictModel):
    """Template for tables that sparse features name but ``tables`` does not list."""

    dim: int = Field(16, ge=1, le=4096)
    dtype: Literal["float32", "float16"] = "float32"
    init: InitSpec = Field(default_factory=InitSpec)
    default_row: Literal["zeros", "init"] = "zeros"
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec)
    eviction: EvictionSpec = Field(default_factory=EvictionSpec)


class SparseFeature(StrictModel):
    """A categorical feature: one id (one-hot) or up to ``max_ids`` ids (multi-hot) per sample."""

    name: str
    table: str | None = Field(
        None, description="Embedding table; defaults to the feature name. Tables may be shared."
    )
    max_ids: int = Field(
        1, ge=1, le=65_536, description="Cap on ids per sample; more is rejected as too_many_ids."
    )
    pooling: Literal["sum", "mean"] = Field("sum", description="How a multi-hot feature's rows are combined.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _identifier(v, "feature name")

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
        return _identifier(v, "feature name")

    @field_validator("transforms", mode="before")
    @classmethod
    def _shorthand(cls, v: object) -> object:
        # Allow `transforms: [log1p]` as well as `[{kind: log1p}]`.
        if isinstance(v, list):
            return [{"kind": t} if isinstance(t, str) else t for t in v]
        return v


class LabelSpec(StrictModel):
    name: str = Field("label", description="Field (or column) holding the label.")
    kind: Literal["binary", "float"] = Field(
        "binary", description="binary: 0/1 clicks; float: any finite value."
    )


class FeatureSpec(StrictModel):
    """What a sample looks like: a label, dense features and sparse features over tables."""

    label: LabelSpec = Field(default_factory=LabelSpec)
    dense: list[DenseFeature] = Field(default_factory=list)
    sparse: list[SparseFeature] = Field(default_factory=list)
    tables: list[TableSpec] = Field(default_factory=list)
    table_defaults: TableDefaults = Field(
        default_factory=TableDefaults,
        description="Used for tables named by a sparse feature but not listed under tables.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
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
        return self

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


# --------------------------------------------------------------------------- sources


class CsvMapping(StrictModel):
    """Maps a CSV file with a header onto the feature spec."""

    label_column: str
    dense_columns: dict[str, str] = Field(default_factory=dict, description="dense feature name -> column.")
    sparse_columns: dict[str, str] = Field(default_factory=dict, description="sparse feature name -> column.")
    sort_by: str | None = Field(None, description="Replay rows in this column's order (e.g. orig_row).")
    delimiter: str = ","


class FileSourceConfig(StrictModel):
    path: Path
    format: Literal["criteo_tsv", "csv", "msgpack"]
    csv: CsvMapping | None = None
    limit: int | None = Field(None, gt=0, description="Stop after this many samples.")

    @model_validator(mode="after")
    def _csv_mapping(self) -> Self:
        if self.format == "csv" and self.csv is None:
            raise ValueError("format 'csv' needs a csv mapping (label_column, dense_columns, sparse_columns)")
        return self


class SourceConfig(StrictModel):
    kind: Literal["kafka", "file"] = Field(
        "file", description="file: the embedded default; kafka: production."
    )
    file: FileSourceConfig | None = None


class KafkaSecurity(StrictModel):
    """Passed through to kafka-python; see its docs for each option."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_password: SecretStr | None = None
    ssl_check_hostname: bool = True

    @model_validator(mode="after")
    def _sasl(self) -> Self:
        if self.protocol.startswith("SASL") and self.sasl_mechanism is None:
            raise ValueError(f"protocol {self.protocol} needs sasl_mechanism")
        if self.sasl_mechanism in {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} and not (
            self.sasl_username and self.sasl_password
        ):
            raise ValueError(f"sasl_mechanism {self.sasl_mechanism} needs sasl_username and sasl_password")
        return self


class KafkaConfig(StrictModel):
    bootstrap_servers: list[str] = Field(
        min_length=1, description="host:port list (or comma-separated string)."
    )
    topics: list[str] = Field(min_length=1, description="Topics the trainer group consumes.")
    group_id: str = Field("kelp-trainer", description="Consumer group; all trainers of one model share it.")
    client_id: str = "kelp"
    dead_letter_topic: str | None = Field(
        "kelp-dead-letter",
        description="Rejected records go here with the reason in headers. None drops them "
        "after counting (hazard: nothing to replay).",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a group with no committed offset starts."
    )
    max_poll_records: int = Field(2000, ge=1)
    fetch_max_bytes: int = Field(52_428_800, ge=1024, description="Bytes per fetch response.")
    max_partition_fetch_bytes: int = Field(1_048_576, ge=1024, description="Bytes per partition per fetch.")
    session_timeout_ms: int = Field(10_000, ge=1000)
    heartbeat_interval_ms: int = Field(3000, ge=100)
    max_poll_interval_ms: int = Field(
        300_000, ge=1000, description="Hazard: the first group join waits up to this long on some brokers."
    )
    max_message_bytes: int = Field(1_048_576, ge=64, description="Larger records are rejected as oversize.")
    incremental_fetch_sessions: bool = Field(
        True,
        description="KIP-227 incremental fetch sessions. Hazard: on the Tansu test broker a consumer that "
        "paused partitions (back-pressure) was seen to stop receiving one; tests and demo turn this off.",
    )
    security: KafkaSecurity = Field(default_factory=KafkaSecurity)

    _split = field_validator("bootstrap_servers", "topics", mode="before")(_split_csv)

    @model_validator(mode="after")
    def _intervals(self) -> Self:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below session_timeout_ms "
                f"({self.session_timeout_ms})"
            )
        return self


class BatchingConfig(StrictModel):
    batch_size: int = Field(4096, ge=1, le=1_048_576, description="Samples per micro-batch (upper bound).")
    max_batch_delay_ms: int = Field(200, ge=0, description="Emit a partial batch after this long.")
    queue_depth: int = Field(4, ge=1, le=1024, description="Micro-batches buffered before fetching pauses.")


# --------------------------------------------------------------------------- store


class RetrySpec(StrictModel):
    attempts: int = Field(5, ge=1, le=100, description="Tries per operation, the first included.")
    base_delay_s: float = Field(0.05, ge=0)
    max_delay_s: float = Field(2.0, ge=0)


class RedisTls(StrictModel):
    enabled: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    check_hostname: bool = True


class HotCacheConfig(StrictModel):
    """FAE-style trainer-side cache of the hottest rows, written back periodically."""

    enabled: bool = False
    capacity_rows: int = Field(100_000, ge=1, description="Rows per trainer across all tables.")
    writeback_every_steps: int = Field(50, ge=1)
    writeback_interval_s: float = Field(5.0, gt=0)
    max_staleness_s: float = Field(
        10.0, gt=0, description="A cached row older than this is re-read from the store before use."
    )


class StoreConfig(StrictModel):
    backend: Literal["memory", "redis", "redis-cluster"] = Field(
        "memory",
        description="memory: in-process (embedded default); redis: client-sharded nodes; "
        "redis-cluster: Redis Cluster seed nodes.",
    )
    urls: list[str] = Field(
        default_factory=list,
        description="redis://host:port[/db] per shard (redis) or seed nodes (redis-cluster).",
    )
    replicas: list[list[str]] = Field(
        default_factory=list, description="Optional read-replica URLs per shard, same order as urls."
    )
    username: str | None = None
    password: SecretStr | None = None
    tls: RedisTls = Field(default_factory=RedisTls)
    socket_timeout_s: float = Field(2.0, gt=0)
    connect_timeout_s: float = Field(2.0, gt=0)
    retry: RetrySpec = Field(default_factory=RetrySpec)
    max_rows_per_command: int = Field(
        2048, ge=1, le=100_000, description="Rows per MGET/MSET chunk inside one pipelined round trip."
    )
    cluster_buckets_per_table: int = Field(
        64,
        ge=1,
        le=16_384,
        description="redis-cluster: hash-tag buckets per table; each bucket's rows travel in one command to "
        "one slot. Hazard: changing it changes every key (rows written before become invisible).",
    )
    hot_cache: HotCacheConfig = Field(default_factory=HotCacheConfig)

    _split = field_validator("urls", mode="before")(_split_csv)

    @model_validator(mode="after")
    def _urls(self) -> Self:
        if self.backend != "memory" and not self.urls:
            raise ValueError(f"backend '{self.backend}' needs at least one url (redis://host:port)")
        for url in self.urls + [u for group in self.replicas for u in group]:
            if not url.startswith(("redis://", "rediss://", "unix://")):
                raise ValueError(f"url {url!r} must start with redis://, rediss:// or unix://")
        if self.replicas and len(self.replicas) != len(self.urls):
            raise ValueError(f"replicas has {len(self.replicas)} groups but urls has {len(self.urls)} shards")
        return self


# --------------------------------------------------------------------------- processes


class SparseOptimizerSpec(StrictModel):
    kind: Literal["rowwise_adagrad"] = "rowwise_adagrad"
    lr: float = Field(0.05, gt=0)
    eps: float = Field(1e-8, gt=0)
    initial_accumulator: float = Field(0.0, ge=0)


class DenseOptimizerSpec(StrictModel):
    kind: Literal["adam", "adagrad", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)


class TrainerConfig(StrictModel):
    model: Literal["dlrm-small", "deepfm", "dcn-v2"] = "dlrm-small"
    bottom_mlp: list[int] = Field(default_factory=lambda: [64, 16], min_length=1)
    top_mlp: list[int] = Field(default_factory=lambda: [256, 64], min_length=1)
    device: str = Field("auto", description="auto (cuda when available, else cpu), cpu, cuda or cuda:N.")
    sparse_optimizer: SparseOptimizerSpec = Field(default_factory=SparseOptimizerSpec)
    dense_optimizer: DenseOptimizerSpec = Field(default_factory=DenseOptimizerSpec)
    checkpoint_dir: Path = Field(Path("runs/checkpoints"), description="Dense checkpoints (safetensors).")
    checkpoint_every_steps: int = Field(500, ge=1)
    checkpoint_every_s: float = Field(60.0, gt=0)
    prefetch_batches: int = Field(
        2, ge=0, le=16, description="Batches whose rows are pulled ahead; 0 = strictly sequential steps."
    )
    push_queue_batches: int = Field(
        2, ge=1, le=16, description="Write-behind depth: trained batches whose pushes may still be in flight."
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Intra-op threads for CPU training. Default: one core fewer than the machine has when "
        "prefetching (the prefetch and push threads need a core), else all.",
    )
    max_store_outage_s: float = Field(
        60.0, gt=0, description="A store outage is retried this long, then the trainer exits non-zero."
    )
    eval_window_batches: int = Field(50, ge=1, description="Window of the windowed progressive AUC.")
    log_every_s: float = Field(10.0, gt=0)
    drain_timeout_s: float = Field(
        30.0, gt=0, description="SIGTERM drain budget; match the pod's grace period."
    )
    max_steps: int | None = Field(None, ge=1, description="Stop after this many steps (demos, tests).")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v in {"auto", "cpu", "cuda"} or re.fullmatch(r"cuda:\d+", v):
            return v
        raise ValueError("expected auto, cpu, cuda or cuda:N")


class PublisherConfig(StrictModel):
    enabled: bool = Field(True, description="Publish dense snapshots for serving (off: a trainer only).")
    channel: Literal["redis", "filesystem"] = "redis"
    interval_s: float = Field(5.0, gt=0, description="Seconds between dense snapshots.")
    keep_versions: int = Field(5, ge=1, description="Older snapshots are deleted.")
    redis_url: str | None = Field(None, description="Defaults to the store's first url.")
    path: Path | None = Field(None, description="Directory for channel=filesystem.")

    @model_validator(mode="after")
    def _path(self) -> Self:
        if self.channel == "filesystem" and self.path is None:
            raise ValueError("channel 'filesystem' needs path")
        return self


class ServingConfig(StrictModel):
    host: str = "0.0.0.0"
    port: int = Field(8080, ge=1, le=65_535)
    workers: int = Field(1, ge=1, le=64)
    max_samples_per_request: int = Field(1024, ge=1)
    max_ids_per_feature: int = Field(256, ge=1)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    local_cache_ttl_ms: int = Field(
        0, ge=0, description="Serving-side row cache; 0 = off. Hazard: rows can be this much staler."
    )
    poll_interval_s: float = Field(5.0, gt=0, description="Fallback poll for new model versions.")


class MetricsConfig(StrictModel):
    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = Field(9400, ge=1, le=65_535, description="/metrics, /healthz and /readyz of the trainer.")


class LoggingConfig(StrictModel):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"


# --------------------------------------------------------------------------- root


class KelpConfig(StrictModel):
    """The root of a Kelp config file."""

    version: Literal[1] = Field(1, description="Config format version.")
    deployment: str = Field(
        "kelp", description="Namespace for Redis keys and snapshots; two deployments never share rows."
    )
    features: FeatureSpec = Field(default_factory=FeatureSpec)
    source: SourceConfig = Field(default_factory=SourceConfig)
    kafka: KafkaConfig | None = None
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    publisher: PublisherConfig = Field(default_factory=PublisherConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @field_validator("deployment")
    @classmethod
    def _deployment(cls, v: str) -> str:
        if not _DEPLOYMENT.match(v):
            raise ValueError(
                "expected 1-64 lowercase letters, digits or '-', not starting or ending with '-'"
            )
        return v

    @model_validator(mode="after")
    def _source(self) -> Self:
        if self.source.kind == "kafka" and self.kafka is None:
            raise ValueError("source.kind is 'kafka' but there is no kafka section")
        if self.source.kind == "file" and self.source.file is None:
            raise ValueError("source.kind is 'file' but source.file is missing")
        return self

"""Where samples come from: ``source`` (a Kafka topic or a file, one discriminated union) and ``batching``.

``source.kind`` picks the model, and each kind carries only its own settings::

    source: {kind: kafka, bootstrap_servers: [b1:9092], topics: [events], group_id: kelp-trainer}
    source: {kind: file, path: data/train.tsv, format: criteo_tsv}

:func:`kelp.consumers.build_source` takes this slice (plus the feature spec and
``batching``) and nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator

from kelp.config.base import StrictModel, split_csv

__all__ = [
    "BatchingConfig",
    "CsvJoin",
    "CsvMapping",
    "FileSourceConfig",
    "FlagColumns",
    "KafkaSecurity",
    "KafkaSourceConfig",
    "SourceConfig",
]


class CsvJoin(StrictModel):
    """Columns from a second delimited file, looked up by key (e.g. MovieLens ``u.item``: item -> genres).

    The joined file is read into memory once; its columns (all but ``key``)
    can then be mapped like the main file's. A row whose key is not in the
    joined file reads those columns as missing.
    """

    path: Path = Field(description="The file to join; relative paths are relative to the config file.")
    column: str = Field(description="Column of the main file that holds the key.")
    key: str | None = Field(None, description="Column of the joined file to match; default: the same name.")
    delimiter: str = ","
    columns: list[str] | None = Field(
        None, min_length=1, description="Column names when the joined file has no header row."
    )
    encoding: str = Field("utf-8", description="Text encoding of the joined file (e.g. latin-1).")

    @property
    def key_column(self) -> str:
        return self.key or self.column


class FlagColumns(StrictModel):
    """A sparse feature read from 0/1 indicator columns: its ids are the names of the columns set to 1.

    MovieLens marks each film's genres with 19 such columns. The ids are the
    column names, hashed like any string id.
    """

    columns: list[str] = Field(min_length=1, description="The indicator columns, in priority order.")
    take: Literal["first", "all"] = Field(
        "first",
        description="first: only the first column set to 1 (one id); all: every such column "
        "(multi-hot: give the feature max_ids >= the number of columns).",
    )


class CsvMapping(StrictModel):
    """Maps a delimited text file (with or without a header row) onto the feature spec.

    Id parsing: a value of ASCII digits only is the integer id itself (it must
    be below 2**64, else the row is rejected as ``bad_id``); any other value
    (``-3``, ``0x1f``, ``12.0``, ``alice``) is a string id, hashed with
    xxh3_64 like string ids in events. An empty value is a missing feature.
    """

    label_column: str
    label_threshold: float | None = Field(
        None,
        description="Binary label from a numeric column: 1 when the value is >= this, else 0 (e.g. "
        "rating >= 4 as implicit feedback). None: the column holds the label itself.",
    )
    dense_columns: dict[str, str] = Field(default_factory=dict, description="dense feature name -> column.")
    sparse_columns: dict[str, str] = Field(default_factory=dict, description="sparse feature name -> column.")
    flag_columns: dict[str, FlagColumns] = Field(
        default_factory=dict, description="sparse feature name -> 0/1 indicator columns (see FlagColumns)."
    )
    event_time_column: str | None = Field(
        None, description="Column with the event's unix time in seconds (the sample's ts)."
    )
    sort_by: str | None = Field(None, description="Replay rows in this column's order (e.g. orig_row).")
    delimiter: str = ","
    columns: list[str] | None = Field(
        None, min_length=1, description="Column names when the file has no header row (MovieLens u.data)."
    )
    encoding: str = Field("utf-8", description="Text encoding of the file.")
    joins: list[CsvJoin] = Field(default_factory=list, description="Columns looked up in other files by key.")

    @model_validator(mode="after")
    def _one_source_per_feature(self) -> Self:
        both = sorted(set(self.sparse_columns) & set(self.flag_columns))
        if both:
            raise ValueError(f"feature(s) {', '.join(both)} in both sparse_columns and flag_columns")
        return self


class FileSourceConfig(StrictModel):
    """``source.kind: file``: replay a file (the embedded default; demos, backfills, tests)."""

    kind: Literal["file"] = "file"
    path: Path = Field(description="The file to replay; relative paths are relative to the config file.")
    format: Literal["criteo_tsv", "csv", "msgpack"] = Field(
        description="criteo_tsv: Criteo's label + 13 ints + 26 hex ids; csv: with a csv mapping; "
        "msgpack: a log of schema-v1 event records."
    )
    csv: CsvMapping | None = None
    limit: int | None = Field(None, gt=0, description="Stop after this many samples.")

    @model_validator(mode="after")
    def _csv_mapping(self) -> Self:
        if self.format == "csv" and self.csv is None:
            raise ValueError("format 'csv' needs a csv mapping (label_column, dense_columns, sparse_columns)")
        return self


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


class KafkaSourceConfig(StrictModel):
    """``source.kind: kafka``: a consumer group on Kafka topics (production)."""

    kind: Literal["kafka"] = "kafka"
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

    _split = field_validator("bootstrap_servers", "topics", mode="before")(split_csv)

    @model_validator(mode="after")
    def _intervals(self) -> Self:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below session_timeout_ms "
                f"({self.session_timeout_ms})"
            )
        return self


SourceConfig = Annotated[KafkaSourceConfig | FileSourceConfig, Field(discriminator="kind")]
"""``source``: :class:`KafkaSourceConfig` or :class:`FileSourceConfig`, picked by ``kind``."""


class BatchingConfig(StrictModel):
    batch_size: int = Field(4096, ge=1, le=1_048_576, description="Samples per micro-batch (upper bound).")
    max_batch_delay_ms: int = Field(200, ge=0, description="Emit a partial batch after this long.")
    queue_depth: int = Field(4, ge=1, le=1024, description="Micro-batches buffered before fetching pauses.")

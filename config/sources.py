"""Where samples come from: ``source`` (a Kafka topic or a file, one discriminated union) and ``batching``.

``source.kind`` picks the model, and each kind carries only its own settings::

    source: {kind: kafka, bootstrap_servers: [b1:9092], topics: [events], group_id: kelp-trainer}
    source: {kind: file, path: data/train.tsv, format: criteo_tsv}
    source: {kind: kafka, ..., format: json, json: {label_field: clicked, sparse_fields: {user: user.id}}}
    source: {kind: kafka, topics: [raw, joined], format: json, topic_formats: {joined: msgpack}, json: ...}

:func:`kelp.consumers.build_source` takes this slice (plus the feature spec and
``batching``) and nothing else.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from kelp.config.base import StrictModel, decoder_ref, kafka_topic, split_csv
from kelp.config.json_mapping import JsonMapping

__all__ = [
    "BatchingConfig",
    "CsvJoin",
    "CsvMapping",
    "FileSourceConfig",
    "FlagColumns",
    "JsonMapping",
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

    Id parsing follows the one id rule of every source (:mod:`kelp.consumers.ids`):
    a value of ASCII digits only below 2**64 is that integer id; any other value
    (``-3``, ``0x1f``, ``12.0``, ``alice``, digits of 2**64 and beyond) is a
    string id, hashed with xxh3_64. An empty value is a missing feature.

    With several labels (``features.labels``) ``label_column`` is the first
    task's and ``label_columns`` names the column of every later task, as the
    JSON mapping's ``labels`` does; ``weight_column`` gives each row a weight.
    """

    label_column: str = Field(description="Column of the label; with features.labels, the first task's.")
    label_threshold: float | None = Field(
        None,
        description="Binary label from a numeric column: 1 when the value is >= this, else 0 (e.g. "
        "rating >= 4 as implicit feedback). None: the column holds the label itself. Applies to "
        "label_column only, never to label_columns.",
    )
    label_columns: dict[str, str] = Field(
        default_factory=dict,
        description="features.labels: each task after the first -> the column of its label (read as is).",
    )
    weight_column: str | None = Field(
        None, description="Column of the sample weight (a finite number >= 0); None or an empty cell: 1."
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

    # ``json`` would shadow BaseModel.json: the field is json_mapping, written ``json`` in configs.
    model_config = ConfigDict(**StrictModel.model_config, validate_by_name=True, serialize_by_alias=True)

    kind: Literal["file"] = "file"
    path: Path = Field(description="The file to replay; relative paths are relative to the config file.")
    format: Literal["criteo_tsv", "csv", "msgpack", "json"] = Field(
        description="criteo_tsv: Criteo's label + 13 ints + 26 hex ids; csv: with a csv mapping; "
        "msgpack: a log of schema-v1 event records; json: JSON Lines (one object a line) with a json mapping."
    )
    csv: CsvMapping | None = None
    json_mapping: JsonMapping | None = Field(
        None, alias="json", description="format json: where each field of an object is (see JsonMapping)."
    )
    limit: int | None = Field(None, gt=0, description="Stop after this many samples.")

    @model_validator(mode="after")
    def _csv_mapping(self) -> Self:
        if self.format == "csv" and self.csv is None:
            raise ValueError("format 'csv' needs a csv mapping (label_column, dense_columns, sparse_columns)")
        if self.format == "json" and self.json_mapping is None:
            raise ValueError("format 'json' needs a json mapping (label_field, dense_fields, sparse_fields)")
        if self.format != "json" and self.json_mapping is not None:
            raise ValueError(f"a json mapping is read only with format 'json', not {self.format!r}")
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
        # The credentials themselves are checked by the processes that connect (preflight), so a
        # serving pod that never talks to Kafka needs no Kafka secret.
        if self.protocol.startswith("SASL") and self.sasl_mechanism is None:
            raise ValueError(f"protocol {self.protocol} needs sasl_mechanism")
        return self

    def missing_credentials(self) -> str | None:
        """What a connection with these settings lacks (None: nothing), for the processes that connect."""
        if self.sasl_mechanism in {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} and not (
            self.sasl_username and self.sasl_password
        ):
            return f"sasl_mechanism {self.sasl_mechanism} needs sasl_username and sasl_password"
        return None


class KafkaSourceConfig(StrictModel):
    """``source.kind: kafka``: a consumer group on Kafka topics (production)."""

    # ``json`` would shadow BaseModel.json: the field is json_mapping, written ``json`` in configs.
    model_config = ConfigDict(**StrictModel.model_config, validate_by_name=True, serialize_by_alias=True)

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
        "after counting (hazard: nothing to replay). A record too big for the dead-letter producer is "
        "sent truncated, with headers truncated and original_size.",
    )
    max_initial_reject_fraction: float | None = Field(
        0.99,
        gt=0.0,
        le=1.0,
        description="Stop (exit 2, nothing committed) when at least this share of the first "
        "initial_check_records records read from a partition is rejected: a topic of the wrong format "
        "would otherwise be dead-lettered and committed whole. None: no check. Hazard: records of a "
        "partition are held back until the check decides (at most initial_check_records, or until the "
        "partition is caught up); on a slow topic records released before the check completes commit.",
    )
    initial_check_records: int = Field(
        100,
        ge=1,
        le=100_000,
        description="Records per partition the max_initial_reject_fraction check reads before deciding.",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a group with no committed offset starts."
    )
    start_from: str = Field(
        "committed",
        description="Where each partition starts the first time this process is assigned it. committed: "
        "the group's committed offset, else auto_offset_reset. earliest / latest: the partition's first "
        "record / its end. A time, ISO-8601 with a zone (2024-05-01T00:00:00Z) or epoch milliseconds: "
        "the first record whose timestamp is at or after it, or the end when none is. Commits then go on "
        "as usual. Hazard: it applies at every start of the process, so a restart with it still set "
        "replays (or skips) again; set it back to committed once the new position is committed.",
    )
    group_instance_id: str | None = Field(
        None,
        description="KIP-345 static membership: a member that restarts under the same id within "
        "session_timeout_ms gets its partitions back and nobody's partitions move. In a trainer group of "
        "several ranks each rank appends -<RANK>. None: dynamic membership (every restart rebalances). "
        "Hazard: two live consumers with one id fence each other; a static member that is gone for good "
        "keeps its partitions idle until session_timeout_ms passes (it never leaves the group).",
    )
    partition_assignment: Literal["cooperative-sticky", "sticky", "range", "roundrobin"] = Field(
        "cooperative-sticky",
        description="Partition assignor. cooperative-sticky (KIP-429): a rebalance revokes only the "
        "partitions that move, the others keep being read. sticky, range, roundrobin: eager, every "
        "rebalance revokes every partition first. Hazard: all members of a group need a common assignor; "
        "changing between cooperative and eager in a running group needs every member stopped first "
        "(a new member cannot join a group whose members share no assignor with it).",
    )
    max_poll_records: int = Field(2000, ge=1)
    fetch_max_bytes: int = Field(52_428_800, ge=1024, description="Bytes per fetch response.")
    max_partition_fetch_bytes: int = Field(1_048_576, ge=1024, description="Bytes per partition per fetch.")
    session_timeout_ms: int = Field(10_000, ge=1000)
    heartbeat_interval_ms: int = Field(3000, ge=100)
    max_poll_interval_ms: int = Field(
        300_000, ge=1000, description="Hazard: the first group join waits up to this long on some brokers."
    )
    metadata_max_age_ms: int = Field(
        30_000,
        ge=100,
        description="Longest time between two refreshes of the topics' metadata (ms). Partitions added to "
        "a topic are read only after a refresh shows them, so this bounds how long new partitions sit "
        "unread (kafka-python's own default is 5 min). A deleted or recreated topic is usually seen "
        "sooner, through fetch errors. Hazard: each refresh is one request per consumer; very low values "
        "add load on large groups.",
    )
    max_message_bytes: int = Field(1_048_576, ge=64, description="Larger records are rejected as oversize.")
    reconnect_backoff_max_ms: int = Field(
        1000,
        ge=50,
        description="Longest wait between reconnects to a broker that went away. kafka-python's own "
        "default (30 s) left a trainer idle for most of that after a broker came back within seconds; "
        "1 s is the Java client's default.",
    )
    incremental_fetch_sessions: bool = Field(
        True,
        description="KIP-227 incremental fetch sessions. Hazard: on the Tansu test broker a consumer that "
        "paused partitions (back-pressure) was seen to stop receiving one; tests and demo turn this off.",
    )
    security: KafkaSecurity = Field(default_factory=KafkaSecurity)
    format: Literal["msgpack", "json"] = Field(
        "msgpack",
        description="msgpack: schema-v1 events; json: one JSON object per record, read by the json mapping. "
        "Ignored when a decoder is set. A topic listed in topic_formats is read in its own format.",
    )
    topic_formats: dict[str, Literal["msgpack", "json"]] = Field(
        default_factory=dict,
        description="Topics read in another format than the others: topic -> msgpack or json, e.g. "
        "{events-joined: msgpack} so a format json trainer also reads the schema-v1 msgpack events kelp "
        "join writes. Every key must be in topics; a json topic needs the json mapping. Topics not "
        "listed are read by format, or by the decoder when one is set.",
    )
    json_mapping: JsonMapping | None = Field(
        None,
        alias="json",
        description="format json or a decoder: where each field of a sample is (see JsonMapping).",
    )
    decoder: str | None = Field(
        None,
        description="A plug-in decoder for any other format, package.module:attr on the Python path: "
        "attr(spec, **decoder_args) returns an object whose decode(value) -> dict gives a sample that the "
        "json mapping reads (docs/consumers.md). Hazard: it runs in the poll thread, on every record.",
    )
    decoder_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the decoder (a schema, a path...); relative paths are the "
        "decoder's to resolve, from the working directory.",
    )

    _split = field_validator("bootstrap_servers", "topics", mode="before")(split_csv)
    _decoder = field_validator("decoder")(decoder_ref)

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, value: list[str]) -> list[str]:
        for i, name in enumerate(value):
            try:
                kafka_topic(name)
            except ValueError as exc:
                raise ValueError(f"topics[{i}] {name!r}: {exc}") from None
        return value

    @field_validator("topic_formats")
    @classmethod
    def _formats_of_read_topics(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        topics = info.data.get("topics")
        if topics is None:  # topics itself was refused; that error says enough
            return value
        for name in value:
            if name not in topics:
                raise ValueError(
                    f"{name!r} is not in source.topics ({', '.join(topics)}): a format is given only "
                    "for a topic the source reads; add the topic to source.topics or drop the entry"
                )
        return value

    @field_validator("dead_letter_topic")
    @classmethod
    def _dead_letter_name(cls, value: str | None) -> str | None:
        return None if value is None else kafka_topic(value)

    @field_validator("start_from", mode="before")
    @classmethod
    def _start_from(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str):
            text = value.strip()
            if text in _START_KEYWORDS or start_timestamp_ms(text) is not None:
                return text
        raise ValueError(
            "expected committed, earliest, latest, an ISO-8601 time with a zone, or epoch milliseconds"
        )

    @field_validator("group_instance_id")
    @classmethod
    def _instance_id(cls, value: str | None) -> str | None:
        return None if value is None else check_instance_id(value)

    @property
    def start_timestamp_ms(self) -> int | None:
        """``start_from`` as epoch milliseconds when it is a time; None for the keywords."""
        return start_timestamp_ms(self.start_from)

    def for_rank(self, rank: int, world_size: int) -> KafkaSourceConfig:
        """This rank's copy: in a group of several ranks the static member id gets ``-<rank>``.

        Ranks share one config (and, under torchrun on one host, one environment),
        but two live consumers with one ``group.instance.id`` fence each other, so
        each rank needs its own. torchrun's global rank is unique in the group
        whichever host a rank runs on.
        """
        if self.group_instance_id is None or world_size <= 1:
            return self
        member = f"{self.group_instance_id}-{rank}"
        try:
            check_instance_id(member)
        except ValueError as exc:
            raise ValueError(f"source.group_instance_id: rank {rank}'s id {member!r}: {exc}") from None
        return self.model_copy(update={"group_instance_id": member})

    @model_validator(mode="after")
    def _intervals(self) -> Self:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below session_timeout_ms "
                f"({self.session_timeout_ms})"
            )
        return self

    @model_validator(mode="after")
    def _record_format(self) -> Self:
        if self.decoder is not None:
            if self.format == "json":
                raise ValueError(
                    "decoder and format 'json' exclude each other: the decoder reads the records"
                )
            if self.json_mapping is None:
                raise ValueError("a decoder needs a json mapping (label_field, dense_fields, sparse_fields)")
            if all(topic in self.topic_formats for topic in self.topics):
                raise ValueError(
                    "decoder: every topic has its own format in topic_formats, so the decoder reads none; "
                    "drop the decoder or a topic's topic_formats entry"
                )
        elif self.decoder_args:
            raise ValueError("decoder_args given without a decoder")
        json_topics = [t for t in self.topics if self.topic_format(t) == "json"]
        if json_topics and self.json_mapping is None:
            listed = f"topic_formats json ({', '.join(json_topics)})"
            which = "format 'json'" if self.format == "json" else listed
            raise ValueError(f"{which} needs a json mapping (label_field, dense_fields, sparse_fields)")
        if self.json_mapping is not None and not self.mapped:
            raise ValueError(
                "a json mapping is read only with format 'json' or a decoder (or a json topic in "
                "topic_formats)"
            )
        return self

    def topic_format(self, topic: str) -> Literal["msgpack", "json", "decoder"]:
        """How ``topic``'s records are read: its topic_formats entry, else the decoder if set, else format."""
        listed = self.topic_formats.get(topic)
        if listed is not None:
            return listed
        return "decoder" if self.decoder is not None else self.format

    def format_origin(self, topic: str) -> str:
        """Which setting gives ``topic`` its format, as a person would look for it in the config."""
        if topic in self.topic_formats:
            return f"topic_formats {self.topic_formats[topic]}"
        if self.decoder is not None:
            return f"decoder {self.decoder}"
        return f"format {self.format}"

    @property
    def mapped(self) -> bool:
        """Whether any topic's records are JSON or plug-in samples read through the json mapping."""
        return any(self.topic_format(t) != "msgpack" for t in self.topics)


_START_KEYWORDS = ("committed", "earliest", "latest")
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9._-]+$")
_INSTANCE_ID_MAX = 249  # the broker's limit (JoinGroupRequest.validateGroupInstanceId)


def start_timestamp_ms(value: str) -> int | None:
    """Epoch milliseconds from ``"1714521600000"`` or an ISO-8601 time with a zone; None otherwise.

    A time without a zone is refused (None): read on hosts in different zones it
    would name different instants.

    >>> start_timestamp_ms("2024-05-01T00:00:00Z"), start_timestamp_ms("1714521600000")
    (1714521600000, 1714521600000)
    >>> start_timestamp_ms("2024-05-01T00:00:00") is None
    True
    """
    if value.isascii() and value.isdigit():
        return int(value)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None or when.utcoffset() is None:
        return None
    ms = int(when.timestamp() * 1000)
    return ms if ms >= 0 else None  # Kafka timestamps start at the epoch


def check_instance_id(value: str) -> str:
    """``value`` if the broker accepts it as a ``group.instance.id``, else a ValueError saying why."""
    if not value or value in {".", ".."}:
        raise ValueError("expected a non-empty id other than '.' or '..'")
    if len(value) > _INSTANCE_ID_MAX:
        raise ValueError(f"expected at most {_INSTANCE_ID_MAX} characters, got {len(value)}")
    if not _INSTANCE_ID.match(value):
        raise ValueError("expected letters, digits, '.', '_' and '-' only (Kafka's rule for instance ids)")
    return value


SourceConfig = Annotated[KafkaSourceConfig | FileSourceConfig, Field(discriminator="kind")]
"""``source``: :class:`KafkaSourceConfig` or :class:`FileSourceConfig`, picked by ``kind``."""


class BatchingConfig(StrictModel):
    batch_size: int = Field(4096, ge=1, le=1_048_576, description="Samples per micro-batch (upper bound).")
    max_batch_delay_ms: int = Field(200, ge=0, description="Emit a partial batch after this long.")
    queue_depth: int = Field(4, ge=1, le=1024, description="Micro-batches buffered before fetching pauses.")

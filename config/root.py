"""The root of a Kelp config file: one section per room, and the rules that span sections."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from kelp.config.base import StrictModel
from kelp.config.features import FeatureSpec
from kelp.config.join import JoinConfig
from kelp.config.processes import LoggingConfig, MetricsConfig, PublisherConfig, ServingConfig
from kelp.config.snapshots import SnapshotsConfig
from kelp.config.sources import BatchingConfig, KafkaSourceConfig, SourceConfig
from kelp.config.store import StoreConfig
from kelp.config.trainer import TrainerConfig

__all__ = ["CONFIG_VERSION", "KelpConfig"]

CONFIG_VERSION = 2
"""Layout version of the config file. Version 2 moved ``kafka:`` and ``source.file:`` into ``source``."""

_DEPLOYMENT = re.compile(r"^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$")


class KelpConfig(StrictModel):
    """The root of a Kelp config file.

    Each process hands each builder only its own slice: ``source`` and
    ``batching`` to the consumers, ``store`` to the store, ``trainer`` to the
    trainer, ``publisher``/``serving`` to their processes; ``features`` is the
    one slice everyone reads.
    """

    version: Literal[2] = Field(CONFIG_VERSION, description="Config layout version.")
    deployment: str = Field(
        "kelp", description="Namespace for Redis keys and snapshots; two deployments never share rows."
    )
    features: FeatureSpec = Field(default_factory=FeatureSpec)
    source: SourceConfig = Field(description="kind: kafka (production) or kind: file (embedded default).")
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    publisher: PublisherConfig = Field(default_factory=PublisherConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)
    join: JoinConfig = Field(default_factory=JoinConfig)
    snapshots: SnapshotsConfig = Field(default_factory=SnapshotsConfig)
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
    def _checkpoints_per_deployment(self) -> Self:
        if self.trainer.checkpoint_dir is None:
            self.trainer.checkpoint_dir = Path("runs") / self.deployment / "checkpoints"
        return self

    @model_validator(mode="after")
    def _request_log_has_brokers(self) -> Self:
        if self.serving.request_log.enabled and self.source.kind != "kafka":
            raise ValueError(
                "serving.request_log.enabled: the request log goes to the source's Kafka brokers, but "
                f"source.kind is {self.source.kind!r}; use a kafka source, or turn the request log off"
            )
        return self

    @model_validator(mode="after")
    def _join_names_known_tasks_and_features(self) -> Self:
        tasks = [t.name for t in self.features.tasks]
        for i, action in enumerate(self.join.actions):
            if action.task not in tasks:
                raise ValueError(
                    f"join.actions[{i}].task: {action.task!r} is not a label of features.labels "
                    f"(expected one of {', '.join(tasks)})"
                )
            if action.item_field is not None and self.join.item_feature is None:
                raise ValueError(
                    f"join.actions[{i}].item_field: matching an item needs join.item_feature, the sparse "
                    "feature that names each candidate"
                )
        sparse = [f.name for f in self.features.sparse]
        if self.join.item_feature is not None and self.join.item_feature not in sparse:
            raise ValueError(
                f"join.item_feature: {self.join.item_feature!r} is not a sparse feature "
                f"(expected one of {', '.join(sparse) or 'none configured'})"
            )
        if self.join.actions:
            missing = [t for t in tasks if t not in self.join.windows()]
            if missing:
                raise ValueError(
                    f"join.actions: no action topic for task(s) {', '.join(missing)}; every label needs one, "
                    "or its events would never be labelled"
                )
        return self

    @property
    def join_output_topic(self) -> str | None:
        """Where ``kelp join`` writes: ``join.output_topic``, else the source's first topic (None: none)."""
        if self.join.output_topic is not None:
            return self.join.output_topic
        return self.source.topics[0] if isinstance(self.source, KafkaSourceConfig) else None

    @model_validator(mode="after")
    def _join_writes_what_the_source_reads(self) -> Self:
        """Refuse a join whose schema-v1 msgpack output this config's trainer would read as JSON.

        The trainer would reject every labelled event as bad_payload, dead-letter it and commit past
        it: the labels would be lost without a stop. Checked only when the join is configured
        (actions or an output_topic), so a JSON trainer that runs no join is not refused.
        """
        source = self.source
        topic = self.join_output_topic
        in_use = bool(self.join.actions) or self.join.output_topic is not None
        if not in_use or not isinstance(source, KafkaSourceConfig) or topic not in source.topics:
            return self
        fmt = source.topic_format(topic)
        if fmt == "msgpack":
            return self
        default = "" if self.join.output_topic is not None else " (unset: source.topics[0])"
        origin = source.format_origin(topic)
        reader = f"as json by source ({origin})" if fmt == "json" else f"by source.decoder {source.decoder}"
        named = topic if self.join.output_topic is not None else "<topic>"
        raise ValueError(
            f"join.output_topic: {topic!r}{default} is read {reader}; "
            "kelp join writes schema-v1 msgpack: set join.output_topic to a msgpack topic and list it in "
            f"source.topics with source.topic_formats {{{named}: msgpack}}"
        )

    @model_validator(mode="after")
    def _publisher_has_a_channel(self) -> Self:
        pub = self.publisher
        if (
            pub.enabled
            and pub.channel == "redis"
            and pub.redis_url is None
            and self.store.backend == "memory"
        ):
            # A cross-section rule: the message starts with the field it is about (see the loader).
            raise ValueError(
                "publisher.channel: 'redis' needs a Redis, but store.backend is 'memory' and "
                "publisher.redis_url is not set; set publisher.redis_url, or publisher.channel: filesystem "
                "with publisher.path"
            )
        return self

"""Config-driven construction: the trainer calls :func:`build_source` with its ``source`` slice."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from kelp.config import BatchingConfig, FeatureSpec, KafkaSourceConfig, SourceConfig
from kelp.consumers.base import Source

__all__ = ["build_source"]


def build_source(
    source: SourceConfig,
    features: FeatureSpec,
    batching: BatchingConfig,
    registry: CollectorRegistry | None = None,
    consumer_overrides: dict[str, Any] | None = None,
) -> Source:
    """A :class:`~kelp.consumers.kafka_source.KafkaSource` or :class:`~kelp.consumers.file_source.FileSource`.

    ``source.kind`` picks it; ``features`` and ``batching`` shape the batches.
    ``consumer_overrides`` go to kafka-python's consumer (tests shorten timeouts).
    """
    if isinstance(source, KafkaSourceConfig):
        from kelp.consumers.kafka_source import KafkaSource

        return KafkaSource(source, features, batching, registry, consumer_overrides=consumer_overrides)
    from kelp.consumers.file_source import FileSource

    return FileSource(source, features, batching, registry)

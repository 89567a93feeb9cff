"""Config-driven construction: the trainer calls :func:`build_source` and gets the right source."""

from __future__ import annotations

from typing import Any

from kelp.config import KelpConfig
from kelp.consumers.base import Source
from prometheus_client import CollectorRegistry

from kelp.errors import ConfigError

__all__ = ["build_source"]


def build_source(
    cfg: KelpConfig,
    registry: CollectorRegistry | None = None,
    consumer_overrides: dict[str, Any] | None = None,
) -> Source:
    """A :class:`~kelp.consumers.kafka_source.KafkaSource` or :class:`~kelp.consumers.file_source.FileSource`.

    ``source.kind`` picks it; ``cfg.features`` and ``cfg.batching`` shape the batches.
    """
    if cfg.source.kind == "kafka":
        if cfg.kafka is None:
            raise ConfigError("source.kind is 'kafka' but there is no kafka section")
        from kelp.consumers.kafka_source import KafkaSource

        return KafkaSource(
            cfg.kafka, cfg.features, cfg.batching, registry, consumer_overrides=consumer_overrides
        )
    if cfg.source.file is None:
        raise ConfigError("source.kind is 'file' but source.file is missing")
    from kelp.consumers.file_source import FileSource

    return FileSource(cfg.source.file, cfg.features, cfg.batching, registry)

"""Kelp's configuration: one pydantic model tree, loaded from YAML with ``KELP_...`` env overrides.

Use :func:`load_config` in processes; it raises :class:`~kelp.errors.ConfigError`
with one line per problem, each naming the field, the given value and what was
expected.
"""

from kelp.config.loader import apply_env_overrides, format_validation_error, load_config, parse_config
from kelp.config.redact import effective_config
from kelp.config.schema import (
    FeatureSpec,
    KafkaConfig,
    KelpConfig,
    SparseFeature,
    StoreConfig,
    TableSpec,
)

__all__ = [
    "FeatureSpec",
    "KafkaConfig",
    "KelpConfig",
    "SparseFeature",
    "StoreConfig",
    "TableSpec",
    "apply_env_overrides",
    "effective_config",
    "format_validation_error",
    "load_config",
    "parse_config",
]

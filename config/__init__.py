"""Kelp's configuration: one pydantic model tree, loaded from YAML with ``KELP_...`` env overrides.

Use :func:`load_config` in processes; it raises :class:`~kelp.errors.ConfigError`
with one line per problem, each naming the field, the given value and what was
expected. Every config model is importable from here; each room's slice lives in
its own module:

* :mod:`~kelp.config.features`: label, dense and sparse features, tables (admission, eviction);
* :mod:`~kelp.config.sources`: ``source`` (kafka | file) and ``batching``;
* :mod:`~kelp.config.store`: the embedding store and its hot-row cache;
* :mod:`~kelp.config.trainer`: model, optimizers, checkpoints, pipeline;
* :mod:`~kelp.config.processes`: publisher, serving, metrics, logging;
* :mod:`~kelp.config.join`: ``kelp join`` (impressions and actions to labelled events);
* :mod:`~kelp.config.root`: :class:`KelpConfig` and the rules that span sections.
"""

from kelp.config.features import (
    FALLBACK_SUFFIX,
    AdmissionSpec,
    ClipTransform,
    DenseFeature,
    DenseTransform,
    EvictionSpec,
    FeatureSpec,
    InitSpec,
    LabelSpec,
    Log1pTransform,
    SparseFeature,
    StandardizeTransform,
    TableDefaults,
    TableSpec,
)
from kelp.config.join import ActionStream, JoinConfig
from kelp.config.loader import apply_env_overrides, format_validation_error, load_config, parse_config
from kelp.config.processes import (
    LoggingConfig,
    MetricsConfig,
    PublisherConfig,
    RequestLogConfig,
    ServingConfig,
)
from kelp.config.redact import effective_config
from kelp.config.root import CONFIG_VERSION, KelpConfig
from kelp.config.sources import (
    BatchingConfig,
    CsvJoin,
    CsvMapping,
    FileSourceConfig,
    FlagColumns,
    JsonMapping,
    KafkaSecurity,
    KafkaSourceConfig,
    SourceConfig,
)
from kelp.config.store import HotCacheConfig, RedisTls, RetrySpec, RowLayoutSpec, StoreConfig
from kelp.config.trainer import (
    MODEL_NAMES,
    DenseOptimizerSpec,
    DistributedConfig,
    SparseOptimizerSpec,
    TrainerConfig,
)

__all__ = [
    "CONFIG_VERSION",
    "FALLBACK_SUFFIX",
    "MODEL_NAMES",
    "ActionStream",
    "AdmissionSpec",
    "BatchingConfig",
    "ClipTransform",
    "CsvJoin",
    "CsvMapping",
    "DenseFeature",
    "DenseOptimizerSpec",
    "DenseTransform",
    "DistributedConfig",
    "EvictionSpec",
    "FeatureSpec",
    "FileSourceConfig",
    "FlagColumns",
    "HotCacheConfig",
    "InitSpec",
    "JoinConfig",
    "JsonMapping",
    "KafkaSecurity",
    "KafkaSourceConfig",
    "KelpConfig",
    "LabelSpec",
    "Log1pTransform",
    "LoggingConfig",
    "MetricsConfig",
    "PublisherConfig",
    "RedisTls",
    "RequestLogConfig",
    "RetrySpec",
    "RowLayoutSpec",
    "ServingConfig",
    "SourceConfig",
    "SparseFeature",
    "SparseOptimizerSpec",
    "StandardizeTransform",
    "StoreConfig",
    "TableDefaults",
    "TableSpec",
    "TrainerConfig",
    "apply_env_overrides",
    "effective_config",
    "format_validation_error",
    "load_config",
    "parse_config",
]

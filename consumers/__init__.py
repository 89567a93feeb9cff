"""Kafka and file sources: event schema v1, decoding, validation, dead letters, micro-batches.

The trainer needs three names: :func:`build_source` (config -> source),
:class:`Source` (iterate batches, ``commit`` when durable, ``close``) and
:class:`MicroBatch` (the one batch type; its docstring draws the layout).
:func:`criteo_feature_spec` describes the Criteo format (the synthetic benchmark stream lives in
``kelp.bench.synth``).
"""

from kelp.consumers.base import Source
from kelp.consumers.batch import JaggedIds, MicroBatch, SourceRange, TableIds, dedup_ids
from kelp.consumers.build import build_source
from kelp.consumers.codec import REASONS, SCHEMA_VERSION, encode_columns, encode_sample, hash_str_id
from kelp.consumers.criteo import criteo_feature_spec
from kelp.consumers.plugin_decoder import DecodeError

__all__ = [
    "REASONS",
    "SCHEMA_VERSION",
    "DecodeError",
    "JaggedIds",
    "MicroBatch",
    "Source",
    "SourceRange",
    "TableIds",
    "build_source",
    "criteo_feature_spec",
    "dedup_ids",
    "encode_columns",
    "encode_sample",
    "hash_str_id",
]

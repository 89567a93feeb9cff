"""Which decoder reads a source's records: schema-v1 msgpack, JSON by a mapping, or a plug-in decoder.

Kafka and file sources ask :func:`record_decoder` for one; everything after
decoding (batching, dead letters, metrics) is the same whatever it returns.
"""

from __future__ import annotations

from kelp.config import FeatureSpec, FileSourceConfig, KafkaSourceConfig
from kelp.consumers.decode import Decoder

__all__ = ["record_decoder"]


def record_decoder(source: KafkaSourceConfig | FileSourceConfig, spec: FeatureSpec) -> Decoder:
    """The decoder for ``source``'s format; a :class:`SourceUserError` when its mapping or plug-in is bad."""
    max_bytes = source.max_message_bytes if isinstance(source, KafkaSourceConfig) else None
    decoder_ref = source.decoder if isinstance(source, KafkaSourceConfig) else None
    if decoder_ref is None and source.format != "json":
        return Decoder(spec, max_bytes)
    from kelp.consumers.json_events import MappedDecoder, parse_json

    mapping = source.json_mapping
    assert mapping is not None  # the config model requires it for format json and a decoder
    parse = parse_json
    if decoder_ref is not None:
        from kelp.consumers.plugin_decoder import load_decoder, parse_with

        assert isinstance(source, KafkaSourceConfig)
        parse = parse_with(load_decoder(decoder_ref, spec, source.decoder_args))
    return MappedDecoder(spec, mapping, parse, max_bytes)

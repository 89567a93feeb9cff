"""Which decoder reads a source's records: schema-v1 msgpack, JSON by a mapping, or a plug-in decoder.

Kafka and file sources ask :func:`record_decoder` for one; everything after
decoding (batching, dead letters, metrics) is the same whatever it returns. A
Kafka source whose topics differ in format (``source.topic_formats``) asks
:func:`topic_decoders` for one decoder per topic instead.
"""

from __future__ import annotations

from typing import Literal

from kelp.config import FeatureSpec, FileSourceConfig, KafkaSourceConfig
from kelp.consumers.decode import Decoder

__all__ = ["expected_records", "record_decoder", "topic_decoders"]

Format = Literal["msgpack", "json", "decoder"]


def record_decoder(source: KafkaSourceConfig | FileSourceConfig, spec: FeatureSpec) -> Decoder:
    """The decoder for ``source``'s format; a :class:`SourceUserError` when its mapping or plug-in is bad.

    For a Kafka source this is the decoder of the topics without a ``topic_formats`` entry.
    """
    if isinstance(source, KafkaSourceConfig):
        return _decoder(source, spec, "decoder" if source.decoder is not None else source.format)
    return _decoder(source, spec, "json" if source.format == "json" else "msgpack")


def topic_decoders(source: KafkaSourceConfig, spec: FeatureSpec) -> dict[str, Decoder]:
    """Each of ``source.topics`` -> the decoder of its format (topics of one format share one decoder).

    Built once, up front, so a bad mapping or plug-in stops the source before it reads anything.
    """
    by_format: dict[Format, Decoder] = {}
    out = {}
    for topic in source.topics:
        fmt = source.topic_format(topic)
        if fmt not in by_format:
            by_format[fmt] = _decoder(source, spec, fmt)
        out[topic] = by_format[fmt]
    return out


def expected_records(source: KafkaSourceConfig, topic: str) -> str:
    """What ``topic``'s records should be, for the wrong-format stop's message."""
    fmt = source.topic_format(topic)
    if fmt == "decoder":
        return f"records that source.decoder {source.decoder} reads"
    return "JSON objects" if fmt == "json" else "schema-v1 msgpack events"


def _decoder(source: KafkaSourceConfig | FileSourceConfig, spec: FeatureSpec, fmt: Format) -> Decoder:
    max_bytes = source.max_message_bytes if isinstance(source, KafkaSourceConfig) else None
    if fmt == "msgpack":
        return Decoder(spec, max_bytes)
    from kelp.consumers.json_events import MappedDecoder, parse_json

    mapping = source.json_mapping
    assert mapping is not None  # the config model requires it for format json and a decoder
    parse = parse_json
    if fmt == "decoder":
        from kelp.consumers.plugin_decoder import load_decoder, parse_with

        assert isinstance(source, KafkaSourceConfig) and source.decoder is not None
        parse = parse_with(load_decoder(source.decoder, spec, source.decoder_args))
    return MappedDecoder(spec, mapping, parse, max_bytes)

"""A Kelp plug-in decoder for Avro records in the Confluent wire format (an example, not part of Kelp).

Each Kafka record is framed as Confluent's serializers write it::

    byte 0      magic byte, always 0
    bytes 1-4   schema id, big-endian unsigned 32-bit (the id in the schema registry)
    bytes 5-    the Avro binary encoding of one datum, written with that schema

Kelp has no network access to a schema registry here: the schemas are given in
the config, by id, as ``decoder_args``::

    source:
      decoder: avro_decoder:ConfluentAvroDecoder      # this directory on PYTHONPATH
      decoder_args:
        schemas: {"1": click.avsc}                    # id -> .avsc path or the schema itself
      json: {label_field: clicked, sparse_fields: {user: user.id}}

``decode`` returns the datum as a dict (nested records are dicts, arrays
lists), which ``source.json`` maps onto the features like a JSON object. A
record with another magic byte is rejected as ``bad_payload``, one whose id
is not configured as ``unknown_schema``, one that does not parse with its
schema as ``bad_payload``; Kelp dead-letters each with that reason.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fastavro

from kelp.config import FeatureSpec
from kelp.consumers import DecodeError

__all__ = ["ConfluentAvroDecoder", "frame"]

MAGIC = 0
_HEADER = struct.Struct(">bI")


def _load_schema(value: str | Mapping[str, Any], base: Path) -> Any:
    """A parsed Avro schema from a dict, a JSON string, or a path to an .avsc file."""
    if isinstance(value, str) and not value.lstrip().startswith(("{", "[", '"')):
        path = Path(value)
        value = json.loads((path if path.is_absolute() else base / path).read_text())
    elif isinstance(value, str):
        value = json.loads(value)
    return fastavro.parse_schema(value)


class ConfluentAvroDecoder:
    """``decode(record) -> dict`` for Confluent-framed Avro; ``schemas`` maps schema id -> schema.

    ``schema_dir`` is where relative ``.avsc`` paths are looked up (default:
    the working directory).
    """

    def __init__(
        self, spec: FeatureSpec, schemas: Mapping[str | int, Any], schema_dir: str | None = None
    ) -> None:
        if not schemas:
            raise ValueError("schemas: give at least one schema id -> schema")
        base = Path(schema_dir) if schema_dir else Path.cwd()
        self.schemas = {int(sid): _load_schema(s, base) for sid, s in schemas.items()}

    def decode(self, value: bytes) -> dict[str, Any]:
        if len(value) < _HEADER.size:
            raise DecodeError("bad_payload", f"{len(value)} bytes, shorter than the 5-byte header")
        magic, schema_id = _HEADER.unpack_from(value)
        if magic != MAGIC:
            raise DecodeError("bad_payload", f"magic byte {magic}, expected {MAGIC} (not Confluent framing)")
        schema = self.schemas.get(schema_id)
        if schema is None:
            known = ", ".join(str(s) for s in sorted(self.schemas))
            raise DecodeError("unknown_schema", f"schema id {schema_id} is not configured (known: {known})")
        body = io.BytesIO(value[_HEADER.size :])
        try:
            datum = fastavro.schemaless_reader(body, schema)
        except (EOFError, ValueError, IndexError, UnicodeDecodeError, struct.error) as exc:
            raise DecodeError(
                "bad_payload", f"not Avro of schema {schema_id}: {type(exc).__name__}"
            ) from None
        if body.tell() != len(value) - _HEADER.size:
            raise DecodeError("bad_payload", f"trailing bytes after the Avro datum of schema {schema_id}")
        return datum


def frame(schema: Any, schema_id: int, datum: Mapping[str, Any]) -> bytes:
    """``datum`` as a Confluent-framed Avro record (what a producer with the registry serializer sends)."""
    out = io.BytesIO()
    out.write(_HEADER.pack(MAGIC, schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), dict(datum))
    return out.getvalue()

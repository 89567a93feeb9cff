"""Request and response bodies on the wire: JSON (parsed with orjson) or msgpack, chosen by content type.

JSON stays the default and the documented form; msgpack (``Content-Type:
application/msgpack``) is the compact one for clients that send packed id
columns (:mod:`kelp.serving.features`). A response is msgpack when the request
``Accept``s ``application/msgpack``, JSON otherwise.

orjson is strict JSON: it refuses ``NaN`` and integers beyond 64 bits. The
standard library parser takes both, so a body orjson refuses is parsed again
with it, and the feature checks then reject the value with its precise reason
(``bad_dense``, ``bad_id``) instead of ``bad_json``. Only broken bodies pay
for the second parse. An integer with more digits than Python converts
(``sys.get_int_max_str_digits()``) becomes a :class:`LongInteger` there, which
no check accepts, so it too is refused naming its field.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import orjson

from kelp.serving.errors import BadRequestError

__all__ = ["MSGPACK", "LongInteger", "decode_body", "encode_body", "wants_msgpack"]

MSGPACK = "application/msgpack"
_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack", "application/vnd.msgpack")


def _is_msgpack(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() in _MSGPACK_TYPES


class LongInteger:
    """A JSON integer too long for ``int()``: only its digit count is kept, for the error message."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _parse_int(text: str) -> int | LongInteger:
    try:
        return int(text)
    except ValueError:  # past the interpreter's digit limit
        return LongInteger(len(text.lstrip("-")))


def decode_body(raw: bytes, content_type: str) -> Any:
    """The decoded body; ``bad_json`` / ``bad_msgpack`` (422) when it does not parse."""
    if _is_msgpack(content_type):
        try:
            return msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
        except Exception as exc:  # msgpack raises several unrelated types for broken input
            raise BadRequestError("bad_msgpack", f"the body is not msgpack: {exc}") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            # Too deep for orjson is too deep for a request; Python 3.12's json would parse it.
            raise BadRequestError("bad_json", f"the body is not JSON: {exc}") from None
        try:
            return json.loads(raw, parse_int=_parse_int)
        except (ValueError, RecursionError):
            raise BadRequestError("bad_json", f"the body is not JSON: {exc}") from None


def wants_msgpack(accept: str) -> bool:
    return any(_is_msgpack(part) for part in accept.split(","))


def encode_body(payload: Any, msgpack_reply: bool) -> tuple[bytes, str]:
    """``(bytes, media type)`` of a response payload."""
    if msgpack_reply:
        return msgpack.packb(payload, use_bin_type=True), MSGPACK
    return orjson.dumps(payload), "application/json"

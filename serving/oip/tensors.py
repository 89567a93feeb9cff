"""Inference requests and responses of the Open Inference Protocol (KServe v2) REST API on the wire.

A request is a JSON object with named input tensors. Each tensor's values come
either inline (``"data"``, a flat or nested row-major list) or, with the binary
tensor data extension that Triton's clients use by default, as raw
little-endian bytes after the JSON: the ``Inference-Header-Content-Length``
header says where the JSON ends, and each tensor's
``parameters.binary_data_size`` how many of the following bytes are its own.
``BYTES`` elements are JSON strings inline, and a 4-byte little-endian length
before each element in binary.

A response carries the outputs the same two ways: binary when the request
asked (``parameters.binary_data_output``, or ``binary_data`` on a requested
output), inline otherwise.

Every problem with the shape of a request is a 400 whose message names the
tensor and what was expected; nothing here knows the model's features
(:mod:`kelp.serving.oip.inputs` does).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from kelp.serving.errors import RequestError

__all__ = [
    "BINARY_HEADER",
    "DTYPES",
    "CountCheck",
    "InferRequest",
    "OutputRequest",
    "Tensor",
    "encode_response",
    "from_binary",
    "parse_request",
]

BINARY_HEADER = "inference-header-content-length"

DTYPES: dict[str, np.dtype[Any] | None] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": None,
}
"""The protocol's datatypes and their numpy dtypes (``BYTES``: an object array of ``bytes``)."""

# KServe's own client also sends the model's name and version in the body: taken, and ignored (the path
# names the model).
_REQUEST_KEYS = frozenset({"id", "parameters", "inputs", "outputs", "model_name", "model_version"})
_TENSOR_KEYS = frozenset({"name", "shape", "datatype", "parameters", "data"})


CountCheck = Callable[[str, int], None]
"""Called with an input's name and element count (from its shape) before its elements are read;
raises a :class:`RequestError` when no request within the limits has that many."""


def _bad(message: str) -> RequestError:
    return RequestError("invalid_request", message, status=400)


@dataclass(frozen=True)
class Tensor:
    """One named input: ``data`` has ``shape`` (a numpy array; ``BYTES``: dtype object of ``bytes``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True)
class OutputRequest:
    """An output the client asked for by name, and whether it wants it as binary data."""

    name: str
    binary: bool


@dataclass(frozen=True)
class InferRequest:
    """A parsed request: its inputs by name, in request order."""

    id: str | None
    inputs: dict[str, Tensor]
    outputs: tuple[OutputRequest, ...] | None
    """None: every output, binary when ``binary_output``."""
    binary_output: bool


def parse_request(
    raw: bytes, header_length: int | None, check_count: CountCheck | None = None
) -> InferRequest:
    """The request in ``raw``; ``header_length`` is the binary extension's header (None: all JSON).

    ``check_count`` sees each input's element count before its elements are read, so an input too
    big to score is refused at the cost of its shape, not of its elements (a ``BYTES`` element
    costs a Python call).
    """
    if header_length is None:
        head, rest = raw, b""
    else:
        if not 0 <= header_length <= len(raw):
            raise _bad(f"{BINARY_HEADER} is {header_length}, but the body has {len(raw)} bytes")
        head, rest = raw[:header_length], raw[header_length:]
    try:
        body = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"the request is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad(f"the request is {type(body).__name__}, expected an object")
    extra = sorted(set(body) - _REQUEST_KEYS)
    if extra:
        raise _bad(f"unknown request field(s) {extra}; expected {sorted(_REQUEST_KEYS)}")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _bad("'id' must be a string")
    parameters = _parameters(body.get("parameters"), "request")
    raw_inputs = body.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise _bad("'inputs' must be a non-empty list of tensors")
    inputs: dict[str, Tensor] = {}
    offset = 0
    for k, item in enumerate(raw_inputs):
        tensor, used = _tensor(item, f"inputs[{k}]", memoryview(rest)[offset:], check_count)
        if tensor.name in inputs:
            raise _bad(f"input {tensor.name!r} is given twice")
        inputs[tensor.name] = tensor
        offset += used
    if offset != len(rest):
        raise _bad(f"{len(rest) - offset} bytes of binary data after the last input's")
    return InferRequest(
        request_id,
        inputs,
        _outputs(body.get("outputs")),
        _flag(parameters, "binary_data_output", "request"),
    )


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{where} 'parameters' must be an object")
    return value


def _flag(parameters: dict[str, Any], key: str, where: str) -> bool:
    value = parameters.get(key, False)
    if type(value) is not bool:
        raise _bad(f"{where} parameter {key!r} must be true or false")
    return value


def _outputs(value: Any) -> tuple[OutputRequest, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _bad("'outputs' must be a list")
    outputs = []
    for k, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _bad(f"outputs[{k}] must be an object with a 'name'")
        parameters = _parameters(item.get("parameters"), f"outputs[{k}]")
        outputs.append(OutputRequest(item["name"], _flag(parameters, "binary_data", f"outputs[{k}]")))
    return tuple(outputs) or None  # an empty list asks for nothing in particular: every output


def _tensor(
    item: Any, where: str, binary: memoryview, check_count: CountCheck | None = None
) -> tuple[Tensor, int]:
    """The tensor ``item`` describes, and how many bytes of ``binary`` it took."""
    if not isinstance(item, dict):
        raise _bad(f"{where} must be an object")
    extra = sorted(set(item) - _TENSOR_KEYS)
    if extra:
        raise _bad(f"{where}: unknown field(s) {extra}")
    name, shape, datatype = item.get("name"), item.get("shape"), item.get("datatype")
    if not isinstance(name, str):
        raise _bad(f"{where}: 'name' must be a string")
    where = f"input {name!r}"
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise _bad(f"{where}: 'shape' must be a list of integers >= 0")
    if datatype not in DTYPES:
        raise _bad(f"{where}: datatype {datatype!r} is not one of {sorted(DTYPES)}")
    count = math.prod(shape)
    if check_count is not None:
        check_count(name, count)
    parameters = _parameters(item.get("parameters"), where)
    size = parameters.get("binary_data_size")
    if size is None:
        if "data" not in item:
            raise _bad(f"{where}: needs 'data' or parameters.binary_data_size")
        data = _inline(item["data"], datatype, count, len(shape), where)
        return Tensor(name, datatype, tuple(shape), data), 0
    if "data" in item:
        raise _bad(f"{where}: has both 'data' and parameters.binary_data_size")
    if type(size) is not int or not 0 <= size <= len(binary):
        raise _bad(f"{where}: binary_data_size {size!r}, but {len(binary)} bytes of binary data are left")
    data = from_binary(binary[:size], datatype, count, where)
    return Tensor(name, datatype, tuple(shape), data), size


def _flatten(data: Any, rank: int, where: str) -> list[Any]:
    """Row-major elements of a flat or nested list, nested at most as deep as the shape has dimensions.

    One level at a time, not recursively: a document nested as deep as the JSON parser allows must
    be a 400 naming the input, never a ``RecursionError``.
    """
    values = data if isinstance(data, list) else [data]
    depth = 1
    while any(isinstance(x, list) for x in values):
        depth += 1
        if depth > max(rank, 1):
            raise _bad(f"{where}: 'data' is nested deeper than its shape's {rank} dimension(s)")
        flat: list[Any] = []
        for x in values:
            if isinstance(x, list):
                flat.extend(x)
            else:
                flat.append(x)
        values = flat
    return values


def _inline(data: Any, datatype: str, count: int, rank: int, where: str) -> np.ndarray:
    values = _flatten(data, rank, where)
    if len(values) != count:
        raise _bad(f"{where}: {len(values)} values for a shape of {count} elements")
    dtype = DTYPES[datatype]
    if dtype is None:
        if not all(isinstance(v, str) for v in values):
            raise _bad(f"{where}: BYTES data must be strings")
        out = np.empty(count, dtype=object)
        out[:] = [v.encode("utf-8", "surrogatepass") for v in values]
        return out
    kind = dtype.kind
    for v in values:
        ok = (type(v) is bool) if kind == "b" else (type(v) is int or (kind == "f" and type(v) is float))
        if not ok:
            raise _bad(f"{where}: {v!r} is not a {datatype} value")
    try:
        return np.array(values, dtype=dtype)
    except OverflowError:
        raise _bad(f"{where}: a value is out of range for {datatype}") from None


def from_binary(raw: memoryview | bytes, datatype: str, count: int, where: str) -> np.ndarray:
    """``count`` elements of ``datatype`` from the protocol's raw little-endian form (``BYTES``: each
    element after its 4-byte length)."""
    dtype = DTYPES[datatype]
    if dtype is not None:
        if len(raw) != count * dtype.itemsize:
            raise _bad(f"{where}: {len(raw)} bytes of binary data for {count} x {datatype}")
        return np.frombuffer(raw, dtype=dtype)
    if count > len(raw) // 4:  # every element takes at least its 4-byte length
        raise _bad(f"{where}: {len(raw)} bytes cannot hold {count} BYTES elements")
    out = np.empty(count, dtype=object)
    at = 0
    for k in range(count):
        if at + 4 > len(raw):
            raise _bad(f"{where}: the binary BYTES data ends before element {k} of {count}")
        (length,) = struct.unpack_from("<I", raw, at)
        at += 4
        if at + length > len(raw):
            raise _bad(f"{where}: BYTES element {k} says {length} bytes; fewer are left")
        out[k] = bytes(raw[at : at + length])
        at += length
    if at != len(raw):
        raise _bad(f"{where}: {len(raw) - at} bytes after its {count} BYTES elements")
    return out


def encode_response(
    head: dict[str, Any], outputs: Sequence[tuple[str, np.ndarray, bool]]
) -> tuple[bytes, int | None]:
    """``(body, header length)`` of a response: ``head`` plus ``(name, FP32 values, binary)`` outputs.

    The header length is None when every output is inline (the body is plain JSON).
    """
    described = []
    blobs = []
    for name, values, binary in outputs:
        tensor: dict[str, Any] = {"name": name, "datatype": "FP32", "shape": list(values.shape)}
        if binary:
            blob = np.ascontiguousarray(values, dtype="<f4").tobytes()
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            tensor["data"] = values.astype(np.float32, copy=False).ravel().tolist()
        described.append(tensor)
    header = orjson.dumps({**head, "outputs": described})
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)

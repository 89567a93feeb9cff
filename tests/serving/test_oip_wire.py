"""The Open Inference Protocol's wire format without a server: what parses, and what is refused and why."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from kelp.serving.errors import RequestError
from kelp.serving.oip.tensors import encode_response, parse_request


def _refusal(raw: bytes, header_length: int | None = None) -> str:
    with pytest.raises(RequestError) as caught:
        parse_request(raw, header_length)
    assert caught.value.status == 400
    return str(caught.value)


def _json(body: object) -> bytes:
    return orjson.dumps(body)


def test_inline_nested_data_is_row_major() -> None:
    request = parse_request(
        _json(
            {
                "id": "x",
                "inputs": [{"name": "d", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4.5]]}],
            }
        ),
        None,
    )
    assert request.id == "x" and request.outputs is None and not request.binary_output
    np.testing.assert_array_equal(request.inputs["d"].data, np.array([1, 2, 3, 4.5], np.float32))


def test_binary_tensors_follow_the_json_header_in_input_order() -> None:
    strings = [b"alice", b"", b"12"]
    packed = b"".join(struct.pack("<I", len(s)) + s for s in strings)
    ids = np.array([5, 6, 7], "<i8").tobytes()
    head = _json(
        {
            "inputs": [
                {
                    "name": "a",
                    "shape": [3],
                    "datatype": "INT64",
                    "parameters": {"binary_data_size": len(ids)},
                },
                {
                    "name": "b",
                    "shape": [3],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(packed)},
                },
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    request = parse_request(head + ids + packed, len(head))
    assert request.binary_output
    assert request.inputs["a"].data.tolist() == [5, 6, 7]
    assert request.inputs["b"].data.tolist() == strings


def test_refusals_name_what_was_wrong() -> None:
    one = {"name": "a", "shape": [2], "datatype": "INT64", "data": [1, 2]}
    assert "not valid JSON" in _refusal(b"[")
    assert "non-empty list" in _refusal(_json({"inputs": []}))
    assert "unknown request field" in _refusal(_json({"inputs": [one], "extra": 1}))
    assert "given twice" in _refusal(_json({"inputs": [one, one]}))
    assert "3 values for a shape of 2" in _refusal(_json({"inputs": [{**one, "data": [1, 2, 3]}]}))
    assert "True is not a INT64" in _refusal(_json({"inputs": [{**one, "data": [True, 2]}]}))
    assert "1.5 is not a INT64" in _refusal(_json({"inputs": [{**one, "data": [1.5, 2]}]}))
    assert "out of range" in _refusal(_json({"inputs": [{**one, "datatype": "INT8", "data": [1, 300]}]}))
    assert "datatype 'INT128'" in _refusal(_json({"inputs": [{**one, "datatype": "INT128"}]}))
    assert "'shape' must be" in _refusal(_json({"inputs": [{**one, "shape": [-1]}]}))
    assert "binary_data_output" in _refusal(_json({"inputs": [one], "parameters": {"binary_data_output": 1}}))

    head = _json(
        {"inputs": [{"name": "a", "shape": [2], "datatype": "INT64", "parameters": {"binary_data_size": 16}}]}
    )
    assert "bytes of binary data are left" in _refusal(head + b"\0" * 8, len(head))
    assert "after the last input" in _refusal(head + b"\0" * 20, len(head))
    assert "the body has" in _refusal(head, len(head) + 1)
    huge = _json(
        {
            "inputs": [
                {"name": "b", "shape": [10**12], "datatype": "BYTES", "parameters": {"binary_data_size": 8}}
            ]
        }
    )
    assert "cannot hold" in _refusal(huge + b"\0" * 8, len(huge))  # refused before any allocation
    bad_bytes = _json(
        {"inputs": [{"name": "b", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}]}
    )
    assert "says 9 bytes" in _refusal(bad_bytes + struct.pack("<I", 9) + b"ab", len(bad_bytes))


def test_response_is_json_or_json_then_binary() -> None:
    scores = np.array([0.25, 0.5], np.float32)
    body, header_length = encode_response({"model_name": "m"}, [("label", scores, False)])
    assert header_length is None
    assert orjson.loads(body)["outputs"] == [
        {"name": "label", "datatype": "FP32", "shape": [2], "data": [0.25, 0.5]}
    ]

    body, header_length = encode_response({"model_name": "m"}, [("label", scores, True)])
    assert header_length is not None
    head = orjson.loads(body[:header_length])
    assert head["outputs"][0]["parameters"] == {"binary_data_size": 8}
    np.testing.assert_array_equal(np.frombuffer(body[header_length:], "<f4"), scores)

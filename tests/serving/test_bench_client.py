"""``kelp bench serve``'s load generator speaks enough HTTP to read the replica's real replies.

The benchmark sends pre-encoded requests on a raw keep-alive socket
(:class:`kelp.bench.serve._Connection`) instead of ``http.client``; these
tests hold it to what uvicorn actually answers: JSON and msgpack replies,
error replies, several requests on one connection.
"""

from __future__ import annotations

import json

import msgpack

from kelp.bench.serve import JSON, MSGPACK, _Connection, _encode_request, _parse_reply

from .conftest import Live


def test_one_connection_reads_json_msgpack_and_error_replies(live: Live) -> None:
    port = live.server.port
    body = {"user": {"sparse": {"C3": 9}}, "candidates": [{"sparse": {"C1": 4}}, {}]}
    good_json = _encode_request(port, json.dumps(body).encode(), JSON)
    good_msgpack = _encode_request(port, msgpack.packb(body), MSGPACK)
    bad = _encode_request(port, b'{"candidates": []}', JSON)
    conn = _Connection(port)
    try:
        for _ in range(2):  # keep-alive: every reply is read to its end, the next one starts clean
            status, data = conn.exchange(good_json)
            reply = _parse_reply(status, data, JSON)
            assert reply is not None and len(reply["scores"]) == 2 and reply["model_version"] == 1
            status, data = conn.exchange(bad)
            assert _parse_reply(status, data, JSON) is None
            assert status == 422 and json.loads(data)["error"] == "invalid_request"
            status, data = conn.exchange(good_msgpack)
            packed = _parse_reply(status, data, MSGPACK)
            assert packed is not None and packed["scores"] == reply["scores"]
    finally:
        conn.close()

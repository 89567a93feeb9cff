"""Bad actors against a real replica under uvicorn, over real sockets: bearer-token auth, slow and
oversized bodies, deeply nested documents and huge id counts.

The replica here has ``serving.auth_token_file`` set and a short
``serving.body_timeout_s``. Every abuse gets a 4xx (or the body deadline's
408) while another client, on its own connection at the same time, is
answered normally: nothing an abuser does holds up the event loop or the
scoring thread.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import msgpack
import pytest
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig
from kelp.errors import UserError
from kelp.serving import ServingReplica, create_app

from .conftest import Live
from .helpers import small_config

pytestmark = pytest.mark.integration

TOKEN = "t0ken-abc.DEF_123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SAMPLE = {"dense": {"I1": 1.0}, "sparse": {"C1": 3, "C2": [7], "C3": 11}}


@pytest.fixture
def cfg(redis_url: str, tmp_path: Path) -> KelpConfig:
    """The serving fixtures' config with auth on and a short body deadline (overrides conftest's)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    return small_config(
        redis_url, tmp_path, serving={"auth_token_file": str(token_file), "body_timeout_s": 0.5}
    )


def _score_ok(live: Live) -> None:
    """A well-behaved client on its own connection is answered (the abuser did not hold anything up)."""
    with httpx.Client(base_url=live.server.url, timeout=30) as other:
        r = other.post("/v1/score", json={"samples": [SAMPLE]}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert other.get("/healthz").status_code == 200


def _raw(live: Live, payload: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", live.server.port), timeout=30)
    sock.sendall(payload)
    return sock


def _status(sock: socket.socket) -> tuple[int, bytes]:
    """Status code and whole reply of the one response on ``sock`` (read until the server closes or
    the declared length has arrived)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(head.split(b" ", 2)[1]), body


def _post_head(path: str, length: int, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: {length}\r\n{extra}\r\n"
    ).encode()


# -- bearer auth ----------------------------------------------------------------------------------


def test_score_endpoints_need_the_token(live: Live) -> None:
    for path, body in (
        ("/v1/score", {"samples": [SAMPLE]}),
        ("/v1/score/candidates", {"user": {}, "candidates": [SAMPLE]}),
    ):
        missing = live.client.post(path, json=body)
        assert missing.status_code == 401 and missing.json()["error"] == "missing_token", missing.text
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = live.client.post(path, json=body, headers={"Authorization": f"Bearer {TOKEN}x"})
        assert wrong.status_code == 401 and wrong.json()["error"] == "wrong_token"
        basic = live.client.post(path, json=body, headers={"Authorization": "Basic Zm9vOmJhcg=="})
        assert basic.status_code == 401 and basic.json()["error"] == "missing_token"
        assert live.client.post(path, json=body, headers=AUTH).status_code == 200
    # probes and scrapes carry no token and stay open
    for path in ("/healthz", "/readyz", "/metrics"):
        assert live.client.get(path).status_code == 200, path
    text = live.client.get("/metrics").text
    assert 'kelp_serving_requests_total{endpoint="/v1/score",status="401"} 3.0' in text


def test_token_under_a_root_path_too(live: Live) -> None:
    """Behind a proxy (root_path) the score routes go through FastAPI's stack: same check."""
    app = create_app(live.replica, manage_lifecycle=False)

    async def through_fastapi() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app, root_path="/kelp")
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            refused = await client.post("/kelp/v1/score", json={"samples": [SAMPLE]})
            allowed = await client.post("/kelp/v1/score", json={"samples": [SAMPLE]}, headers=AUTH)
        return refused, allowed

    refused, allowed = asyncio.run(through_fastapi())
    assert refused.status_code == 401 and refused.json()["error"] == "missing_token"
    assert allowed.status_code == 200, allowed.text


def test_a_missing_or_empty_token_file_is_a_user_error(redis_url: str, tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    for name, reason in (("absent", "cannot read"), ("empty", "is empty")):
        cfg = small_config(redis_url, tmp_path, serving={"auth_token_file": str(tmp_path / name)})
        replica = ServingReplica(cfg, CollectorRegistry())
        try:
            with pytest.raises(UserError, match=f"serving.auth_token_file: .*{reason}"):
                create_app(replica, manage_lifecycle=False)
        finally:
            replica.close()


def test_config_show_never_prints_the_token(cfg: KelpConfig, tmp_path: Path) -> None:
    path = tmp_path / "kelp.yaml"
    import yaml

    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    shown = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "config", "show", str(path)],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "auth_token_file" in shown and TOKEN not in shown


# -- abuse ----------------------------------------------------------------------------------------


def test_slow_body_gets_408_while_others_are_served(live: Live) -> None:
    body = b'{"samples": [{}]}'
    slow = _raw(live, _post_head("/v1/score", len(body)) + body[:5])  # ... and the rest never comes
    try:
        _score_ok(live)
        status, reply = _status(slow)
        assert status == 408 and b"body_timeout" in reply
    finally:
        slow.close()


def test_slow_headers_hold_only_their_own_connection(live: Live) -> None:
    slow = _raw(live, b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Le")
    try:
        _score_ok(live)
    finally:
        slow.close()


def test_a_declared_huge_body_is_refused_before_it_is_sent(live: Live) -> None:
    sock = _raw(live, _post_head("/v1/score", 10**12))
    try:
        status, reply = _status(sock)
        assert status == 413 and b"body_too_large" in reply
        _score_ok(live)
    finally:
        sock.close()


@pytest.mark.parametrize("kind", ["json-array", "json-object", "msgpack"])
def test_deeply_nested_documents_are_422(live: Live, kind: str) -> None:
    depth = 30_000  # far past any parser's recursion limit, inside serving.max_body_bytes
    if kind == "json-array":
        raw, media = b"[" * depth + b"]" * depth, "application/json"
    elif kind == "json-object":
        raw, media = (
            b'{"samples": [{"sparse": {"C1": ' + b"[" * depth + b"]" * depth + b"}}]}",
            "application/json",
        )
    else:
        raw, media = b"\x91" * depth + b"\xc0", "application/msgpack"
    assert len(raw) < live.cfg.serving.max_body_bytes
    r = live.client.post("/v1/score", content=raw, headers={**AUTH, "Content-Type": media})
    assert r.status_code == 422, r.text
    assert r.json()["error"] in ("bad_json", "bad_msgpack", "bad_id", "invalid_request")
    _score_ok(live)


def test_huge_id_counts_are_4xx(live: Live) -> None:
    many_ids = {"samples": [{"sparse": {"C2": list(range(5000))}}]}  # max_ids_per_feature is 3
    r = live.client.post("/v1/score", json=many_ids, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"] == "too_many_ids", r.text
    columns = {"user": {}, "candidates": {"sparse": {"C1": list(range(8000))}}}  # 64 samples at most
    r = live.client.post("/v1/score/candidates", json=columns, headers=AUTH)
    assert r.status_code in (413, 422), r.text
    packed = msgpack.packb({"samples": [{"sparse": {"C2": list(range(10_000))}}]})
    r = live.client.post("/v1/score", content=packed, headers={**AUTH, "Content-Type": "application/msgpack"})
    assert r.status_code in (413, 422), r.text
    _score_ok(live)


def test_kelp_probe_sends_the_token(live: Live, tmp_path: Path) -> None:
    """The helm test hook's ``kelp probe`` reads serving.auth_token_file like the replica does."""
    import yaml

    doc = live.cfg.model_dump(mode="json", exclude_none=True)
    with_token, without = tmp_path / "with.yaml", tmp_path / "without.yaml"
    with_token.write_text(yaml.safe_dump(doc))
    doc["serving"].pop("auth_token_file")
    without.write_text(yaml.safe_dump(doc))
    for path, code, words in ((with_token, 0, "probe ok"), (without, 1, "answered 401")):
        done = subprocess.run(
            [sys.executable, "-m", "kelp.cli", "probe", "--config", str(path), "--url", live.server.url],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == code and words in done.stdout, (done.stdout, done.stderr)
        assert TOKEN not in done.stdout + done.stderr


def test_every_scoring_route_wants_the_token(live: Live) -> None:
    """/v2 inference and /v1/embeddings read the store and the model too: the same token guards them."""
    oip = {"inputs": [{"name": "C1", "shape": [1], "datatype": "INT64", "data": [3]}]}
    calls = {
        "/v2/models/svc/infer": oip,
        "/v1/embeddings": {"table": "ads", "ids": [3]},
    }
    for path, body in calls.items():
        refused = live.client.post(path, json=body)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"] == 'Bearer realm="kelp"'
        assert live.client.post(path, json=body, headers=AUTH).status_code == 200, path
    assert live.client.get("/v2/health/ready").status_code == 200  # health stays open

"""The score routes' own ASGI handler keeps what FastAPI's stack did for them.

``POST /v1/score`` and ``/v1/score/candidates`` skip the middleware and the
router (:mod:`kelp.serving.dispatch`); metrics, the body limit and the error
shapes must be the same as for every other route, and a request the handler
leaves to FastAPI (one under a ``root_path``) must get the same answer.
"""

from __future__ import annotations

import asyncio
import re

import httpx

from kelp.serving import create_app

from .conftest import Live


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


def test_score_routes_count_every_answer_by_status(live: Live) -> None:
    endpoint = "/v1/score/candidates"
    assert live.client.post(endpoint, json={"candidates": [{}, {"sparse": {"C1": 3}}]}).status_code == 200
    bad = live.client.post(endpoint, json={"candidates": [{"sparse": {"C1": -1}}]})
    assert bad.status_code == 422 and bad.json()["error"] == "bad_id"
    too_large = live.client.post(endpoint, content=b" " * (live.cfg.serving.max_body_bytes + 1))
    assert too_large.status_code == 413 and too_large.json()["error"] == "body_too_large"

    text = live.client.get("/metrics").text
    for status in ("200", "422", "413"):
        assert _metric(text, "kelp_serving_requests_total", endpoint=endpoint, status=status) == 1.0
    assert _metric(text, "kelp_serving_request_seconds_count", endpoint=endpoint) == 3.0
    assert "kelp_serving_inflight_requests 1.0" in text  # the /metrics request itself


def test_a_request_left_to_fastapi_gets_the_same_answer(live: Live) -> None:
    """Under a root_path the dispatcher steps aside; FastAPI's route answers with the same handler."""
    body = {"user": {"sparse": {"C3": 9}}, "candidates": [{"sparse": {"C1": 4}}, {}]}
    direct = live.client.post("/v1/score/candidates", json=body)
    app = create_app(live.replica, manage_lifecycle=False)

    async def through_fastapi() -> tuple[httpx.Response, httpx.Response]:
        # No lifespan runs here: the replica's lifecycle stays the fixture's.
        transport = httpx.ASGITransport(app=app, root_path="/kelp")
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            routed = await client.post("/kelp/v1/score/candidates", json=body)
            refused = await client.post("/kelp/v1/score/candidates", json={"candidates": []})
        return routed, refused

    routed, refused = asyncio.run(through_fastapi())
    assert routed.status_code == direct.status_code == 200
    assert routed.json()["scores"] == direct.json()["scores"]
    assert refused.status_code == 422 and refused.json()["error"] == "invalid_request"

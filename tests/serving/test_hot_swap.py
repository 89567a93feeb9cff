"""Hot swap under concurrent load: zero failed requests, and no response mixes two versions."""

from __future__ import annotations

import math
import threading

import httpx
import pytest

from .conftest import Live
from .helpers import logit_for, wait_until

pytestmark = pytest.mark.integration

CLIENTS = 4
SWAPS = 6


def test_swaps_under_load_never_fail_or_mix_versions(live: Live) -> None:
    body = {
        "samples": [
            {"dense": {"I1": float(i)}, "sparse": {"C1": i, "C2": [i, i + 1], "C3": i}} for i in range(32)
        ]
    }
    stop = threading.Event()
    results: list[list[tuple[int, list[float]]]] = [[] for _ in range(CLIENTS)]
    failures: list[str] = []

    def client(k: int) -> None:
        with httpx.Client(base_url=live.server.url, timeout=30) as c:
            while not stop.is_set():
                try:
                    r = c.post("/v1/score", json=body)
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                    continue
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")
                    continue
                out = r.json()
                results[k].append((out["model_version"], out["scores"]))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        published = [1]
        for _ in range(SWAPS):
            # wait for some traffic on the current version, then swap
            seen = len(published)
            wait_until(lambda n=seen: sum(len(r) for r in results) >= 10 * n, what="traffic")
            published.append(live.publish())
            wait_until(lambda v=published[-1]: live.replica.slot.current.version == v, what="the swap")
        wait_until(
            lambda: any(r and r[-1][0] == published[-1] for r in results),
            what="responses from the last version",
        )
    finally:
        stop.set()
        for t in threads:
            t.join(30)

    assert failures == []
    versions_seen = {v for r in results for v, _ in r}
    assert versions_seen <= set(published) and published[-1] in versions_seen
    for per_client in results:
        versions = [v for v, _ in per_client]
        assert versions == sorted(versions), "a client saw an older version after a newer one"
        for version, scores in per_client:
            expected = 1.0 / (1.0 + math.exp(-logit_for(version)))
            assert scores == pytest.approx([expected] * len(scores)), f"v{version} response mixes models"
    text = live.client.get("/metrics").text
    assert f"kelp_serving_swaps_total {float(SWAPS)}" in text

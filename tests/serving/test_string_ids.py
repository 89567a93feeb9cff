"""A string id scores the row training wrote: real Redis store, real replica under uvicorn.

Training reads ``"258029"`` and ``258029`` as one id and ``"alice"`` as its
xxh3-64 hash (:mod:`kelp.consumers.ids`); serving must read them the same way,
in JSON and msgpack bodies, or a model would score the default row for ids it
has learned.
"""

from __future__ import annotations

from typing import Any

import httpx
import msgpack
import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig
from kelp.consumers import hash_str_id
from kelp.publish import build_snapshot
from kelp.serving import ServingReplica
from kelp.serving.body import MSGPACK
from kelp.store import build_store
from kelp.trainer import build_model

from .helpers import LiveServer, publisher_for, wait_until

pytestmark = pytest.mark.integration

NUMBER = 258029
NAME = "alice"


def _score(client: httpx.Client, sample: dict[str, Any], as_msgpack: bool) -> dict[str, Any]:
    body = {"samples": [sample]}
    if as_msgpack:
        reply = client.post(
            "/v1/score", content=msgpack.packb(body), headers={"Content-Type": MSGPACK, "Accept": MSGPACK}
        )
        assert reply.status_code == 200, reply.content
        return msgpack.unpackb(reply.content)
    reply = client.post("/v1/score", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_an_id_scores_its_row_as_an_int_and_as_a_string(cfg: KelpConfig) -> None:
    torch.manual_seed(0)
    model = build_model(cfg.features, cfg.trainer)
    store = build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry())
    publisher = publisher_for(cfg)
    replica = ServingReplica(cfg, CollectorRegistry())
    try:
        rows = np.stack([np.full(4, 3.0, np.float32), np.full(4, -2.0, np.float32)])
        store.push("C3", np.array([NUMBER, hash_str_id(NAME)], np.uint64), rows, np.zeros(2, np.float32))
        version = publisher.channel.next_version()
        publisher.channel.write(
            build_snapshot(model, cfg.features, cfg.trainer, version=version, step=1, offsets={})
        )
        with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            wait_until(lambda: client.get("/readyz").status_code == 200, what="the replica to be ready")
            for as_msgpack in (False, True):
                scores = {
                    repr(v): _score(client, {"sparse": {"C3": v}}, as_msgpack)
                    for v in (NUMBER, str(NUMBER), NUMBER + 1, NAME, hash_str_id(NAME), [str(NUMBER)])
                }
                for got in scores.values():
                    assert got["model_version"] == version
                by = {k: v["scores"][0] for k, v in scores.items()}
                # the digit string, as one id or in a list, is the integer id: the row pushed for it
                assert by[repr(str(NUMBER))] == by[repr(NUMBER)] == by[repr([str(NUMBER)])]
                assert scores[repr(str(NUMBER))]["default_row_rate"] == 0.0
                # a name is its hash: the same row as the hashed integer, another than the number's
                assert by[repr(NAME)] == by[repr(hash_str_id(NAME))]
                assert scores[repr(NAME)]["default_row_rate"] == 0.0
                assert by[repr(NAME)] != pytest.approx(by[repr(NUMBER)], abs=1e-6)
                # an id with no row scores the default row: the rows above were really read
                assert scores[repr(NUMBER + 1)]["default_row_rate"] == 1.0
                assert by[repr(NUMBER + 1)] != pytest.approx(by[repr(NUMBER)], abs=1e-6)
    finally:
        publisher.close()
        store.close()

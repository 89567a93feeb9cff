"""Serving fixtures: a replica on the real Redis, under real uvicorn, with a model published to it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig
from kelp.publish import Publisher
from kelp.serving import ServingReplica

from .helpers import LiveServer, constant_model, logit_for, publisher_for, small_config


@dataclass
class Live:
    cfg: KelpConfig
    publisher: Publisher
    replica: ServingReplica
    server: LiveServer
    client: httpx.Client

    def publish(self, step: int = 0) -> int:
        """Publish a constant model whose score identifies its version (see helpers.logit_for)."""
        version = self.publisher.channel.next_version()
        from kelp.publish import build_snapshot

        model = constant_model(self.cfg, logit_for(version))
        snap = build_snapshot(
            model, self.cfg.features, self.cfg.trainer, version=version, step=step, offsets={}
        )
        self.publisher.channel.write(snap)
        return version


@pytest.fixture
def cfg(redis_url: str, tmp_path: Path) -> KelpConfig:
    return small_config(redis_url, tmp_path)


@pytest.fixture
def live(cfg: KelpConfig) -> Iterator[Live]:
    """A ready replica serving v1 (a constant model) over HTTP."""
    publisher = publisher_for(cfg)
    replica = ServingReplica(cfg, CollectorRegistry())
    state = Live(cfg, publisher, replica, None, None)  # type: ignore[arg-type]
    state.publish()
    with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        state.server, state.client = server, client
        yield state
    publisher.close()

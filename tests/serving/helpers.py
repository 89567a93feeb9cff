"""Shared pieces of the serving tests: a small config, deterministic models, and a live uvicorn server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import torch
from prometheus_client import CollectorRegistry
from torch import nn

from kelp.config import KelpConfig, parse_config
from kelp.harness.asgi_thread import AsgiThreadServer
from kelp.publish import Publisher, build_publisher, build_snapshot
from kelp.serving import ServingReplica, create_app
from kelp.trainer import build_model

DEPLOYMENT = "svc"


def small_config(redis_url: str, tmp_path: Path, **sections: Any) -> KelpConfig:
    """Three sparse features over two tables (one shared, one multi-hot), two dense features."""
    data: dict[str, Any] = {
        "deployment": DEPLOYMENT,
        "source": {"kind": "file", "path": str(tmp_path / "none.msgpack"), "format": "msgpack"},
        "features": {
            "dense": [{"name": "I1", "transforms": ["log1p"]}, {"name": "I2", "default": 1.5}],
            "sparse": [
                {"name": "C1", "table": "ads"},
                {"name": "C2", "table": "ads", "max_ids": 4, "pooling": "mean"},
                {"name": "C3"},
            ],
            "tables": [{"name": "ads", "dim": 4}, {"name": "C3", "dim": 4}],
        },
        "store": {"backend": "redis", "urls": [redis_url]},
        "trainer": {"bottom_mlp": [8, 4], "top_mlp": [16], "device": "cpu"},
        "publisher": {"interval_s": 0.2, "keep_versions": 3},
        "serving": {
            "poll_interval_s": 0.5,
            "max_samples_per_request": 64,
            "max_ids_per_feature": 3,
            "max_body_bytes": 65_536,
        },
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return parse_config(data, origin="small_config")


def constant_model(cfg: KelpConfig, logit: float) -> nn.Module:
    """A model whose every score is ``sigmoid(logit)``: identifies the version from any response."""
    model = build_model(cfg.features, cfg.trainer)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
        last.bias.fill_(logit)
    return model


def logit_for(version: int) -> float:
    return -2.0 + 0.25 * version


def publisher_for(cfg: KelpConfig) -> Publisher:
    return build_publisher(cfg, CollectorRegistry())


class LiveServer(AsgiThreadServer):
    """The real app under uvicorn in a thread on a free loopback port (real HTTP, real sockets)."""

    def __init__(self, replica: ServingReplica) -> None:
        self.replica = replica
        super().__init__(create_app(replica))


@contextmanager
def serving(cfg: KelpConfig, model: nn.Module) -> Iterator[httpx.Client]:
    """``model`` published as the deployment's next version and a live replica serving it: a client
    of that replica, once the replica serves that version."""
    publisher = publisher_for(cfg)
    try:
        version = publisher.channel.next_version()
        publisher.channel.write(
            build_snapshot(model, cfg.features, cfg.trainer, version=version, step=1, offsets={})
        )
        replica = ServingReplica(cfg, CollectorRegistry())
        with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            wait_until(lambda: client.get("/v1/model").json().get("version") == version, what="v1 served")
            yield client
    finally:
        publisher.close()


def wait_until(predicate: Any, timeout_s: float = 15.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until truthy; fail after ``timeout_s`` (a bound on waiting, not a timing check)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_serve(config: Path, **env: str) -> subprocess.Popen[str]:
    """``kelp serve --config config`` as a real process (output captured), with no ``KELP_...`` overrides
    from this environment, plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    return subprocess.Popen(
        [sys.executable, "-m", "kelp.cli", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**clean, **env},
    )

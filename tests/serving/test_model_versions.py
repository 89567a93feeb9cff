"""Model versions an operator controls: pin, roll back and unpin across two live replicas.

Real `kelp model` processes move the pin on the real Redis channel; two
replicas under uvicorn follow it. Each published model is a constant whose
score names its version (helpers.logit_for), and every response names the
version that scored it (body and ``kelp-model-version`` header), so the tests
read the version from the scores too, not only from what the replica claims.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig
from kelp.publish import build_snapshot

from .helpers import LiveServer, constant_model, logit_for, publisher_for, small_config, wait_until

pytestmark = pytest.mark.integration

SAMPLE = {"samples": [{"dense": {"I1": 1.0}, "sparse": {"C1": 3}}]}


def _kelp_model(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", "model", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


class Deployment:
    """A publisher on the real Redis channel, the config file the CLI reads, and replicas to start."""

    def __init__(self, cfg: KelpConfig, tmp_path: Path) -> None:
        self.cfg = cfg
        self.publisher = publisher_for(cfg)
        self.config = tmp_path / "kelp.yaml"
        self.config.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))

    def publish(self) -> int:
        channel = self.publisher.channel
        version = channel.next_version()
        model = constant_model(self.cfg, logit_for(version))
        channel.write(
            build_snapshot(model, self.cfg.features, self.cfg.trainer, version=version, step=0, offsets={})
        )
        channel.prune(self.cfg.publisher.keep_versions)
        return version


def _served(client: httpx.Client) -> int:
    """The version a replica answers with, checked against the score that version's model gives."""
    response = client.post("/v1/score", json=SAMPLE)
    response.raise_for_status()
    version = int(response.headers["kelp-model-version"])
    assert response.json()["model_version"] == version
    expected = 1 / (1 + math.exp(-logit_for(version)))
    assert response.json()["scores"][0] == pytest.approx(expected, abs=1e-6)
    return version


@pytest.fixture
def deployment(cfg: KelpConfig, tmp_path: Path) -> Iterator[Deployment]:
    state = Deployment(cfg, tmp_path)
    yield state
    state.publisher.close()


def _replica(cfg: KelpConfig):  # type: ignore[no-untyped-def]
    from kelp.serving import ServingReplica

    return LiveServer(ServingReplica(cfg, CollectorRegistry()))


def test_rollback_pin_and_unpin_reach_every_replica(deployment: Deployment, cfg: KelpConfig) -> None:
    for _ in range(3):
        deployment.publish()
    with (
        _replica(cfg) as a,
        _replica(cfg) as b,
        httpx.Client(base_url=a.url) as ca,
        httpx.Client(base_url=b.url) as cb,
    ):
        assert _served(ca) == 3 and _served(cb) == 3

        rolled = _kelp_model(deployment.config, "rollback")
        assert rolled.returncode == 0 and "pinned v2" in rolled.stdout, rolled.stderr
        for client in (ca, cb):
            wait_until(lambda c=client: _served(c) == 2, what="every replica on the rollback")

        assert deployment.publish() == 4  # a new publish does not override the pin
        for server in (a, b):
            assert not server.replica.watcher.check_once()  # what a poll would do: nothing to load
        assert _served(ca) == 2 and _served(cb) == 2

        listing = _kelp_model(deployment.config, "list")
        assert "replicas serve v2 (pinned to v2)" in listing.stdout
        assert [line.split()[0] for line in listing.stdout.splitlines()[1:-1]] == ["2", "3", "4"]

        pinned = _kelp_model(deployment.config, "pin", "3")
        assert pinned.returncode == 0, pinned.stderr
        wait_until(lambda: _served(ca) == 3 and _served(cb) == 3, what="every replica on the pin")

        missing = _kelp_model(deployment.config, "pin", "1")  # pruned: keep_versions is 3
        assert missing.returncode == 2 and "v1 is not stored" in missing.stderr

        unpinned = _kelp_model(deployment.config, "unpin")
        assert unpinned.returncode == 0 and "follow latest, v4" in unpinned.stdout
        wait_until(lambda: _served(ca) == 4 and _served(cb) == 4, what="every replica on latest")


def test_a_replica_configured_with_a_version_serves_only_that_one(
    deployment: Deployment, redis_url: str, tmp_path: Path
) -> None:
    for _ in range(2):
        deployment.publish()
    pinned_cfg = small_config(redis_url, tmp_path, serving={"model_version": 1, "poll_interval_s": 0.5})
    with _replica(pinned_cfg) as server, httpx.Client(base_url=server.url) as client:
        assert _served(client) == 1
        deployment.publish()
        deployment.publisher.channel.set_pin(2)
        assert not server.replica.watcher.check_once()
        assert _served(client) == 1
        oip = client.post(
            "/v2/models/svc/infer",
            json={"inputs": [{"name": "C1", "shape": [1], "datatype": "INT64", "data": [3]}]},
        )
        assert oip.headers["kelp-model-version"] == "1" and oip.json()["model_version"] == "1"


def test_a_replica_is_ready_only_with_a_warmed_up_model(deployment: Deployment, cfg: KelpConfig) -> None:
    deployment.publish()
    with _replica(cfg) as server, httpx.Client(base_url=server.url) as client:
        assert client.get("/readyz").status_code == 200
        # The warm-up scored one synthetic request (id 0 of each table) before the model took requests.
        rows = server.replica.registry.get_sample_value("kelp_serving_rows_total", {"result": "default"})
        assert rows == len(cfg.features.tables)  # no request was sent: these are the warm-up's

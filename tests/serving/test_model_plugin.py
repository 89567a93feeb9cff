"""A replica serves a user model, and refuses a snapshot whose model code differs from its own.

The model module lives outside the kelp package, in a temp folder put on
``sys.path`` (as ``PYTHONPATH`` does in a pod). The replica keeps serving its
current version and counts the reason (``model_digest`` / ``model_import``).
"""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from prometheus_client import CollectorRegistry

from kelp.publish import build_snapshot
from kelp.serving import ServingReplica
from kelp.trainer import build_model

from .helpers import LiveServer, publisher_for, small_config, wait_until

pytestmark = pytest.mark.integration

SOURCE = '''
import torch
from torch import nn


class Mlp(nn.Module):
    """One hidden layer over every input; the bias is the logit when the weights are zero."""

    def __init__(self, spec, hidden=4):
        super().__init__()
        self.names = list(spec.sparse)
        width = len(spec.dense) + sum(spec.sparse.values())
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, batch):
        x = torch.cat([batch.dense, *(batch.sparse[n] for n in self.names)], dim=1)
        return self.net(x).squeeze(1)
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A fresh module name in a folder on sys.path: ``(name, its file)``."""
    name = f"user_model_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "user_code"
    folder.mkdir()
    path = folder / f"{name}.py"
    path.write_text(SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()
    yield name, path
    sys.modules.pop(name, None)


def _constant(model: torch.nn.Module, logit: float) -> torch.nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.net[-1].bias.fill_(logit)
    return model


def _rejected(replica: ServingReplica, reason: str) -> float:
    value = replica.registry.get_sample_value("kelp_serving_snapshots_rejected_total", {"reason": reason})
    return value or 0.0


def test_a_snapshot_of_other_model_code_is_refused_and_the_replica_keeps_its_model(
    redis_url: str, tmp_path: Path, plugin: tuple[str, Path]
) -> None:
    name, path = plugin
    cfg = small_config(redis_url, tmp_path, trainer={"model": f"{name}:Mlp", "model_args": {"hidden": 3}})
    publisher = publisher_for(cfg)
    channel = publisher.channel
    v1, v2 = channel.next_version(), channel.next_version()
    # The trainer runs model code A (its digest goes into the snapshot) ...
    snap_a = build_snapshot(
        _constant(build_model(cfg.features, cfg.trainer), 1.0),
        cfg.features,
        cfg.trainer,
        version=v2,
        step=2,
        offsets={},
    )
    # ... while the replica's image holds code B: the same class, one edited line.
    path.write_text(SOURCE.replace("hidden=4", "hidden=5"))
    served = build_snapshot(
        _constant(build_model(cfg.features, cfg.trainer), -1.0),
        cfg.features,
        cfg.trainer,
        version=v1,
        step=1,
        offsets={},
    )
    assert served.manifest.model["reference"] == f"{name}:Mlp"
    assert served.manifest.model["model_args"] == {"hidden": 3}
    assert served.manifest.model["digest"] != snap_a.manifest.model["digest"]
    channel.write(served)
    replica = ServingReplica(cfg, CollectorRegistry())
    try:
        with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            wait_until(lambda: client.get("/v1/model").json().get("version") == v1, what="v1 served")
            first = client.post("/v1/score", json={"samples": [{}]}).json()
            assert first["model_version"] == v1
            assert first["scores"][0] == pytest.approx(float(torch.sigmoid(torch.tensor(-1.0))))

            channel.write(snap_a)
            wait_until(lambda: _rejected(replica, "model_digest") == 1, what="the model_digest rejection")
            again = client.post("/v1/score", json={"samples": [{}]}).json()
            assert again["model_version"] == v1 and again["scores"] == first["scores"]
            assert client.get("/v1/model").json()["model"]["reference"] == f"{name}:Mlp"
    finally:
        publisher.close()


def test_a_snapshot_whose_model_does_not_import_is_refused(
    redis_url: str, tmp_path: Path, plugin: tuple[str, Path]
) -> None:
    name, path = plugin
    cfg = small_config(redis_url, tmp_path, trainer={"model": f"{name}:Mlp"})
    publisher = publisher_for(cfg)
    channel = publisher.channel
    v1, v2 = channel.next_version(), channel.next_version()
    first, second = (
        build_snapshot(
            _constant(build_model(cfg.features, cfg.trainer), logit),
            cfg.features,
            cfg.trainer,
            version=v,
            step=v,
            offsets={},
        )
        for v, logit in ((v1, -1.0), (v2, 1.0))
    )
    channel.write(first)
    replica = ServingReplica(cfg, CollectorRegistry())
    try:
        with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            wait_until(lambda: client.get("/v1/model").json().get("version") == v1, what="v1 served")
            path.unlink()  # a replica whose image lacks the trainer's model package
            sys.modules.pop(name, None)
            importlib.invalidate_caches()
            channel.write(second)
            wait_until(lambda: _rejected(replica, "model_import") == 1, what="the model_import rejection")
            assert client.post("/v1/score", json={"samples": [{}]}).json()["model_version"] == v1
    finally:
        publisher.close()


def test_a_snapshot_may_not_name_a_model_the_replica_config_does_not(
    redis_url: str, tmp_path: Path, plugin: tuple[str, Path]
) -> None:
    """The channel never makes a replica import and call code its own trainer.model does not name."""
    name, _ = plugin
    cfg = small_config(redis_url, tmp_path)  # the replica's config: the built-in dlrm-small
    other = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"model": f"{name}:Mlp"})})
    publisher = publisher_for(cfg)
    channel = publisher.channel
    v1, v2 = channel.next_version(), channel.next_version()
    channel.write(
        build_snapshot(
            build_model(cfg.features, cfg.trainer), cfg.features, cfg.trainer, version=v1, step=1, offsets={}
        )
    )
    foreign = build_snapshot(
        build_model(other.features, other.trainer),
        other.features,
        other.trainer,
        version=v2,
        step=2,
        offsets={},
    )
    replica = ServingReplica(cfg, CollectorRegistry())
    try:
        with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            wait_until(lambda: client.get("/v1/model").json().get("version") == v1, what="v1 served")
            channel.write(foreign)
            wait_until(lambda: _rejected(replica, "model_import") == 1, what="the model_import rejection")
            assert client.post("/v1/score", json={"samples": [{}]}).json()["model_version"] == v1
    finally:
        publisher.close()


FRAGILE_SOURCE = '''
import torch
from torch import nn


class Fragile(nn.Module):
    """Raises on a batch of more than three samples, or whenever its bias is above 100 (a broken weight)."""

    def __init__(self, spec):
        super().__init__()
        self.net = nn.Linear(len(spec.dense), 1)

    def forward(self, batch):
        if batch.dense.shape[0] > 3:
            raise RuntimeError("cannot take more than three samples")
        if float(self.net.bias) > 100:
            raise ValueError("bias out of range")
        return self.net(batch.dense).squeeze(1)
'''


def test_a_model_that_fails_its_probe_is_refused_and_one_that_fails_a_request_is_a_500(
    redis_url: str, tmp_path: Path, plugin: tuple[str, Path]
) -> None:
    """``model_contract`` before a swap; ``500 model_error`` (counted) for input-dependent failures."""
    name, path = plugin
    path.write_text(FRAGILE_SOURCE)
    cfg = small_config(redis_url, tmp_path, trainer={"model": f"{name}:Fragile"})
    publisher = publisher_for(cfg)
    channel = publisher.channel
    v1, v2 = channel.next_version(), channel.next_version()
    model = build_model(cfg.features, cfg.trainer)
    with torch.no_grad():
        model.net.weight.zero_()
        model.net.bias.fill_(0.5)
    channel.write(build_snapshot(model, cfg.features, cfg.trainer, version=v1, step=1, offsets={}))
    with torch.no_grad():
        model.net.bias.fill_(1000.0)
    broken = build_snapshot(model, cfg.features, cfg.trainer, version=v2, step=2, offsets={})
    replica = ServingReplica(cfg, CollectorRegistry())
    try:
        with LiveServer(replica) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            wait_until(lambda: client.get("/v1/model").json().get("version") == v1, what="v1 served")
            three = client.post("/v1/score", json={"samples": [{}, {}, {}]})
            assert three.status_code == 200
            assert three.json()["scores"] == [pytest.approx(float(torch.sigmoid(torch.tensor(0.5))))] * 3

            four = client.post("/v1/score", json={"samples": [{}, {}, {}, {}]})
            assert four.status_code == 500
            body = four.json()
            assert body["error"] == "model_error"
            assert f"{name}:Fragile" in body["detail"] and "three samples" in body["detail"]
            errors = replica.registry.get_sample_value("kelp_serving_model_errors_total")
            assert errors == 1.0

            channel.write(broken)
            wait_until(lambda: _rejected(replica, "model_contract") == 1, what="the model_contract rejection")
            after = client.post("/v1/score", json={"samples": [{}]}).json()
            assert after["model_version"] == v1 and after["scores"] == three.json()["scores"][:1]
    finally:
        publisher.close()

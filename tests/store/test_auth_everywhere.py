"""A wrong Redis password is one non-retriable error in every room that talks to Redis.

Real password-protected redis-servers (and a Redis Cluster with ``requirepass``
on every node): the store (``build_store``, redis and redis-cluster), the
publish Redis channel (``build_channel``, from the store's settings and from
``publisher.redis_url``) and a serving replica's store all raise
:class:`~kelp.errors.RedisAuthError`, whose message is one line naming the
node and the setting to check, never the password, and nothing retries it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kelp.config import KelpConfig
from kelp.daemon.outage import OutageGuard, outage_policy
from kelp.errors import RedisAuthError, UserError
from kelp.harness import RedisCluster, RedisServer
from kelp.publish import build_channel
from kelp.retry import RetryPolicy
from kelp.serving import ServingReplica
from kelp.store import build_store
from kelp.trainer.metrics import TrainerMetrics

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-pw"
WRONG = "wr0ng-pw"
IDS = np.arange(3, dtype=np.uint64)


@pytest.fixture(scope="module")
def locked_server() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD) as server:
        yield server


@pytest.fixture(scope="module")
def locked_cluster() -> Iterator[RedisCluster]:
    """A fresh 3-node cluster (not the shared one), then ``requirepass`` on every node."""
    with RedisCluster() as cluster:
        for server in cluster.servers:
            server.client().config_set("requirepass", PASSWORD)
        yield cluster


def _config(tmp_path: Path, store: dict[str, Any], **sections: Any) -> KelpConfig:
    return KelpConfig.model_validate(
        {
            "deployment": "authtest",
            "source": {"kind": "file", "path": str(tmp_path / "none.msgpack"), "format": "msgpack"},
            "features": {"sparse": [{"name": "C1", "table": "ads"}], "tables": [{"name": "ads", "dim": 4}]},
            "store": store,
            **sections,
        }
    )


def _check(err: BaseException, where: str, setting: str) -> None:
    assert type(err) is RedisAuthError and isinstance(err, UserError)
    assert err.retriable is False and not RetryPolicy().retry_on(err)
    text = str(err)
    assert "\n" not in text, text
    assert where in text and setting in text, text
    assert PASSWORD not in text and WRONG not in text, text


def _not_retried(call: Any) -> RedisAuthError:
    """The trainer's OutageGuard gives up at once (no retry) and re-raises the same error."""
    metrics = TrainerMetrics(CollectorRegistry())
    never_sleep = outage_policy(60.0, sleep=lambda _s: pytest.fail("an auth error must not be retried"))
    guard = OutageGuard(60.0, metrics, policy=never_sleep)
    with pytest.raises(RedisAuthError) as info:
        guard.call("pull", call)
    assert metrics.errors.labels(stage="pull", kind="retried")._value.get() == 0
    assert metrics.errors.labels(stage="pull", kind="fatal")._value.get() == 1
    return info.value


@pytest.mark.parametrize("password", [WRONG, None], ids=["wrong", "missing"])
def test_standalone_store_channel_and_replica(tmp_path: Path, locked_server: RedisServer, password) -> None:  # type: ignore[no-untyped-def]
    where = f"127.0.0.1:{locked_server.port}"
    setting = "store.username / store.password"
    store_section = {"backend": "redis", "urls": [locked_server.url_without_auth], "password": password}
    cfg = _config(tmp_path, store_section)
    errors = []
    with build_store(cfg.store, list(cfg.features.tables), cfg.deployment) as store:
        errors.append(_not_retried(lambda: store.pull_many({"ads": IDS})))
        assert store.metrics.retries.labels(op="pull")._value.get() == 0  # the store's own retry too
    with build_channel(cfg.publisher, cfg.store, cfg.deployment) as channel:
        errors.append(_not_retried(channel.latest_version))
    replica = ServingReplica(cfg)
    try:
        errors.append(_not_retried(lambda: replica.store.pull_many({"ads": IDS}, count=False)))
        assert not replica.readiness()[0]
    finally:
        replica.close()
    assert len({type(e) for e in errors}) == 1
    for err in errors:
        _check(err, where, setting)


def test_publisher_redis_url_with_a_wrong_password(tmp_path: Path, locked_server: RedisServer) -> None:
    url = f"redis://:{WRONG}@127.0.0.1:{locked_server.port}"
    cfg = _config(tmp_path, {"backend": "memory"}, publisher={"redis_url": url})
    with build_channel(cfg.publisher, cfg.store, cfg.deployment) as channel:
        err = _not_retried(channel.next_version)
    _check(err, f"127.0.0.1:{locked_server.port}", "publisher.redis_url")


def test_good_password_still_works(tmp_path: Path, locked_server: RedisServer) -> None:
    cfg = _config(
        tmp_path, {"backend": "redis", "urls": [locked_server.url_without_auth], "password": PASSWORD}
    )
    with build_store(cfg.store, list(cfg.features.tables), cfg.deployment) as store:
        assert store.pull_many({"ads": IDS})["ads"].admitted.all()
    with build_channel(cfg.publisher, cfg.store, cfg.deployment) as channel:
        assert channel.latest_version() is None


def test_cluster_store_channel_and_replica(tmp_path: Path, locked_cluster: RedisCluster) -> None:
    """A cluster client reads the slot map when built, so the error comes from construction."""
    urls = [s.url_without_auth for s in locked_cluster.servers]
    cfg = _config(tmp_path, {"backend": "redis-cluster", "urls": urls, "password": WRONG})
    where = "cluster(" + ",".join(f"127.0.0.1:{s.port}" for s in locked_cluster.servers) + ")"
    errors = [
        _not_retried(lambda: build_store(cfg.store, list(cfg.features.tables), cfg.deployment)),
        _not_retried(lambda: build_channel(cfg.publisher, cfg.store, cfg.deployment)),
        _not_retried(lambda: ServingReplica(cfg)),
    ]
    for err in errors:
        _check(err, where, "store.username / store.password")
    good = _config(tmp_path, {"backend": "redis-cluster", "urls": urls, "password": PASSWORD}).store
    with build_store(good, list(cfg.features.tables), cfg.deployment) as store:
        assert store.pull_many({"ads": IDS})["ads"].admitted.all()

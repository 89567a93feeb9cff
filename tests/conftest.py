"""Session-wide real services for integration tests.

Each fixture starts the real program once per test session on free loopback
ports and always stops it. A missing binary fails the test with one line
saying how to install it: integration tests are never skipped silently.

* ``redis_server``: standalone redis-server, no persistence. Tests share it;
  each test gets a clean keyspace through ``redis_url`` (FLUSHALL before use).
* ``redis_cluster``: 3-node Redis Cluster, ``cluster_state:ok`` before use.
* ``tansu``: Tansu Kafka-protocol broker, memory storage. Tests create their
  own uniquely named topics (``unique_topic``) instead of sharing.
* ``metrics_registry``: a fresh prometheus registry per test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from prometheus_client import CollectorRegistry

from kelp.errors import MissingBinaryError
from kelp.harness import RedisCluster, RedisServer, TansuBroker

S = TypeVar("S", RedisServer, RedisCluster, TansuBroker)


def _started(factory: Callable[[], S]) -> S:
    """Construct and start a service; a missing binary fails with its one-line install hint."""
    try:
        service = factory()
        service.start()
    except MissingBinaryError as exc:
        pytest.fail(str(exc), pytrace=False)
    return service


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = _started(RedisServer)
    yield server
    server.cleanup()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the shared standalone Redis with an empty keyspace."""
    redis_server.client().flushall()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    cluster = _started(RedisCluster)
    yield cluster
    cluster.cleanup()


@pytest.fixture
def clean_redis_cluster(redis_cluster: RedisCluster) -> RedisCluster:
    """The shared cluster with every node's keyspace emptied."""
    for server in redis_cluster.servers:
        server.client().flushall()
    return redis_cluster


@pytest.fixture(scope="session")
def tansu() -> Iterator[TansuBroker]:
    broker = _started(TansuBroker)
    yield broker
    broker.stop()


@pytest.fixture
def unique_topic() -> str:
    """A topic name no other test uses (tests share one broker)."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def metrics_registry() -> CollectorRegistry:
    return CollectorRegistry()

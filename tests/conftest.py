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
from collections.abc import Iterator

import pytest
from kelp.harness import RedisCluster, RedisServer, TansuBroker
from prometheus_client import CollectorRegistry

from kelp.errors import MissingBinaryError


def _start_or_fail(service):  # type: ignore[no-untyped-def]
    try:
        return service.start()
    except MissingBinaryError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    try:
        server = RedisServer()
    except MissingBinaryError as exc:
        pytest.fail(str(exc), pytrace=False)
    _start_or_fail(server)
    yield server
    server.cleanup()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the shared standalone Redis with an empty keyspace."""
    redis_server.client().flushall()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    try:
        cluster = RedisCluster()
    except MissingBinaryError as exc:
        pytest.fail(str(exc), pytrace=False)
    _start_or_fail(cluster)
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
    try:
        broker = TansuBroker()
    except MissingBinaryError as exc:
        pytest.fail(str(exc), pytrace=False)
    _start_or_fail(broker)
    yield broker
    broker.stop()


@pytest.fixture
def unique_topic() -> str:
    """A topic name no other test uses (tests share one broker)."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def metrics_registry() -> CollectorRegistry:
    return CollectorRegistry()

"""Session-wide real services for integration tests.

Each fixture starts the real program once per test session on free loopback
ports and always stops it. A missing binary fails the test with one line
saying how to install it: integration tests are never skipped silently.

* ``redis_server``: standalone redis-server, no persistence. Tests share it;
  each test gets a clean keyspace through ``redis_url`` (FLUSHALL before use).
* ``redis_cluster``: 3-node Redis Cluster, ``cluster_state:ok`` before use.
* ``kafka_broker``: Apache Kafka 4 (KRaft) where Java and Maven are at hand,
  Tansu otherwise (:func:`kelp.harness.broker_kind`; ``KELP_BROKER`` forces
  one). The session's header line names the broker that ran. Tests create
  their own uniquely named topics (``unique_topic``) instead of sharing.
  Modules whose consumers pause partitions override ``kafka_broker`` with
  ``isolated_kafka_broker``: the same broker on Apache Kafka, one of the
  test's own on Tansu.
* ``metrics_registry``: a fresh prometheus registry per test.

The session runs torch on one intra-op thread (``OMP_NUM_THREADS=1`` unless the
caller set it), and so does every process a test starts. The test models are
tiny, and the machine's two cores are already shared by pytest-xdist workers,
brokers and the processes under test: OpenMP worker threads that spin waiting
for a core make the CPU-bound tests much slower, not faster.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from prometheus_client import CollectorRegistry

from kelp.errors import MissingBinaryError
from kelp.harness import KafkaBroker, RedisCluster, RedisServer, TansuBroker, broker_kind, make_broker
from kelp.harness.s3proxy import S3ProxyServer, s3proxy_available

S = TypeVar("S", bound=object)


def pytest_configure(config: pytest.Config) -> None:
    """One intra-op thread for torch here and in child processes (see the module docstring)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # a plugin imported it before this ran: the variable came too late
        sys.modules["torch"].set_num_threads(1)


def pytest_report_header() -> str:
    """One line naming the Kafka broker the integration tests run on."""
    kind = broker_kind()
    if kind == "kafka":
        from kelp.harness.kafka_dist import KAFKA_VERSION

        return f"kafka broker: Apache Kafka {KAFKA_VERSION} (KRaft, single node)"
    return "kafka broker: Tansu (fallback: java or mvn not found, or KELP_BROKER=tansu)"


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
def session_kafka_broker() -> Iterator[KafkaBroker]:
    broker = _started(make_broker)
    yield broker
    broker.cleanup()


@pytest.fixture
def kafka_broker(session_kafka_broker: KafkaBroker) -> KafkaBroker:
    """The session's broker (tests share it; each makes its own topics and groups)."""
    return session_kafka_broker


@pytest.fixture
def isolated_kafka_broker(session_kafka_broker: KafkaBroker) -> Iterator[KafkaBroker]:
    """A broker earlier consumers cannot disturb.

    Tansu keeps broker-side incremental fetch-session state that a consumer
    which paused its partitions leaves in a bad state: a *later* group on the
    same broker can then never receive one of its partitions. So on Tansu a
    test that pauses gets a broker of its own. Apache Kafka has no such state
    to leak, so there it is the session's broker.
    """
    if not isinstance(session_kafka_broker, TansuBroker):
        yield session_kafka_broker
        return
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


# -- a real S3-protocol server (s3proxy) for row snapshots: one per session (per xdist worker); each
# test gets a fresh prefix and the credentials boto3 reads, only for that test.


@pytest.fixture(scope="session")
def s3proxy_server() -> Iterator[S3ProxyServer]:
    if not s3proxy_available():
        pytest.skip("S3 snapshot tests need java and mvn (s3proxy from Maven Central); not found")
    server = S3ProxyServer()
    try:
        server.start()
    except MissingBinaryError as exc:
        pytest.skip(f"s3proxy unavailable: {' '.join(str(exc).split())[:200]}")
    yield server
    server.cleanup()


@pytest.fixture
def s3_snapshot_url(s3proxy_server: S3ProxyServer, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """``(s3://bucket/<fresh prefix>, endpoint)``, with s3proxy's credentials in the environment."""
    for key, value in s3proxy_server.aws_env().items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    return f"s3://{s3proxy_server.bucket}/t-{uuid.uuid4().hex[:12]}", s3proxy_server.endpoint


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Take back the root handler an in-process ``kelp`` command installs (``configure_logging``).

    Its stream is the test's captured stderr, which pytest closes after the test; a thread of a
    later test logging through it (kafka-python retrying a stopped broker) would print
    "--- Logging error ---" tracebacks. pytest's own capture handlers are subclasses, left alone.
    """
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler and handler not in before:
            root.removeHandler(handler)
    root.setLevel(level)

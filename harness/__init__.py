"""Start real services on free loopback ports, and always stop them.

Used by the test fixtures, ``kelp demo`` and ``kelp bench``. Nothing here
pretends to be Redis or Kafka: each class runs the real program
(``redis-server``, ``redis-cli --cluster create``, Apache Kafka in KRaft
mode, or Tansu's ``tansu broker`` where Java cannot be had)
as a child process and waits until it answers.

Each service is a context manager::

    with RedisServer() as redis_srv:
        client = redis.Redis.from_url(redis_srv.url)
"""

from kelp.harness.binaries import find_binary
from kelp.harness.broker import KafkaBroker, broker_kind, make_broker
from kelp.harness.kafka import ApacheKafka
from kelp.harness.ports import free_port
from kelp.harness.redis_cluster import RedisCluster
from kelp.harness.redis_server import RedisServer
from kelp.harness.s3 import S3Server
from kelp.harness.tansu import TansuBroker

__all__ = [
    "ApacheKafka",
    "KafkaBroker",
    "RedisCluster",
    "RedisServer",
    "S3Server",
    "TansuBroker",
    "broker_kind",
    "find_binary",
    "free_port",
    "make_broker",
]

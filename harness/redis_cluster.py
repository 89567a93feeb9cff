"""A real 3-node Redis Cluster (masters only) on free loopback ports."""

from __future__ import annotations

import subprocess
import time
from types import TracebackType

import redis
from redis.cluster import ClusterNode
from redis.cluster import RedisCluster as RedisClusterClient

from kelp.harness.binaries import find_binary
from kelp.harness.redis_server import RedisServer

__all__ = ["RedisCluster"]


class RedisCluster:
    """``nodes`` cluster-enabled ``redis-server`` processes joined by ``redis-cli --cluster create``.

    Ready means every node reports ``cluster_state:ok`` and all 16384 slots are
    covered, so the first command of a test never races slot assignment.
    """

    def __init__(self, nodes: int = 3, start_timeout_s: float = 30.0) -> None:
        if nodes < 3:
            raise ValueError("Redis Cluster needs at least 3 masters")
        self.start_timeout_s = start_timeout_s
        self.servers = [RedisServer(cluster=True) for _ in range(nodes)]
        self._cli = find_binary("redis-cli")

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        return [ClusterNode(s.host, s.port) for s in self.servers]

    def client(self, **kwargs: object) -> RedisClusterClient:
        return RedisClusterClient(startup_nodes=self.startup_nodes, **kwargs)  # type: ignore[arg-type]

    def start(self) -> RedisCluster:
        try:
            for server in self.servers:
                server.start()
            addresses = [f"{s.host}:{s.port}" for s in self.servers]
            create = ["--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"]
            result = subprocess.run(
                [self._cli, *self._cli_args(), *create],
                capture_output=True,
                text=True,
                timeout=self.start_timeout_s,
                check=False,
            )
            if result.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{result.stdout}\n{result.stderr}")
            self._wait_ok()
        except BaseException:
            self.cleanup()
            raise
        return self

    def _cli_args(self) -> list[str]:
        """Connection arguments ``redis-cli`` needs to reach the nodes (none for plain TCP)."""
        return []

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if all(self._node_ok(s) for s in self.servers):
                return
            time.sleep(0.1)
        raise RuntimeError(f"Redis Cluster not ok after {self.start_timeout_s}s")

    @staticmethod
    def _node_ok(server: RedisServer) -> bool:
        try:
            info = server.client(socket_timeout=1).execute_command("CLUSTER", "INFO")
        except redis.exceptions.RedisError:
            return False
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text and "cluster_slots_assigned:16384" in text

    def cleanup(self) -> None:
        for server in self.servers:
            server.cleanup()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

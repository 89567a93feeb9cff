"""A Redis Cluster whose every node is on its own host of a :class:`~kelp.harness.hosts.HostRig`.

Three primaries and one replica each by default (``redis-cli --cluster create
--cluster-replicas 1``, which puts a primary's replica on another address, so
on another host), with a short ``cluster-node-timeout`` so a killed primary's
replica is promoted within a few seconds. Nodes can be killed (SIGKILL),
paused (SIGSTOP), restarted on their own ``nodes.conf`` (a killed primary comes
back as a replica of the node that replaced it), or cut off with the rig's
:meth:`~kelp.harness.hosts.HostRig.partition`.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import redis
from redis.crc import key_slot

from kelp.harness.binaries import find_binary
from kelp.harness.hosts import Host, HostRig
from kelp.harness.process import ManagedProcess

__all__ = ["RedisHostCluster", "RedisHostNode"]

_PORT = 6379


@dataclass
class RedisHostNode:
    """One ``redis-server`` on one host of the rig; its data and ``nodes.conf`` in ``workdir``."""

    host: Host
    workdir: Path
    port: int = _PORT
    proc: ManagedProcess | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """``address:port``, as the cluster and redis-py name the node."""
        return f"{self.host.address}:{self.port}"

    @property
    def url(self) -> str:
        return f"redis://{self.name}"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host=self.host.address, port=self.port, **kwargs)  # type: ignore[arg-type]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


class RedisHostCluster:
    """``primaries`` primaries with ``replicas`` replicas each, every node on its own rig host.

    ``appendonly``: each node's append-only file (``appendfsync always``) on or off.
    """

    def __init__(
        self,
        rig: HostRig,
        *,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 2000,
        appendonly: bool = False,
        start_timeout_s: float = 60.0,
    ) -> None:
        if primaries < 3:
            raise ValueError("Redis Cluster needs at least 3 primaries")
        self.rig = rig
        self.node_timeout_ms = node_timeout_ms
        self.appendonly = appendonly
        self.start_timeout_s = start_timeout_s
        self.replicas = replicas
        self._binary = find_binary("redis-server")
        self._cli = find_binary("redis-cli")
        count = primaries * (1 + replicas)
        self.nodes = [
            RedisHostNode(rig.add_host(f"redis-{i}"), Path(tempfile.mkdtemp(prefix=f"kelp-redis-host-{i}-")))
            for i in range(count)
        ]

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> RedisHostCluster:
        try:
            for node in self.nodes:
                self.start_node(node)
            create = [self._cli, "--cluster", "create", *(n.name for n in self.nodes)]
            create += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
            result = subprocess.run(
                create, capture_output=True, text=True, timeout=self.start_timeout_s, check=False
            )
            if result.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{result.stdout}\n{result.stderr}")
            self.wait_healthy(self.start_timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def _argv(self, node: RedisHostNode) -> list[str]:
        argv = [self._binary, "--bind", node.host.address, "--port", str(node.port)]
        argv += ["--protected-mode", "no", "--save", "", "--daemonize", "no", "--dir", str(node.workdir)]
        argv += ["--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "always"]
        argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        return [*argv, "--cluster-node-timeout", str(self.node_timeout_ms)]

    def start_node(self, node: RedisHostNode, timeout_s: float = 30.0) -> None:
        """Start (or restart, on its own ``nodes.conf``) one node and wait until it answers."""
        node.proc = node.host.process(self._argv(node), name=f"redis-{node.host.name}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not node.proc.alive():
                raise RuntimeError(f"redis-server on {node.host} exited:\n{node.proc.log_tail()}")
            try:
                if node.client(socket_timeout=0.5).ping():
                    return
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on {node.host} did not answer within {timeout_s}s")

    def kill(self, node: RedisHostNode) -> None:
        """SIGKILL: the host's Redis crashes with whatever it had not replicated."""
        if node.proc is not None:
            node.proc.kill()
            node.proc.stop()

    def pause(self, node: RedisHostNode) -> None:
        """SIGSTOP: the node keeps its sockets and answers nothing, replication included."""
        if node.proc is not None:
            node.proc.kill(signal.SIGSTOP)

    def resume(self, node: RedisHostNode) -> None:
        if node.proc is not None:
            node.proc.kill(signal.SIGCONT)

    def close(self) -> None:
        for node in self.nodes:
            if node.proc is not None:
                node.proc.kill(signal.SIGCONT)
                node.proc.stop()
            shutil.rmtree(node.workdir, ignore_errors=True)

    def __enter__(self) -> RedisHostCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- topology ---------------------------------------------------------------------------------

    def topology(self) -> dict[str, dict[str, str]]:
        """``CLUSTER NODES`` as seen by the first live node that answers: per node name, its
        ``role`` (master/slave), ``flags``, ``master`` (a replica's primary, by name) and ``slots``."""
        for node in self.nodes:
            if not node.alive():
                continue
            try:
                text = node.client(socket_timeout=1).execute_command("CLUSTER", "NODES")
            except redis.exceptions.RedisError:
                continue
            return _parse_nodes(text.decode() if isinstance(text, bytes) else str(text))
        raise RuntimeError("no node of the cluster answers CLUSTER NODES")

    def node(self, name: str) -> RedisHostNode:
        return next(n for n in self.nodes if n.name == name)

    def primary_of(self, key: bytes) -> RedisHostNode:
        """The node serving ``key``'s slot now."""
        slot = key_slot(key)
        for name, info in self.topology().items():
            if info["role"] == "master" and "fail" not in info["flags"] and _has_slot(info["slots"], slot):
                return self.node(name)
        raise RuntimeError(f"no live primary serves slot {slot}")

    def replicas_of(self, primary: RedisHostNode) -> list[RedisHostNode]:
        topo = self.topology()
        ids = {info["id"]: name for name, info in topo.items()}
        return [
            self.node(name)
            for name, info in topo.items()
            if info["role"] == "slave" and ids.get(info["master"]) == primary.name
        ]

    def wait_healthy(self, timeout_s: float) -> None:
        """Until every live node says ``cluster_state:ok`` and every primary has its replicas online."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._healthy():
                return
            time.sleep(0.1)
        raise RuntimeError(f"Redis Cluster on hosts not healthy after {timeout_s}s: {self.topology()}")

    def _healthy(self) -> bool:
        try:
            for node in self.nodes:
                if not node.alive():
                    continue
                client = node.client(socket_timeout=1)
                if b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                    return False
                info = client.info("replication")
                if info["role"] == "master" and int(info.get("connected_slaves", 0)) < self.replicas:
                    return False
                if info["role"] == "slave" and info.get("master_link_status") != "up":
                    return False
        except redis.exceptions.RedisError:
            return False
        return True

    def wait_promoted(self, old: RedisHostNode, key: bytes, timeout_s: float) -> RedisHostNode:
        """The node that took over ``key``'s slot from ``old``, once it serves it as a primary."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                now = self.primary_of(key)
                if now.name != old.name:
                    return now
            except RuntimeError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"no replica took over from {old.name} within {timeout_s}s: {self.topology()}")


def _parse_nodes(text: str) -> dict[str, dict[str, str]]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        name = parts[1].split("@")[0]
        flags = parts[2]
        role = "master" if "master" in flags else "slave"
        slots = " ".join(parts[8:])
        out[name] = {"id": parts[0], "flags": flags, "role": role, "master": parts[3], "slots": slots}
    return out


def _has_slot(slots: str, slot: int) -> bool:
    for item in slots.split():
        if item.startswith("["):
            continue  # a slot being migrated or imported
        lo, _, hi = item.partition("-")
        if int(lo) <= slot <= int(hi or lo):
            return True
    return False

"""Free loopback ports for services started by the harness."""

from __future__ import annotations

import socket
import time

__all__ = ["free_port", "wait_for_port"]


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(also_free_offset: int | None = None) -> int:
    """A TCP port on 127.0.0.1 that is free now.

    ``also_free_offset`` asks that ``port + offset`` be free too (Redis Cluster
    uses ``port + 10000`` for its bus). There is an unavoidable race between
    this check and the service binding the port; services are started with a
    retry on "address in use" for that reason.
    """
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if also_free_offset is None:
            return port
        if port + also_free_offset <= 65_535 and _bindable(port + also_free_offset):
            return port
    raise RuntimeError("could not find a free loopback port")


def wait_for_port(port: int, timeout_s: float, host: str = "127.0.0.1") -> bool:
    """True once something accepts TCP connections on host:port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False

"""Free loopback ports for services started by the harness, picked outside the kernel's ephemeral range.

The kernel gives the local end of every outgoing TCP connection a port from its
ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by
default on Linux). A port picked inside that range is free only until some
client connection, of this process or any other, is given it: between the pick
and the service's bind that may happen, and it is likely for a port nobody
binds at pick time at all, such as ``port + offset`` of :func:`free_port` (rank
1's metrics port, a Redis Cluster node's bus port), which then stays unbound
while rank 0 or the node starts. A port outside the range is only ever taken by
an explicit bind, so :func:`free_port` picks there, at random (not from
``random``'s shared, possibly seeded, state), and never hands out a port it
handed out recently in this process.
"""

from __future__ import annotations

import collections
import random
import socket
import threading
import time
from pathlib import Path

__all__ = ["candidate_ports", "ephemeral_range", "free_port", "wait_for_port"]

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
ASSUMED_EPHEMERAL = (32_768, 65_535)
"""Where the file cannot be read (not Linux): Linux's default start, through the end of the IANA
dynamic range that BSD and macOS use."""
LOWEST = 10_000
"""No port below this is picked: many well-known services listen there."""
_HIGHEST = 65_535

_random = random.SystemRandom()
_recent: collections.deque[int] = collections.deque(maxlen=1024)
_lock = threading.Lock()


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections, both ends included.

    >>> ephemeral_range(Path("/nonexistent"))
    (32768, 65535)
    """
    try:
        low, high = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return ASSUMED_EPHEMERAL
    return low, high


def candidate_ports(offset: int, ephemeral: tuple[int, int], lowest: int = LOWEST) -> list[range]:
    """Ports ``p`` with both ``p`` and ``p + offset`` in ``[lowest, 65535]`` and outside ``ephemeral``.

    >>> candidate_ports(0, (32768, 60999))
    [range(10000, 32768), range(61000, 65536)]
    >>> candidate_ports(10_000, (32768, 60999))  # a Redis Cluster node and its bus port
    [range(10000, 22768)]
    >>> candidate_ports(1, (1024, 65535))  # the whole range is ephemeral: nothing is safe
    []
    """
    low, high = ephemeral
    below, above = range(lowest, min(low, _HIGHEST + 1)), range(max(high + 1, lowest), _HIGHEST + 1)
    outside = [r for r in (below, above) if r]
    out = []
    for first in outside:
        for second in outside:
            both = range(max(first.start, second.start - offset), min(first.stop, second.stop - offset))
            if both:
                out.append(both)
    return sorted(out, key=lambda r: r.start)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(also_free_offset: int | None = None) -> int:
    """A TCP port on 127.0.0.1 that is free now, outside the kernel's ephemeral range.

    ``also_free_offset`` asks that ``port + offset`` be free too (Redis Cluster
    uses ``port + 10000`` for its bus; a group of trainer ranks serves metrics on
    ``port + local rank``). Only an explicit bind by another process (one that
    picks ports the same way, say) can still take either port before the service
    binds it. Where the ephemeral range leaves no room, the kernel picks (``bind``
    to port 0) and client connections can take the ports again.
    """
    offset = also_free_offset or 0
    ranges = candidate_ports(offset, ephemeral_range())
    sizes = [len(r) for r in ranges]
    for _ in range(200):
        port = _pick(ranges, sizes) if ranges else _kernel_pick()
        wanted = (port, port + offset) if offset else (port,)
        if port + offset > _HIGHEST:
            continue
        with _lock:
            if any(p in _recent for p in wanted):
                continue
            if all(_bindable(p) for p in wanted):
                _recent.extend(wanted)
                return port
    raise RuntimeError("could not find a free loopback port")


def _pick(ranges: list[range], sizes: list[int]) -> int:
    """A port drawn uniformly from ``ranges`` (``sizes``: their lengths)."""
    (chosen,) = _random.choices(ranges, weights=sizes)
    return _random.choice(chosen)


def _kernel_pick() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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

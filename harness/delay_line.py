"""A wire with latency between two rig hosts, in user space: for kernels without ``sch_netem``.

Each end is a TAP interface inside one host's network namespace, with an
address of a /24 of its own; this process carries every Ethernet frame from
one TAP to the other ``delay_ms`` after it read it (one way, so a round trip
takes ``2 * delay_ms``), in order. Processes on the two hosts that talk over
these addresses (gloo, with ``GLOO_SOCKET_IFNAME`` set to :attr:`DelayLine.ifname`)
see the latency; their other traffic (Kafka, Redis) keeps the rig's links.

The MTU is large (64 KB): the frames carry the same bytes in fewer packets, so
the carrying threads cost little CPU. The latency is a sleep until each
frame's due time: on a busy machine add the scheduling noise the measured
round trip shows (``kelp bench scale`` with ``hosts`` reports it).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import select
import struct
import subprocess
import threading
import time
from types import TracebackType
from typing import Any

__all__ = ["DelayLine"]

_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_MTU = 65000


def _ip(*argv: str, netns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    done = subprocess.run([*prefix, "ip", *argv], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)} failed: {done.stderr.strip()}")


class DelayLine:
    """A point-to-point wire between ``a`` and ``b`` (rig hosts) on ``subnet`` (``"198.19.7"``: .1 and .2).

    ``delay_ms`` may change while it runs (:attr:`delay_ms`); frames already on the wire keep theirs.
    """

    def __init__(self, a: Any, b: Any, subnet: str, name: str, delay_ms: float = 0.0) -> None:
        self.hosts = (a, b)
        self.addresses = (f"{subnet}.1", f"{subnet}.2")
        self.ifname = f"{name}w"[:15]
        self.delay_ms = delay_ms
        self._fds: list[int] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> DelayLine:
        for i, host in enumerate(self.hosts):
            temp = f"{self.ifname[:12]}t{i}"
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
            fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", temp.encode(), _IFF_TAP | _IFF_NO_PI))
            self._fds.append(fd)
            _ip("link", "set", temp, "netns", host.netns)
            _ip("link", "set", temp, "name", self.ifname, netns=host.netns)
            _ip("link", "set", self.ifname, "mtu", str(_MTU), netns=host.netns)
            _ip("addr", "add", f"{self.addresses[i]}/24", "dev", self.ifname, netns=host.netns)
            _ip("link", "set", self.ifname, "up", netns=host.netns)
        for src, dst in ((0, 1), (1, 0)):
            queue: collections.deque[tuple[float, bytes]] = collections.deque()
            ready = threading.Condition()
            for target in (self._read, self._write):
                thread = threading.Thread(
                    target=target, args=(self._fds[src], self._fds[dst], queue, ready), daemon=True
                )
                thread.start()
                self._threads.append(thread)
        return self

    def _read(self, src: int, _dst: int, queue: collections.deque[tuple[float, bytes]], ready: Any) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select([src], [], [], 0.2)
            if not readable:
                continue
            with contextlib.suppress(BlockingIOError, OSError):
                while True:
                    frame = os.read(src, _MTU + 64)
                    with ready:
                        queue.append((time.monotonic() + self.delay_ms / 1e3, frame))
                        ready.notify()

    def _write(self, _src: int, dst: int, queue: collections.deque[tuple[float, bytes]], ready: Any) -> None:
        while not self._stop.is_set():
            with ready:
                while not queue and not self._stop.is_set():
                    ready.wait(0.2)
                if not queue:
                    continue
                due, frame = queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    ready.wait(wait)  # woken early by a new frame: the head is still first
                    continue
                queue.popleft()
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(dst, frame)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(2)
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)  # the TAP goes with its last file descriptor
        self._fds.clear()

    def __enter__(self) -> DelayLine:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

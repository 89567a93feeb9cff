"""free_port: ports a client connection can never be given, free when picked, never handed out twice."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kelp.harness import ports
from kelp.harness.ports import candidate_ports, ephemeral_range, free_port


@pytest.mark.parametrize("offset", [None, 1, 10_000])
def test_picked_ports_and_their_offsets_are_free_and_outside_the_ephemeral_range(offset: int | None) -> None:
    low, high = ephemeral_range()
    if not candidate_ports(offset or 0, (low, high)):
        pytest.skip(f"the ephemeral range {low}-{high} leaves no port outside it")
    picked = [free_port(also_free_offset=offset) for _ in range(50)]
    for port in picked:
        for p in (port, port + (offset or 0)):
            assert ports.LOWEST <= p <= 65_535 and not low <= p <= high, (p, (low, high))
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", p))  # free: binds
    assert len(set(picked)) == len(picked)  # never handed out twice in a row


def test_client_connections_take_their_local_ports_from_the_ephemeral_range_only() -> None:
    """The premise of the pick: the kernel gives outgoing connections ports inside the range."""
    low, high = ephemeral_range()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        clients = [socket.create_connection(server.getsockname()) for _ in range(50)]
        try:
            assert all(low <= c.getsockname()[1] <= high for c in clients)
        finally:
            for c in clients:
                c.close()


def test_a_port_bound_by_someone_else_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        draws = iter([busy, 20_001])
        monkeypatch.setattr(ports, "_pick", lambda _ranges, _sizes: next(draws))
        monkeypatch.setattr(ports, "_recent", ports.collections.deque(maxlen=8))
        if not ports._bindable(20_001):
            pytest.skip("port 20001 is in use on this machine")
        assert free_port() == 20_001


def test_with_no_room_outside_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65_535))
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_the_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ephemeral_range(path) == (40_000, 50_000)
    path.write_text("garbage")
    assert ephemeral_range(path) == ports.ASSUMED_EPHEMERAL


@given(
    st.integers(1024, 65_535).flatmap(lambda low: st.tuples(st.just(low), st.integers(low, 65_535))),
    st.integers(0, 20_000),
)
def test_candidates_are_exactly_the_ports_outside_the_range_with_their_offset(
    ephemeral: tuple[int, int], offset: int
) -> None:
    every = np.arange(65_536 + offset)
    outside = (
        (every >= ports.LOWEST) & (every <= 65_535) & ~((every >= ephemeral[0]) & (every <= ephemeral[1]))
    )
    expected = np.flatnonzero(outside[:65_536] & outside[offset : offset + 65_536])
    got = [p for r in candidate_ports(offset, ephemeral) for p in r]
    assert got == expected.tolist()

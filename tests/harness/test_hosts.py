"""The host rig: namespaces that reach each other and the test process, partitions, netem, clean-up."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kelp.harness.hosts import RANGE, Host, HostRig, available, clean_stale, wait_port

pytestmark = pytest.mark.integration

_OK, _WHY = available()
if not _OK:
    pytest.skip(f"host rig unavailable here: {_WHY}", allow_module_level=True)

_PORT = 7400
_ECHO = (
    "import socket,sys\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8)\n"
    "while True:\n"
    "    c,_=s.accept(); c.sendall(c.recv(64)); c.close()\n"
)


@pytest.fixture(scope="module")
def rig() -> Iterator[HostRig]:
    with HostRig() as r:
        for name in ("a", "b"):
            host = r.add_host(name)
            host.process([sys.executable, "-c", _ECHO, host.address, str(_PORT)], name=f"echo-{name}")
        for host in r.hosts.values():
            assert wait_port(host.address, _PORT, 30), f"echo server on {host} did not start"
        yield r


def _out(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def _echo(address: str, timeout_s: float = 5.0) -> bytes:
    with socket.create_connection((address, _PORT), timeout=timeout_s) as s:
        s.sendall(b"ping")
        return s.recv(64)


def _echo_from(host: Host, address: str) -> str:
    code = (
        "import socket,sys\n"
        "s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); s.sendall(b'hop')\n"
        "print(s.recv(64).decode())\n"
    )
    out = host.popen(
        [sys.executable, "-c", code, address, str(_PORT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stdout, stderr = out.communicate(timeout=30)
    return stdout.decode().strip() or stderr.decode().strip()


def test_hosts_reach_each_other_and_the_test_process_reaches_them(rig: HostRig) -> None:
    a, b = rig.hosts["a"], rig.hosts["b"]
    assert a.address != b.address
    assert all(ipaddress.ip_address(h.address) in RANGE for h in (a, b))
    assert _echo(a.address) == b"ping"
    assert _echo_from(a, b.address) == "hop"


def test_no_route_leaves_the_range(rig: HostRig) -> None:
    a = rig.hosts["a"]
    routes = subprocess.run(a.wrap(["ip", "-4", "route"]), capture_output=True, text=True, check=True).stdout
    assert "default" not in routes
    for line in routes.splitlines():
        assert ipaddress.ip_network(line.split()[0]).subnet_of(RANGE), line  # type: ignore[arg-type]
    root = _out(["ip", "-4", "route", "show", "dev", rig.bridge])
    assert [line.split()[0] for line in root.splitlines()] == [f"{rig.address.rsplit('.', 1)[0]}.0/24"]


def test_partition_cuts_a_host_off_and_heal_brings_it_back(rig: HostRig) -> None:
    a, b = rig.hosts["a"], rig.hosts["b"]
    with rig.partitioned(b):
        with pytest.raises(OSError):
            _echo(b.address, timeout_s=1.0)
        assert _echo(a.address) == b"ping"  # only b's link is down
    assert wait_port(b.address, _PORT, 30)
    assert _echo(b.address) == b"ping"


def test_netem_goes_on_both_ends_and_comes_off(rig: HostRig) -> None:
    ok, why = rig.netem_available()
    if not ok:
        pytest.skip(why)
    a = rig.hosts["a"]

    def qdiscs() -> str:
        inside = _out(a.wrap(["tc", "qdisc", "show", "dev", a.peer]))
        return _out(["tc", "qdisc", "show", "dev", a.veth]) + inside

    with rig.fault(a, delay_ms=1, jitter_ms=0.5, loss_pct=0):
        assert qdiscs().count("netem") == 2
        assert _echo(a.address) == b"ping"
    assert "netem" not in qdiscs()


_SINK = (
    "import socket,sys\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8)\n"
    "while True:\n"
    "    c,_=s.accept(); n=0\n"
    "    while (b:=c.recv(65536)): n+=len(b)\n"
    "    c.sendall(str(n).encode()); c.close()\n"
)
_SEND = (
    "import socket,sys\n"
    "s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)\n"
    "s.sendall(bytes(int(sys.argv[3]))); s.shutdown(socket.SHUT_WR)\n"
    "print(s.recv(64).decode())\n"
)
_SINK_PORT = 7401
_TRANSFER = 64 << 20
"""Hundreds of (offloaded, up to 64 KiB) segments: at 5 % loss some are certain to be dropped."""


def test_loss_drops_packets_tcp_still_delivers_and_the_rule_comes_off(rig: HostRig) -> None:
    ok, why = rig.loss_available()
    if not ok:
        pytest.skip(why)
    a, b = rig.hosts["a"], rig.hosts["b"]
    b.process([sys.executable, "-c", _SINK, b.address, str(_SINK_PORT)], name="sink-b")
    assert wait_port(b.address, _SINK_PORT, 30), "sink on b did not start"
    before = rig.tcp_retransmits(a)
    # The loss on the receiver: a dropped data segment is one the sender must retransmit (a segment
    # dropped on the sender's own way out is only re-queued, which the counter does not show).
    with rig.fault(b, loss_pct=5, duration_s=120):
        if not rig.netem_available()[0]:
            assert "numgen random mod 10000 < 500 drop" in rig.loss_rules(b)
        sender = a.popen(
            [sys.executable, "-c", _SEND, b.address, str(_SINK_PORT), str(_TRANSFER)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = sender.communicate(timeout=120)
    assert out.decode().strip() == str(_TRANSFER), err.decode()
    assert rig.tcp_retransmits(a) > before  # the loss was real: the kernel resent what was dropped
    assert "kelp_loss" not in rig.loss_rules(b)
    assert _echo(b.address) == b"ping"


def test_everything_is_removed_at_exit_and_stale_rigs_at_the_next_start() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"kr{dead.pid & 0xFFFFFF:06x}ff-left"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    with HostRig() as r:
        host = r.add_host("x")
        proc = host.process(["sleep", "600"], name="sleeper")
        names = (r.prefix, r.bridge, host.netns)
        assert stale not in _out(["ip", "netns", "list"])
    assert not proc.alive()
    netns = _out(["ip", "netns", "list"])
    links = _out(["ip", "-o", "link", "show"])
    assert names[2] not in netns
    assert names[1] not in links and f"{names[0]}h" not in links
    assert clean_stale() == []


def test_bad_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="name_prefix"):
        HostRig(name_prefix="Not-OK!")

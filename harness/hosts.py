"""Hosts you can fail, on one machine: Linux network namespaces joined by one bridge per rig.

Each :class:`Host` is a network namespace with one veth link into the rig's
bridge and one IPv4 address from the benchmarking range 198.18.0.0/15. The
bridge itself has an address in the same /24 in the root namespace, so the test
process (clients, benchmarks) talks to every host directly. Nothing else is
routed: the namespaces have no default route, and the root namespace gains only
the /24 that the bridge is connected to, so no traffic can leave the machine.

Faults are per host link: :meth:`HostRig.link` puts ``tc netem`` (delay,
jitter, loss) on *both* ends of the host's veth, so each direction gets the
delay (a round trip to a host with ``delay_ms=1`` takes 2 ms more) and the
loss; :meth:`HostRig.partition` takes the host's link down (nothing in or out,
open connections hang as across a real partition) and :meth:`HostRig.heal`
brings it back. Kernels built without ``sch_netem`` refuse netem:
:meth:`HostRig.netem_available` says so and :meth:`HostRig.link` raises
:class:`NetemUnavailableError` naming it for delay and jitter; partitions need no
qdisc and always work. Loss alone does not need netem: without it,
:meth:`HostRig.link` drops ``loss_pct`` of the packets in and out of the host's
interface with an nftables rule (``numgen random``) in the host's namespace,
which goes with the namespace if the rig dies before removing it
(:meth:`HostRig.loss_available`; the ``nft`` command is Debian's ``nftables``).

Everything a rig makes (processes, namespaces, veths, the bridge and its
qdiscs) is removed on exit, after a failed test too, and by an ``atexit`` and
SIGTERM guard. Names carry the creating pid (``kr<pid><rand>``), so a rig left
behind by a killed run is found and removed when the next rig starts.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from kelp.harness.process import ManagedProcess

__all__ = ["Host", "HostRig", "NetemUnavailableError", "available"]

RANGE = ipaddress.ip_network("198.18.0.0/15")
"""The benchmarking range (RFC 2544): never routed on the Internet, used inside the rig only."""
_SUBNETS = 512
"""/24 subnets of :data:`RANGE`: one per live rig, so parallel test workers never share one."""
_MAX_HOSTS = 250
_STALE = re.compile(r"^kr([0-9a-f]{6})[0-9a-f]{2}")
"""Names made by the default prefix scheme: ``kr`` + creating pid (6 hex) + 2 random hex."""
_LOCK_PATH = Path(tempfile.gettempdir()) / "kelp-hostrig.lock"
_IP = "ip"
_NFT = "nft"
_LOSS_TABLE = "kelp_loss"
"""The nftables table (family ``inet``) a host's namespace holds while it has a loss fault."""
_LOSS_SCALE = 10_000
"""``numgen random mod`` this: loss in steps of 0.01 %."""


class NetemUnavailableError(RuntimeError):
    """No ``sch_netem`` in this kernel: no delay or jitter on a link (nor loss, without ``nft``)."""


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def available() -> tuple[bool, str]:
    """``(True, "")`` where this process can make namespaces, veths and a bridge; else why not."""
    if shutil.which(_IP) is None:
        return False, "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    prefix = _default_prefix()  # the rig scheme: a probe cut short is cleaned as a stale rig
    probe = f"{prefix}-probe"
    made = _run([_IP, "netns", "add", probe], check=False)
    if made.returncode != 0:
        return False, f"`ip netns add` not permitted: {made.stderr.strip()}"
    try:
        pair = [_IP, "link", "add", f"{prefix}pa", "type", "veth", "peer", "name", f"{prefix}pb"]
        veth = _run(pair, check=False)
        if veth.returncode != 0:
            return False, f"veth pairs not permitted: {veth.stderr.strip()}"
        _run([_IP, "link", "del", f"{prefix}pa"], check=False)
    finally:
        _run([_IP, "netns", "del", probe], check=False)
    return True, ""


def _default_prefix() -> str:
    """``kr`` + this pid (6 hex) + 2 random hex digits: unique per process, and says whose it is."""
    return f"kr{os.getpid() & 0xFFFFFF:06x}{secrets.token_hex(1)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_netns_pids(netns: str) -> None:
    """SIGKILL whatever still runs in ``netns`` (a namespace outlives nothing it holds)."""
    pids = _run([_IP, "netns", "pids", netns], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def clean_stale() -> list[str]:
    """Remove namespaces and links of rigs whose creating process is gone; returns their names."""
    removed = []
    for line in _run([_IP, "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _STALE.match(name)
        if m and not _pid_alive(int(m.group(1), 16)):
            _kill_netns_pids(name)
            _run([_IP, "netns", "del", name], check=False)
            removed.append(name)
    for line in _run([_IP, "-o", "link", "show"], check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        dev = parts[1].strip().split("@")[0]
        m = _STALE.match(dev)
        if m and not _pid_alive(int(m.group(1), 16)):
            _run([_IP, "link", "del", dev], check=False)
            removed.append(dev)
    return removed


class Host:
    """One network namespace of a rig: its name, its address, and a way to run programs inside it."""

    def __init__(self, rig: HostRig, name: str, *, netns: str, address: str, veth: str, peer: str) -> None:
        self.rig = rig
        self.name = name
        self.netns = netns
        self.address = address
        self.veth = veth
        """The link's end in the root namespace (a port of the rig's bridge)."""
        self.peer = peer
        """The link's end inside the namespace."""

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec`` execs it: same pid)."""
        return [_IP, "netns", "exec", self.netns, *argv]

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the namespace; the caller owns the process."""
        return subprocess.Popen(self.wrap(argv), **kwargs)

    def process(self, argv: list[str], *, name: str, log_path: Path | None = None) -> ManagedProcess:
        """Start ``argv`` inside the namespace, output to ``log_path``; the rig stops it at exit."""
        proc = ManagedProcess(self.wrap(argv), name, workdir=log_path.parent if log_path else None)
        if log_path is not None:
            proc.log_path = log_path
        proc.start()
        self.rig._processes.append(proc)
        return proc

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address})"


_LIVE: list[HostRig] = []
_GUARD_LOCK = threading.Lock()
_GUARD: dict[str, bool] = {"installed": False}


def _close_live() -> None:
    for rig in list(_LIVE):
        rig.close()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _close_live()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_guard() -> None:
    """atexit always; SIGTERM only where nobody else handles it (and only the main thread may)."""
    with _GUARD_LOCK:
        if _GUARD["installed"]:
            return
        atexit.register(_close_live)
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError):
                if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                    signal.signal(signal.SIGTERM, _on_sigterm)
        _GUARD["installed"] = True


class HostRig:
    """A bridge and the hosts on it; a context manager that removes all of it on exit.

    ``name_prefix``: at most 10 characters of ``[a-z0-9]``, the start of every name the rig
    makes; default ``kr`` + this pid + 2 random hex digits, unique per run and per test worker.
    """

    def __init__(self, name_prefix: str | None = None) -> None:
        prefix = name_prefix or _default_prefix()
        if not re.fullmatch(r"[a-z0-9]{1,10}", prefix):
            raise ValueError(f"name_prefix must be 1-10 characters of [a-z0-9], not {prefix!r}")
        self.prefix = prefix
        self.bridge = f"{prefix}br"
        self.hosts: dict[str, Host] = {}
        self._processes: list[ManagedProcess] = []
        self._subnet: ipaddress.IPv4Network | None = None
        self._netem: bool | None = None
        self._closed = False
        self._lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> HostRig:
        ok, why = available()
        if not ok:
            raise RuntimeError(f"host rig unavailable: {why}")
        _install_guard()
        _LIVE.append(self)
        try:
            with self._allocation_lock():
                clean_stale()
                self._subnet = self._free_subnet()
                _run([_IP, "link", "add", self.bridge, "type", "bridge"])
                _run([_IP, "addr", "add", f"{self._subnet[1]}/24", "dev", self.bridge])
                _run([_IP, "link", "set", self.bridge, "up"])
        except BaseException:
            self.close()
            raise
        return self

    @contextlib.contextmanager
    def _allocation_lock(self) -> Iterator[None]:
        """One rig at a time picks a subnet and makes its bridge (parallel workers, one machine)."""
        with open(_LOCK_PATH, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _free_subnet(self) -> ipaddress.IPv4Network:
        """A /24 of :data:`RANGE` that no address in the root namespace is on yet."""
        used = set()
        for line in _run([_IP, "-o", "-4", "addr", "show"], check=False).stdout.splitlines():
            m = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", line)
            if m and ipaddress.ip_address(m.group(1)) in RANGE:
                used.add(ipaddress.ip_network(f"{m.group(1)}/24", strict=False))
        subnets = list(RANGE.subnets(new_prefix=24))
        start = int.from_bytes(self.prefix.encode(), "big") % _SUBNETS
        for i in range(_SUBNETS):
            net = subnets[(start + i) % _SUBNETS]
            if net not in used:
                return net
        raise RuntimeError("every /24 of 198.18.0.0/15 is taken by a host rig")

    @property
    def address(self) -> str:
        """The bridge's address in the root namespace: where the test process is, seen from a host."""
        assert self._subnet is not None, "start() the rig first"
        return str(self._subnet[1])

    def close(self) -> None:
        """Stop every process, then remove namespaces, links and the bridge; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for proc in reversed(self._processes):
            with contextlib.suppress(Exception):
                proc.kill(signal.SIGCONT)  # a paused process would ignore the SIGTERM
                proc.stop(timeout_s=3.0)
        for host in self.hosts.values():
            _kill_netns_pids(host.netns)
            _run([_IP, "link", "del", host.veth], check=False)
            _run([_IP, "netns", "del", host.netns], check=False)
        _run([_IP, "link", "del", self.bridge], check=False)
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)

    def __enter__(self) -> HostRig:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- hosts ------------------------------------------------------------------------------------

    def add_host(self, name: str) -> Host:
        """A namespace with ``lo`` up and one veth into the bridge, at the next address of the subnet."""
        if self._subnet is None:
            raise RuntimeError("start() the rig (or enter it) before adding hosts")
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists already")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", name):
            raise ValueError(f"host name must be 1-40 characters of [A-Za-z0-9_.-], not {name!r}")
        index = len(self.hosts) + 1
        if index > _MAX_HOSTS:
            raise ValueError(f"a rig holds at most {_MAX_HOSTS} hosts")
        address = str(self._subnet[index + 1])
        host = Host(
            self,
            name,
            netns=f"{self.prefix}-{name}",
            address=address,
            veth=f"{self.prefix}h{index}",
            peer=f"{self.prefix}n{index}",
        )
        self.hosts[name] = host  # registered first: a half-made host is still removed at close
        _run([_IP, "netns", "add", host.netns])
        _run([_IP, "link", "add", host.veth, "type", "veth", "peer", "name", host.peer])
        _run([_IP, "link", "set", host.peer, "netns", host.netns])
        _run([_IP, "link", "set", host.veth, "master", self.bridge])
        _run([_IP, "link", "set", host.veth, "up"])
        inside = [_IP, "netns", "exec", host.netns, _IP]
        _run([*inside, "link", "set", "lo", "up"])
        _run([*inside, "addr", "add", f"{address}/24", "dev", host.peer])
        _run([*inside, "link", "set", host.peer, "up"])
        return host

    # -- faults -----------------------------------------------------------------------------------

    def netem_available(self) -> tuple[bool, str]:
        """Whether this kernel takes ``tc qdisc ... netem`` (probed once on the rig's bridge)."""
        if self._netem is None:
            if shutil.which("tc") is None:
                return False, "no `tc` command (iproute2)"
            probe = _run(
                ["tc", "qdisc", "add", "dev", self.bridge, "root", "netem", "delay", "0ms"], check=False
            )
            self._netem = probe.returncode == 0
            if self._netem:
                _run(["tc", "qdisc", "del", "dev", self.bridge, "root"], check=False)
        if self._netem:
            return True, ""
        return False, "this kernel has no sch_netem (tc qdisc netem: unknown qdisc kind)"

    def loss_available(self) -> tuple[bool, str]:
        """Whether :meth:`link` can drop packets here: netem, or else ``nft`` (nftables)."""
        if self.netem_available()[0]:
            return True, ""
        if shutil.which(_NFT) is None:
            return False, "no sch_netem in this kernel and no `nft` command (Debian package nftables)"
        return True, ""

    def link(self, host: Host, *, delay_ms: float = 0, jitter_ms: float = 0, loss_pct: float = 0) -> None:
        """netem on both ends of ``host``'s link: each direction gets ``delay_ms`` (± ``jitter_ms``)
        and ``loss_pct``; all zeros removes it. Loss alone without netem: an nftables rule instead."""
        if min(delay_ms, jitter_ms, loss_pct) < 0 or loss_pct > 100:
            raise ValueError("delay_ms and jitter_ms must be >= 0, loss_pct in [0, 100]")
        ends = [["tc"], [_IP, "netns", "exec", host.netns, "tc"]]
        devs = [host.veth, host.peer]
        if not (delay_ms or jitter_ms or loss_pct):
            for tc, dev in zip(ends, devs, strict=True):
                _run([*tc, "qdisc", "del", "dev", dev, "root"], check=False)
            self._drop_loss_rule(host)
            return
        ok, why = self.netem_available()
        if not ok and not (delay_ms or jitter_ms):
            self._loss_rule(host, loss_pct)
            return
        if not ok:
            raise NetemUnavailableError(f"cannot put delay or jitter on {host.name}'s link: {why}")
        spec = ["delay", f"{delay_ms}ms"]
        if jitter_ms:
            spec.append(f"{jitter_ms}ms")
        spec += ["loss", f"{loss_pct}%"]
        for tc, dev in zip(ends, devs, strict=True):
            _run([*tc, "qdisc", "replace", "dev", dev, "root", "netem", *spec])

    def _loss_rule(self, host: Host, loss_pct: float) -> None:
        """Drop ``loss_pct`` of the packets in and out of ``host``'s interface (nftables, in its
        namespace): the same loss on both directions as netem's on both ends of the link."""
        ok, why = self.loss_available()
        if not ok:
            raise NetemUnavailableError(f"cannot put loss on {host.name}'s link: {why}")
        below = round(loss_pct / 100 * _LOSS_SCALE)
        drop = f"numgen random mod {_LOSS_SCALE} < {below} drop"
        ruleset = (
            f"table inet {_LOSS_TABLE} {{\n"
            f"  chain input {{ type filter hook input priority 0; policy accept; "
            f'iifname "{host.peer}" {drop}; }}\n'
            f"  chain output {{ type filter hook output priority 0; policy accept; "
            f'oifname "{host.peer}" {drop}; }}\n'
            "}\n"
        )
        self._drop_loss_rule(host)  # a second call replaces the rate rather than adding a rule
        argv = host.wrap([_NFT, "-f", "-"])
        done = subprocess.run(argv, input=ruleset, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"nft -f (loss on {host.name}) failed: {done.stderr.strip()}")

    def _drop_loss_rule(self, host: Host) -> None:
        if shutil.which(_NFT) is not None:
            _run(host.wrap([_NFT, "delete", "table", "inet", _LOSS_TABLE]), check=False)

    def loss_rules(self, host: Host) -> str:
        """The nftables ruleset of ``host``'s namespace (empty when it has no loss rule)."""
        if shutil.which(_NFT) is None:
            return ""
        return _run(host.wrap([_NFT, "list", "ruleset"]), check=False).stdout

    def tcp_retransmits(self, host: Host) -> int:
        """TCP segments retransmitted in ``host``'s namespace so far (``RetransSegs`` of its
        /proc/net/snmp): the evidence that packets were lost on its link."""
        text = _run(host.wrap(["cat", "/proc/net/snmp"])).stdout
        header, values = [line.split() for line in text.splitlines() if line.startswith("Tcp:")][:2]
        return int(values[header.index("RetransSegs")])

    @contextlib.contextmanager
    def fault(
        self,
        host: Host,
        *,
        delay_ms: float = 0,
        jitter_ms: float = 0,
        loss_pct: float = 0,
        duration_s: float | None = None,
    ) -> Iterator[None]:
        """:meth:`link`'s fault on ``host`` (netem, or loss alone as an nftables rule) for the block
        (and, with ``duration_s``, at most that long: a timer clears it early); always cleared after."""
        self.link(host, delay_ms=delay_ms, jitter_ms=jitter_ms, loss_pct=loss_pct)
        with _undone_after(lambda: self.link(host), duration_s):
            yield

    def partition(self, host: Host) -> None:
        """``host``'s link down: no packet in or out until :meth:`heal`."""
        _run([_IP, "link", "set", host.veth, "down"])

    def heal(self, host: Host) -> None:
        _run([_IP, "link", "set", host.veth, "up"])

    @contextlib.contextmanager
    def partitioned(self, host: Host, duration_s: float | None = None) -> Iterator[None]:
        """:meth:`partition` for the block (or ``duration_s``, whichever ends first), healed after."""
        self.partition(host)
        with _undone_after(lambda: self.heal(host), duration_s):
            yield

    available = staticmethod(available)


def wait_port(host: str, port: int, timeout_s: float) -> bool:
    """Whether a TCP connect to ``host:port`` succeeds within ``timeout_s`` (polled)."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def _undone_after(undo: Callable[[], None], duration_s: float | None) -> Iterator[None]:
    """Run ``undo`` when the block ends, or after ``duration_s`` if that comes first (a timer), so
    a fault never outlives its bound even while the block still runs."""
    timer = None
    if duration_s is not None:
        timer = threading.Timer(duration_s, undo)
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        undo()

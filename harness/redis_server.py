"""A real standalone ``redis-server`` on a free loopback port."""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis

from kelp.harness.binaries import find_binary
from kelp.harness.ports import free_port
from kelp.harness.process import ManagedProcess

__all__ = ["RedisServer"]


class RedisServer:
    """``redis-server`` with no persistence unless asked, stopped on exit.

    ``password`` turns on ``requirepass`` (the default user); ``persistence``
    turns on the append-only file (``appendfsync`` = ``always`` unless given:
    ``everysec`` or ``no`` for the weaker guarantees) so a restart keeps data;
    ``data_dir`` is where it lives (default: a fresh temporary folder, removed
    by :meth:`cleanup`; a given one is kept), and :meth:`kill` then
    :meth:`start` brings the server back on the same folder; ``extra_args`` go
    to the command line verbatim, e.g.
    ``["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lfu"]``.
    """

    def __init__(
        self,
        *,
        password: str | None = None,
        persistence: bool = False,
        appendfsync: str = "always",
        data_dir: Path | None = None,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        cluster: bool = False,
        start_timeout_s: float = 10.0,
    ) -> None:
        self.password = password
        self.persistence = persistence
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, not {appendfsync!r}")
        self.appendfsync = appendfsync
        self.extra_args = list(extra_args)
        self.port = port or free_port(also_free_offset=10_000 if cluster else None)
        self.cluster = cluster
        self.start_timeout_s = start_timeout_s
        self._binary = find_binary("redis-server")
        self._proc: ManagedProcess | None = None
        self._workdir: Path | None = data_dir
        self._keep_workdir = data_dir is not None

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}"

    @property
    def url_without_auth(self) -> str:
        return f"redis://{self.host}:{self.port}"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, password=self.password, **kwargs)  # type: ignore[arg-type]

    def _argv(self) -> list[str]:
        argv = [
            self._binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "yes" if self.persistence else "no",
            "--daemonize",
            "no",
        ]
        if self.persistence:
            argv += ["--appendfsync", self.appendfsync]
        if self.password:
            argv += ["--requirepass", self.password]
        if self.cluster:
            argv += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ]
        return argv + self.extra_args

    def start(self) -> RedisServer:
        proc = ManagedProcess(self._argv(), f"redis-{self.port}", workdir=self._workdir)
        self._workdir = proc.workdir
        proc.start()
        self._proc = proc
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(
                    f"redis-server on port {self.port} exited during start:\n{proc.log_tail()}"
                )
            try:
                if self.client(socket_timeout=0.5).ping():
                    return self
            except redis.exceptions.ConnectionError:
                time.sleep(0.02)
            except redis.exceptions.BusyLoadingError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {self.start_timeout_s}s")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill(signal.SIGCONT)  # a paused server would ignore the SIGTERM
            self._proc.stop()
            self._proc = None

    def kill(self) -> None:
        """SIGKILL, no clean shutdown: simulates a crashed shard."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.stop()
            self._proc = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets but answers nothing (a stalled shard)."""
        if self._proc is not None:
            self._proc.kill(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self._proc is not None:
            self._proc.kill(signal.SIGCONT)

    def restart(self) -> RedisServer:
        """Start again on the same port and directory (data survives only with persistence)."""
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._workdir is not None and not self._keep_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

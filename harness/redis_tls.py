"""A TLS-only ``redis-server`` and the throwaway certificates it needs, made with the ``openssl`` CLI.

:func:`make_test_pki` writes a CA, a server certificate for ``127.0.0.1`` and
``localhost`` (so hostname checks pass), a client certificate signed by the
same CA, and a *stranger*: a client certificate from another CA, which the
server must refuse. Keys are P-256 (fast to make); everything lives two days.

:class:`TlsRedisServer` listens on TLS only (``--port 0 --tls-port P``) and,
with ``auth_clients``, demands a client certificate from the CA
(``--tls-auth-clients yes``). :class:`TlsRedisCluster` is three of them in a
Redis Cluster whose bus is TLS too.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster as RedisClusterClient

from kelp.harness.binaries import find_binary
from kelp.harness.redis_cluster import RedisCluster
from kelp.harness.redis_server import RedisServer

__all__ = ["TestPki", "TlsRedisCluster", "TlsRedisServer", "make_test_pki"]


@dataclass(frozen=True)
class TestPki:
    """Paths of the files :func:`make_test_pki` wrote."""

    __test__ = False  # not a pytest test class

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path

    def client_tls(self) -> dict[str, Any]:
        """redis-py's arguments for a TLS client presenting the good client certificate."""
        return {
            "ssl": True,
            "ssl_ca_certs": str(self.ca),
            "ssl_certfile": str(self.client_cert),
            "ssl_keyfile": str(self.client_key),
        }


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([find_binary("openssl"), *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _self_signed(cwd: Path, name: str, subject: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", subject, cwd=cwd,
    )  # fmt: skip


def _signed(cwd: Path, name: str, subject: str, ca: str, extensions: str) -> None:
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=cwd,
    )  # fmt: skip
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=cwd,
    )  # fmt: skip


def make_test_pki(folder: Path) -> TestPki:
    """A CA, server and client certificates, and a client certificate of another CA, under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    _self_signed(folder, "ca", "/CN=kelp-test-ca")
    _signed(
        folder,
        "server",
        "/CN=localhost",
        "ca",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    _signed(folder, "client", "/CN=kelp-client", "ca", "extendedKeyUsage=clientAuth\n")
    _self_signed(folder, "other-ca", "/CN=someone-else-ca")
    _signed(folder, "stranger", "/CN=stranger", "other-ca", "extendedKeyUsage=clientAuth\n")
    f = folder
    return TestPki(
        f / "ca.crt", f / "server.crt", f / "server.key", f / "client.crt", f / "client.key",
        f / "stranger.crt", f / "stranger.key",
    )  # fmt: skip


class TlsRedisServer(RedisServer):
    """``redis-server`` on a TLS port only; its :meth:`client` presents the good client certificate."""

    def __init__(self, pki: TestPki, *, auth_clients: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pki = pki
        self.extra_args = [
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", str(pki.server_cert),
            "--tls-key-file", str(pki.server_key),
            "--tls-ca-cert-file", str(pki.ca),
            "--tls-auth-clients", "yes" if auth_clients else "no",
            *self.extra_args,
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"rediss://{self.host}:{self.port}"

    @property
    def url_without_auth(self) -> str:
        return self.url

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(
            host=self.host,
            port=self.port,
            password=self.password,
            **self.pki.client_tls(),
            **kwargs,  # type: ignore[arg-type]
        )


class TlsRedisCluster(RedisCluster):
    """A Redis Cluster whose nodes speak TLS only, among themselves too (``--tls-cluster yes``).

    On the cluster bus each node presents its server certificate as a client
    certificate, which is why :func:`make_test_pki` gives it both key usages.
    """

    def __init__(self, pki: TestPki, nodes: int = 3, start_timeout_s: float = 30.0) -> None:
        super().__init__(nodes, start_timeout_s)
        self.pki = pki
        self.servers = [
            TlsRedisServer(pki, cluster=True, extra_args=["--tls-cluster", "yes"]) for _ in range(nodes)
        ]

    def client(self, **kwargs: object) -> RedisClusterClient:
        return RedisClusterClient(
            startup_nodes=self.startup_nodes,
            **self.pki.client_tls(),
            **kwargs,  # type: ignore[arg-type]
        )

    def _cli_args(self) -> list[str]:
        pki = self.pki
        return [
            "--tls",
            *("--cacert", str(pki.ca)),
            *("--cert", str(pki.client_cert)),
            *("--key", str(pki.client_key)),
        ]

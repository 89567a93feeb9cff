"""Kelp over TLS to a real redis-server that speaks TLS only and demands client certificates.

Throwaway certificates come from the ``openssl`` CLI (:mod:`kelp.harness.redis_tls`):
a CA, the server's certificate for 127.0.0.1, a client certificate from the
same CA, and a stranger's from another CA. Over that server:

* the store contract suite (every check of :mod:`kelp.store.checks`, default layout),
  on one node and on a 3-node TLS Redis Cluster (``--tls-cluster yes``);
* the ACL users of ``kelp store acl`` on that cluster (their cluster set-up
  commands: the serving user reads, its write is refused);
* one train-then-serve pass, with ``store.tls`` as the only Redis settings;
* refusals, each one line naming the setting to check: no client certificate,
  the stranger's certificate (retriable, with a hint at ``store.tls.cert_file``),
  a client that does not trust the server (non-retriable, ``store.tls.ca_file``),
  and through the real CLI (``kelp store stats``).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from secure_flow import flow_config, serve_and_score, train_and_publish

from kelp.config import StoreConfig, TableSpec
from kelp.errors import RedisAuthError
from kelp.harness.redis_tls import TestPki, TlsRedisCluster, TlsRedisServer, make_test_pki
from kelp.retry import RetryPolicy
from kelp.store import build_store
from kelp.store.checks import ALL_CHECKS, MakeStore
from kelp.store.errors import ShardUnavailableError

pytestmark = pytest.mark.integration

ONCE = RetryPolicy(attempts=1, base_delay_s=0.0, max_delay_s=0.0, sleep=lambda _s: None)
_deployments = (f"tls{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(pki: TestPki) -> Iterator[TlsRedisServer]:
    with TlsRedisServer(pki) as server:
        yield server


def _tls(pki: TestPki, cert: str = "client", ca: bool = True) -> dict[str, Any]:
    tls: dict[str, Any] = {"enabled": True}
    if ca:
        tls["ca_file"] = str(pki.ca)
    if cert == "client":
        tls |= {"cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    elif cert == "stranger":
        tls |= {"cert_file": str(pki.stranger_cert), "key_file": str(pki.stranger_key)}
    return tls


@pytest.fixture(scope="module")
def tls_cluster(pki: TestPki) -> Iterator[TlsRedisCluster]:
    with TlsRedisCluster(pki) as cluster:
        yield cluster


@pytest.fixture(params=["standalone", "cluster"])
def make_tls_store(request: pytest.FixtureRequest, pki: TestPki) -> Iterator[MakeStore]:
    if request.param == "standalone":
        urls = [request.getfixturevalue("tls_server").url]
        cfg = StoreConfig(backend="redis", urls=urls, tls=_tls(pki))
    else:
        urls = request.getfixturevalue("tls_cluster").urls
        cfg = StoreConfig(backend="redis-cluster", urls=urls, tls=_tls(pki))
    made = []

    def factory(tables: list[TableSpec]):  # type: ignore[no-untyped-def]
        store = build_store(cfg, tables, next(_deployments), retry=ONCE, seed=0)
        made.append(store)
        return store

    yield factory
    for store in made:
        store.close()


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_contract_over_tls(make_tls_store: MakeStore, check) -> None:  # type: ignore[no-untyped-def]
    check(make_tls_store)


def test_train_then_serve_over_tls(tls_server: TlsRedisServer, pki: TestPki, tmp_path: Path) -> None:
    # a redis:// URL with store.tls.enabled is TLS too (the scheme need not say so)
    store = {"backend": "redis", "urls": [f"redis://127.0.0.1:{tls_server.port}"], "tls": _tls(pki)}
    cfg = flow_config("tlsflow", store, tmp_path)
    version = train_and_publish(cfg)
    assert tls_server.client().exists(f"kelp:{cfg.deployment}:layout")
    answer = serve_and_score(cfg, version)
    assert answer["model_version"] == version and answer["default_row_rate"] < 1.0


def _pull(tls_server: TlsRedisServer, tls: dict[str, Any]) -> None:
    cfg = StoreConfig(backend="redis", urls=[tls_server.url], tls=tls, layout={"kind": "keys"})
    with build_store(cfg, [TableSpec(name="t", dim=4)], "tlsrefused", retry=ONCE) as store:
        store.pull_many({"t": np.arange(3, dtype=np.uint64)}, count=False)


@pytest.mark.parametrize("cert", ["none", "stranger"])
def test_client_without_a_trusted_certificate_is_refused(
    tls_server: TlsRedisServer, pki: TestPki, cert
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ShardUnavailableError) as info:
        _pull(tls_server, _tls(pki, cert=cert))
    text = str(info.value)
    assert "\n" not in text and f"127.0.0.1:{tls_server.port}" in text
    assert "TLS" in text and "store.tls.cert_file" in text, text


def test_client_that_does_not_trust_the_server_is_refused(tls_server: TlsRedisServer, pki: TestPki) -> None:
    with pytest.raises(RedisAuthError) as info:  # not retried: the CA file will not change by itself
        _pull(tls_server, _tls(pki, ca=False))
    text = str(info.value)
    assert "CERTIFICATE_VERIFY_FAILED" in text and "store.tls.ca_file" in text and "\n" not in text


def test_cli_reports_a_refused_certificate_in_one_line(
    tls_server: TlsRedisServer, pki: TestPki, tmp_path: Path
) -> None:
    store = {
        "backend": "redis",
        "urls": [tls_server.url],
        "tls": _tls(pki, cert="stranger"),
        "retry": {"attempts": 1},
    }
    cfg = flow_config("tlscli", store, tmp_path).model_dump(mode="json", exclude_none=True)
    path = tmp_path / "kelp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "store", "stats", "--config", str(path)],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kelp: error: ") and "store.tls.cert_file" in lines[0], (
        done.stderr
    )
    assert "Traceback" not in done.stderr


def test_acl_users_on_a_tls_cluster(tls_cluster: TlsRedisCluster, pki: TestPki) -> None:
    """The ACL lines cover redis-py's cluster start-up (slot map, COMMAND, READONLY) too."""
    from kelp.errors import RedisAuthError
    from kelp.store.redis.acl import setuser_line

    for server in tls_cluster.servers:  # ACL users are per node
        for role, password in (("trainer", "tr-pw"), ("serving", "sv-pw")):
            server.client().execute_command(*setuser_line("tlsacl", role, password=password).split())
    tables = [TableSpec(name="t", dim=4)]
    ids = np.arange(50, dtype=np.uint64)

    def cfg(role: str, password: str) -> StoreConfig:
        return StoreConfig(
            backend="redis-cluster", urls=tls_cluster.urls, tls=_tls(pki), username=f"kelp-tlsacl-{role}",
            password=password, layout={"kind": "keys"},
        )  # fmt: skip

    with build_store(cfg("trainer", "tr-pw"), tables, "tlsacl", retry=ONCE) as trainer:
        trainer.push("t", ids, np.ones((50, 4), np.float32), np.zeros(50, np.float32))
    with build_store(cfg("serving", "sv-pw"), tables, "tlsacl", retry=ONCE) as serving:
        got = serving.pull_many({"t": ids}, count=False)["t"]
        assert got.admitted.all() and float(got.rows.sum()) == 200.0
        with pytest.raises(RedisAuthError, match="lacks a permission"):
            serving.push("t", ids, np.zeros((50, 4), np.float32), np.zeros(50, np.float32))

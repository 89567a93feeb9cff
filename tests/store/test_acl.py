"""The ACL users of ``kelp store acl`` on a real redis-server: the trainer trains within its own keys,
serving only reads.

A dedicated redis-server (the session's shared one keeps its users untouched)
gets the two users of deployment ``acl`` exactly as ``kelp store acl`` prints
them, plus the trainer user of another deployment. Then:

* a train-then-serve pass runs with the trainer user (rows pulled and pushed
  in the ``buckets`` layout with a TTL, so the Lua scripts run; snapshots
  published) and the serving user (rows and snapshots read, a score answered);
* the serving user's row write and snapshot write fail with NOPERM, reported
  as one-line :class:`~kelp.errors.RedisAuthError` naming the ACL rules;
* the trainer user cannot read or write another deployment's keys, not even
  through a Lua script;
* without CONFIG rights the trainer still trains (the listpack limits are logged instead).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from prometheus_client import CollectorRegistry
from secure_flow import flow_config, serve_and_score, train_and_publish

from kelp.errors import RedisAuthError
from kelp.harness import RedisServer
from kelp.publish import build_channel
from kelp.store import build_store
from kelp.store.redis.acl import acl_rules, key_patterns, setuser_line

pytestmark = pytest.mark.integration

PASSWORDS = {"trainer": "tr4iner-pw", "serving": "s3rving-pw", "other": "0ther-pw"}


def _cli_line(deployment: str, role: str, password: str, tmp_path: Path) -> str:
    """The ``ACL SETUSER`` line printed by the real CLI, the password read from a file."""
    secret = tmp_path / f"{deployment}-{role}.pw"
    secret.write_text(password + "\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kelp.cli",
            "store",
            "acl",
            "--deployment",
            deployment,
            "--role",
            role,
            "--password-file",
            str(secret),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert password not in out and out.count("\n") == 0, out
    return out


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    tmp = tmp_path_factory.mktemp("acl")
    with RedisServer() as server:
        admin = server.client()
        for deployment, role, pw in (
            ("acl", "trainer", PASSWORDS["trainer"]),
            ("acl", "serving", PASSWORDS["serving"]),
            ("other", "trainer", PASSWORDS["other"]),
        ):
            line = _cli_line(deployment, role, pw, tmp)
            assert admin.execute_command(*line.split()) in (b"OK", True, "OK")
        yield server


def _store(server: RedisServer, user: str, password: str, **extra: object) -> dict[str, object]:
    return {
        "backend": "redis",
        "urls": [server.url_without_auth],
        "username": user,
        "password": password,
        **extra,
    }


def test_rules_cover_only_this_deployment() -> None:
    rules = acl_rules("shop-eu", "serving")
    assert all(not r.startswith("~") for r in rules)  # serving's key selectors are read-only (%R~)
    assert {"%R~" + p for p in key_patterns("shop-eu")} <= set(rules)
    assert (
        "+set" not in rules and "+eval" not in rules and "+config|set" not in acl_rules("shop-eu", "trainer")
    )
    assert "#" + "0" * 4 not in setuser_line("d", "trainer", password="x")
    assert setuser_line("d", "trainer").split()[2] == "kelp-d-trainer"
    join = acl_rules("shop-eu", "join")
    assert [r for r in join if not r.startswith("+")] == ["~{kelp:shop-eu:join}:*"]  # its state, no channel
    assert "+eval" not in join and "+hset" not in join and "+multi" in join
    assert "+wait" in acl_rules("shop-eu", "trainer")  # store.durability.replicas_ack
    assert "+wait" not in rules


def test_the_cli_prints_the_join_user(tmp_path: Path) -> None:
    line = _cli_line("shop-eu", "join", "j0in-pw", tmp_path)
    assert line == setuser_line("shop-eu", "join", password="j0in-pw")


def test_trainer_trains_and_serving_reads(acl_server: RedisServer, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    trainer = flow_config("acl", _store(acl_server, "kelp-acl-trainer", PASSWORDS["trainer"]), tmp_path)
    with caplog.at_level(logging.WARNING, logger="kelp"):
        version = train_and_publish(trainer)
    # no CONFIG rights: the buckets layout says which redis.conf lines to set, and training went on
    assert any("hash-max-listpack" in r.getMessage() for r in caplog.records)
    rows = acl_server.client().keys("k2:acl:*")
    assert rows, "the trainer user stored no rows"

    serving = flow_config("acl", _store(acl_server, "kelp-acl-serving", PASSWORDS["serving"]), tmp_path)
    answer = serve_and_score(serving, version)
    assert answer["model_version"] == version and answer["default_row_rate"] < 1.0


def test_serving_user_cannot_write(acl_server: RedisServer, tmp_path: Path) -> None:
    cfg = flow_config("acl", _store(acl_server, "kelp-acl-serving", PASSWORDS["serving"]), tmp_path)
    ids = np.array([1, 2], np.uint64)
    with build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry()) as store:
        store.pull_many({"C2": ids}, count=False)  # reading is allowed
        with pytest.raises(RedisAuthError) as info:
            store.push("C2", ids, np.ones((2, 4), np.float32), np.zeros(2, np.float32))
    text = str(info.value)
    assert (
        "lacks a permission" in text
        and "ACL rules" in text
        and "\n" not in text
        and PASSWORDS["serving"] not in text
    )
    with build_channel(cfg.publisher, cfg.store, cfg.deployment) as channel, pytest.raises(RedisAuthError):
        channel.next_version()
    # and not through a raw client either: a write command or a script
    client = redis.Redis(
        host="127.0.0.1", port=acl_server.port, username="kelp-acl-serving", password=PASSWORDS["serving"]
    )
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.set("k1:acl:C2:r:x", b"1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.eval("return redis.call('SET', KEYS[1], '1')", 1, "k1:acl:C2:r:x")


def test_trainer_cannot_touch_another_deployment(acl_server: RedisServer, tmp_path: Path) -> None:
    acl_server.client().set("k1:acl:ads:r:secret", b"theirs")
    client = redis.Redis(
        host="127.0.0.1", port=acl_server.port, username="kelp-other-trainer", password=PASSWORDS["other"]
    )
    client.set("kelp:other:probe", b"ok")  # its own keys: fine
    for call in (
        lambda: client.get("k1:acl:ads:r:secret"),
        lambda: client.set("k1:acl:ads:r:secret", b"overwritten"),
        lambda: client.delete("k2:acl:ads:h:\x00\x00\x00\x01"),
        lambda: client.hset("{k1:acl:model}:v:000000000001", "weights", b"x"),
        lambda: client.eval("return redis.call('DEL', KEYS[1])", 1, "kelp:acl:layout"),
        lambda: client.eval("return redis.call('DEL', 'k1:acl:ads:r:secret')", 1, "k1:other:x"),
        lambda: client.publish("{k1:acl:model}:notify", b"999"),
        client.flushall,
        lambda: client.config_set("maxmemory", "1mb"),
    ):
        # NOPERM, or a script's "can't access at least one of the keys": refused either way
        with pytest.raises(redis.exceptions.ResponseError, match=r"permission|can.t access"):
            call()
    assert acl_server.client().get("k1:acl:ads:r:secret") == b"theirs"
    # through Kelp's store: the other deployment's trainer stores and reads its own rows only
    cfg = flow_config("other", _store(acl_server, "kelp-other-trainer", PASSWORDS["other"]), tmp_path)
    with build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry()) as store:
        ids = np.array([5], np.uint64)
        got = store.pull_many({"C2": ids})
        assert got["C2"].rows.shape == (1, 4)
    with pytest.raises(RedisAuthError):
        bad = flow_config("acl", _store(acl_server, "kelp-other-trainer", PASSWORDS["other"]), tmp_path)
        with build_store(bad.store, list(bad.features.tables), bad.deployment, CollectorRegistry()) as store:
            store.pull_many({"C2": np.array([5], np.uint64)})

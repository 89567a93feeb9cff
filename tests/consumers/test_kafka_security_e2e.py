"""SASL_SSL (SCRAM-SHA-512) and mutual TLS end to end: ``kelp produce`` and ``kelp train`` as real processes.

The harness's Apache Kafka has one listener of each kind
(:class:`kelp.harness.ApacheKafka`). A good client produces the 2000-row Criteo
fixture over the secure listener, and ``kelp train`` reads it back over that
same listener into a real Redis and commits every offset. Then each mistake an
operator makes with these settings (a wrong SASL password, a client
certificate the broker does not trust, a CA that does not sign the broker's
certificate, a wrong key passphrase) must end both commands with exit 2 and
one line that names the listener and the setting to check: waiting cannot fix
those, so they must not read as "broker unreachable".

The secrets come from the environment (``KELP_SOURCE__SECURITY__SASL_PASSWORD``,
``KELP_SOURCE__SECURITY__SSL_PASSWORD``), never the config file, and no
output or file a process writes may contain them.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from kafka import KafkaConsumer, TopicPartition

from kelp.cli.startup_config import MESSAGE as STARTUP_RECORD
from kelp.config import KafkaSourceConfig, StoreConfig, load_config
from kelp.harness import ApacheKafka, KafkaBroker, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CRITEO = ROOT / "tests" / "daemon" / "data" / "criteo-2000.tsv"
CRITEO_ROWS = 2000
PARTITIONS = 2
KEY_PASSPHRASE = f"key-pass-{secrets.token_urlsafe(12)}"
FAILING_BUDGET_S = "4"  # a refused client fails when the start-up budget is spent; keep the runs short


@pytest.fixture
def secure_broker(kafka_broker: KafkaBroker) -> ApacheKafka:
    if not isinstance(kafka_broker, ApacheKafka):
        pytest.skip(
            "needs Apache Kafka's SASL_SSL and mTLS listeners (Tansu has no TLS); KELP_BROKER=tansu is set"
        )
    return kafka_broker


@pytest.fixture(scope="module")
def encrypted_client_key(tmp_path_factory: pytest.TempPathFactory, session_kafka_broker: KafkaBroker) -> Path:
    """The trusted client's key, encrypted with KEY_PASSPHRASE, so ``ssl_password`` is really used."""
    pki = getattr(session_kafka_broker, "pki", None)
    if pki is None:
        pytest.skip("needs Apache Kafka's test PKI")
    out = tmp_path_factory.mktemp("keys") / "client-encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(pki.client_key), "-out", str(out), "-aes256",
         "-passout", f"pass:{KEY_PASSPHRASE}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert out.read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    return out


def _listener(broker: ApacheKafka, kind: str, key: Path) -> tuple[str, dict[str, Any]]:
    """(bootstrap, source.security without its secrets) for a good client of the ``kind`` listener."""
    assert broker.pki is not None
    if kind == "sasl_ssl":
        return broker.sasl_ssl_bootstrap, {
            "protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": broker.scram_username,
            "ssl_cafile": str(broker.pki.ca),
        }
    return broker.ssl_bootstrap, {
        "protocol": "SSL",
        "ssl_cafile": str(broker.pki.ca),
        "ssl_certfile": str(broker.pki.client_cert),
        "ssl_keyfile": str(key),
    }


def _config(
    tmp_path: Path, bootstrap: str, security: dict[str, Any], topic: str, redis_url: str, **trainer: Any
) -> Path:
    """The shipped Criteo config on ``topic`` over one secure listener, written without any secret."""
    cfg = load_config(ROOT / "examples" / "criteo-kaggle.yaml")
    cfg.source = KafkaSourceConfig(
        bootstrap_servers=[bootstrap],
        topics=[topic],
        group_id=f"trainer-{topic}",
        dead_letter_topic=None,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        max_poll_interval_ms=5000,
    )
    cfg.store = StoreConfig(
        backend="redis",
        urls=[redis_url],
        retry={"attempts": 2, "base_delay_s": 0.01, "max_delay_s": 0.05},
        socket_timeout_s=1.0,
        connect_timeout_s=1.0,
    )
    cfg.trainer.checkpoint_dir = tmp_path / "checkpoints"
    cfg.trainer.log_every_s = 1.0
    for key, value in trainer.items():
        setattr(cfg.trainer, key, value)
    cfg.publisher.enabled = False
    cfg.metrics.port = free_port()
    data = cfg.model_dump(mode="json", exclude_none=True)
    data["source"]["security"] = security
    path = tmp_path / "kelp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _env(sasl_password: str) -> dict[str, str]:
    return {
        **os.environ,
        "KELP_SOURCE__SECURITY__SASL_PASSWORD": sasl_password,
        "KELP_SOURCE__SECURITY__SSL_PASSWORD": KEY_PASSPHRASE,
    }


def _kelp(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", *map(str, args)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _assert_no_secret(secrets_: list[str], *texts: str, folder: Path | None = None) -> None:
    """None of ``secrets_`` in the texts, nor in any file under ``folder`` (logs, checkpoints, records)."""
    for secret in secrets_:
        for text in texts:
            assert secret not in text
        if folder is not None:
            for path in folder.rglob("*"):
                if path.is_file():
                    assert secret.encode() not in path.read_bytes(), path


def _offsets(broker: ApacheKafka, topic: str, group: str | None = None) -> list[int]:
    """End offsets of ``topic`` (or ``group``'s committed offsets), read over the PLAINTEXT listener."""
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        if group is None:
            ends = consumer.end_offsets(partitions)
            return [ends[tp] for tp in partitions]
        return [consumer.committed(tp) or 0 for tp in partitions]
    finally:
        consumer.close()


def _wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s  # only so a broken run cannot hang the suite
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture
def topic(secure_broker: ApacheKafka, unique_topic: str) -> Iterator[str]:
    secure_broker.create_topic(unique_topic, PARTITIONS)
    yield unique_topic


@pytest.mark.parametrize("kind", ["sasl_ssl", "mtls"])
def test_produce_then_train_over_the_secure_listener(
    *,
    tmp_path: Path,
    secure_broker: ApacheKafka,
    encrypted_client_key: Path,
    topic: str,
    redis_url: str,
    kind: str,
) -> None:
    bootstrap, security = _listener(secure_broker, kind, encrypted_client_key)
    config = _config(tmp_path, bootstrap, security, topic, redis_url)
    secrets_ = [secure_broker.scram_password, KEY_PASSPHRASE]
    _assert_no_secret(secrets_, config.read_text())
    env = _env(secure_broker.scram_password)

    produced = _kelp(env, "produce", "--config", config, "--file", CRITEO, "--batch-size", "1")
    assert produced.returncode == 0, produced.stderr
    summary = json.loads(produced.stdout.strip().splitlines()[-1])
    assert summary["records"] == summary["messages"] == CRITEO_ROWS and summary["topic"] == topic
    ends = _offsets(secure_broker, topic)
    assert sum(ends) == CRITEO_ROWS

    log = tmp_path / "train.log"
    group = f"trainer-{topic}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kelp.cli", "train", "--config", str(config)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(
            lambda: _offsets(secure_broker, topic, group) == ends or proc.poll() is not None, 180, "commits"
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        proc.kill()
    text = log.read_text()
    # Every record was read over the secure listener, trained once, pushed to Redis, and committed.
    assert _offsets(secure_broker, topic, group) == ends
    assert f"trained {CRITEO_ROWS:,} samples" in text, text[-3000:]
    assert "stopped by SIGTERM" in text
    assert redis.Redis.from_url(redis_url).dbsize() > 0
    _assert_no_secret(secrets_, produced.stdout, produced.stderr, text, folder=tmp_path)


# (listener, what is wrong, the setting the one line must name)
REFUSALS = [
    ("sasl_ssl", "wrong_password", "source.security.sasl_password"),
    ("mtls", "stranger_cert", "source.security.ssl_certfile"),
    ("mtls", "untrusted_broker", "source.security.ssl_cafile"),
    ("sasl_ssl", "untrusted_broker", "source.security.ssl_cafile"),
    ("mtls", "wrong_passphrase", "source.security.ssl_password"),
]


@pytest.mark.parametrize("command", ["produce", "train"])
@pytest.mark.parametrize(("kind", "mistake", "setting"), REFUSALS)
def test_a_refused_client_exits_2_with_one_line(
    *,
    tmp_path: Path,
    secure_broker: ApacheKafka,
    encrypted_client_key: Path,
    topic: str,
    redis_url: str,
    command: str,
    kind: str,
    mistake: str,
    setting: str,
) -> None:
    assert secure_broker.pki is not None
    bootstrap, security = _listener(secure_broker, kind, encrypted_client_key)
    password = secure_broker.scram_password
    env = _env(password)
    if mistake == "wrong_password":
        env["KELP_SOURCE__SECURITY__SASL_PASSWORD"] = f"not-{password}"
    elif mistake == "stranger_cert":
        security["ssl_certfile"] = str(secure_broker.pki.stranger_cert)
        security["ssl_keyfile"] = str(secure_broker.pki.stranger_key)
    elif mistake == "untrusted_broker":
        security["ssl_cafile"] = str(secure_broker.pki.ca.with_name("other-ca.crt"))
    else:
        env["KELP_SOURCE__SECURITY__SSL_PASSWORD"] = f"not-{KEY_PASSPHRASE}"
    budget_s = FAILING_BUDGET_S
    config = _config(tmp_path, bootstrap, security, topic, redis_url, startup_timeout_s=float(budget_s))
    if command == "produce":
        budget = ("--startup-timeout-s", budget_s)
        proc = _kelp(env, "produce", "--config", config, "--synth", "criteo", "--samples", "100", *budget)
    else:
        proc = _kelp(env, "train", "--config", config)

    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == ""
    lines = [line for line in proc.stderr.splitlines() if STARTUP_RECORD not in line]  # train logs it first
    assert len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    assert line.startswith("kelp: error: ") and setting in line, line
    if mistake != "wrong_passphrase":  # the key is checked before any connection
        assert f"{bootstrap} ({security['protocol']})" in line, line
    # Nothing reached the broker under this name: no record, no commit.
    assert _offsets(secure_broker, topic) == [0] * PARTITIONS
    wrong = [env["KELP_SOURCE__SECURITY__SASL_PASSWORD"], env["KELP_SOURCE__SECURITY__SSL_PASSWORD"]]
    _assert_no_secret([password, KEY_PASSPHRASE, *wrong], proc.stdout, proc.stderr, folder=tmp_path)

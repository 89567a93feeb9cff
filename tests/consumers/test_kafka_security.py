"""Kafka security settings reach kafka-python unchanged (config level, no broker).

``source.security`` becomes kafka-python's own option names and values for the
consumer, the dead-letter producer and admin clients, every name is one
kafka-python accepts (it rejects unknown options at construction), and the
secrets come from the environment, never the file. The same settings working
against a real broker (SASL_SSL with SCRAM-SHA-512, and mutual TLS), and each
refusal failing with one line, is ``test_kafka_security_e2e.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from kelp.config import parse_config
from kelp.consumers.kafka_client import client_settings, consumer_settings


def _source(tmp_path: Path, security: dict[str, object]) -> dict[str, object]:
    return {
        "kind": "kafka",
        "bootstrap_servers": "broker-1:9093,broker-2:9093",
        "topics": ["events"],
        "security": security,
    }


def _cfg(tmp_path: Path, security: dict[str, object], environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    data = {
        "source": _source(tmp_path, security),
        "features": {"sparse": [{"name": "a"}]},
        "store": {"backend": "redis", "urls": ["redis://redis:6379"]},
    }
    return parse_config(data, origin="test", environ=environ or {})


def test_sasl_ssl_reaches_kafka_python(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("pem")
    security = {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "kelp-trainer",
        "ssl_cafile": str(ca),
        "ssl_check_hostname": True,
    }
    cfg = _cfg(tmp_path, security, {"KELP_SOURCE__SECURITY__SASL_PASSWORD": "from-env"})
    settings = client_settings(cfg.source)
    assert settings["bootstrap_servers"] == ["broker-1:9093", "broker-2:9093"]
    assert settings["security_protocol"] == "SASL_SSL"
    assert settings["sasl_mechanism"] == "SCRAM-SHA-512"
    assert settings["sasl_plain_username"] == "kelp-trainer"
    assert settings["sasl_plain_password"] == "from-env"
    assert settings["ssl_cafile"] == str(ca) and settings["ssl_check_hostname"] is True
    # every option is one each kafka-python client knows (they raise on unknown options)
    for client in (KafkaConsumer, KafkaProducer, KafkaAdminClient):
        unknown = set(settings) - set(client.DEFAULT_CONFIG)
        assert not unknown, (client.__name__, unknown)
    assert not set(consumer_settings(cfg.source)) - set(KafkaConsumer.DEFAULT_CONFIG)


def test_mutual_tls_files_reach_kafka_python(tmp_path: Path) -> None:
    files = {name: tmp_path / name for name in ("ca.crt", "user.crt", "user.key")}
    for path in files.values():
        path.write_text("pem")
    security = {
        "protocol": "SSL",
        "ssl_cafile": str(files["ca.crt"]),
        "ssl_certfile": str(files["user.crt"]),
        "ssl_keyfile": str(files["user.key"]),
        "ssl_check_hostname": False,
    }
    cfg = _cfg(tmp_path, security, {"KELP_SOURCE__SECURITY__SSL_PASSWORD": "key-pass"})
    settings = client_settings(cfg.source)
    assert settings["security_protocol"] == "SSL" and settings["ssl_check_hostname"] is False
    assert settings["ssl_certfile"] == str(files["user.crt"]) and settings["ssl_keyfile"] == str(
        files["user.key"]
    )
    assert settings["ssl_password"] == "key-pass"
    assert "sasl_mechanism" not in settings


def test_plaintext_sends_no_tls_or_sasl_options(tmp_path: Path) -> None:
    settings = client_settings(_cfg(tmp_path, {"protocol": "PLAINTEXT"}).source)
    assert settings["security_protocol"] == "PLAINTEXT"
    assert not [k for k in settings if k.startswith(("ssl_", "sasl_"))]


def test_a_sasl_mechanism_without_its_password_is_refused_where_kafka_is_used(tmp_path: Path) -> None:
    from kelp.daemon.preflight import preflight
    from kelp.errors import ConfigError

    security = {"protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"}
    cfg = _cfg(tmp_path, security)  # a serving replica without the request log never connects to Kafka
    preflight(cfg, "kelp.yaml", role="serve")
    with pytest.raises(ConfigError, match="sasl_password"):
        preflight(cfg, "kelp.yaml", role="train")


def test_a_sasl_listener_closing_every_login_is_a_refusal_but_an_outage_is_not() -> None:
    """kafka-python may lose the broker's SASL failure and see only closed connections; an outage refuses."""
    from kafka.errors import KafkaConnectionError

    from kelp.consumers.bootstrap_check import _refusal
    from kelp.consumers.errors import SourceAuthError

    settings = {
        "bootstrap_servers": ["broker:9093"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "kelp",
    }
    closed = [KafkaConnectionError("socket disconnected")] * 3
    refusal = _refusal(closed, settings)
    assert isinstance(refusal, SourceAuthError)
    assert "broker:9093 (SASL_SSL)" in str(refusal) and "source.security.sasl_password" in str(refusal)
    outage = [*closed, KafkaConnectionError("111 ECONNREFUSED")]
    assert _refusal(outage, settings) is None
    assert _refusal(closed[:1], settings) is None
    assert _refusal(closed, {**settings, "security_protocol": "SSL"}) is None

"""Secrets never reach the terminal, whatever their characters, and env secrets are taken verbatim.

Covers ``kelp config show`` and ``kelp config validate`` run as real CLI
processes, start-up errors of ``kelp train``, the loader's field errors, and
the URL forms redis-py accepts credentials in (user-info, ``?password=``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from kelp.config import KelpConfig, load_config
from kelp.config.secrets import is_secret_field
from kelp.errors import ConfigError
from kelp.redaction import REDACTED, redact_text, redact_url
from kelp.store.redis.connection import node_name

DATA = Path(__file__).resolve().parents[1] / "consumers" / "data"
CRITEO = DATA / "criteo_sample.tsv"
SECRETS = ("hunter2", "qsecret", "s3/cr@t", "t0ken")

FILE_SOURCE = f"source: {{kind: file, path: {CRITEO}, format: criteo_tsv}}\n"
FS_PUBLISHER = "publisher: {channel: filesystem, path: snapshots}\n"
KAFKA_SOURCE = (
    "source:\n  kind: kafka\n  bootstrap_servers: [b:9092]\n  topics: [t]\n"
    "  security: {protocol: SASL_SSL, sasl_mechanism: PLAIN, sasl_username: kelp}\n"
)


def _kelp(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        check=False,
        timeout=120,
    )


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kelp.yaml"
    path.write_text(text)
    return path


def _no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, text


# --- kelp config show --------------------------------------------------------------------------


def test_config_show_hides_a_password_in_a_url_query_string(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        FILE_SOURCE
        + "store:\n  backend: redis\n  urls: ['redis://h:6379/0?password=qsecret&db=0']\n"
        + "publisher: {channel: redis, redis_url: 'redis://p:6379/0?x=1&PASSWORD=qsecret'}\n",
    )
    result = _kelp("config", "show", str(path))
    assert result.returncode == 0, result.stderr
    _no_secret(result.stdout + result.stderr)
    assert f"redis://h:6379/0?password={REDACTED}&db=0" in result.stdout
    assert f"redis://p:6379/0?x=1&PASSWORD={REDACTED}" in result.stdout


def test_config_show_hides_a_userinfo_password_holding_an_at_sign(tmp_path: Path) -> None:
    store = "store: {backend: redis, urls: ['redis://kelp:hunter2@t0ken@h:1']}\n"
    result = _kelp(
        "config", "show", str(_write(tmp_path, FILE_SOURCE + FS_PUBLISHER + store)), "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    _no_secret(result.stdout + result.stderr)
    assert f"redis://kelp:{REDACTED}@h:1" in result.stdout


def test_a_userinfo_password_holding_a_slash_is_refused_without_showing_it(tmp_path: Path) -> None:
    """Unencoded, its '/' ends the host part: redis-py would read the rest of the password as the host."""
    path = _write(
        tmp_path, FILE_SOURCE + FS_PUBLISHER + "store: {backend: redis, urls: ['redis://kelp:s3/cr@t@h:1']}\n"
    )
    for verb in ("show", "validate"):
        result = _kelp("config", verb, str(path))
        assert result.returncode == 2, (result.stdout, result.stderr)
        _no_secret(result.stdout + result.stderr)
        assert f"url 'redis://kelp:{REDACTED}@h:1' has an '@' after its host part" in result.stderr
        assert "%2F" in result.stderr


@pytest.mark.parametrize("password", ["[hunter2", "{x: 1, hunter2: 3}", "[hunter2]", " {hunter2"])
def test_an_env_password_is_taken_verbatim_and_never_shown(tmp_path: Path, password: str) -> None:
    path = _write(tmp_path, FILE_SOURCE + FS_PUBLISHER + "store: {backend: redis, urls: ['redis://h:1']}\n")
    cfg = load_config(path, environ={"KELP_STORE__PASSWORD": password})
    assert cfg.store.password is not None
    assert cfg.store.password.get_secret_value() == password
    result = _kelp("config", "show", str(path), env={"KELP_STORE__PASSWORD": password})
    assert result.returncode == 0, result.stderr
    _no_secret(result.stdout + result.stderr)
    assert f"password: '{REDACTED}'" in result.stdout


def test_env_sasl_and_tls_key_passwords_are_taken_verbatim(tmp_path: Path) -> None:
    path = _write(tmp_path, KAFKA_SOURCE + FS_PUBLISHER)
    env = {
        "KELP_SOURCE__SECURITY__SASL_PASSWORD": "[hunter2",
        "KELP_SOURCE__SECURITY__SSL_PASSWORD": "{hunter2}",
    }
    cfg = load_config(path, environ=env)
    security = cfg.source.security  # type: ignore[union-attr]
    assert security.sasl_password.get_secret_value() == "[hunter2"
    assert security.ssl_password.get_secret_value() == "{hunter2}"
    result = _kelp("config", "show", str(path), env=env)
    assert result.returncode == 0, result.stderr
    _no_secret(result.stdout + result.stderr)


# --- validation errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("store", "given"),
    [
        ("store: {backend: redis, urls: ['redis://h:1'], password: [hunter2]}\n", "hunter2"),
        ("store: {password: 12345678}\n", "12345678"),
    ],
)
def test_a_secret_fields_error_never_echoes_its_value(tmp_path: Path, store: str, given: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, FILE_SOURCE + FS_PUBLISHER + store), environ={})
    message = str(info.value)
    assert f"store.password: got {REDACTED}" in message
    assert given not in message


def test_a_sasl_password_error_never_echoes_its_value(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        KAFKA_SOURCE.replace("sasl_username: kelp", "sasl_username: kelp, sasl_password: [hunter2]")
        + FS_PUBLISHER,
    )
    result = _kelp("config", "validate", str(path))
    assert result.returncode == 2
    _no_secret(result.stderr)
    assert f"source.security.sasl_password: got {REDACTED}" in result.stderr


@pytest.mark.parametrize(
    "urls",
    [
        "['http://:hunter2@h:6379/0']",  # wrong scheme: the message quotes the URL
        "[':hunter2@h:6379']",  # no scheme at all
        "['redis://h:1', ['redis://:hunter2@h:2']]",  # a list where a string goes: pydantic echoes it
    ],
)
def test_a_url_fields_error_never_echoes_its_password(tmp_path: Path, urls: str) -> None:
    path = _write(tmp_path, FILE_SOURCE + FS_PUBLISHER + f"store: {{backend: redis, urls: {urls}}}\n")
    result = _kelp("config", "validate", str(path))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    _no_secret(result.stderr)
    assert "store" in result.stderr


# --- start-up errors ---------------------------------------------------------------------------


def test_a_start_up_error_hides_a_query_string_password(tmp_path: Path) -> None:
    features = (
        "features:\n"
        "  dense: [" + ", ".join(f"{{name: I{i}}}" for i in range(1, 14)) + "]\n"
        "  sparse: [" + ", ".join(f"{{name: C{i}}}" for i in range(1, 27)) + "]\n"
    )
    path = _write(
        tmp_path,
        FILE_SOURCE
        + FS_PUBLISHER
        + features
        + "store: {backend: redis, urls: ['redis://127.0.0.1:1/0?password=qsecret']}\n"
        + f"trainer: {{startup_timeout_s: 0.5, checkpoint_dir: {tmp_path / 'ckpt'}}}\n",
    )
    result = _kelp("train", "--config", str(path))
    assert result.returncode != 0
    _no_secret(result.stdout + result.stderr)
    assert f"redis://127.0.0.1:1/0?password={REDACTED}" in result.stderr


def test_node_names_never_read_a_password_as_the_host() -> None:
    assert node_name("redis://kelp:1234/hunter2@10.0.0.1:7000/2") == "10.0.0.1:7000"
    assert node_name("redis://kelp:s3/cr@t@h:1/0") == "h:1"
    assert node_name("redis://h:1/0?password=qsecret") == "h:1"
    assert node_name("unix:///tmp/redis.sock?password=qsecret") == "unix:///tmp/redis.sock"


# --- the redactor ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://h:6379/0?password=qsecret", f"redis://h:6379/0?password={REDACTED}"),
        ("redis://h/0?db=1&Pass=qsecret&x=y", f"redis://h/0?db=1&Pass={REDACTED}&x=y"),
        ("https://h/x?access_token=t0ken", f"https://h/x?access_token={REDACTED}"),
        ("https://h/x?AUTH=t0ken;secret=qsecret", f"https://h/x?AUTH={REDACTED};secret={REDACTED}"),
        ("redis://kelp:s3/cr@t@h:1/0", f"redis://kelp:{REDACTED}@h:1/0"),
        ("redis://:hunter2/x?y#z@h:1", f"redis://:{REDACTED}@h:1"),
        ("redis://kelp:pa ss'hunter2@h:1", f"redis://kelp:{REDACTED}@h:1"),
        (":hunter2@b:9092", f":{REDACTED}@b:9092"),
        ("redis://h:1/0?db=2", "redis://h:1/0?db=2"),
        (f"redis://h:1/0?password={REDACTED}", f"redis://h:1/0?password={REDACTED}"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_text_finds_each_url_in_a_line() -> None:
    line = "shards redis://:hunter2@a:1,redis://b:2/0?password=qsecret and 'rediss://u:s3/cr@t@c:3' x@y"
    shown = redact_text(line)
    _no_secret(shown)
    assert shown == (
        f"shards redis://:{REDACTED}@a:1,redis://b:2/0?password={REDACTED} "
        f"and 'rediss://u:{REDACTED}@c:3' x@y"
    )


# --- which fields are secret -------------------------------------------------------------------


def _fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    from kelp.config.secrets import _models_in

    out = []
    for name, field in model.model_fields.items():
        out.append(((*prefix, name), field.annotation))
        for sub in _models_in(field.annotation):
            out += _fields(sub, (*prefix, name))
    return out


def test_every_field_named_like_a_secret_is_a_secret_str() -> None:
    """A new ``*_password`` or ``*_token`` field typed ``str`` would be shown and parsed: use SecretStr."""
    named = [
        (loc, annotation)
        for loc, annotation in _fields(KelpConfig)
        if any(w in loc[-1] for w in ("password", "secret", "token")) and not loc[-1].endswith("_file")
    ]
    assert {loc for loc, _ in named} >= {
        ("store", "password"),
        ("source", "security", "sasl_password"),
        ("source", "security", "ssl_password"),
    }
    for loc, annotation in named:
        assert SecretStr in getattr(annotation, "__args__", (annotation,)), loc
        assert is_secret_field(KelpConfig, loc), loc
    assert not is_secret_field(KelpConfig, ("store", "username"))
    assert not is_secret_field(KelpConfig, ("serving", "auth_token_file"))

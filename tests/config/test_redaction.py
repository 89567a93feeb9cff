"""URL passwords are hidden wherever Kelp prints a URL: the rules of :mod:`kelp.redaction`."""

from __future__ import annotations

import logging

import pytest

from kelp.config import KelpConfig, effective_config
from kelp.logs import JsonLineFormatter, TextFormatter
from kelp.redaction import REDACTED, redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379", f"redis://:{REDACTED}@h:6379"),
        ("redis://kelp:pw@h:6379/2", f"redis://kelp:{REDACTED}@h:6379/2"),
        ("rediss://kelp:p%40ss:w@h", f"rediss://kelp:{REDACTED}@h"),
        ("https://TOKEN@example.com/x", f"https://{REDACTED}@example.com/x"),
        ("redis://u:p@ss@h:1/0", f"redis://u:{REDACTED}@h:1/0"),  # an unencoded '@' in the password
        ("redis://h:6379", "redis://h:6379"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
        ("127.0.0.1:9092", "127.0.0.1:9092"),
        (f"redis://:{REDACTED}@h", f"redis://:{REDACTED}@h"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_every_url_in_a_text_is_redacted_and_the_rest_kept() -> None:
    text = "shards ['redis://:a1@h:1', 'redis://u:b2@h:2'] and mail x@y.z"
    assert (
        redact_text(text) == f"shards ['redis://:{REDACTED}@h:1', 'redis://u:{REDACTED}@h:2'] and mail x@y.z"
    )


def test_config_show_redacts_urls_in_every_section() -> None:
    cfg = KelpConfig.model_validate(
        {
            "source": {"kind": "kafka", "bootstrap_servers": ["b:9092"], "topics": ["t"]},
            "store": {
                "backend": "redis",
                "urls": ["redis://:s1@a:6379"],
                "replicas": [["redis://u:s2@r:6379"]],
            },
            "publisher": {"redis_url": "redis://:s3@p:6379/0"},
        }
    )
    text = repr(effective_config(cfg))
    assert "s1@" not in text and "s2@" not in text and "s3@" not in text
    assert text.count(REDACTED) == 3


@pytest.mark.parametrize("formatter", [TextFormatter(), JsonLineFormatter()])
def test_log_lines_are_redacted(formatter: logging.Formatter) -> None:
    record = logging.makeLogRecord(
        {"name": "kelp.x", "levelname": "INFO", "msg": "connecting %s", "args": ("redis://:hunter2@h:1",)}
    )
    record.url = "redis://u:hunter3@h:2"
    line = formatter.format(record)
    assert "hunter2" not in line and "hunter3" not in line and REDACTED in line

"""Where a URL's user-info ends and which query values are secret: the tricky shapes of kelp.redaction.

An ``@`` inside the query (``?password=abc@TAIL``) must not be taken for the
end of a user-info part: that showed the part of the password after it.
"""

from __future__ import annotations

import pytest

from kelp.redaction import REDACTED, redact_text, redact_url

SECRETS = ("abc", "SECRETTAIL99", "s3cr", "hunter2", "K3Y", "qpw", "tail")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # an '@' in a secret query value: the value is hidden whole, there is no user-info
        ("redis://127.0.0.1:1/0?password=abc@SECRETTAIL99", f"redis://127.0.0.1:1/0?password={REDACTED}"),
        ("redis://h:1/0?db=2&Password=abc@SECRETTAIL99#x", f"redis://h:1/0?db=2&Password={REDACTED}"),
        ("redis://h:1?token=abc&tail@x", f"redis://h:1?token={REDACTED}&{REDACTED}"),  # an unencoded '&'
        # an '@' in the password, and another in the query
        ("redis://u:s3cr@t@h:1/0?pwd=qpw@x", f"redis://u:{REDACTED}@h:1/0?pwd={REDACTED}"),
        # a password holding '?': what precedes it is no host, so everything to the last '@' is hidden
        ("redis://:hunter2?x@h:1", f"redis://:{REDACTED}@h:1"),
        ("redis://u:hunter2#frag@h:1/0", f"redis://u:{REDACTED}@h:1/0"),
        # no user-info: an '@' in a harmless parameter stays
        ("redis://h:6379/0?client_name=ops@team", "redis://h:6379/0?client_name=ops@team"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        # IPv6 hosts
        ("redis://[::1]:6379/0?password=abc@SECRETTAIL99", f"redis://[::1]:6379/0?password={REDACTED}"),
        ("redis://u:hunter2@[fe80::1%eth0]:6379", f"redis://u:{REDACTED}@[fe80::1%eth0]:6379"),
        # TLS, secret-named parameters of every kind
        (
            "rediss://default:s3cr@t@cache:6380/0?ssl_cert_reqs=none",
            f"rediss://default:{REDACTED}@cache:6380/0?ssl_cert_reqs=none",
        ),
        ("https://h/x?api_key=K3Y@1&sig=2", f"https://h/x?api_key={REDACTED}&sig=2"),
        (
            "kafka://h:9092?sasl_password=qpw@x;key=K3Y",
            f"kafka://h:9092?sasl_password={REDACTED};key={REDACTED}",
        ),
        ("unix:///run/redis.sock?password=abc@SECRETTAIL99", f"unix:///run/redis.sock?password={REDACTED}"),
        # Kafka bootstrap lists, with and without a scheme
        ("SASL_SSL://user:hunter2@b1:9092,b2:9092", f"SASL_SSL://user:{REDACTED}@b1:9092,b2:9092"),
        ("user:hunter2@b1:9092", f"user:{REDACTED}@b1:9092"),
        ("b1:9092,b2:9092", "b1:9092,b2:9092"),
        ("b1:9092,b2:9092?password=abc@SECRETTAIL99", f"b1:9092,b2:9092?password={REDACTED}"),
    ],
)
def test_tricky_urls(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(shown) == shown  # redacting twice changes nothing
    for secret in SECRETS:
        assert secret not in shown.replace("ssl_cert_reqs", "")


def test_a_query_password_with_an_at_in_free_text() -> None:
    line = (
        "cannot reach redis://127.0.0.1:1/0?password=abc@SECRETTAIL99 (refused); also redis://u:hunter2@h:2"
    )
    assert redact_text(line) == (
        f"cannot reach redis://127.0.0.1:1/0?password={REDACTED} (refused); also redis://u:{REDACTED}@h:2"
    )

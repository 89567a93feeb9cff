"""Why a Kafka client could not bootstrap, when waiting cannot fix it.

kafka-python retries every failed attempt until ``bootstrap_timeout_ms`` and
then raises a bare ``KafkaTimeoutError``, whatever the reason. A wrong SASL
password, a client certificate the broker refuses, or a broker certificate
that ``ssl_cafile`` does not trust would read as "unreachable" (a retriable
outage) although no wait can fix them. :func:`watch_bootstrap` keeps the
reason of each failed attempt (kafka-python only logs it) and turns such a
failure into :class:`~kelp.consumers.errors.SourceAuthError`, a user error
naming the listener and the setting to check.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kelp.consumers.errors import SourceAuthError

__all__ = ["watch_bootstrap"]


# What OpenSSL reports on the client when the server rejects its certificate, or its lack of one.
_CLIENT_CERT_REFUSED = (
    "ALERT_CERTIFICATE_UNKNOWN",
    "ALERT_BAD_CERTIFICATE",
    "ALERT_UNKNOWN_CA",
    "CERTIFICATE_REQUIRED",
)
_KEPT_FAILURES = 32  # a bootstrap that retries for minutes must not grow a list without bound


@contextmanager
def watch_bootstrap(settings: Mapping[str, Any]) -> Iterator[None]:
    """Around a kafka-python client's construction (its bootstrap): refusals become :class:`SourceAuthError`.

    ``settings`` are the client's kafka-python settings
    (:func:`kelp.consumers.kafka_client.client_settings`). The TLS files are
    loaded first, so a wrong ``ssl_password`` or a missing file fails at once.
    Should the block then fail while some attempt was refused for credentials
    or trust, that refusal is raised instead; any other failure propagates
    unchanged. kafka-python's per-attempt log lines stay off the output
    meanwhile (the one error says it all) unless ``kelp`` logs at debug.
    """
    _load_tls_files(settings)
    kafka_log = logging.getLogger("kafka")
    attempts = _AttemptLog()
    saved = kafka_log.level, kafka_log.propagate
    kafka_log.addHandler(attempts)
    kafka_log.setLevel(min(kafka_log.getEffectiveLevel(), logging.WARNING))
    kafka_log.propagate = logging.getLogger("kelp").isEnabledFor(logging.DEBUG)
    try:
        yield
    except Exception:
        refused = _refusal(attempts.failures, settings)
        if refused is not None:
            raise refused from None
        raise
    finally:
        kafka_log.removeHandler(attempts)
        kafka_log.setLevel(saved[0])
        kafka_log.propagate = saved[1]


class _AttemptLog(logging.Handler):
    """Keeps the exceptions kafka-python logs while it retries: its only report of why an attempt failed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.failures: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = (
            [a for a in record.args if isinstance(a, BaseException)] if isinstance(record.args, tuple) else []
        )
        if record.exc_info and record.exc_info[1] is not None:
            found.append(record.exc_info[1])
        if len(self.failures) < _KEPT_FAILURES:
            self.failures.extend(found)


def _listener(settings: Mapping[str, Any]) -> str:
    servers = settings.get("bootstrap_servers") or []
    shown = servers if isinstance(servers, str) else ",".join(servers)
    return f"Kafka listener {shown} ({settings.get('security_protocol', 'PLAINTEXT')})"


def _load_tls_files(settings: Mapping[str, Any]) -> None:
    """Load the CA and the client certificate and key as kafka-python will, naming the file that fails."""
    if settings.get("security_protocol") not in {"SSL", "SASL_SSL"}:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cafile = settings.get("ssl_cafile")
    if cafile:
        try:
            context.load_verify_locations(cafile)
        except (OSError, ssl.SSLError) as exc:
            raise SourceAuthError(
                f"source.security.ssl_cafile {cafile}: no CA certificate could be loaded ({_ssl_reason(exc)})"
            ) from None
    certfile = settings.get("ssl_certfile")
    if certfile:
        keyfile = settings.get("ssl_keyfile")
        try:
            context.load_cert_chain(certfile, keyfile, password=settings.get("ssl_password"))
        except (OSError, ssl.SSLError) as exc:
            raise SourceAuthError(
                f"source.security.ssl_certfile {certfile} with ssl_keyfile {keyfile or certfile}: the client "
                f"certificate and key could not be loaded ({_ssl_reason(exc)}); check both files and "
                "source.security.ssl_password, the key's passphrase"
            ) from None


def _refusal(failures: list[BaseException], settings: Mapping[str, Any]) -> SourceAuthError | None:
    """The first attempt refused for credentials or trust, as one line; None when none was."""
    from kafka import errors as kerr

    listener = _listener(settings)
    for exc in failures:
        if isinstance(exc, kerr.SaslAuthenticationFailedError):
            return SourceAuthError(
                f"{listener} refused the {settings.get('sasl_mechanism')} login of user "
                f"{settings.get('sasl_plain_username')!r}: check source.security.sasl_username and "
                f"source.security.sasl_password ({_kafka_reason(exc)})"
            )
        if isinstance(exc, kerr.UnsupportedSaslMechanismError):
            return SourceAuthError(
                f"{listener} does not offer SASL mechanism {settings.get('sasl_mechanism')}: check "
                f"source.security.sasl_mechanism ({_kafka_reason(exc)})"
            )
        text = " ".join(str(exc).split())
        if "CERTIFICATE_VERIFY_FAILED" in text and "mismatch" in text:
            return SourceAuthError(
                f"{listener}: its certificate does not name that host: check the address in "
                f"source.bootstrap_servers or source.security.ssl_check_hostname ({_ssl_reason(exc)})"
            )
        if "CERTIFICATE_VERIFY_FAILED" in text:
            trusted = settings.get("ssl_cafile") or "the system's CA certificates"
            return SourceAuthError(
                f"{listener}: its certificate is not signed by a CA in {trusted}: check "
                f"source.security.ssl_cafile ({_ssl_reason(exc)})"
            )
        if any(alert in text for alert in _CLIENT_CERT_REFUSED):
            cert = settings.get("ssl_certfile")
            shown = f"the client certificate {cert}" if cert else "this client, which has no certificate,"
            return SourceAuthError(
                f"{listener} refused {shown}: check source.security.ssl_certfile and "
                f"source.security.ssl_keyfile ({_ssl_reason(exc)})"
            )
    return _closed_during_login(failures, settings, listener)


def _closed_during_login(
    failures: list[BaseException], settings: Mapping[str, Any], listener: str
) -> SourceAuthError | None:
    """A SASL listener that keeps accepting connections and then closing them: a refused login.

    After a failed login the broker sends its reason and closes the connection
    shortly after; kafka-python drops a reply that it reads together with the
    close, so some refused logins leave only "socket disconnected". Every attempt
    reaching the broker and being closed by it, twice or more, with none refused
    or timed out, is what a wrong password looks like then; an outage or a wrong
    address refuses or times out instead.
    """
    if not str(settings.get("security_protocol", "")).startswith("SASL"):
        return None
    texts = [" ".join(str(exc).split()).lower() for exc in failures]
    closed = sum("socket disconnected" in text for text in texts)
    others = [t for t in texts if "socket disconnected" not in t and "unable to bootstrap" not in t]
    if closed < 2 or any("refused" in t or "timed out" in t or "timeout" in t for t in others):
        return None
    return SourceAuthError(
        f"{listener} closed every connection during the {settings.get('sasl_mechanism')} login of user "
        f"{settings.get('sasl_plain_username')!r}: check source.security.sasl_username, "
        "source.security.sasl_password and source.security.sasl_mechanism"
    )


def _ssl_reason(exc: BaseException) -> str:
    """OpenSSL's words without the ``[SSL: CODE]`` tag and the C source position."""
    text = " ".join(str(exc).split())
    found = re.search(r"\[SSL(?:: \w+)?\] (.+?)(?: \(_ssl\.c:\d+\))?$", text)
    return found.group(1) if found else text


def _kafka_reason(exc: BaseException) -> str:
    """The broker's message without kafka-python's ``[Error 58] Name: Name:`` prefix."""
    text = " ".join(str(exc).split())
    return re.sub(r"^(\[Error -?\d+\] )?(\w+Error: )*", "", text) or type(exc).__name__

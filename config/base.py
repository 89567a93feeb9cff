"""What every config section shares: strict models and small field helpers.

Every section forbids unknown keys (a typo is an error, never a silent
default) and validates assignments, so a config changed in code (tests, the
CLI's ``--max-steps``) is checked the same way as one read from YAML.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from kelp.redaction import redact_url

__all__ = ["StrictModel", "decoder_ref", "identifier", "kafka_topic", "split_csv", "url_with_plain_userinfo"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors; assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)


_DECODER_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def decoder_ref(value: str | None) -> str | None:
    """A plug-in decoder's ``package.module:attr`` (sources and join actions name one the same way)."""
    if value is not None and not _DECODER_REF.match(value):
        raise ValueError(f"{value!r}: expected package.module:attr (e.g. avro_decoder:ConfluentAvro)")
    return value


def identifier(value: str, what: str) -> str:
    """``value`` if it is a safe name for keys, metrics and files; a ValueError naming ``what`` otherwise."""
    if not _IDENT.match(value):
        raise ValueError(
            f"{what} must start with a letter or '_' and use letters, digits, '_', '.', '-' only"
        )
    return value


def kafka_topic(value: str) -> str:
    """``value`` if Kafka accepts it as a topic name; a ValueError saying what a name may be otherwise.

    The broker (and kafka-python's producer) refuse other names only when the
    topic is first used, which for a dead-letter topic is the first rejected
    record, hours into a run: checked with the config instead.
    """
    if value in {".", ".."} or not _TOPIC.match(value):
        raise ValueError(
            "expected a Kafka topic name: 1 to 249 of the characters a-z A-Z 0-9 . _ -, and not '.' or '..'"
        )
    return value


def split_csv(value: object) -> object:
    """Allow ``"a:9092,b:9092"`` (handy in env overrides) where a list is expected."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def url_with_plain_userinfo(url: str, what: str) -> str:
    """``url`` unless an ``@`` follows its host part; a ValueError naming ``what`` (never the password).

    A password holding an unencoded ``/``, ``?`` or ``#`` ends the host part
    early: clients then read the rest of the password as the host, port or
    database, connect elsewhere, and name that "host" in their errors.
    """
    _scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    if "@" in rest[min(ends, default=len(rest)) :]:
        raise ValueError(
            f"{what} {redact_url(url)!r} has an '@' after its host part: percent-encode the password's "
            "'/', '?', '#' and '@' (%2F, %3F, %23, %40), or set the password in its own field"
        )
    return url

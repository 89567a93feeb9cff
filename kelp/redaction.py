"""Passwords inside URLs, hidden before anything is printed.

An operator may put credentials in a URL (``redis://:PASSWORD@host:6379``,
``redis://user:PASSWORD@host``, ``https://TOKEN@host``,
``redis://host:6379/0?password=PASSWORD``, which redis-py honours) instead of
the separate secret fields. Every place Kelp prints text that may hold such a
URL (``kelp config show``, log lines, the CLI's one-line errors) runs it
through :func:`redact_text`, so the secret never reaches a terminal or a log
collector:

>>> redact_url("redis://:s3cret@10.0.0.1:6379/0")
'redis://:**redacted**@10.0.0.1:6379/0'
>>> redact_url("redis://kelp:s3cret@10.0.0.1:6379")
'redis://kelp:**redacted**@10.0.0.1:6379'
>>> redact_url("https://TOKEN@example.com/x")
'https://**redacted**@example.com/x'
>>> redact_url("redis://10.0.0.1:6379/0?Password=s3cret&health_check_interval=5")
'redis://10.0.0.1:6379/0?Password=**redacted**&health_check_interval=5'
>>> redact_url("redis://kelp:s3/cr@t@10.0.0.1:6379")
'redis://kelp:**redacted**@10.0.0.1:6379'
>>> redact_text("store shard redis://u:p@h:1 and redis://h:2")
'store shard redis://u:**redacted**@h:1 and redis://h:2'

The user-info part is everything between ``://`` and the *last* ``@`` of the
URL, whatever characters the password holds (an unencoded ``/``, ``?`` or
``@`` included): when that over-reaches into the host or path, more is hidden
than needed, never less. A user name followed by a password is kept (Redis ACL
user names are not secret, and ``store.username`` is shown in clear too); a
lone user-info part may be a token, so it is hidden whole. Query parameters
whose name holds ``pass``, ``pwd``, ``token``, ``secret``, ``auth``,
``credential`` or ``apikey`` (any case) have their value hidden. This module
imports nothing, so logging can use it before anything else is loaded.
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact_text", "redact_url"]

REDACTED = "**redacted**"

_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*://"
# A URL inside free text: its scheme, then every character up to whitespace, a quote, '<' or '>',
# or the start of the next URL (two URLs joined by a comma are two URLs).
_URL_IN_TEXT = re.compile(rf"(?P<scheme>{_SCHEME})(?P<rest>(?:(?!{_SCHEME})[^\s'\"<>])*)")
_SECRET_PARAM = re.compile(
    r"(?P<name>(?:^|[?&;])[^=&;#?]*(?:pass|pwd|token|secret|auth|credential|api[_-]?key)[^=&;#?]*=)"
    r"(?P<value>[^&;#]*)",
    re.IGNORECASE,
)


def _hide_userinfo(userinfo: str) -> str:
    if userinfo == REDACTED or userinfo.endswith(":" + REDACTED):
        return userinfo
    user, colon, _password = userinfo.partition(":")
    if colon and not any(c in user for c in "/?#@"):
        return f"{user}:{REDACTED}"
    return REDACTED


def _hide_param(match: re.Match[str]) -> str:
    return match.group("name") + (REDACTED if match.group("value") else "")


def _hide_query(tail: str) -> str:
    """``tail`` (host, path, query) with secret-named query parameters' values hidden."""
    path, question, query = tail.partition("?")
    if not question:
        return tail
    return path + question + _SECRET_PARAM.sub(_hide_param, query)


def _redact_rest(rest: str) -> str:
    """What follows ``scheme://``: user-info up to the last '@' hidden, then the query's secrets."""
    userinfo, at, tail = rest.rpartition("@")
    if not at:
        return _hide_query(rest)
    return f"{_hide_userinfo(userinfo)}@{_hide_query(tail)}"


def redact_url(url: str) -> str:
    """``url`` (the whole string is one URL) with its user-info password and secret query values hidden.

    A string without ``scheme://`` that holds an ``@`` (``user:pw@host:9092``) has
    everything before its last ``@`` hidden.
    """
    match = re.match(_SCHEME, url)
    if match is None:
        if "://" in url:  # text around a URL: find it
            return redact_text(url)
        userinfo, at, tail = url.rpartition("@")
        return f"{_hide_userinfo(userinfo)}@{tail}" if at else url
    return match.group(0) + _redact_rest(url[match.end() :])


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (see :func:`redact_url`); other text unchanged.

    In free text a URL ends at whitespace or a quote, so a password holding one
    of those cannot be told from the text around it: pass a lone URL to
    :func:`redact_url` instead.
    """
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: m.group("scheme") + _redact_rest(m.group("rest")), text)

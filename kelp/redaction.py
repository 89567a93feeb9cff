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
>>> redact_url("redis://127.0.0.1:1/0?password=abc@SECRETTAIL99")
'redis://127.0.0.1:1/0?password=**redacted**'

Where the user-info part ends: at the last ``@`` before the first ``?`` or
``#``, whatever characters the password holds before it (an unencoded ``/``
or ``@`` included): when that over-reaches into the host or path, more is
hidden than needed, never less. An ``@`` only *after* the first ``?`` or
``#`` belongs to the query when what precedes it is a plain host list
(``host``, ``host:port``, ``[v6]:port``, comma-separated), as urllib and
redis-py read it; otherwise (``redis://:pa?ss@h``, a password holding an
unencoded ``?``) everything up to the last ``@`` is hidden. A user name
followed by a password is kept (Redis ACL user names are not secret, and
``store.username`` is shown in clear too); a lone user-info part may be a
token, so it is hidden whole. Query parameters whose name holds ``pass``,
``pwd``, ``token``, ``secret``, ``auth``, ``credential`` or ``key`` (any
case) have their whole value hidden, ``@``, ``#`` or ``?`` included, and so
have the parameters without ``=`` that follow one (a password holding an
unencoded ``&``); a parameter without ``=`` that holds an ``@`` has what
precedes its last ``@`` hidden. This module imports nothing, so logging can
use it before anything else is loaded.
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact_text", "redact_url"]

REDACTED = "**redacted**"

_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*://"
# A URL inside free text: its scheme, then every character up to whitespace, a quote, '<' or '>',
# or the start of the next URL (two URLs joined by a comma are two URLs).
_URL_IN_TEXT = re.compile(rf"(?P<scheme>{_SCHEME})(?P<rest>(?:(?!{_SCHEME})[^\s'\"<>])*)")
_SECRET_NAME = re.compile(r"pass|pwd|token|secret|auth|credential|key", re.IGNORECASE)
# What urllib would take for the host part: hosts or [IPv6] literals, each with an optional port, or
# nothing at all ('unix:///path'); a port that is not a number means the part is a password's.
_HOST = r"(?:\[[0-9A-Fa-f:.%\w]*\]|[A-Za-z0-9._~%!$'()*+\-]+)(?::\d*)?"
_HOST_LIST = re.compile(rf"(?:{_HOST}(?:,{_HOST})*)?")


def _hide_userinfo(userinfo: str) -> str:
    if userinfo == REDACTED or userinfo.endswith(":" + REDACTED):
        return userinfo
    user, colon, _password = userinfo.partition(":")
    if colon and not any(c in user for c in "/?#@"):
        return f"{user}:{REDACTED}"
    return REDACTED


def _hide_param(param: str, after_secret: bool) -> tuple[str, bool]:
    """One ``name=value`` of a query, hidden as needed, and whether it was a secret (or part of one)."""
    name, eq, value = param.partition("=")
    if eq:
        if _SECRET_NAME.search(name):
            return name + eq + (REDACTED if value else ""), True
        return param, False
    if after_secret and param:  # a secret value's unencoded '&' split it: the rest is the secret too
        return REDACTED, True
    if "@" in param:  # 'pw@host' after a '?' that was in a password
        return REDACTED + "@" + param.rpartition("@")[2], False
    return param, False


def _hide_query(query: str) -> str:
    """``query`` (what follows the first ``?`` or ``#``) with secret-named parameters' values hidden."""
    parts = re.split(r"([&;])", query)
    secret = False
    for i in range(0, len(parts), 2):
        parts[i], secret = _hide_param(parts[i], secret)
    return "".join(parts)


def _split_userinfo(rest: str) -> tuple[str | None, str]:
    """What follows ``scheme://`` as (user-info or None, the rest from the host on); see the module doc."""
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    userinfo, at, tail = rest[:cut].rpartition("@")
    if at:
        return userinfo, tail + rest[cut:]
    if "@" not in rest[cut:]:
        return None, rest
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if _HOST_LIST.fullmatch(netloc):
        return None, rest  # the '@' is the query's
    userinfo, _, tail = rest.rpartition("@")
    return userinfo, tail


def _hide_tail(tail: str) -> str:
    """``tail`` (host, path, query) with the query's secrets hidden."""
    cut = min((i for i in (tail.find("?"), tail.find("#")) if i >= 0), default=-1)
    if cut < 0:
        return tail
    return tail[: cut + 1] + _hide_query(tail[cut + 1 :])


def _redact_rest(rest: str) -> str:
    """What follows ``scheme://``: the user-info's password hidden, then the query's secrets."""
    userinfo, tail = _split_userinfo(rest)
    if userinfo is None:
        return _hide_tail(tail)
    return f"{_hide_userinfo(userinfo)}@{_hide_tail(tail)}"


def redact_url(url: str) -> str:
    """``url`` (the whole string is one URL) with its user-info password and secret query values hidden.

    A string without ``scheme://`` (``user:pw@host:9092``, a Kafka bootstrap
    list) is read the same way, as if it followed one.
    """
    match = re.match(_SCHEME, url)
    if match is None:
        if "://" in url:  # text around a URL: find it
            return redact_text(url)
        return _redact_rest(url)  # 'user:pw@host:9092', or a bootstrap list
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

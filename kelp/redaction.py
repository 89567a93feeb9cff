"""Passwords inside URLs, hidden before anything is printed.

An operator may put credentials in a URL (``redis://:PASSWORD@host:6379``,
``redis://user:PASSWORD@host``, ``https://TOKEN@host``) instead of the separate
secret fields. Every place Kelp prints text that may hold such a URL (``kelp
config show``, log lines, the CLI's one-line errors) runs it through
:func:`redact_text`, so the user-info part never reaches a terminal or a log
collector:

>>> redact_url("redis://:s3cret@10.0.0.1:6379/0")
'redis://:**redacted**@10.0.0.1:6379/0'
>>> redact_url("redis://kelp:s3cret@10.0.0.1:6379")
'redis://kelp:**redacted**@10.0.0.1:6379'
>>> redact_url("https://TOKEN@example.com/x")
'https://**redacted**@example.com/x'
>>> redact_text("store shard redis://u:p@h:1 and redis://h:2")
'store shard redis://u:**redacted**@h:1 and redis://h:2'

A user name followed by a password is kept (Redis ACL user names are not
secret, and ``store.username`` is shown in clear too); a lone user-info part
may be a token, so it is hidden whole. This module imports nothing, so logging
can use it before anything else is loaded.
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact_text", "redact_url"]

REDACTED = "**redacted**"

# scheme://userinfo@ : the authority stops at the first '/', whitespace or quote, and its *last* '@'
# ends the user-info, as urllib.parse.urlsplit reads it (so an unencoded '@' in a password stays hidden).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s'\"<>]+)@")


def _hide(match: re.Match[str]) -> str:
    userinfo = match.group("userinfo")
    if userinfo == REDACTED or userinfo.endswith(":" + REDACTED):
        return match.group(0)
    user, colon, _password = userinfo.partition(":")
    shown = f"{user}:{REDACTED}" if colon else REDACTED
    return f"{match.group('scheme')}{shown}@"


def redact_url(url: str) -> str:
    """``url`` with the password of its user-info part (or the whole part, without a password) hidden."""
    return _USERINFO.sub(_hide, url)


def redact_text(text: str) -> str:
    """``text`` with every URL's user-info part hidden (see :func:`redact_url`); other text unchanged."""
    if "://" not in text:
        return text
    return _USERINFO.sub(_hide, text)

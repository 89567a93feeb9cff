"""A listening address a process cannot take is an operator mistake: one line naming the setting.

``kelp train`` listens on ``metrics.host:metrics.port`` (plus the rank's
``LOCAL_RANK``), ``kelp serve`` on ``serving.host:serving.port``. A port that
another process holds, a port below 1024 without the right, or a host that is
not this machine's would otherwise surface as an ``OSError`` traceback
(``http.server``) or as uvicorn's own log line and exit status 3.
:func:`listen_error` turns the ``OSError`` into a
:class:`~kelp.errors.UserError` (exit 2), and :func:`check_listen` tries the
bind up front for a server that binds on its own (uvicorn).
"""

from __future__ import annotations

import errno
import socket

from kelp.errors import UserError

__all__ = ["check_listen", "listen_error"]


def listen_error(exc: OSError, host: str, port: int, section: str) -> UserError:
    """The one-line error for a failed bind of ``section.host:section.port`` (``section``: ``serving``...)."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return UserError(
            f"{section}.port {port}: {where} is already in use by another process; stop it or set another "
            f"{section}.port"
        )
    if exc.errno == errno.EACCES:
        return UserError(
            f"{section}.port {port}: permission denied to listen on {where} (ports below 1024 need root or "
            "CAP_NET_BIND_SERVICE); set a port above 1023"
        )
    reason = exc.strerror or str(exc)
    return UserError(f"{section}.host {host!r}: cannot listen on {where}: {reason}; check {section}.host")


def check_listen(host: str, port: int, section: str) -> None:
    """Bind ``host:port`` once (as uvicorn will, ``SO_REUSEADDR`` set) and let go; :class:`UserError`
    naming ``section.port`` or ``section.host`` when that fails. Port 0 (any free port) always passes."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise listen_error(exc, host, port, section) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise listen_error(exc, host, port, section) from None

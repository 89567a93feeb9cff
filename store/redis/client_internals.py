"""The one module that reaches into redis-py's private names; everything else calls these functions.

The fast paths read replies straight off a connection's socket and hand leftover
bytes to its hiredis reader, and the cluster store reads redis-py's slot map.
redis-py does not promise any of these names (``_parser``, ``_reader``,
``_sock``, ``read_from_socket``, ``NOT_ENOUGH_DATA``, ``nodes_manager``), so a
redis-py upgrade that renames one breaks here and nowhere else, and the
dependency's upper bound in ``pyproject.toml`` is the version range these
functions were tested with. Every function degrades to "no fast path" (None,
False) rather than failing when a name is missing, so the callers fall back to
redis-py's public reads.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = [
    "connection_socket",
    "hiredis_reader",
    "node_name_of_slot",
    "not_enough_data",
    "read_more",
    "reads_from_socket",
    "refresh_slot_map",
]


def hiredis_reader(conn: Any) -> Any | None:
    """The connection's ``hiredis.Reader``, or None with the pure-Python parser (or none connected).

    Callers ``feed`` it the bytes they read past their own replies and ask it (``has_data``,
    ``gets``) for replies it already holds, so the connection's next read sees every byte."""
    return getattr(getattr(conn, "_parser", None), "_reader", None)


def connection_socket(conn: Any) -> socket.socket | None:
    """The connection's socket (an ``ssl.SSLSocket`` under TLS), or None when it is not connected."""
    return getattr(conn, "_sock", None)


def reads_from_socket(conn: Any) -> bool:
    """Whether the connection's parser is hiredis with a ``read_from_socket`` step to drive by hand."""
    parser = getattr(conn, "_parser", None)
    return getattr(parser, "_reader", None) is not None and hasattr(parser, "read_from_socket")


def read_more(conn: Any) -> None:
    """Receive once from the socket into the hiredis reader (raises redis-py's connection errors)."""
    conn._parser.read_from_socket()


def not_enough_data() -> object:
    """The sentinel a hiredis ``gets`` returns (through redis-py) when no whole reply is buffered yet.

    Imported on call: ``redis._parsers.hiredis`` needs the hiredis package, which only the
    readers that found a hiredis parser ever reach."""
    from redis._parsers.hiredis import NOT_ENOUGH_DATA

    return NOT_ENOUGH_DATA


def refresh_slot_map(client: Any) -> None:
    """Make a ``RedisCluster`` client read the slot map again (``CLUSTER SLOTS``) from its nodes."""
    client.nodes_manager.initialize()


def node_name_of_slot(client: Any, slot: int) -> str:
    """``host:port`` of the primary a ``RedisCluster`` client's slot map gives for ``slot``."""
    return client.nodes_manager.get_node_from_slot(slot).name

"""Read a config file's YAML with bounds, so no file can exhaust memory, hang the reader or hide a key.

A config file is a few kilobytes of settings, yet YAML lets a small file stand
for a huge one (aliases of aliases: the "billion laughs"), a path may name a
FIFO or a device that never ends, and a key written twice silently replaces
the first. :func:`read_config_file` refuses each of these with one line that
names the file and the limit:

* only a regular file is read (checked before it is opened, and opened
  non-blocking, so a FIFO without a writer never blocks), and at most
  :data:`MAX_CONFIG_BYTES` of it;
* a document holds at most :data:`MAX_NODES` nodes, nested at most
  :data:`MAX_DEPTH` levels (also counted through aliases), each checked
  while the file is parsed, so a large file is refused before its whole
  parse tree is held in memory;
* aliases may stand for at most :data:`MAX_ALIAS_NODES` nodes in all (each
  use of an alias counts the nodes it repeats), and an alias may not contain
  itself;
* a mapping may not hold the same key twice (merge keys ``<<`` still work: a
  key written beside a merge overrides the merged one, as YAML says).

:func:`parse_yaml_text` applies the same node and depth limits to YAML from
elsewhere (``KELP_...`` values that start with ``[`` or ``{``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kelp.errors import ConfigError

__all__ = [
    "MAX_ALIAS_NODES",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "InvalidYamlError",
    "parse_yaml_text",
    "read_config_file",
]

MAX_CONFIG_BYTES = 1 << 20
"""Largest config file read (1 MiB); real configs are a few kilobytes."""

MAX_NODES = 50_000
"""Most nodes (mappings, lists, values, alias uses) written in one document; a Kelp config has hundreds."""

MAX_ALIAS_NODES = 10_000
"""Most nodes that aliases may add to a document when expanded (the file's own nodes are not counted)."""

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists, aliases expanded; a Kelp config needs fewer than ten."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InvalidYamlError(ConfigError):
    """The text is not YAML at all (as opposed to YAML beyond a limit, a plain ConfigError)."""


class _LimitError(Exception):
    """A limit was hit while composing; ``line`` is 1-based, or None when no one line is to blame."""

    def __init__(self, reason: str, line: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing too many nodes or too deep a nesting while composing.

    The composer recurses once per level, so the depth is checked before a
    deep document can exhaust Python's stack; each node costs far more memory
    than the bytes that wrote it, so they are counted as they are made.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Node | None, index: object) -> Node | None:
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _LimitError(f"nested more than {MAX_DEPTH} levels deep", mark.line + 1)
            if self._nodes > MAX_NODES:
                mark = self.peek_event().start_mark
                raise _LimitError(
                    f"holds more than {MAX_NODES:,} values (the limit; a Kelp config holds hundreds)",
                    mark.line + 1,
                )
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1


def read_config_file(path: Path, max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """The YAML document in ``path`` (None when it holds none), within the limits of this module.

    Raises :class:`~kelp.errors.ConfigError` with one line naming ``path``.
    """
    raw = _read_bounded(path, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start} cannot be decoded)") from None
    return parse_yaml_text(text, str(path))


def parse_yaml_text(text: str, origin: str) -> Any:
    """``text`` parsed as one YAML document, refusing what :func:`read_config_file` refuses.

    ``origin`` starts every error line (a file name, ``env KELP_X``).
    """
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, loader)
        return loader.construct_document(node)
    except _LimitError as exc:
        where = f" line {exc.line}:" if exc.line is not None else ""
        raise ConfigError(f"{origin}:{where} {exc.reason}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
        # Only the problem: str(exc) quotes the offending line, which may hold a secret.
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise InvalidYamlError(f"{origin}:{where} invalid YAML: {problem}") from None
    finally:
        loader.dispose()


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of a regular file; a ConfigError for anything else."""
    try:
        kind = _kind(os.stat(path).st_mode)
        if kind is not None:
            raise ConfigError(f"{path}: not a regular file but {kind}; give the path of a YAML config file")
        # Non-blocking: should the path become a FIFO after the check above, opening it cannot hang.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise ConfigError(f"{path}: not a regular file but {kind}; give the path of a YAML config file")
        chunks: list[bytes] = []
        left = max_bytes + 1  # one byte more than allowed tells "too big" from "exactly at the limit"
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > max_bytes:
        raise ConfigError(
            f"{path}: config file is larger than the {_size(max_bytes)} limit; a Kelp config is a few "
            "kilobytes: is this the right file?"
        )
    return raw


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((words for test, words in _KINDS if test(mode)), "not a file")


def _size(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB ({n} bytes)"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} KiB ({n} bytes)"
    return f"{n} bytes"


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_nodes(root: Node, loader: yaml.SafeLoader) -> None:
    """Refuse duplicate keys, recursive aliases, and aliases that expand too far, before constructing.

    Aliases are shared node objects in PyYAML's graph, so each node is visited
    once (iteratively, without recursion) and its expanded size is computed
    from its children's: a document that stands for billions of nodes is
    measured in the time it takes to read the file.
    """
    cap = MAX_ALIAS_NODES + (1 << 40)  # expanded sizes stop growing here: no huge integers
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            kids = _children(node)
            size[key] = min(cap, 1 + sum(size[id(k)] for k in kids))
            height[key] = 1 + max((height[id(k)] for k in kids), default=0)
            in_progress.discard(key)
            if height[key] > MAX_DEPTH:
                raise _LimitError(
                    f"nested more than {MAX_DEPTH} levels deep once its aliases are expanded",
                    node.start_mark.line + 1,
                )
            continue
        if key in size:
            continue  # an alias to a node already measured
        if key in in_progress:
            raise _LimitError("an alias refers to a node that contains it (a recursive alias)", _line(node))
        if isinstance(node, MappingNode):
            _refuse_duplicate_keys(node, loader)
        in_progress.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in _children(node))
    if size[id(root)] - len(size) > MAX_ALIAS_NODES:
        raise _LimitError(
            f"its aliases expand to more than {MAX_ALIAS_NODES:,} values (the limit, against documents "
            "that stand for far more data than they hold); write the repeated settings out, or alias less"
        )


def _line(node: Node) -> int | None:
    return node.start_mark.line + 1 if node.start_mark is not None else None


def _refuse_duplicate_keys(node: MappingNode, loader: yaml.SafeLoader) -> None:
    """A key written twice in one mapping is an error naming both lines (``<<`` merges are not keys)."""
    seen: dict[Any, Node] = {}
    for key_node, _value in node.value:
        if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
            continue
        try:
            key = loader.construct_object(key_node)
            hash(key)
        except (yaml.YAMLError, TypeError):
            key = (key_node.tag, key_node.value)
        first = seen.get(key)
        if first is not None:
            raise _LimitError(
                f"key {key_node.value!r} is written twice in one mapping, on line {_line(first)} and line "
                f"{_line(key_node)}; keep one (a second one would silently replace the first)",
                _line(key_node),
            )
        seen[key] = key_node

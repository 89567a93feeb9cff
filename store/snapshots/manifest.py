"""A snapshot's manifest: what it holds, what it is consistent with, and a checksum over all of it.

The manifest is the one object that makes a snapshot whole (it is written
last; see :mod:`kelp.store.snapshots.catalog`). It lists every shard with its
size and sha256, so a restore can check every byte before it writes a row,
and the point the rows correspond to (Kafka offsets, dense version, trainer
checkpoint). It is canonical JSON (sorted keys, no spaces) with a
``checksum`` key: the sha256 of the canonical JSON of every other field, so
an edited or damaged manifest is refused rather than believed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from kelp.store.snapshots.errors import SnapshotError

__all__ = ["MANIFEST_FORMAT_VERSION", "ShardEntry", "SnapshotManifest", "new_snapshot_id"]

MANIFEST_FORMAT_VERSION = 1
"""The manifest layout this module writes; a manifest with a newer one is refused, naming it."""


@dataclass(frozen=True)
class ShardEntry:
    """One shard object of a snapshot, with what reading it back must find."""

    table: str
    name: str
    """The object's name in the snapshot storage (``<deployment>/<id>/shards/...``)."""
    rows: int
    bytes: int
    sha256: str
    """Hex sha256 of the object's bytes."""


@dataclass
class SnapshotManifest:
    """Everything about one snapshot; :meth:`to_bytes` / :meth:`from_bytes` are its only file form."""

    format_version: int
    snapshot_id: str
    deployment: str
    kind: Literal["full", "incremental"]
    parent: str | None
    """The snapshot an incremental applies on top of (full or incremental); None for a full one."""
    created_at: float
    """Unix seconds when taking it began."""
    finished_at: float
    updated_since_s: int | None
    """An incremental holds the rows with ``updated_s >= updated_since_s``; None for a full one."""
    tables: dict[str, dict[str, Any]]
    """Table name -> ``{"dim": int, "dtype": "float32" | "float16"}``."""
    shards: list[ShardEntry]
    consistency: dict[str, Any] = field(default_factory=dict)
    """How the rows relate to the offsets and dense version (barrier step...), written by the taker."""
    offsets: list[dict[str, Any]] = field(default_factory=list)
    """``{"topic", "partition", "offset"}``: the next offset to consume after restoring these rows."""
    group_id: str | None = None
    dense: dict[str, Any] | None = None
    """``{"version": int, "step": int, "file": object name or None}`` of the dense model."""
    checkpoint: str | None = None
    """Object name of the trainer checkpoint stored with the snapshot, or None."""

    def __post_init__(self) -> None:
        if self.kind not in ("full", "incremental"):
            raise SnapshotError(
                f"snapshot {self.snapshot_id}: kind must be 'full' or 'incremental', not {self.kind!r}"
            )
        if self.kind == "incremental" and not self.parent:
            raise SnapshotError(f"snapshot {self.snapshot_id}: an incremental snapshot needs a parent")

    @property
    def total_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_bytes(self) -> bytes:
        """Canonical JSON of every field plus ``checksum`` (sha256 of the canonical JSON without it)."""
        body = dataclasses.asdict(self)
        return _canonical({**body, "checksum": _checksum(body)})

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "manifest") -> SnapshotManifest:
        """The manifest in ``data``; a damaged, edited or newer-format one is one :class:`SnapshotError`."""
        try:
            body = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            raise SnapshotError(f"{source}: not a snapshot manifest (not JSON)") from None
        if not isinstance(body, dict):
            raise SnapshotError(f"{source}: not a snapshot manifest (not a JSON object)")
        version = body.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise SnapshotError(f"{source}: not a snapshot manifest (no integer format_version)")
        if version > MANIFEST_FORMAT_VERSION:
            raise SnapshotError(
                f"{source}: manifest format_version {version} is newer than this Kelp reads "
                f"({MANIFEST_FORMAT_VERSION}); upgrade Kelp"
            )
        claimed = body.pop("checksum", None)
        if claimed != _checksum(body):
            raise SnapshotError(
                f"{source}: manifest checksum does not match its contents (edited or damaged)"
            )
        return _from_dict(body, source)


def new_snapshot_id(now: float | None = None) -> str:
    """An id that sorts by time: UTC ``YYYYmmddTHHMMSS.mmmZ`` then a random suffix (two takers never clash).

    >>> new_snapshot_id(0.0)[:20]
    '19700101T000000.000Z'
    """
    now = time.time() if now is None else now
    seconds, millis = divmod(int(now * 1000), 1000)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(seconds))
    return f"{stamp}.{millis:03d}Z-{secrets.token_hex(3)}"


def _canonical(body: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except ValueError as exc:
        raise SnapshotError(f"snapshot manifest cannot be written: {exc}") from None
    return text.encode("ascii")


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(body)).hexdigest()


_FIELDS = {f.name for f in dataclasses.fields(SnapshotManifest)}
_SHARD_FIELDS = {f.name for f in dataclasses.fields(ShardEntry)}
_TYPES: dict[str, tuple[type, ...]] = {
    "format_version": (int,),
    "snapshot_id": (str,),
    "deployment": (str,),
    "kind": (str,),
    "parent": (str, type(None)),
    "created_at": (int, float),
    "finished_at": (int, float),
    "updated_since_s": (int, type(None)),
    "tables": (dict,),
    "shards": (list,),
    "consistency": (dict,),
    "offsets": (list,),
    "group_id": (str, type(None)),
    "dense": (dict, type(None)),
    "checkpoint": (str, type(None)),
}


def _from_dict(body: dict[str, Any], source: str) -> SnapshotManifest:
    """Build the manifest, naming the first missing, unknown or mistyped field."""
    if missing := sorted(_FIELDS - body.keys()):
        raise SnapshotError(f"{source}: manifest lacks field {missing[0]!r}")
    if unknown := sorted(body.keys() - _FIELDS):
        raise SnapshotError(f"{source}: manifest has unknown field {unknown[0]!r}")
    for name, types in _TYPES.items():
        if not isinstance(body[name], types):
            raise SnapshotError(
                f"{source}: manifest field {name!r} has the wrong type ({type(body[name]).__name__})"
            )
    shards = [_shard(entry, source) for entry in body["shards"]]
    return SnapshotManifest(**{**body, "shards": shards})


def _shard(entry: object, source: str) -> ShardEntry:
    if not isinstance(entry, dict) or entry.keys() != _SHARD_FIELDS:
        raise SnapshotError(f"{source}: manifest shard entry must have exactly {sorted(_SHARD_FIELDS)}")
    shard = ShardEntry(**entry)
    sizes_ok = all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (shard.rows, shard.bytes)
    )
    names_ok = isinstance(shard.table, str) and isinstance(shard.name, str) and isinstance(shard.sha256, str)
    if not (sizes_ok and names_ok and re.fullmatch(r"[0-9a-f]{64}", shard.sha256)):
        raise SnapshotError(f"{source}: manifest shard entry {entry.get('name')!r} has a malformed field")
    return shard

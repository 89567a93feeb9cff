"""Row snapshots of a deployment: its rows, the Kafka offsets they are consistent with, the dense model.

:func:`take_snapshot` writes, in this order:

1. the consumer group's committed offsets, read **before** the row scan starts
   (or the offsets a trainer passes at its flush barrier);
2. the dense version the publish channel names as newest (weights and the
   published manifest, copied as they are), and the trainer checkpoint when
   the caller passes one;
3. every row (:func:`~kelp.store.snapshots.take.take_rows`, one thread per
   store shard), while trainers keep writing;
4. the manifest, last: a snapshot without one is partial and never listed as whole.

**What "consistent" means.** A trainer commits a batch's offsets only after the
store says that batch's rows are durable (``daemon/stages.py``), and every rank
of a group does the same for its own partitions. So every row update caused by a
record *below* the committed offsets is in the store before those offsets are
committed, and the scan, which starts after the offsets were read, sees that
update or a newer one. Every row of the snapshot is therefore at least as new as
the recorded offsets ("rows-at-or-after-offsets"); some rows may already hold
updates from records at or above them. A restore sets the group back to the
recorded offsets, so training replays those records once more: nothing is lost,
and a record may be trained twice (at-least-once, as after any trainer crash).
The rows of one snapshot are not of one instant: each is as of when the scan read it.

:func:`restore_snapshot` refuses, before writing anything, a group that has
active members; once every shard is checked it sets a marker key
(``k1:<deployment>:restore``) in the store's Redis, writes the rows, commits
the snapshot's offsets for the group, installs the snapshot's trainer
checkpoint, and deletes the marker. A restore killed half-way leaves the
marker: a trainer refuses to start while it is there (:func:`restore_in_progress`),
so does a new snapshot, and the next restore of any snapshot replaces the
half-restored rows and clears it.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kelp.config import KafkaSourceConfig, KelpConfig
from kelp.daemon.group_offsets import active_members, commit_offsets, committed_offsets
from kelp.files import atomic_write
from kelp.store.base import EmbeddingStore
from kelp.store.snapshots.catalog import (
    chain,
    delete_snapshot,
    incomplete_snapshots,
    list_snapshots,
    object_name,
    write_manifest,
)
from kelp.store.snapshots.errors import SnapshotError
from kelp.store.snapshots.manifest import MANIFEST_FORMAT_VERSION, SnapshotManifest, new_snapshot_id
from kelp.store.snapshots.restore_rows import restore_rows
from kelp.store.snapshots.storage import SnapshotStorage, open_storage
from kelp.store.snapshots.take import DEFAULT_SHARD_ROWS, take_rows

__all__ = [
    "RestoreReport",
    "marker_key",
    "open_snapshot_storage",
    "prune_snapshots",
    "resolve_snapshot_id",
    "restore_in_progress",
    "restore_snapshot",
    "take_snapshot",
]

log = logging.getLogger("kelp.snapshots")

CONSISTENCY_RULE = "rows-at-or-after-offsets"
UPDATED_SINCE_MARGIN_S = 1
"""An incremental takes rows updated since its parent's start minus this: ``updated_s`` is whole
seconds (a row updated in the parent's first second must not fall between the two)."""
INCOMPLETE_MAX_AGE_S = 3600.0
"""A snapshot without a manifest older than this is a killed one (never one still being written)."""

DENSE_WEIGHTS = "dense.safetensors"
DENSE_MANIFEST = "dense.manifest.json"
CHECKPOINT = "checkpoint.safetensors"


# --------------------------------------------------------------------------- opening things


def open_snapshot_storage(config: KelpConfig, url: str | None = None) -> SnapshotStorage:
    """Where ``config``'s snapshots are kept: ``url`` (a command's --to/--from) or ``snapshots.rows.url``."""
    url = url or config.snapshots.rows.url
    if not url:
        raise SnapshotError(
            "snapshots.rows.url is not set: set it in the config, or pass --to/--from "
            "(a directory, file://... or s3://bucket/prefix)"
        )
    return open_storage(url, s3_endpoint=config.snapshots.rows.s3_endpoint)


def _refuse_memory(config: KelpConfig) -> None:
    if config.store.backend == "memory":
        raise SnapshotError(
            "store.backend is memory: its rows live inside the `kelp train` process, which this command "
            "cannot see; row snapshots need a Redis backend"
        )


@contextmanager
def _open_store(config: KelpConfig) -> Iterator[EmbeddingStore]:
    """The deployment's backing store itself (no hot tier: its rows are in Redis, not in this process)."""
    from kelp.store.factory import build_store

    store_cfg = config.store.model_copy(
        update={"hot_cache": config.store.hot_cache.model_copy(update={"enabled": False})}
    )
    with build_store(store_cfg, config.features.store_tables(), config.deployment) as store:
        yield store


def _kafka(config: KelpConfig) -> KafkaSourceConfig | None:
    return config.source if isinstance(config.source, KafkaSourceConfig) else None


# --------------------------------------------------------------------------- taking


def take_snapshot(
    config: KelpConfig,
    *,
    incremental: bool = False,
    storage_url: str | None = None,
    barrier: dict[str, Any] | None = None,
    checkpoint_path: Path | None = None,
    offsets: list[dict[str, Any]] | None = None,
    shard_rows: int = DEFAULT_SHARD_ROWS,
) -> SnapshotManifest:
    """Take a full (or incremental) snapshot of ``config``'s deployment; returns its manifest.

    ``barrier``: what a trainer's schedule knows of the point it took it at
    (``{"step": N, "ranks": R}``), recorded in ``consistency``. ``offsets``: the
    group's committed offsets as the caller read them before asking (default:
    read here, before the scan). ``checkpoint_path``: a trainer checkpoint to
    keep with the snapshot. ``shard_rows``: rows per shard object (memory holds
    about one shard per store shard while taking it). Raises
    :class:`~kelp.store.snapshots.errors.SnapshotError` (one line) for what a user
    can fix: no url, a memory store, an unfinished restore, no full snapshot under an incremental.
    """
    _refuse_memory(config)
    storage = open_snapshot_storage(config, storage_url)
    restoring = restore_in_progress(config)
    if restoring is not None:  # half-restored rows are no point in time to go back to
        raise SnapshotError(f"{restoring} has not finished; finish it (run kelp store restore again) first")
    deployment = config.deployment
    tables = {t.name: {"dim": int(t.dim), "dtype": str(t.dtype)} for t in config.features.store_tables()}
    parent = _parent(storage, deployment, tables) if incremental else None
    created_at = time.time()
    snapshot_id = new_snapshot_id(created_at)
    since = None if parent is None else max(0, math.floor(parent.created_at) - UPDATED_SINCE_MARGIN_S)
    source = _kafka(config)
    offsets_from = "caller" if offsets is not None else "group"
    if offsets is None:
        offsets = committed_offsets(source) if source is not None else []
    offsets_read_at = time.time()
    dense = _copy_dense(config, storage, snapshot_id)
    checkpoint = _copy_checkpoint(storage, deployment, snapshot_id, checkpoint_path)
    with _open_store(config) as store:
        scan_started_at = time.time()
        shards = take_rows(
            store,
            storage,
            deployment,
            snapshot_id=snapshot_id,
            tables=tables,
            updated_since_s=since,
            shard_rows=shard_rows,
            max_rows_per_s=config.snapshots.rows.max_rows_per_s,
        )
    finished_at = time.time()
    consistency: dict[str, Any] = {
        "rule": CONSISTENCY_RULE,
        "offsets_from": offsets_from,
        "offsets_read_at": offsets_read_at,
        "scan_started_at": scan_started_at,
        "scan_finished_at": finished_at,
        **({"updated_since_margin_s": UPDATED_SINCE_MARGIN_S} if since is not None else {}),
        **({"checkpoint_sha256": checkpoint[1]} if checkpoint else {}),
    }
    if barrier:
        consistency.update({f"barrier_{k}" if k in ("step", "at") else k: v for k, v in barrier.items()})
    manifest = SnapshotManifest(
        format_version=MANIFEST_FORMAT_VERSION,
        snapshot_id=snapshot_id,
        deployment=deployment,
        kind="incremental" if parent is not None else "full",
        parent=None if parent is None else parent.snapshot_id,
        created_at=created_at,
        finished_at=finished_at,
        updated_since_s=since,
        tables=tables,
        shards=shards,
        consistency=consistency,
        offsets=[dict(o) for o in offsets],
        group_id=source.group_id if source is not None else None,
        dense=dense,
        checkpoint=checkpoint[0] if checkpoint else None,
    )
    write_manifest(storage, manifest)
    return manifest


def _parent(storage: SnapshotStorage, deployment: str, tables: dict[str, dict[str, Any]]) -> SnapshotManifest:
    """The newest complete snapshot, which an incremental builds on; its tables must be these."""
    done = list_snapshots(storage, deployment)
    if not done:
        raise SnapshotError(
            f"no full snapshot to build on: deployment {deployment!r} has none in {storage.describe()}; "
            "take a full one first"
        )
    parent = done[-1]
    if {n: int(s["dim"]) for n, s in parent.tables.items()} != {n: s["dim"] for n, s in tables.items()}:
        raise SnapshotError(
            f"the tables changed since snapshot {parent.snapshot_id} (its: "
            f"{', '.join(sorted(parent.tables))}); take a full snapshot"
        )
    return parent


def _copy_dense(config: KelpConfig, storage: SnapshotStorage, snapshot_id: str) -> dict[str, Any] | None:
    """Copy the channel's newest dense version into the snapshot; None when nothing is published."""
    if not config.publisher.enabled:
        return None
    from kelp.publish.publisher import build_channel
    from kelp.publish.snapshot import verify_snapshot

    with build_channel(config.publisher, config.store, config.deployment) as channel:
        version = channel.latest_version()
        if version is None:
            return None
        manifest_raw, weights = channel.read_raw(version)
    published = verify_snapshot(manifest_raw, weights).manifest  # never copy a corrupt version
    weights_name = object_name(config.deployment, snapshot_id, DENSE_WEIGHTS)
    manifest_name = object_name(config.deployment, snapshot_id, DENSE_MANIFEST)
    storage.put(weights_name, weights)
    storage.put(manifest_name, manifest_raw)
    return {
        "version": int(version),
        "step": int(published.step),
        "file": weights_name,
        "manifest": manifest_name,
        "sha256": hashlib.sha256(weights).hexdigest(),
    }


def _copy_checkpoint(
    storage: SnapshotStorage, deployment: str, snapshot_id: str, path: Path | None
) -> tuple[str, str] | None:
    """Store a trainer checkpoint file with the snapshot: ``(object name, sha256)``, or None."""
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SnapshotError(f"cannot read checkpoint {path}: {exc.strerror}") from None
    name = object_name(deployment, snapshot_id, CHECKPOINT)
    storage.put(name, data)
    return name, hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- keeping


def prune_snapshots(config: KelpConfig, storage: SnapshotStorage, *, now: float | None = None) -> list[str]:
    """Delete full snapshots beyond ``snapshots.rows.keep`` (oldest first) with their incrementals,
    and snapshots without a manifest older than an hour (killed ones); returns the ids deleted."""
    deployment = config.deployment
    done = list_snapshots(storage, deployment)
    fulls = [m.snapshot_id for m in done if m.kind == "full"]
    old_fulls = set(fulls[: max(0, len(fulls) - config.snapshots.rows.keep)])
    parents = {m.snapshot_id: m.parent for m in done}
    doomed = [m.snapshot_id for m in done if _root(m.snapshot_id, parents) in old_fulls]
    now = time.time() if now is None else now
    doomed += [s for s in incomplete_snapshots(storage, deployment) if _age_s(s, now) > INCOMPLETE_MAX_AGE_S]
    for snapshot_id in doomed:
        delete_snapshot(storage, deployment, snapshot_id)
    return doomed


def _root(snapshot_id: str, parents: dict[str, str | None]) -> str | None:
    """The full snapshot at the start of ``snapshot_id``'s chain (None when a link is missing)."""
    seen = set()
    while snapshot_id in parents and snapshot_id not in seen:
        seen.add(snapshot_id)
        parent = parents[snapshot_id]
        if parent is None:
            return snapshot_id
        snapshot_id = parent
    return None


def _age_s(snapshot_id: str, now: float) -> float:
    """How old a snapshot is, from the UTC time its id starts with (0 when the id does not parse)."""
    try:  # new_snapshot_id: YYYYmmddTHHMMSS.mmmZ-<suffix>
        taken = calendar.timegm(time.strptime(snapshot_id[:15], "%Y%m%dT%H%M%S"))
    except ValueError:
        return 0.0
    return now - taken


# --------------------------------------------------------------------------- restoring


@dataclass
class RestoreReport:
    """What :func:`restore_snapshot` did."""

    snapshot_id: str
    chain: list[str]
    rows: dict[str, int]
    replaced: bool
    interrupted: str | None = None
    """The unfinished restore found (and finished over), or None."""
    offsets: list[dict[str, Any]] | None = None
    """The offsets committed for the group; None when left as they were."""
    offsets_note: str = ""
    dense: dict[str, Any] | None = None
    checkpoint: str | None = None
    """Where the snapshot's trainer checkpoint was installed, or None."""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "snapshot": self.snapshot_id,
            "chain": self.chain,
            "rows": self.rows,
            "replaced": self.replaced,
            "interrupted": self.interrupted,
            "offsets": self.offsets,
            "offsets_note": self.offsets_note or None,
            "dense_version": None if self.dense is None else self.dense.get("version"),
            "checkpoint": self.checkpoint,
            "seconds": round(self.seconds, 3),
        }


def resolve_snapshot_id(storage: SnapshotStorage, deployment: str, wanted: str) -> str:
    """``wanted``, or the newest complete snapshot for ``latest``; one line when there is no such snapshot."""
    done = list_snapshots(storage, deployment)
    ids = [m.snapshot_id for m in done]
    if wanted == "latest":
        if not ids:
            raise SnapshotError(f"deployment {deployment!r} has no complete snapshot in {storage.describe()}")
        return ids[-1]
    if wanted not in ids:
        newest = ", ".join(ids[-3:]) or "none"
        raise SnapshotError(
            f"no complete snapshot {wanted!r} of deployment {deployment!r} in {storage.describe()} "
            f"(newest: {newest}; `kelp store snapshots` lists them)"
        )
    return wanted


def restore_snapshot(
    config: KelpConfig,
    snapshot_id: str,
    *,
    replace: bool,
    set_offsets: bool = True,
    storage_url: str | None = None,
    checkpoint_dir: Path | None = None,
) -> RestoreReport:
    """Rebuild the deployment's rows from ``snapshot_id`` (or ``latest``) and put the group back there.

    ``replace``: drop the rows of the snapshot's tables first (without it a store
    holding any is refused). ``set_offsets``: commit the snapshot's offsets for
    ``source.group_id`` (refused while the group has members). ``checkpoint_dir``:
    where to install the snapshot's trainer checkpoint as the latest (default:
    ``trainer.checkpoint_dir`` when that directory exists here).
    """
    _refuse_memory(config)
    started = time.monotonic()
    storage = open_snapshot_storage(config, storage_url)
    snapshot_id = resolve_snapshot_id(storage, config.deployment, snapshot_id)
    manifests = chain(storage, config.deployment, snapshot_id)
    target = manifests[-1]
    source, note = _offsets_plan(config, target, set_offsets)
    report = RestoreReport(snapshot_id, [m.snapshot_id for m in manifests], {}, replace, dense=target.dense)
    report.interrupted = restore_in_progress(config)
    if report.interrupted is not None:  # the rows there are a killed restore's, never training's
        log.warning("%s did not finish; this restore replaces its rows", report.interrupted)
        report.replaced = True
    with _open_store(config) as store:
        report.rows = restore_rows(
            store,
            storage,
            manifests,
            replace=report.replaced,
            before_write=lambda: _set_marker(config, snapshot_id),
        )
    if source is not None:
        committed = commit_offsets(source, target.offsets)
        report.offsets = [
            {"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(committed.items())
        ]
    report.offsets_note = note
    report.checkpoint = _install_checkpoint(config, storage, target, checkpoint_dir)
    _clear_marker(config)
    report.seconds = time.monotonic() - started
    return report


def _offsets_plan(
    config: KelpConfig, target: SnapshotManifest, set_offsets: bool
) -> tuple[KafkaSourceConfig | None, str]:
    """The source whose group gets the snapshot's offsets (None: left alone) and why, checked before
    anything is written: a group with members is refused."""
    source = _kafka(config)
    if not set_offsets:
        return None, "kept (--keep-offsets)"
    if source is None:
        return None, "the source is not Kafka: no offsets"
    if target.group_id is None:
        return None, "the snapshot was taken from a file source: no offsets recorded"
    members = active_members(source)
    if members:
        raise SnapshotError(
            f"consumer group {source.group_id!r} has {members} active member(s): stop its trainers before "
            "restoring (or pass --keep-offsets to leave the group's offsets as they are)"
        )
    note = "" if target.group_id == source.group_id else f"recorded for group {target.group_id!r}"
    return source, note


def _install_checkpoint(
    config: KelpConfig, storage: SnapshotStorage, target: SnapshotManifest, directory: Path | None
) -> str | None:
    """Make the snapshot's trainer checkpoint the latest of ``directory``; returns its path, or None."""
    from kelp.trainer.checkpoint import FORMAT_VERSION as CKPT_FORMAT
    from kelp.trainer.checkpoint import LATEST, read_checkpoint

    if target.checkpoint is None:
        return None
    if directory is None:
        configured = config.trainer.checkpoint_dir
        if configured is None or not Path(configured).is_dir():
            return None
        directory = Path(configured)
    data = storage.get(target.checkpoint)
    recorded = target.consistency.get("checkpoint_sha256")
    digest = hashlib.sha256(data).hexdigest()
    if recorded is not None and recorded != digest:
        raise SnapshotError(f"{target.checkpoint}: checksum mismatch (corrupt or replaced)")
    step = _checkpoint_step(target.checkpoint, data)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt-{step:012d}.safetensors"
    atomic_write(path, data)
    read_checkpoint(path, digest)  # the trainer's own reader accepts it before `latest` names it
    pointer = {"file": path.name, "sha256": digest, "step": step, "format_version": CKPT_FORMAT}
    atomic_write(directory / LATEST, json.dumps(pointer).encode())
    return str(path)


def _checkpoint_step(name: str, data: bytes) -> int:
    """The step a checkpoint's Kelp metadata records (read from the safetensors header alone)."""
    try:
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + header_len])
        return int(json.loads(header["__metadata__"]["kelp"])["step"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"{name}: not a Kelp trainer checkpoint ({type(exc).__name__})") from None


# --------------------------------------------------------------------------- the restore marker


def marker_key(deployment: str) -> str:
    """The key that says a restore of ``deployment`` is running (or was killed)."""
    return f"k1:{deployment}:restore"


@contextmanager
def _marker_client(config: KelpConfig) -> Iterator[Any]:
    """A client of the node that holds the marker: the first standalone shard, or the cluster."""
    from kelp.store.redis.connection import (
        cluster_name,
        connect_cluster,
        connect_node,
        connection_options,
        node_name,
        translate_redis_errors,
    )

    options = connection_options(config.store)
    urls = config.store.urls
    if config.store.backend == "redis-cluster":
        client: Any = connect_cluster(urls, options)
        where = cluster_name(urls)
    else:
        client = connect_node(urls[0], options)
        where = node_name(urls[0])
    try:
        with translate_redis_errors(where):
            yield client
    finally:
        client.close()


def _describe_marker(key: str, raw: bytes) -> str:
    try:
        doc = json.loads(raw)
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(doc["started_at"])))
        return (
            f"a restore of snapshot {doc['snapshot_id']} started {when} on {doc['host']} (pid {doc['pid']})"
        )
    except (ValueError, KeyError, TypeError):
        return f"a restore marker {key} that Kelp cannot read"


def restore_in_progress(config: KelpConfig) -> str | None:
    """What restore is running on (or was killed half-way through) this deployment's rows; None: none.

    A trainer refuses to start while this says something: it would train on
    half-restored rows and commit over the offsets the restore sets.
    """
    if config.store.backend == "memory":
        return None
    key = marker_key(config.deployment)
    with _marker_client(config) as client:
        raw = client.get(key)
    return None if raw is None else _describe_marker(key, raw)


def _set_marker(config: KelpConfig, snapshot_id: str) -> None:
    """Mark the deployment's rows as being restored; only :func:`_clear_marker`, after a restore
    completes, removes it, so a killed or failed restore leaves it."""
    doc = {
        "snapshot_id": snapshot_id,
        "started_at": time.time(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    with _marker_client(config) as client:
        client.set(marker_key(config.deployment), json.dumps(doc))


def _clear_marker(config: KelpConfig) -> None:
    with _marker_client(config) as client:
        client.delete(marker_key(config.deployment))

"""The catalog: only a verified manifest makes a snapshot whole; shards checked; chains resolve or refuse."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from kelp.store.rows.stored import StoredRows
from kelp.store.snapshots.catalog import (
    chain,
    delete_snapshot,
    incomplete_snapshots,
    list_snapshots,
    object_name,
    read_manifest,
    read_shard,
    shard_name,
    write_manifest,
)
from kelp.store.snapshots.errors import MissingObjectError, SnapshotError
from kelp.store.snapshots.format import encode_shard
from kelp.store.snapshots.manifest import ShardEntry, SnapshotManifest
from kelp.store.snapshots.storage import FileStorage, SnapshotStorage, open_storage

DEP = "kelp"


def rows_of(ids: list[int], value: float) -> StoredRows:
    n = len(ids)
    return StoredRows(
        ids=np.array(ids, np.uint64),
        rows=np.full((n, 4), value, np.float32),
        state=np.full(n, value, np.float32),
        access_count=np.arange(n, dtype=np.uint32),
        updated_s=np.full(n, 1000, np.uint32),
    )


def take(
    storage: SnapshotStorage,
    snapshot_id: str,
    rows: StoredRows,
    *,
    parent: str | None = None,
    created_at: float = 1.0,
    manifest: bool = True,
) -> SnapshotManifest:
    """A one-shard snapshot written the way a taker does: shards, then the manifest."""
    data = encode_shard("C1", rows)
    name = shard_name(DEP, snapshot_id, "C1", 0, 0)
    storage.put(name, data)
    result = SnapshotManifest(
        format_version=1,
        snapshot_id=snapshot_id,
        deployment=DEP,
        kind="incremental" if parent else "full",
        parent=parent,
        created_at=created_at,
        finished_at=created_at + 0.5,
        updated_since_s=900 if parent else None,
        tables={"C1": {"dim": 4, "dtype": "float32"}},
        shards=[ShardEntry("C1", name, len(rows), len(data), hashlib.sha256(data).hexdigest())],
    )
    if manifest:
        write_manifest(storage, result)
    return result


@pytest.fixture
def storage(tmp_path: Path) -> FileStorage:
    return FileStorage(tmp_path / "snaps")


def test_layout_names() -> None:
    assert shard_name("kelp", "s1", "C1", 2, 7) == "kelp/s1/shards/C1.2.7.safetensors"
    assert object_name("kelp", "s1", "dense.safetensors") == "kelp/s1/dense.safetensors"
    for bad in ("..", "a/b", "", ".x"):
        with pytest.raises(SnapshotError, match="invalid snapshot id"):
            object_name("kelp", bad, "manifest.json")


def test_a_snapshot_without_manifest_is_incomplete_and_never_listed(storage: FileStorage) -> None:
    whole = take(storage, "s1", rows_of([1, 2], 1.0))
    take(storage, "s2", rows_of([3], 2.0), manifest=False, created_at=2.0)  # its taker was killed
    assert [m.snapshot_id for m in list_snapshots(storage, DEP)] == ["s1"]
    assert list_snapshots(storage, DEP)[0] == whole
    assert incomplete_snapshots(storage, DEP) == ["s2"]
    with pytest.raises(MissingObjectError, match="snapshot s2 of deployment kelp has no manifest"):
        read_manifest(storage, DEP, "s2")
    assert list_snapshots(storage, "other") == []


def test_a_damaged_manifest_is_incomplete_not_whole(storage: FileStorage) -> None:
    take(storage, "s1", rows_of([1], 1.0))
    name = object_name(DEP, "s1", "manifest.json")
    storage.put(name, storage.get(name).replace(b'"rows":1', b'"rows":2'))
    assert list_snapshots(storage, DEP) == []
    assert incomplete_snapshots(storage, DEP) == ["s1"]
    with pytest.raises(SnapshotError, match="checksum does not match"):
        read_manifest(storage, DEP, "s1")


def test_a_manifest_copied_to_another_place_is_refused(storage: FileStorage) -> None:
    take(storage, "s1", rows_of([1], 1.0))
    storage.put(
        object_name("prod", "s1", "manifest.json"), storage.get(object_name(DEP, "s1", "manifest.json"))
    )
    with pytest.raises(SnapshotError, match="of deployment kelp"):
        read_manifest(storage, "prod", "s1")


def test_snapshots_list_oldest_first(storage: FileStorage) -> None:
    take(storage, "b", rows_of([1], 1.0), created_at=5.0)
    take(storage, "a", rows_of([1], 1.0), created_at=9.0)
    take(storage, "c", rows_of([1], 1.0), created_at=1.0)
    assert [m.snapshot_id for m in list_snapshots(storage, DEP)] == ["c", "b", "a"]


def test_read_shard_returns_the_rows(storage: FileStorage) -> None:
    rows = rows_of([5, 6, 7], 3.0)
    manifest = take(storage, "s1", rows)
    back = read_shard(storage, manifest.shards[0])
    np.testing.assert_array_equal(back.ids, rows.ids)
    np.testing.assert_array_equal(back.rows, rows.rows)


def test_a_flipped_byte_is_refused_naming_the_object(storage: FileStorage) -> None:
    manifest = take(storage, "s1", rows_of(list(range(50)), 3.0))
    entry = manifest.shards[0]
    data = bytearray(storage.get(entry.name))
    data[-5] ^= 0x01
    storage.put(entry.name, bytes(data))
    with pytest.raises(SnapshotError) as info:
        read_shard(storage, entry)
    assert str(info.value) == f"{entry.name}: sha256 does not match the manifest (damaged or tampered)"


def test_a_truncated_shard_is_refused_naming_the_object(storage: FileStorage) -> None:
    entry = take(storage, "s1", rows_of(list(range(50)), 3.0)).shards[0]
    storage.put(entry.name, storage.get(entry.name)[:-100])
    with pytest.raises(SnapshotError, match=f"^{entry.name}: .* bytes, the manifest says {entry.bytes}"):
        read_shard(storage, entry)


def test_chain_runs_from_the_full_snapshot_through_each_incremental(storage: FileStorage) -> None:
    take(storage, "s1", rows_of([1, 2], 1.0), created_at=1.0)
    take(storage, "s2", rows_of([2], 2.0), parent="s1", created_at=2.0)
    take(storage, "s3", rows_of([3], 3.0), parent="s2", created_at=3.0)
    take(storage, "s4", rows_of([4], 4.0), parent="s2", created_at=4.0)  # a branch s3 never sees
    assert [m.snapshot_id for m in chain(storage, DEP, "s3")] == ["s1", "s2", "s3"]
    assert [m.snapshot_id for m in chain(storage, DEP, "s1")] == ["s1"]

    assert delete_snapshot(storage, DEP, "s1") == 2
    assert [m.snapshot_id for m in list_snapshots(storage, DEP)] == ["s2", "s3", "s4"]
    with pytest.raises(SnapshotError, match="snapshot s2: its parent s1 is missing or incomplete"):
        chain(storage, DEP, "s3")


def test_chain_refuses_a_table_that_changes_shape(storage: FileStorage) -> None:
    take(storage, "s1", rows_of([1], 1.0))
    child = take(storage, "s2", rows_of([1], 2.0), parent="s1", manifest=False)
    child.tables = {"C1": {"dim": 8, "dtype": "float32"}}
    write_manifest(storage, child)
    with pytest.raises(SnapshotError, match="table 'C1' is"):
        chain(storage, DEP, "s2")


def test_catalog_over_s3(s3_snapshot_url: tuple[str, str]) -> None:
    url, endpoint = s3_snapshot_url
    storage = open_storage(url, s3_endpoint=endpoint)
    full = take(storage, "s1", rows_of([1, 2], 1.0))
    take(storage, "s2", rows_of([2], 2.0), parent="s1", manifest=False)
    assert [m.snapshot_id for m in list_snapshots(storage, DEP)] == ["s1"]
    assert incomplete_snapshots(storage, DEP) == ["s2"]
    np.testing.assert_array_equal(read_shard(storage, full.shards[0]).ids, [1, 2])
    assert delete_snapshot(storage, DEP, "s2") == 1
    assert incomplete_snapshots(storage, DEP) == []

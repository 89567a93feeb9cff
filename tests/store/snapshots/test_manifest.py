"""Manifests: exact round trip, canonical bytes, and refusal of an edited, foreign or newer one."""

from __future__ import annotations

import hashlib
import json

import pytest

from kelp.store.snapshots.errors import SnapshotError
from kelp.store.snapshots.manifest import ShardEntry, SnapshotManifest, new_snapshot_id


def manifest(**changes: object) -> SnapshotManifest:
    fields: dict[str, object] = {
        "format_version": 1,
        "snapshot_id": "20261129T140512.123Z-9f3a1c",
        "deployment": "kelp",
        "kind": "incremental",
        "parent": "20261129T130000.000Z-000001",
        "created_at": 1_795_000_000.25,
        "finished_at": 1_795_000_010.5,
        "updated_since_s": 1_794_999_000,
        "tables": {"C1": {"dim": 16, "dtype": "float16"}},
        "shards": [ShardEntry("C1", "kelp/x/shards/C1.0.0.safetensors", 10, 999, "ab" * 32)],
        "consistency": {"barrier_step": 12, "note": "rows as of the flush barrier"},
        "offsets": [{"topic": "events", "partition": 0, "offset": 1234}],
        "group_id": "kelp-trainer",
        "dense": {"version": 7, "step": 12, "file": "kelp/x/dense.safetensors"},
        "checkpoint": None,
    }
    fields.update(changes)
    return SnapshotManifest(**fields)  # type: ignore[arg-type]


def test_round_trip_is_exact_and_canonical() -> None:
    original = manifest()
    data = original.to_bytes()
    back = SnapshotManifest.from_bytes(data)
    assert back == original
    assert back.to_bytes() == data
    body = json.loads(data)
    assert data == json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert len(body["checksum"]) == 64
    assert (back.total_rows, back.total_bytes) == (10, 999)


def _edited(data: bytes, **changes: object) -> bytes:
    """The manifest's JSON with fields changed and the old checksum kept, as a hand edit leaves it."""
    body = json.loads(data)
    body.update(changes)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "change",
    [
        {"offsets": [{"topic": "events", "partition": 0, "offset": 1}]},
        {"kind": "full"},
        {"checksum": "0" * 64},
    ],
)
def test_an_edited_manifest_is_refused(change: dict[str, object]) -> None:
    with pytest.raises(SnapshotError, match="checksum does not match") as info:
        SnapshotManifest.from_bytes(_edited(manifest().to_bytes(), **change), source="kelp/x/manifest.json")
    assert str(info.value).startswith("kelp/x/manifest.json: ")


def test_a_manifest_without_checksum_is_refused() -> None:
    body = json.loads(manifest().to_bytes())
    del body["checksum"]
    with pytest.raises(SnapshotError, match="checksum"):
        SnapshotManifest.from_bytes(json.dumps(body).encode())


def test_a_newer_format_is_refused_naming_it() -> None:
    with pytest.raises(SnapshotError, match="format_version 2 is newer than this Kelp reads"):
        SnapshotManifest.from_bytes(_edited(manifest().to_bytes(), format_version=2))


def _body(**changes: object) -> dict[str, object]:
    """The manifest's fields without its checksum, changed as given (None drops a field)."""
    body = {k: v for k, v in json.loads(manifest().to_bytes()).items() if k != "checksum"}
    body.update(changes)
    return {k: v for k, v in body.items() if v is not None or k not in changes}


def _resealed(body: dict[str, object]) -> bytes:
    """A body with a valid checksum: well-formed, but of the wrong shape."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({**body, "checksum": hashlib.sha256(canonical).hexdigest()}).encode()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00\x01", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"a": 1}', "no integer format_version"),
        (_resealed(_body(shards=None)), "lacks field 'shards'"),
        (_resealed(_body(extra=1)), "unknown field 'extra'"),
        (_resealed(_body(tables=[])), "'tables' has the wrong type"),
        (_resealed(_body(shards=[{"table": "C1"}])), "shard entry must have exactly"),
        (
            _resealed(
                _body(shards=[{"table": "C1", "name": "n", "rows": -1, "bytes": 1, "sha256": "ab" * 32}])
            ),
            "shard entry 'n' has a malformed field",
        ),
    ],
)
def test_malformed_manifests_are_refused_with_one_line(data: bytes, reason: str) -> None:
    with pytest.raises(SnapshotError, match=reason) as info:
        SnapshotManifest.from_bytes(data)
    assert "\n" not in str(info.value)


def test_an_incremental_needs_a_parent() -> None:
    with pytest.raises(SnapshotError, match="needs a parent"):
        manifest(parent=None)


def test_snapshot_ids_sort_by_time_and_never_clash() -> None:
    times = [1_795_000_000.0, 1_795_000_000.001, 1_795_000_001.999, 1_795_000_002.0]
    ids = [new_snapshot_id(t) for t in times]
    assert ids == sorted(ids)
    assert new_snapshot_id(times[0]) != new_snapshot_id(times[0])
    assert ids[0].startswith("20261118T")

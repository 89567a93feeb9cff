"""The storage contract on a directory and on a real S3 server (s3proxy), and S3's one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kelp.harness.ports import free_port
from kelp.store.snapshots import storage as storage_module
from kelp.store.snapshots.errors import MissingObjectError, SnapshotError
from kelp.store.snapshots.storage import FileStorage, S3Storage, SnapshotStorage, open_storage


@pytest.fixture(params=["file", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> SnapshotStorage:
    if request.param == "file":
        return open_storage(f"file://{tmp_path / 'snaps'}")
    url, endpoint = request.getfixturevalue("s3_snapshot_url")
    return open_storage(url, s3_endpoint=endpoint)


def test_put_get_names_delete(storage: SnapshotStorage) -> None:
    objects = {
        "dep/s1/manifest.json": b"{}",
        "dep/s1/shards/C1.0.0.safetensors": b"\x00" * 1000,
        "dep/s1/shards/C1.1.0.safetensors": b"",
        "dep/s2/shards/C1.0.0.safetensors": b"two",
        "other/s1/manifest.json": b"other",
    }
    for name, data in objects.items():
        storage.put(name, data)
    assert {name: storage.get(name) for name in objects} == objects
    storage.put("dep/s2/shards/C1.0.0.safetensors", b"replaced")
    assert storage.get("dep/s2/shards/C1.0.0.safetensors") == b"replaced"

    assert storage.names("dep/s1/") == sorted(n for n in objects if n.startswith("dep/s1/"))
    assert storage.names("dep/") == sorted(n for n in objects if n.startswith("dep/"))
    assert storage.names("dep/s") == storage.names("dep/")
    assert storage.names("nothing/") == []

    assert storage.delete("dep/s1/") == 3
    assert storage.names("dep/") == ["dep/s2/shards/C1.0.0.safetensors"]
    assert storage.get("other/s1/manifest.json") == b"other"
    with pytest.raises(MissingObjectError, match=r"no object dep/s1/manifest\.json"):
        storage.get("dep/s1/manifest.json")
    with pytest.raises(SnapshotError, match="give a prefix"):
        storage.delete("")
    assert storage.delete("dep/s1/") == 0


@pytest.mark.parametrize("name", ["", "/abs", "a//b", "a/../b", "../b", "a/.hidden", "a\\b"])
def test_names_that_could_leave_the_root_are_refused(storage: SnapshotStorage, name: str) -> None:
    with pytest.raises(SnapshotError, match="invalid snapshot object name"):
        storage.put(name, b"x")


@pytest.mark.parametrize("prefix", ["/", "../", "a/../", "a//", "a/.b", "a/."])
def test_prefixes_that_could_leave_the_root_are_refused(storage: SnapshotStorage, prefix: str) -> None:
    with pytest.raises(SnapshotError, match="invalid snapshot object prefix"):
        storage.names(prefix)


def test_a_killed_writers_temp_file_is_never_listed_and_is_deleted(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    storage.put("dep/s1/shards/C1.0.0.safetensors", b"whole")
    # what kelp.files.atomic_write leaves when its process dies before the rename
    (tmp_path / "dep/s1/shards/.C1.0.1.safetensors.abc123.tmp").write_bytes(b"ha")
    (tmp_path / "dep/s1/.manifest.json.def456.tmp").write_bytes(b"{")
    assert storage.names("dep/") == ["dep/s1/shards/C1.0.0.safetensors"]
    assert storage.delete("dep/s1/") == 1
    assert not (tmp_path / "dep/s1").exists()


def test_delete_goes_in_batches(storage: SnapshotStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_module, "_DELETE_BATCH", 2)
    for i in range(5):
        storage.put(f"dep/s1/shards/C1.0.{i}.safetensors", b"x")
    assert storage.delete("dep/s1/") == 5
    assert storage.names("dep/") == []


def test_unsupported_urls_are_refused() -> None:
    with pytest.raises(SnapshotError, match=r"expected a directory, file://\.\.\. or s3://bucket/prefix"):
        open_storage("gs://bucket/x")
    with pytest.raises(SnapshotError, match="needs a bucket"):
        open_storage("s3:///prefix")


def test_s3_without_boto3_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # an import of boto3 now fails as if not installed
    with pytest.raises(SnapshotError, match=r"pip install 'kelp\[s3\]'"):
        open_storage("s3://bucket/prefix", s3_endpoint="http://127.0.0.1:9")


def test_s3_errors_are_one_line_naming_the_url(
    s3_snapshot_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, endpoint = s3_snapshot_url
    messages = []
    with pytest.raises(SnapshotError, match="no such bucket") as info:
        open_storage("s3://no-such-bucket/p", s3_endpoint=endpoint).names("dep/")
    assert "s3://no-such-bucket/p/" in str(info.value)
    messages.append(str(info.value))

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(SnapshotError, match="access denied") as info:
        open_storage(url, s3_endpoint=endpoint).put("dep/s1/manifest.json", b"{}")
    assert "wrong-secret" not in str(info.value)
    messages.append(str(info.value))

    port = free_port()  # nothing listens there
    unreachable = S3Storage("bucket", "p", endpoint=f"http://kelp:hunter2@127.0.0.1:{port}", max_attempts=1)
    with pytest.raises(SnapshotError, match="S3 endpoint unreachable") as info:
        unreachable.get("dep/s1/manifest.json")
    assert "hunter2" not in str(info.value)
    assert f"127.0.0.1:{port}" in str(info.value)
    messages.append(str(info.value))
    assert not [m for m in messages if "\n" in m]

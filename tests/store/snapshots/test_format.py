"""Shards: exact round trips, one-line refusals of anything not a whole Kelp shard, a reader without Kelp."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from kelp.store.rows.stored import StoredRows
from kelp.store.snapshots.catalog import shard_name, write_manifest
from kelp.store.snapshots.errors import SnapshotError
from kelp.store.snapshots.format import decode_shard, encode_shard
from kelp.store.snapshots.manifest import ShardEntry, SnapshotManifest
from kelp.store.snapshots.storage import FileStorage

DOCS = Path(__file__).resolve().parents[3] / "docs" / "snapshots.md"


def rows_of(n: int, dim: int = 4, dtype: str = "float32", seed: int = 0) -> StoredRows:
    rng = np.random.default_rng(seed)
    return StoredRows(
        ids=rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True),
        rows=rng.standard_normal((n, dim)).astype(dtype),
        state=rng.random(n, dtype=np.float32),
        access_count=rng.integers(0, 2**32 - 1, n, dtype=np.uint32, endpoint=True),
        updated_s=rng.integers(0, 2**32 - 1, n, dtype=np.uint32, endpoint=True),
    )


def assert_same(a: StoredRows, b: StoredRows) -> None:
    for name in ("ids", "rows", "state", "access_count", "updated_s"):
        left, right = getattr(a, name), getattr(b, name)
        assert left.dtype == right.dtype, name
        assert left.shape == right.shape, name
        np.testing.assert_array_equal(left, right, err_msg=name)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n", [0, 1, 257])
def test_round_trip_is_exact(dtype: str, n: int) -> None:
    rows = rows_of(n, dim=8, dtype=dtype)
    table, back = decode_shard(encode_shard("C1", rows))
    assert table == "C1"
    assert_same(rows, back)


def test_empty_block_is_a_valid_shard() -> None:
    table, back = decode_shard(encode_shard("C9", StoredRows.empty(16, "float16")))
    assert (table, len(back), back.rows.shape, back.rows.dtype) == ("C9", 0, (0, 16), np.float16)


def test_encode_refuses_rows_it_cannot_store() -> None:
    bad = rows_of(3)
    with pytest.raises(SnapshotError, match="float32 or float16"):
        encode_shard(
            "C1", StoredRows(bad.ids, bad.rows.astype(np.float64), bad.state, bad.access_count, bad.updated_s)
        )


def _tensors(rows: StoredRows) -> dict[str, np.ndarray]:
    return {name: getattr(rows, name) for name in ("ids", "rows", "state", "access_count", "updated_s")}


_META = {"kelp_shard_format": "1", "table": "C1"}


def _file(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = _META) -> bytes:
    return bytes(safetensors.numpy.save(tensors, metadata=metadata))


def _bad_files() -> dict[str, tuple[bytes, str]]:
    good_tensors = _tensors(rows_of(5))
    good = encode_shard("C1", rows_of(5))
    missing = {k: v for k, v in good_tensors.items() if k != "state"}
    return {
        "empty": (b"", "truncated"),
        "cut in the header": (good[:40], "header of"),
        "cut in the data": (good[:-7], "not a readable safetensors"),
        "not safetensors": (b"\x05\x00\x00\x00\x00\x00\x00\x00hello", "not JSON"),
        "no kelp metadata": (_file(good_tensors, metadata=None), "no kelp_shard_format"),
        "newer format": (_file(good_tensors, {"kelp_shard_format": "2", "table": "C1"}), "'2'"),
        "no table": (_file(good_tensors, {"kelp_shard_format": "1"}), "without a table"),
        "missing tensor": (_file(missing), "without the 'state' tensor"),
        "wrong dtype": (_file({**good_tensors, "ids": good_tensors["ids"].astype(np.int64)}), "'ids' is I64"),
        "float64 rows": (
            _file({**good_tensors, "rows": good_tensors["rows"].astype(np.float64)}),
            "F32 or F16",
        ),
        "lengths differ": (
            _file({**good_tensors, "state": good_tensors["state"][:4]}),
            "4 entries for 5 ids",
        ),
        "rows not 2-d": (_file({**good_tensors, "rows": good_tensors["rows"].ravel()}), "'rows' has shape"),
    }


@pytest.mark.parametrize("case", list(_bad_files()))
def test_bad_shards_are_refused_with_one_line(case: str) -> None:
    data, reason = _bad_files()[case]
    with pytest.raises(SnapshotError) as info:
        decode_shard(data, source="d/s/shards/C1.0.0.safetensors")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("d/s/shards/C1.0.0.safetensors: ")
    assert reason in message


def _docs_reader() -> str:
    """The plain-Python reading example of docs/snapshots.md, as the reader would copy it."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## Reading a snapshot without Kelp", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "docs/snapshots.md lost its reading example"
    return match.group(1)


def test_the_documented_plain_reader_reads_what_kelp_wrote(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path / "snaps")
    first = rows_of(7, 4, "float32", 1)
    again = rows_of(1, 4, "float32", 4)  # the scan met first's row 0 again, later, with newer values
    again = StoredRows(first.ids[:1], again.rows, again.state, again.access_count, again.updated_s)
    blocks = {"C1": [first, rows_of(3, 4, "float32", 2), again], "C2": [rows_of(5, 2, "float16", 3)]}
    keep = {"C1": np.r_[1:11], "C2": np.r_[0:5]}  # every row but the earlier copy of the repeated id
    shards = []
    for table, parts in blocks.items():
        for seq, rows in enumerate(parts):
            data = encode_shard(table, rows)
            name = shard_name("dep", "snap1", table, 0, seq)
            storage.put(name, data)
            shards.append(ShardEntry(table, name, len(rows), len(data), hashlib.sha256(data).hexdigest()))
    write_manifest(
        storage,
        SnapshotManifest(
            format_version=1, snapshot_id="snap1", deployment="dep", kind="full", parent=None,
            created_at=1.0, finished_at=2.0, updated_since_s=None,
            tables={"C1": {"dim": 4, "dtype": "float32"}, "C2": {"dim": 2, "dtype": "float16"}},
            shards=shards,
        ),
    )  # fmt: skip
    out = tmp_path / "read.npz"
    script = _docs_reader() + (
        "\nimport sys\n"
        "got = read_snapshot(sys.argv[1], 'dep', 'snap1')\n"
        "assert not [m for m in sys.modules if m.partition('.')[0] == 'kelp'], 'the example imported kelp'\n"
        "np.savez(sys.argv[2], **{f'{t}.{c}': v for t, cols in got.items() for c, v in cols.items()})\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, str(tmp_path / "snaps"), str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with np.load(out) as read:
        assert sorted({k.split(".")[0] for k in read.files}) == ["C1", "C2"]
        for table, parts in blocks.items():
            for column in ("ids", "rows", "state", "access_count", "updated_s"):
                want = np.concatenate([getattr(p, column) for p in parts])[keep[table]]
                assert read[f"{table}.{column}"].dtype == want.dtype
                np.testing.assert_array_equal(read[f"{table}.{column}"], want)

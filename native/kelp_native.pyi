"""Kelp's native batch work: per-batch passes that release the GIL.

rows_io.rs (row and integer replies into buffers, packed commands), sketch.rs,
index.rs, hashing.rs, dedup.rs.
"""

from collections.abc import Sequence

from typing_extensions import Buffer

def take_rows_into(
    buf: Buffer,
    cursor: int,
    got: int,
    limit: int,
    width: int,
    present: Buffer,
    values: Buffer,
    taken: int,
    stored: int,
) -> tuple[int, int, int, bool]:
    """Take row replies from ``buf[:got]`` at ``cursor``, at most ``limit``, copying as it goes.

    Each record's flag goes to ``present[taken]`` onwards (writable uint8: 1 a value, 0 nil) and
    each value's ``width`` bytes to row ``stored`` onwards of ``values`` (writable uint8). Returns
    ``(cursor, taken, stored, foreign)``: the new cursor, the records and values taken, and whether
    the scan stopped at a reply that is no such record. The GIL is released while it runs; buffers
    without room for ``limit`` more records, or sharing memory, raise ValueError.
    """

def pack_rows(
    head: bytes, columns: list[Buffer], widths: Sequence[int], n: int, rows: Buffer | None = None
) -> bytes:
    """One RESP command per row: ``head``, then per column a bulk string of the row's ``widths[i]``
    bytes. ``columns``: C-contiguous uint8 buffers of ``n * widths[i]`` bytes; ``rows``: int64
    positions to take, in that order (None: all ``n``). The GIL is released while it packs; a
    column or row that does not fit raises ValueError.
    """

def take_ints_into(buf: Buffer, cursor: int, got: int, limit: int, out: Buffer) -> tuple[int, int, bool]:
    """Take integer replies (``:<digits>\\r\\n``, 1 to 18 digits) from ``buf[:got]`` at ``cursor``,
    at most ``limit``, writing each value into ``out`` (writable int64) from position 0.

    Returns ``(cursor, taken, foreign)``: the new cursor, the replies taken, and whether the scan
    stopped at a line that is no such reply (an error, another type, a longer number). A line not
    all received yet stops it without being foreign. The GIL is released while it runs; an ``out``
    without room for ``limit``, or sharing memory with ``buf``, raises ValueError.
    """

def sketch_add(counts: Buffer, ids: Buffer, inc: int | Buffer, seeds: Sequence[int], mask: int) -> None:
    """Add ``inc`` to each id's cell ``splitmix64(id ^ seeds[d]) & mask`` in every row ``d`` of ``counts``.

    ``counts``: a writable, C-contiguous uint32 ``[len(seeds), mask + 1]`` array (``mask + 1`` a
    power of two), updated in place with wrapping adds; ``ids``: a C-contiguous uint64 buffer;
    ``inc``: one int in ``[0, 2**32)`` for all ids, or a uint32 buffer with one per id. The GIL is
    released while it runs; a buffer, ``inc`` or ``mask`` that does not fit raises ValueError before
    anything is written.
    """

def sketch_estimate(counts: Buffer, ids: Buffer, seeds: Sequence[int], mask: int, out: Buffer) -> None:
    """Write into ``out`` (writable uint32, one per id) each id's minimum over the rows of its cells.

    ``counts``, ``ids``, ``seeds`` and ``mask`` as for :func:`sketch_add` (``counts`` may be
    read-only here); ``out`` must not share memory with them. The GIL is released while it runs;
    a buffer or ``mask`` that does not fit raises ValueError.
    """

ID_MAP_MAX_TAG: int
"""The largest tag an IdMap key may carry (253): a full entry's state byte is 2 + its tag."""

def splitmix64(ids: Buffer, out: Buffer) -> None:
    """Write ``splitmix64(ids[i])`` into ``out[i]`` (C-contiguous uint64 buffers of as many items, any shape).

    ``out`` must be writable and share no memory with ``ids``; the GIL is released while it runs.
    A buffer that does not fit raises ValueError.
    """

def rendezvous(ids: Buffer, seeds: Buffer, out: Buffer) -> None:
    """Write into ``out[i]`` (writable int64, one per id) the first ``s`` maximising
    ``splitmix64(ids[i] ^ seeds[s])``.

    ``ids`` and ``seeds`` are C-contiguous uint64 buffers, at least one seed. The GIL is released
    while it runs; a buffer that does not fit raises ValueError.
    """

def dedup_columns(columns: Sequence[Buffer], uniques: Buffer, inverse: Buffer) -> list[int]:
    """Dedup each column on its own, as ``np.unique(column, return_inverse=True)``; returns each
    one's distinct count.

    Column ``c``'s sorted distinct ids go to ``uniques`` right after those of the columns before
    it, its inverse (positions among its own distinct ids) to ``inverse`` at the offset its ids
    have in all columns laid end to end. Columns: C-contiguous uint64 buffers (read flat);
    ``uniques`` uint64 and ``inverse`` int64, writable, C-contiguous, as many items as all columns
    together, sharing no memory with them or each other. The GIL is released while it runs; a
    buffer that does not fit raises ValueError.
    """

class IdMap:
    """uint64 id, or (tag, id) with a uint8 tag in ``[0, ID_MAP_MAX_TAG]``, to int64, whole arrays per call.

    Open addressing, at most half full; grows (dropping tombstones) to at most a third full.
    Each call releases the GIL; not thread-safe (a call while another one mutates raises).
    Buffers are C-contiguous: ids uint64, vals int64, tags uint8 or None (tag 0); outputs are
    writable int64, one per id, disjoint from the inputs. Bad buffers or tags raise ValueError
    before anything changes; a table that cannot be allocated raises MemoryError.
    """

    def __init__(self, capacity: int = 1024) -> None: ...
    def __len__(self) -> int: ...
    @property
    def table_len(self) -> int:
        """Entries in the hash table (full, tombstoned or empty)."""
    def lookup(self, ids: Buffer, tags: Buffer | None, out: Buffer) -> None:
        """Write each (tag, id)'s value into ``out``, -1 where absent."""
    def insert(self, ids: Buffer, vals: Buffer, tags: Buffer | None) -> None:
        """Add an entry per id without looking for one already there (callers insert absent keys once)."""
    def delete(self, ids: Buffer, tags: Buffer | None, out: Buffer) -> None:
        """Write the value each (tag, id) had into ``out`` (-1 where absent) and remove them."""
    def items(self, keys: Buffer, vals: Buffer) -> None:
        """Fill ``keys`` (uint64) and ``vals`` (int64), each ``len(map)`` long, in table order."""

"""The lost-update measurement of ``kelp bench scale`` on hand-made traces."""

from __future__ import annotations

import numpy as np

from kelp.bench.scale import lost_update_fraction


def _trace(ids: list[int], read: list[float], written: list[float]) -> dict[str, np.ndarray]:
    return {
        "t.ids": np.array(ids, dtype=np.uint64),
        "t.read": np.array(read, dtype=np.float64),
        "t.written": np.array(written, dtype=np.float64),
    }


def test_a_write_from_an_older_read_overwrites_the_other_ranks_update() -> None:
    # Row 7: rank 0 reads at 0, writes at 2; rank 1 read at 1 (before 2), writes at 3: rank 0's update lost.
    # Row 8: rank 1 reads at 5, after rank 0's write at 4: it builds on it, nothing lost.
    rank0 = _trace([7, 8], [0.0, 3.0], [2.0, 4.0])
    rank1 = _trace([7, 8], [1.0, 5.0], [3.0, 6.0])
    fraction, total = lost_update_fraction([rank0, rank1], ["t"])
    assert total == 4
    assert fraction == 1 / 4


def test_one_rank_never_loses_its_own_updates() -> None:
    only = _trace([1, 1, 1], [0.0, 0.5, 1.0], [2.0, 3.0, 4.0])  # its own overlay keeps them: not counted
    assert lost_update_fraction([only], ["t"]) == (0.0, 3)


def test_tables_without_updates_are_skipped() -> None:
    empty = _trace([], [], [])
    assert lost_update_fraction([empty, empty], ["t"]) == (0.0, 0)

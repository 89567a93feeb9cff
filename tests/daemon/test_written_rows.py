"""WrittenRows never says "not written" for a row that was written; a wrong "maybe" only costs a read."""

from __future__ import annotations

import numpy as np
import pytest

from kelp.daemon.written_rows import WrittenRows


def test_every_written_row_is_a_maybe_and_few_others_are() -> None:
    rng = np.random.default_rng(7)
    written = rng.integers(0, 2**63, 200_000, dtype=np.uint64)
    others = rng.integers(0, 2**63, 100_000, dtype=np.uint64)
    seen = WrittenRows(bits=1 << 22)  # 4M bits for 200k rows: about 0.2% false "maybe" expected
    for chunk in np.array_split(written, 7):
        seen.add("t", chunk)
    assert seen.maybe("t", written).all()  # no false "no": that would lose an update
    assert seen.maybe("t", others).mean() < 0.01
    assert seen.maybe("u", written[:1000]).mean() < 0.01  # tables do not share entries


def test_the_size_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        WrittenRows(bits=1000)

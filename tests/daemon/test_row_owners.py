"""Row owners: who writes a row in a trainer group, and the per-step gradient exchange between ranks.

The exchange runs on a real two-process gloo group on loopback (``torch.multiprocessing``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp
from prometheus_client import CollectorRegistry

from kelp.config import DistributedConfig
from kelp.daemon.group import TrainingGroup, World
from kelp.daemon.ledger import UpdateLedger
from kelp.daemon.row_owners import RowOwners, owner_of
from kelp.harness import free_port
from kelp.store.base import PullResult
from kelp.trainer.metrics import TrainerMetrics
from kelp.trainer.optim import SparseUpdate

DIMS = {"a": 2, "b": 3}
SAMPLES = (10, 30)


def _sent(rank: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """What each rank sends: overlapping ids in table a, table b only on rank 1."""
    ids = {0: np.arange(0, 40, dtype=np.uint64), 1: np.arange(20, 60, dtype=np.uint64)}[rank]
    grads = np.arange(len(ids) * 2, dtype=np.float32).reshape(-1, 2) + 100 * rank
    out = {"a": (ids, grads)}
    if rank == 1:
        out["b"] = (np.array([7, 8], dtype=np.uint64), np.ones((2, 3), np.float32))
    return out


def _rank_main(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    group = TrainingGroup(
        World(rank, rank, 2), DistributedConfig(timeout_s=30), TrainerMetrics(CollectorRegistry())
    )
    group.start(torch.nn.Linear(1, 1), torch.device("cpu"))
    try:
        got, total = RowOwners(group, DIMS).exchange(_sent(rank), SAMPLES[rank])
        np.savez(
            Path(out) / f"rank{rank}.npz",
            total=total,
            **{f"{t}.ids": ids for t, (ids, _) in got.items()},
            **{f"{t}.grads": g for t, (_, g) in got.items()},
        )
    finally:
        group.close()


def _expected(table: str, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum over ranks of samples * grad per id, divided by all samples; the ids ``rank`` owns."""
    sums: dict[int, np.ndarray] = {}
    for r in (0, 1):
        if table not in _sent(r):
            continue
        ids, grads = _sent(r)[table]
        for i, g in zip(ids.tolist(), grads, strict=True):
            sums[i] = sums.get(i, 0) + SAMPLES[r] * g
    ids = np.array(sorted(sums), dtype=np.uint64)
    ids = ids[owner_of(ids, 2) == rank]
    grads = np.array([sums[i] / sum(SAMPLES) for i in ids.tolist()], dtype=np.float32).reshape(len(ids), -1)
    return ids, grads


def test_owner_of_is_stable_and_spreads_consecutive_ids_over_every_rank() -> None:
    ids = np.arange(10_000, dtype=np.uint64)
    for world in (2, 3, 8):
        owners = owner_of(ids, world)
        assert np.array_equal(owners, owner_of(ids.copy(), world))
        counts = np.bincount(owners, minlength=world)
        assert counts.min() > 0.9 * len(ids) / world  # no rank owns much less than its share
    assert (owner_of(ids, 1) == 0).all()


def test_two_ranks_each_get_the_sample_weighted_gradient_sum_of_the_rows_they_own(tmp_path: Path) -> None:
    mp.start_processes(_rank_main, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    seen: set[int] = set()
    for rank in (0, 1):
        got = np.load(tmp_path / f"rank{rank}.npz")
        assert int(got["total"]) == sum(SAMPLES)
        for table in DIMS:
            ids, grads = _expected(table, rank)
            if not len(ids):
                assert f"{table}.ids" not in got
                continue
            np.testing.assert_array_equal(got[f"{table}.ids"], ids)
            np.testing.assert_allclose(got[f"{table}.grads"], grads, rtol=1e-6)
            assert (owner_of(ids, 2) == rank).all()
            seen |= {hash((table, i)) for i in ids.tolist()}
    assert len(seen) == 60 + 2  # every row sent reached exactly one owner


def _rows(ids: list[int], value: float) -> PullResult:
    n = len(ids)
    return PullResult(
        rows=np.full((n, 2), value, np.float32),
        state=np.full(n, value, np.float32),
        admitted=np.ones(n, bool),
    )


def test_a_side_read_gets_every_recorded_update_it_may_have_missed() -> None:
    ledger = UpdateLedger(acked=0)
    ids = np.array([1, 2, 3], dtype=np.uint64)
    ledger.record(
        1,
        {
            "t": SparseUpdate(
                np.array([2], np.uint64), np.full((1, 2), 5.0, np.float32), np.ones(1, np.float32)
            )
        },
    )

    def read() -> dict[str, PullResult]:
        ledger.acknowledge(1)  # the push lands while the read runs: the read may or may not see it
        return {"t": _rows([1, 2, 3], 0.0)}

    got = ledger.side_read(read, {"t": ids})["t"]
    assert got.rows[:, 0].tolist() == [0.0, 5.0, 0.0]
    assert ledger.rows() == 0  # acknowledged and no read open: the entry is gone

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
from kelp.daemon.row_owners import RowOwners, SentRows, owner_of
from kelp.harness import free_port
from kelp.store.base import PullResult
from kelp.trainer.metrics import TrainerMetrics
from kelp.trainer.optim import SparseUpdate

DIMS = {"a": 2, "b": 3}


def _sent(rank: int) -> dict[str, SentRows]:
    """What each rank sends: overlapping ids in table a, table b only on rank 1; its copies are
    ``id + 0.5`` with state ``id``."""
    ids = {0: np.arange(0, 40, dtype=np.uint64), 1: np.arange(20, 60, dtype=np.uint64)}[rank]
    out = {"a": _rows_of(ids, np.arange(len(ids) * 2, dtype=np.float32).reshape(-1, 2) + 100 * rank)}
    if rank == 1:
        out["b"] = _rows_of(np.array([7, 8], dtype=np.uint64), np.ones((2, 3), np.float32))
    return out


def _rows_of(ids: np.ndarray, grads: np.ndarray) -> SentRows:
    copy = np.repeat(ids.astype(np.float32)[:, None] + 0.5, grads.shape[1], axis=1)
    return SentRows(ids, grads, copy, ids.astype(np.float32))


def _rank_main(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    group = TrainingGroup(
        World(rank, rank, 2), DistributedConfig(timeout_s=30), TrainerMetrics(CollectorRegistry())
    )
    group.start(torch.nn.Linear(1, 1), torch.device("cpu"))
    try:
        owners = RowOwners(group, DIMS)
        got = owners.exchange(_sent(rank), durable_step=10 + rank)
        arrays = {"group_durable": np.array(owners.group_durable)}
        for table, parts in got.items():
            for i, part in enumerate(parts):
                for field in SentRows._fields:
                    arrays[f"{table}.{i}.{field}"] = getattr(part, field)
        returned = owners.return_rows({table: _stepped(table, parts, rank) for table, parts in got.items()})
        for table, update in returned.items():
            arrays[f"back.{table}.ids"], arrays[f"back.{table}.rows"] = update.ids, update.rows
            arrays[f"back.{table}.state"] = update.state
        np.savez(Path(out) / f"rank{rank}.npz", **arrays)
    finally:
        group.close()


def _stepped(table: str, parts: list[SentRows], owner: int) -> SparseUpdate:
    """An owner's stepped rows, made recognisable: each value is ``id * 10 + owner``, state ``-id``."""
    ids = np.unique(np.concatenate([p.ids for p in parts]))
    value = ids.astype(np.float32) * 10 + owner
    return SparseUpdate(ids, np.repeat(value[:, None], DIMS[table], axis=1), -ids.astype(np.float32))


def _expected(table: str, owner: int) -> list[SentRows]:
    """Each sending rank's rows of ``table`` that ``owner`` owns, in rank order (ranks with none left out)."""
    parts = []
    for r in (0, 1):
        if table in _sent(r):
            sent = _sent(r)[table]
            mine = owner_of(sent.ids, 2) == owner
            if mine.any():
                parts.append(SentRows(*(a[mine] for a in sent)))
    return parts


def test_owner_of_is_stable_and_spreads_consecutive_ids_over_every_rank() -> None:
    ids = np.arange(10_000, dtype=np.uint64)
    for world in (2, 3, 8):
        owners = owner_of(ids, world)
        assert np.array_equal(owners, owner_of(ids.copy(), world))
        counts = np.bincount(owners, minlength=world)
        assert counts.min() > 0.9 * len(ids) / world  # no rank owns much less than its share
    assert (owner_of(ids, 1) == 0).all()


def test_two_ranks_each_get_every_ranks_gradients_and_copies_of_the_rows_they_own(tmp_path: Path) -> None:
    mp.start_processes(_rank_main, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    received = 0
    for rank in (0, 1):
        got = np.load(tmp_path / f"rank{rank}.npz")
        assert int(got["group_durable"]) == 10  # the lowest durable step any rank reported
        for table in DIMS:
            expected = _expected(table, rank)
            assert sum(1 for key in got.files if key.startswith(f"{table}.") and key.endswith(".ids")) == len(
                expected
            )
            for i, part in enumerate(expected):
                for field in SentRows._fields:  # the ids, gradients and the sender's copies
                    np.testing.assert_array_equal(got[f"{table}.{i}.{field}"], getattr(part, field))
                received += len(part.ids)
    assert received == 40 + 40 + 2  # every row each rank sent reached exactly one owner


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


def test_the_owners_send_each_rank_back_the_stepped_rows_of_what_it_sent(tmp_path: Path) -> None:
    """The inverse exchange: a rank gets every row it trained that another rank owns, as stepped there."""
    mp.start_processes(_rank_main, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in (0, 1):
        got = np.load(tmp_path / f"rank{rank}.npz")
        for table, (ids, *_) in _sent(rank).items():
            others = np.sort(ids[owner_of(ids, 2) != rank])
            if not len(others):
                assert f"back.{table}.ids" not in got.files
                continue
            order = np.argsort(got[f"back.{table}.ids"])
            back_ids = got[f"back.{table}.ids"][order]
            np.testing.assert_array_equal(back_ids, others)
            expected = others.astype(np.float32) * 10 + (1 - rank)
            np.testing.assert_array_equal(
                got[f"back.{table}.rows"][order], np.repeat(expected[:, None], DIMS[table], 1)
            )
            np.testing.assert_array_equal(got[f"back.{table}.state"][order], -others.astype(np.float32))

"""One rank of ``kelp bench scale``: ``kelp train`` plus a trace of when it read and wrote each row.

Run by the suite, alone (world of 1) or under ``torch.distributed.run``::

    python -m kelp.bench.scale_rank --config F --out DIR

It trains exactly as ``kelp train`` does (same :class:`TrainDaemon`), until
SIGTERM, then writes ``DIR/rank-<r>.npz`` (labels and pre-update logits of
every trained sample, the row trace) and ``DIR/rank-<r>.json`` (timings,
all-reduce and row-exchange seconds, its dense parameters' digest) and ``DIR/rank-<r>.pt`` (its
dense state, for the max-abs-diff between ranks).
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from kelp.config import load_config
from kelp.consumers.batch import MicroBatch
from kelp.daemon.train import TrainDaemon
from kelp.logs import configure_logging
from kelp.store.metrics import counter_totals
from kelp.trainer.checkpoint import dense_digest

__all__ = ["RowTrace", "main"]


class RowTrace:
    """Wraps the store: when each batch's rows were read (pull) and when its updates were written (push).

    Every pushed update is paired with the pull of its batch: pushes follow
    pulls in order, and the batch's pull holds every id of the push's first
    table (a pull whose batch pushed nothing is skipped so). A row owner's
    push also holds rows other ranks trained: its batch is the first pull that
    shares some. A push that shares none (a rank with no batch pushing rows it
    owns, which it read just before) counts as read when written. Reads without
    counting (a row owner's read of rows other ranks trained) are not batch pulls.
    """

    def __init__(self, store: Any) -> None:
        self._store = store
        self._pulls: deque[tuple[float, dict[str, np.ndarray]]] = deque()
        self.events: dict[str, list[tuple[np.ndarray, float, float]]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def pull_many(self, ids: dict[str, np.ndarray], **kwargs: Any) -> Any:
        got = self._store.pull_many(ids, **kwargs)
        if kwargs.get("count", True):
            self._pulls.append((time.monotonic(), ids))
        return got

    def push_many(self, payload: dict[str, Any]) -> Any:
        result = self._store.push_many(payload)
        self._record(payload)
        return result

    def apply_adagrad_many(self, payload: dict[str, Any], lr: float, eps: float) -> Any:
        result = self._store.apply_adagrad_many(payload, lr, eps)
        self._record(payload)
        return result

    def _record(self, payload: dict[str, Any]) -> None:
        written = time.monotonic()
        table = next(iter(payload))
        pushed = payload[table][0]
        queued = list(self._pulls)  # a snapshot: the prefetch thread appends while this one reads
        found = [np.isin(pushed, pulled.get(table, ())) for _, pulled in queued]
        # Its own batch's pull holds every row a push writes; a row owner's push also holds rows
        # other ranks trained, so for it the batch is the first pull that shares some.
        match = next((i for i, inside in enumerate(found) if inside.all()), None)
        if match is None:
            match = next((i for i, inside in enumerate(found) if inside.any()), None)
        read = written
        if match is not None:
            read = queued[match][0]
            for _ in range(match + 1):
                self._pulls.popleft()
        for name, update in payload.items():
            self.events.setdefault(name, []).append((np.asarray(update[0], dtype=np.uint64), read, written))

    def arrays(self) -> dict[str, np.ndarray]:
        """Flat arrays per table: ``<table>.ids``, ``<table>.read``, ``<table>.written``."""
        out: dict[str, np.ndarray] = {}
        for name, events in self.events.items():
            out[f"{name}.ids"] = np.concatenate([e[0] for e in events])
            out[f"{name}.read"] = np.concatenate([np.full(len(e[0]), e[1]) for e in events])
            out[f"{name}.written"] = np.concatenate([np.full(len(e[0]), e[2]) for e in events])
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    configure_logging("warning")
    cfg = load_config(args.config)
    traces: list[RowTrace] = []
    labels: list[np.ndarray] = []
    logits: list[np.ndarray] = []
    times: list[float] = []
    first_batch: list[int] = []

    def wrap(store: Any) -> RowTrace:
        traces.append(RowTrace(store))
        return traces[-1]

    def on_step(_step: int, batch: MicroBatch, result: Any) -> None:
        labels.append(batch.labels)
        logits.append(result.logits)
        times.append(time.monotonic())
        if not first_batch:
            first_batch.append(batch.size)

    registry = CollectorRegistry()
    torch.manual_seed(0)
    daemon = TrainDaemon(cfg, registry=registry, http=False, publish=False, on_step=on_step, wrap_store=wrap)
    signal.signal(signal.SIGTERM, lambda *_: daemon.request_stop("SIGTERM"))
    report = daemon.run()
    rank = report.rank
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(
        args.out / f"rank-{rank}.npz",
        labels=np.concatenate(labels) if labels else np.zeros(0, np.float32),
        logits=np.concatenate(logits) if logits else np.zeros(0, np.float32),
        **(traces[0].arrays() if traces else {}),
    )
    torch.save(
        {k: v.detach().cpu() for k, v in daemon.step.model.state_dict().items()}, args.out / f"rank-{rank}.pt"
    )
    summary = {
        "rank": rank,
        "world_size": report.world_size,
        "samples": report.samples,
        "steps": report.steps,
        "first_step_at": times[0] if times else None,
        "last_step_at": times[-1] if times else None,
        "first_batch_samples": first_batch[0] if first_batch else 0,
        "allreduce_seconds": registry.get_sample_value("kelp_trainer_allreduce_seconds_sum") or 0.0,
        "allreduce_count": registry.get_sample_value("kelp_trainer_allreduce_seconds_count") or 0.0,
        "row_exchange_seconds": registry.get_sample_value("kelp_trainer_row_exchange_seconds_sum") or 0.0,
        "row_exchange_count": registry.get_sample_value("kelp_trainer_row_exchange_seconds_count") or 0.0,
        "dense_sha256": dense_digest(daemon.step.model),
        "backend_row_ops": counter_totals(registry).get("backend_row_ops", 0.0),
        "owned_rows_updated": registry.get_sample_value("kelp_trainer_owned_rows_updated_total") or 0.0,
        "owned_rows_read": registry.get_sample_value("kelp_trainer_owned_rows_read_total") or 0.0,
    }
    (args.out / f"rank-{rank}.json").write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``kelp bench pipeline``: what one trainer process can feed a device, with the model taken out.

The ``train`` suite's stream (criteo-synth on Kafka, the store on Redis with
the default hot tier, the real :class:`~kelp.daemon.train.TrainDaemon`), with
its :class:`~kelp.trainer.step.TrainStep` replaced by :class:`FeedOnlyStep`:
every tensor a real step moves is moved (the batch and the pulled rows to the
device, the rows back to the host, pushes of the same ids and shapes), but no
forward, backward or optimizer runs. ``pipeline_samples_per_s`` is therefore
the most a trainer process can hand a device that trained in no time; on a
GPU, where the model step nearly vanishes, it is the ceiling.

Baseline in the same run: the in-memory trainer of the ``train`` suite
(:class:`~kelp.bench.baseline.InMemoryBaseline`, the real model) on the same
batches; ``ratio`` = pipeline / in-memory, how many times faster the feed is
than this machine's model step. The cost per sample over the steady steps
(:mod:`kelp.bench.cost`) is reported for the feed alone.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kelp.bench.runner import progress
from kelp.bench.train import BATCH, inmemory_run, produce_topic, run_header, stream_config, stream_run
from kelp.consumers.batch import MicroBatch
from kelp.harness import RedisServer, make_broker
from kelp.store.policy.fallback import PullPlan
from kelp.trainer import TrainStep
from kelp.trainer.embedding import BatchTensors, rows_to_leaf, to_device
from kelp.trainer.optim import SparseUpdate
from kelp.trainer.step import DenseSync, PulledRows, StageTimer, StepResult, finish_step

__all__ = ["FeedOnlyStep", "run"]


class FeedOnlyStep(TrainStep):
    """A step of the same shapes without the model: tensors in, the same rows back out.

    It builds the batch's tensors and a leaf per pulled table on the device, as
    :class:`TrainStep` does, copies the rows back to the host and returns them
    unchanged as the update of the admitted ids, so the push writer, the
    ledger and the store see exactly the traffic of a real step.
    """

    def __call__(
        self,
        batch: MicroBatch,
        pulled: Mapping[str, PulledRows],
        dense_sync: DenseSync | None = None,
        *,
        plan: PullPlan | None = None,
    ) -> StepResult:
        timer = StageTimer(self.device, self.sync_timings)
        bt = BatchTensors.from_batch(batch, self.spec, self.device)
        if plan is None:
            plan = self.fallback.expand(bt.unique_ids)
        leaves = {table: rows_to_leaf(pulled[table].rows, self.device) for table in plan.ids}
        timer.lap("to_device")
        if dense_sync is not None:
            dense_sync(batch.size)
        updates: dict[str, SparseUpdate] = {}
        on_device = self.sparse_optimizer.on_device  # a working copy takes the rows where they are
        for table, ids in plan.ids.items():
            keep = pulled[table].admitted
            at = torch.from_numpy(np.flatnonzero(keep)).to(self.device)
            rows = leaves[table].detach().index_select(0, at)
            state = to_device(pulled[table].state, self.device).index_select(0, at)
            if not on_device:
                rows, state = rows.cpu().numpy(), state.cpu().numpy()
            updates[table] = SparseUpdate(ids[keep], rows, state)
        timer.lap("sparse_update")
        self.steps += 1
        zeros = torch.zeros(batch.size)
        return finish_step(
            timer, validator=None, labels=batch.labels, loss=zeros.sum(), logits=zeros, updates=updates
        )


def run(quick: bool, broker: str | None = None) -> dict[str, Any]:
    samples = (20 if quick else 120) * BATCH
    out = run_header("none (FeedOnlyStep); baseline dlrm-small in memory")
    service = make_broker(broker)
    out["broker"] = service.label
    progress(f"starting {service.label} and redis-server")
    with service, RedisServer() as redis_srv, tempfile.TemporaryDirectory() as tmp:
        topic = produce_topic(service, "pipeline", samples)
        cfg = stream_config(
            service.bootstrap,
            topic,
            redis_srv.url,
            Path(tmp) / topic,
            hot_cache="auto",
            fetch_sessions=service.fetch_sessions_work,
        )
        progress("pipeline: kelp train with the model step taken out")
        feed, batches = stream_run(cfg, samples, step_class=FeedOnlyStep)
        progress(f"pipeline: {feed['samples_per_s']:,.0f} samples/s over {feed['steps']} steps")
        out["pipeline_samples_per_s"] = round(feed["samples_per_s"], 1)
        out["pipeline_stage_seconds"] = feed["stage_seconds"]
        out.update(feed.get("cost", {}))
        progress("baseline: the in-memory trainer (real model) on the same batches")
        base = inmemory_run(cfg, batches)
        progress(f"baseline: {base['samples_per_s']:,.0f} samples/s")
        out["inmemory_samples_per_s"] = round(base["samples_per_s"], 1)
        out["ratio"] = round(out["pipeline_samples_per_s"] / out["inmemory_samples_per_s"], 3)
        out["batches"] = len(batches)
    return out

"""The plain PyTorch loop a user would write instead of Kelp: the ceiling ``kelp bench train`` is held to.

Every table is an ``nn.EmbeddingBag`` of ``rows_per_table`` rows (ids hashed
into it by ``id mod rows``, the usual way to bound a table), trained with
torch's own sparse Adagrad; the dense part is Kelp's own model (same
architecture, same Adam). The batches are the ones the stream trained,
converted to tensors before the clock starts, so what is timed is only
forward, backward and both optimizer steps: the most a one-process in-memory
trainer can do on this machine. No store, no Kafka, no admission, no
progressive evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from kelp.config import KelpConfig
from kelp.consumers.batch import MicroBatch
from kelp.trainer import ModelInput, build_dense_optimizer, build_model

__all__ = ["plain_samples_per_s"]


def _tensors(
    batch: MicroBatch, features: Sequence[str], rows: int, device: torch.device
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    bags = []
    for name in features:
        jagged = batch.sparse[name]
        index = torch.from_numpy((jagged.values % np.uint64(rows)).astype(np.int64)).to(device)
        bags.append((index, torch.from_numpy(jagged.offsets[:-1].astype(np.int64)).to(device)))
    dense = torch.from_numpy(np.ascontiguousarray(batch.dense)).to(device)
    labels = torch.from_numpy(batch.labels.astype(np.float32)).to(device)
    return dense, bags, labels


def plain_samples_per_s(
    cfg: KelpConfig, batches: Sequence[MicroBatch], device: torch.device, rows_per_table: int = 1 << 18
) -> float:
    """Samples/s of the plain loop over ``batches[1:]`` (the first is a warm-up, as on the other sides)."""
    spec = cfg.features
    torch.manual_seed(0)
    model = build_model(spec, cfg.trainer).to(device)
    dims = {t.name: t.dim for t in spec.tables}
    tables = nn.ModuleDict(
        {
            name: nn.EmbeddingBag(rows_per_table, dim, mode="sum", sparse=True).to(device)
            for name, dim in dims.items()
        }
    )
    for bag in tables.values():
        nn.init.normal_(bag.weight, std=0.01)
    modes = [(f.table_name, f.pooling) for f in spec.sparse]
    names = [f.name for f in spec.sparse]
    dense_opt = build_dense_optimizer(model.parameters(), cfg.trainer.dense_optimizer)
    sparse_opt = torch.optim.Adagrad(tables.parameters(), lr=cfg.trainer.sparse_optimizer.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    prepared = [_tensors(b, [f.name for f in spec.sparse], rows_per_table, device) for b in batches]

    def step(
        dense: torch.Tensor, bags: list[tuple[torch.Tensor, torch.Tensor]], labels: torch.Tensor
    ) -> None:
        pooled = []
        for (table, pooling), (index, offsets) in zip(modes, bags, strict=True):
            out = tables[table](index, offsets)
            if pooling == "mean":
                counts = torch.diff(offsets, append=offsets.new_tensor([index.numel()])).clamp(min=1)
                out = out / counts.unsqueeze(1)
            pooled.append(out)
        loss = loss_fn(model(ModelInput(dense, dict(zip(names, pooled, strict=True)))), labels)
        dense_opt.zero_grad(set_to_none=True)
        sparse_opt.zero_grad(set_to_none=True)
        loss.backward()
        dense_opt.step()
        sparse_opt.step()

    # torch's sparse optimizers skip the invariant checks anyway; opting out explicitly silences its warning.
    with torch.sparse.check_sparse_tensor_invariants(enable=False):
        step(*prepared[0])
        started = time.perf_counter()
        for tensors in prepared[1:]:
            step(*tensors)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return sum(b.size for b in batches[1:]) / (time.perf_counter() - started)

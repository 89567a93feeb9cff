"""A two-task (or more) model plug-in for ``kelp bench accuracy``: a shared DLRM-like trunk, a head per task.

Kelp's built-in models predict one task. This one is what the accuracy
bench's two-task run names as ``trainer.model: kelp.bench.two_heads:two_heads``
(the plug-in contract of docs/models.md), and :mod:`kelp.bench.reference` with
``tasks`` is the same network in plain PyTorch::

    concat(bottom(dense)?, pooled_1 .. pooled_F)
      -> Linear 256 -> ReLU -> Linear 64 -> ReLU        shared trunk (top_mlp)
      -> head_t: Linear 1, for each task t              -> {task: logit f32[B]}

Sharing the trunk is the simplest multi-task design (hard parameter sharing):
a sparse task such as conversion borrows what the frequent one (click) teaches
the embeddings and the trunk. Keep the model in this one module: a snapshot's
digest covers this file only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from kelp.trainer import ModelInput, ModelSpec
from kelp.trainer.models import mlp

__all__ = ["TwoHeads", "two_heads"]


class TwoHeads(nn.Module):
    """Shared trunk over the concatenated inputs; one 1-wide head per task, in ``spec.tasks`` order."""

    def __init__(self, spec: ModelSpec, top_mlp: Sequence[int], bottom_mlp: Sequence[int]) -> None:
        super().__init__()
        if not top_mlp:
            raise ValueError("top_mlp needs at least one layer: it is the trunk the heads share")
        self.tasks = tuple(spec.tasks)
        self.names = tuple(spec.sparse)
        self.bottom = mlp(len(spec.dense), bottom_mlp, relu_last=True) if spec.dense else None
        width = (bottom_mlp[-1] if spec.dense else 0) + sum(spec.sparse.values())
        self.trunk = mlp(width, top_mlp, relu_last=True)
        # a ModuleList in task order: a label's name need not be a valid module key
        self.heads = nn.ModuleList(nn.Linear(top_mlp[-1], 1) for _ in self.tasks)

    def forward(self, batch: ModelInput) -> dict[str, Tensor]:
        parts = [self.bottom(batch.dense)] if self.bottom is not None else []
        trunk = self.trunk(torch.cat([*parts, *(batch.sparse[n] for n in self.names)], dim=1))
        return {task: head(trunk).squeeze(1) for task, head in zip(self.tasks, self.heads, strict=True)}


def two_heads(
    spec: ModelSpec, *, top_mlp: Sequence[int] = (256, 64), bottom_mlp: Sequence[int] = (64, 16)
) -> TwoHeads:
    """The factory ``trainer.model`` names: ``two_heads(spec, **trainer.model_args)``."""
    return TwoHeads(spec, top_mlp, bottom_mlp)

"""A two-task plug-in model for the trainer daemon's multi-label test: one linear head per task."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kelp.trainer import ModelInput, ModelSpec


class TwoHeads(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        width = len(spec.dense) + sum(spec.sparse.values())
        self.tasks = spec.tasks
        self.heads = nn.ModuleDict({t: nn.Linear(width, 1) for t in spec.tasks})

    def forward(self, batch: ModelInput) -> dict[str, Tensor]:
        x = torch.cat([batch.dense, *batch.sparse.values()], dim=1)
        return {t: self.heads[t](x).squeeze(1) for t in self.tasks}

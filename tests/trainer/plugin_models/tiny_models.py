"""Models written the way a user writes them: outside the kelp package, found on the Python path.

The trainer and CLI tests put this folder on ``sys.path`` (or ``PYTHONPATH``)
and name the models as ``tiny_models:<attr>``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from kelp.trainer import ModelInput, ModelSpec


class TwoTower(nn.Module):
    """A small two-tower model: a user tower and an item tower, scored by their dot product.

    ``user_features`` (sparse) and every dense feature feed the user tower; the
    other sparse features feed the item tower.
    """

    def __init__(self, spec: ModelSpec, user_features: Sequence[str], width: int = 8) -> None:
        super().__init__()
        unknown = set(user_features) - set(spec.sparse)
        if unknown:
            raise ValueError(f"user_features {sorted(unknown)} are not sparse features")
        self.user = list(user_features)
        self.item = [name for name in spec.sparse if name not in self.user]
        user_in = len(spec.dense) + sum(spec.sparse[n] for n in self.user)
        item_in = sum(spec.sparse[n] for n in self.item)
        self.user_tower = nn.Sequential(nn.Linear(user_in, width), nn.ReLU(), nn.Linear(width, width))
        self.item_tower = nn.Sequential(nn.Linear(item_in, width), nn.ReLU(), nn.Linear(width, width))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, batch: ModelInput) -> Tensor:
        user = self.user_tower(torch.cat([batch.dense, *(batch.sparse[n] for n in self.user)], dim=1))
        item = self.item_tower(torch.cat([batch.sparse[n] for n in self.item], dim=1))
        return (user * item).sum(dim=1) + self.bias


class TinyMLP(nn.Module):
    """One hidden layer over the concatenated inputs; returns ``{task: logits}`` (the mapping form)."""

    def __init__(self, spec: ModelSpec, hidden: int = 8) -> None:
        super().__init__()
        self.names = list(spec.sparse)
        self.task = spec.tasks[0]
        width = len(spec.dense) + sum(spec.sparse.values())
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, batch: ModelInput) -> dict[str, Tensor]:
        x = torch.cat([batch.dense, *(batch.sparse[n] for n in self.names)], dim=1)
        return {self.task: self.net(x).squeeze(1)}


def tiny_mlp(spec: ModelSpec, hidden: int = 8) -> TinyMLP:
    return TinyMLP(spec, hidden)


def raising(spec: ModelSpec) -> nn.Module:
    raise RuntimeError("this factory always fails")


class _WrongShape(TinyMLP):
    def forward(self, batch: ModelInput) -> Tensor:  # type: ignore[override]
        return super().forward(batch)[self.task].unsqueeze(1)  # [B, 1], not [B]


def wrong_shape(spec: ModelSpec) -> nn.Module:
    return _WrongShape(spec)


class _WrongTasks(TinyMLP):
    def forward(self, batch: ModelInput) -> dict[str, Tensor]:
        return {"ctr": super().forward(batch)[self.task], "cvr": super().forward(batch)[self.task]}


def wrong_tasks(spec: ModelSpec) -> nn.Module:
    return _WrongTasks(spec)


def not_a_module(spec: ModelSpec) -> object:
    return object()


MARKER = 12345.0
"""A dense value no sample carries but the one :func:`raises_on_marked` cannot handle."""


class _RaisesOnMarked(TinyMLP):
    def forward(self, batch: ModelInput) -> dict[str, Tensor]:
        if bool((batch.dense == MARKER).any()):
            raise ValueError(f"cannot score a sample with dense value {MARKER}")
        return super().forward(batch)


def raises_on_marked(spec: ModelSpec, hidden: int = 8) -> nn.Module:
    """A user's model that works, except on the one odd sample it was never written for."""
    return _RaisesOnMarked(spec, hidden)


class _AlwaysRaises(TinyMLP):
    def forward(self, batch: ModelInput) -> dict[str, Tensor]:
        raise RuntimeError("model is broken")


def always_raises(spec: ModelSpec) -> nn.Module:
    """A model broken for every input (``kelp config validate`` would catch it; a live swap may not)."""
    return _AlwaysRaises(spec)

"""A two-tower click model written outside Kelp: a user tower, an item tower, their dot product.

Kelp finds it through ``trainer.model: two_tower:two_tower`` with this folder on
``PYTHONPATH`` (docs/models.md). Each tower is an MLP over the pooled embeddings
(and dense values) of its own features; the logit is the dot product of the two
tower outputs plus a learned bias::

    user features ──► user tower ──► u f32[B, dim] ─┐
                                                    ├─► (u · v) + bias ──► logit f32[B]
    item features ──► item tower ──► v f32[B, dim] ─┘

Because the towers never see each other's features, an item's vector can be
computed once per item and matched against many users (retrieval); Kelp serves
the whole model, scoring one user against candidates with ``/v1/score/candidates``.

With several labels (``features.labels``, e.g. click and buy) each tower keeps
one shared hidden layer and gets a last layer per task, and the forward returns
``{task: logits}``::

    user features ──► shared hidden ──► u_t = head_t(h_u) ─┐
                                                           ├─► (u_t · v_t) + bias_t ──► logit_t
    item features ──► shared hidden ──► v_t = head_t(h_v) ─┘

A task's own last layers (not only a scale and bias on one dot product) let the
tasks rank items differently, while each task's item vectors can still be
computed once per item. One label builds exactly the one-task model above.
Keep the model in this one module: the snapshot's digest covers this file only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from kelp.trainer import ModelInput, ModelSpec

__all__ = ["TwoTower", "two_tower"]


def _tower(width_in: int, hidden: int, dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, dim))


class TwoTower(nn.Module):
    """``logit = user_tower(user features) · item_tower(item features) + bias``, one per task.

    ``user_features`` and ``item_features`` name the spec's features (sparse or
    dense); each feature belongs to exactly one tower, so no input is left
    untrained and none is shared. With one task the towers are whole MLPs and
    the forward returns logits f32[B]; with several, ``user_tower`` and
    ``item_tower`` are the shared hidden layers, ``user_heads[t]`` and
    ``item_heads[t]`` task ``t``'s last layers (``spec.tasks`` order), and the
    forward returns ``{task: logits f32[B]}``.
    """

    def __init__(
        self,
        spec: ModelSpec,
        user_features: Sequence[str],
        item_features: Sequence[str],
        dim: int = 16,
        hidden: int = 32,
    ) -> None:
        super().__init__()
        _check_split(spec, user_features, item_features)
        dense = list(spec.dense)
        # (column indices into batch.dense, sparse names) per tower, in the spec's order
        self.user_dense = [dense.index(n) for n in dense if n in user_features]
        self.item_dense = [dense.index(n) for n in dense if n in item_features]
        self.user_sparse = [n for n in spec.sparse if n in user_features]
        self.item_sparse = [n for n in spec.sparse if n in item_features]
        user_in = len(self.user_dense) + sum(spec.sparse[n] for n in self.user_sparse)
        item_in = len(self.item_dense) + sum(spec.sparse[n] for n in self.item_sparse)
        self.tasks = tuple(spec.tasks)
        if len(self.tasks) == 1:
            self.user_tower = _tower(user_in, hidden, dim)
            self.item_tower = _tower(item_in, hidden, dim)
            self.bias = nn.Parameter(torch.zeros(()))
            return
        self.user_tower = nn.Sequential(nn.Linear(user_in, hidden), nn.ReLU())
        self.item_tower = nn.Sequential(nn.Linear(item_in, hidden), nn.ReLU())
        # ModuleLists in task order: a label's name need not be a valid module key
        self.user_heads = nn.ModuleList(nn.Linear(hidden, dim) for _ in self.tasks)
        self.item_heads = nn.ModuleList(nn.Linear(hidden, dim) for _ in self.tasks)
        self.bias = nn.Parameter(torch.zeros(len(self.tasks)))

    def forward(self, batch: ModelInput) -> Tensor | dict[str, Tensor]:
        vectors = self.encode(batch)
        if len(self.tasks) == 1:
            return (vectors["user"] * vectors["item"]).sum(dim=1) + self.bias
        return {
            task: (vectors[f"user.{task}"] * vectors[f"item.{task}"]).sum(dim=1) + self.bias[t]
            for t, task in enumerate(self.tasks)
        }

    def encode(self, batch: ModelInput) -> dict[str, Tensor]:
        """The towers' outputs, f32[B, dim] each: what a nearest-neighbour index holds.

        Kelp's ``POST /v1/embeddings`` with samples returns them (docs/models.md),
        so an ANN index of item vectors can be refreshed from the served model:
        ``"user"`` and ``"item"`` with one task, ``"user.<task>"`` and
        ``"item.<task>"`` per task with several. The logit is their dot product
        plus the task's bias.
        """
        user = self.user_tower(_inputs(batch, self.user_dense, self.user_sparse))
        item = self.item_tower(_inputs(batch, self.item_dense, self.item_sparse))
        if len(self.tasks) == 1:
            return {"user": user, "item": item}
        vectors = {}
        for task, u, v in zip(self.tasks, self.user_heads, self.item_heads, strict=True):
            vectors[f"user.{task}"], vectors[f"item.{task}"] = u(user), v(item)
        return vectors


def _inputs(batch: ModelInput, dense_columns: list[int], sparse: list[str]) -> Tensor:
    """One tower's input: its dense columns, then its pooled embeddings, side by side."""
    parts = [batch.dense[:, dense_columns]] if dense_columns else []
    parts.extend(batch.sparse[name] for name in sparse)
    return torch.cat(parts, dim=1)


def _check_split(spec: ModelSpec, user: Sequence[str], item: Sequence[str]) -> None:
    """Every feature in exactly one tower, each tower with at least one feature: else a one-line error."""
    known = set(spec.dense) | set(spec.sparse)
    for label, names in (("user_features", user), ("item_features", item)):
        if not names:
            raise ValueError(f"{label} is empty: each tower needs at least one feature")
        unknown = sorted(set(names) - known)
        if unknown:
            raise ValueError(f"{label} {unknown} are not features of the config (known: {sorted(known)})")
    both = sorted(set(user) & set(item))
    if both:
        raise ValueError(f"features {both} are in both user_features and item_features")
    left = sorted(known - set(user) - set(item))
    if left:
        raise ValueError(f"features {left} are in neither user_features nor item_features")


def two_tower(
    spec: ModelSpec,
    *,
    user_features: Sequence[str],
    item_features: Sequence[str],
    dim: int = 16,
    hidden: int = 32,
) -> TwoTower:
    """The factory ``trainer.model`` names: ``two_tower(spec, **trainer.model_args)``."""
    return TwoTower(spec, user_features, item_features, dim=dim, hidden=hidden)

"""A DIN-style model plug-in (Zhou et al. 2018), written as a user would: it reads ``batch.sequences``.

The candidate item's pooled embedding attends over the rows of the user's
history (a ``pooling: none`` feature); the attention-weighted sum of the
history is the user's interest in this candidate, and an MLP scores it with
every other input::

    q = candidate [B, d]        h = history rows, padded [B, L, d], mask [B, L]
    a = attention_mlp(q, h, q - h, q * h) [B, L]          0 where masked (no softmax, as in DIN)
    interest = sum_j a_j h_j [B, d]                       zeros for an empty history
    logit = mlp(dense, every pooled vector, interest)

The tests put this folder on ``sys.path`` and name the factory ``din:din``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from kelp.trainer import ModelInput, ModelSpec

SEEN_LENGTHS: list[list[int]] = []
"""What :class:`LengthsProbe` saw: each forward's first sequence feature's lengths."""


class Din(nn.Module):
    """Target attention of ``candidate`` over ``history``, then an MLP over everything."""

    def __init__(
        self,
        spec: ModelSpec,
        history: str,
        candidate: str,
        *,
        hidden: Sequence[int] = (16,),
        attention_hidden: int = 8,
        max_len: int | None = None,
    ) -> None:
        super().__init__()
        if history not in spec.sequences:
            raise ValueError(f"history {history!r} is not a sequence feature (pooling: none)")
        if candidate not in spec.sparse:
            raise ValueError(f"candidate {candidate!r} is not a pooled sparse feature")
        dim = spec.sequences[history]
        if spec.sparse[candidate] != dim:
            raise ValueError("the candidate and the history need one embedding width")
        self.history = history
        self.candidate = candidate
        self.max_len = max_len
        self.pooled = list(spec.sparse)
        self.attention = nn.Sequential(
            nn.Linear(4 * dim, attention_hidden), nn.ReLU(), nn.Linear(attention_hidden, 1)
        )
        layers: list[nn.Module] = []
        width = len(spec.dense) + sum(spec.sparse.values()) + dim
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def interest(self, batch: ModelInput) -> Tensor:
        """f32[B, d]: the history rows weighted by their attention to the candidate."""
        rows, mask = batch.sequences[self.history].padded(self.max_len)
        query = batch.sparse[self.candidate].unsqueeze(1).expand_as(rows)
        features = torch.cat([query, rows, query - rows, query * rows], dim=2)
        weights = self.attention(features).squeeze(2).masked_fill(~mask, 0.0)
        return (weights.unsqueeze(2) * rows).sum(dim=1)

    def forward(self, batch: ModelInput) -> Tensor:
        x = torch.cat([batch.dense, *(batch.sparse[n] for n in self.pooled), self.interest(batch)], dim=1)
        return self.mlp(x).squeeze(1)


def din(
    spec: ModelSpec,
    *,
    history: str,
    candidate: str,
    hidden: Sequence[int] = (16,),
    max_len: int | None = None,
) -> Din:
    """The factory the config names (``trainer.model: din:din``)."""
    return Din(spec, history, candidate, hidden=hidden, max_len=max_len)


class LengthsProbe(nn.Module):
    """Records the lengths of the first sequence feature it is given; a constant logit otherwise."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.name = next(iter(spec.sequences))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, batch: ModelInput) -> Tensor:
        sequence = batch.sequences[self.name]
        SEEN_LENGTHS.append(sequence.lengths().tolist())
        rows, _ = sequence.padded()
        return rows.sum(dim=(1, 2)) + self.bias

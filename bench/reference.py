"""The minimal in-memory reference that ``kelp bench accuracy`` holds Kelp's learning against.

Plain PyTorch, written apart from Kelp on purpose: it parses the raw files
itself (:mod:`kelp.bench.streams`), keeps each feature's embeddings in one
``nn.Embedding`` indexed by a dense remap of the ids, and applies its own
row-wise Adagrad; it shares no code with Kelp's decoder, store or trainer, so
a bug there cannot hide in both. One pass, progressive validation: each batch
is scored before it trains.

Models (``kind``), over F one-hot fields of width k::

    concat   x = concat(e_1..e_F) -> top MLP -> logit          (Kelp's dlrm-small without dense)
    deepfm   logit = b + sum_f w_f[id_f] + sum_{f<g} <e_f, e_g> + deep(x)
             (per-id first-order weights, Guo et al. 2017)
    deepfm-proj   as deepfm, but the first-order term is w . x (Kelp's deepfm)

Options for the controlled experiments of docs/accuracy.md: the init scale,
element-wise instead of row-wise Adagrad, and admission after ``min_count``
occurrences (a zero row, never updated, until then).

Several tasks (``tasks``, kind ``concat`` only): the top MLP's hidden layers
become a trunk shared by the tasks, and each task gets its own last layer (the
network of :mod:`kelp.bench.two_heads`); the loss is the sum of the tasks' mean
BCEs, as Kelp's step sums them with every ``loss_weight`` 1::

    concat   x -> Linear 256 -> ReLU -> Linear 64 -> ReLU -> head_t: Linear 1 -> logit_t
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the PyTorch convention
from torch import Tensor, nn

from kelp.bench.streams import Stream

__all__ = ["ReferenceOptions", "ReferenceRun", "train_reference"]


@dataclass(frozen=True)
class ReferenceOptions:
    kind: str = "deepfm"
    dim: int = 16
    top_mlp: tuple[int, ...] = (256, 64)
    init_std: float = 0.01
    batch_size: int = 256
    sparse_lr: float = 0.05
    dense_lr: float = 1e-3
    eps: float = 1e-8
    rowwise: bool = True
    min_count: int = 1
    seed: int = 0
    tasks: tuple[str, ...] = ()
    """Several labels (the stream's, by name), one head each; empty: the stream's one label."""


@dataclass(frozen=True)
class ReferenceRun:
    """Pre-update logits f32[N] (progressive validation) and the labels f32[N] they score.

    With ``ReferenceOptions.tasks``: f32[N, T] both, column t = ``tasks[t]``.
    """

    logits: np.ndarray
    labels: np.ndarray


class _Model(nn.Module):
    def __init__(self, vocab: Sequence[int], options: ReferenceOptions) -> None:
        super().__init__()
        self.kind = options.kind
        self.emb = nn.ModuleList(nn.Embedding(v, options.dim) for v in vocab)
        for e in self.emb:
            nn.init.normal_(e.weight, 0.0, options.init_std)
        width = options.dim * len(vocab)
        layers: list[nn.Module] = []
        in_width = width
        for size in options.top_mlp:
            layers += [nn.Linear(in_width, size), nn.ReLU()]
            in_width = size
        n_tasks = len(options.tasks)
        if n_tasks and self.kind != "concat":
            raise ValueError(f"several tasks need kind 'concat', not {self.kind!r}")
        # several tasks: the hidden layers are the shared trunk, each task has its own last layer
        self.deep = nn.Sequential(*layers) if n_tasks else nn.Sequential(*layers, nn.Linear(in_width, 1))
        self.heads = nn.ModuleList(nn.Linear(in_width, 1) for _ in range(n_tasks)) if n_tasks else None
        self.first = nn.ModuleList(nn.Embedding(v, 1) for v in vocab) if self.kind == "deepfm" else None
        if self.first is not None:
            for e in self.first:
                nn.init.zeros_(e.weight)
        self.bias = nn.Parameter(torch.zeros(1))
        self.proj = nn.Linear(width, 1) if self.kind == "deepfm-proj" else None

    def sparse_tables(self) -> list[Tensor]:
        tables = [e.weight for e in self.emb]
        return tables + ([e.weight for e in self.first] if self.first is not None else [])

    def forward(self, x: Tensor, live: Sequence[Tensor]) -> Tensor:
        """``x`` int64[B, F] remapped ids; ``live[f]`` f32[B, 1]: 1 where the id is admitted, else 0."""
        fields = [self.emb[f](x[:, f]) * live[f] for f in range(x.shape[1])]
        flat = torch.cat(fields, dim=1)
        if self.heads is not None:  # f32[B, T]
            trunk = self.deep(flat)
            return torch.cat([head(trunk) for head in self.heads], dim=1)
        logit = self.deep(flat).squeeze(1)
        if self.kind == "concat":
            return logit
        stacked = torch.stack(fields, dim=1)
        total = stacked.sum(dim=1)
        logit = logit + 0.5 * (total.square() - stacked.square().sum(dim=1)).sum(dim=1) + self.bias
        if self.first is not None:
            logit = logit + sum((self.first[f](x[:, f]) * live[f]).squeeze(1) for f in range(x.shape[1]))
        if self.proj is not None:
            logit = logit + self.proj(flat).squeeze(1)
        return logit


@torch.no_grad()
def _adagrad(table: Tensor, accumulator: Tensor, options: ReferenceOptions) -> None:
    """Row-wise (one accumulator per row) or element-wise Adagrad on the rows that got a gradient."""
    grad = table.grad
    if grad is None:
        return
    rows = torch.nonzero(grad.abs().sum(dim=1) > 0).squeeze(1)
    g = grad[rows]
    if options.rowwise:
        accumulator[rows, 0] += g.square().mean(dim=1)
        table[rows] -= options.sparse_lr * g / (accumulator[rows, :1].sqrt() + options.eps)
    else:
        accumulator[rows] += g.square()
        table[rows] -= options.sparse_lr * g / (accumulator[rows].sqrt() + options.eps)
    table.grad = None


def train_reference(stream: Stream, options: ReferenceOptions) -> ReferenceRun:
    """One progressive pass over ``stream`` in order; returns every sample's pre-update logit (per task)."""
    torch.manual_seed(options.seed)
    remapped = np.empty(stream.ids.shape, dtype=np.int64)
    vocab = []
    for f in range(stream.ids.shape[1]):
        uniques, inverse = np.unique(stream.ids[:, f], return_inverse=True)
        remapped[:, f] = inverse
        vocab.append(len(uniques))
    model = _Model(vocab, options)
    sparse = model.sparse_tables()
    sparse_ids = {id(t) for t in sparse}
    dense = torch.optim.Adam([p for p in model.parameters() if id(p) not in sparse_ids], lr=options.dense_lr)
    accumulators = [torch.zeros(t.shape[0], 1 if options.rowwise else t.shape[1]) for t in sparse]
    seen = [np.zeros(v, dtype=np.int64) for v in vocab]
    labels = stream.task_labels(options.tasks) if options.tasks else stream.labels
    x_all, y_all = torch.from_numpy(remapped), torch.from_numpy(labels)
    logits = np.empty(labels.shape, dtype=np.float32)
    for start in range(0, len(stream.labels), options.batch_size):
        x, y = x_all[start : start + options.batch_size], y_all[start : start + options.batch_size]
        live = []
        for f, counts in enumerate(seen):
            np.add.at(counts, remapped[start : start + len(y), f], 1)  # occurrences, this batch included
            live.append(torch.from_numpy(counts[remapped[start : start + len(y), f]] >= options.min_count))
        logit = model(x, [m.float().unsqueeze(1) for m in live])
        logits[start : start + len(y)] = logit.detach().numpy()
        if options.tasks:  # each task's mean BCE, summed (Kelp's step with every loss_weight 1)
            loss = F.binary_cross_entropy_with_logits(logit, y, reduction="none").mean(dim=0).sum()
        else:
            loss = F.binary_cross_entropy_with_logits(logit, y)
        dense.zero_grad(set_to_none=True)
        loss.backward()
        dense.step()
        for table, accumulator in zip(sparse, accumulators, strict=True):
            _adagrad(table, accumulator, options)
    return ReferenceRun(logits=logits, labels=labels)

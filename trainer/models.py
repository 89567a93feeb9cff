"""The model zoo: dense networks over a dense vector and pooled embeddings.

Every model owns only *dense* parameters. Embedding rows live in the store
(or, for the in-memory baseline, in plain tensors); the trainer pools them
per feature and hands the model a :class:`~kelp.trainer.model_api.ModelInput`::

    dense   f32[B, n_dense]                      column j = features.dense[j]
    sparse  {"C1": f32[B, dim], "C2": ...}       one pooled vector per sparse feature, config order

and the model returns logits ``f32[B]`` (train with BCE-with-logits). The
built-ins are plug-ins like any user model (docs/models.md): the factories
:func:`dlrm_small`, :func:`dcn_v2` and :func:`deepfm` take ``(spec, bottom_mlp,
top_mlp)``, and :func:`build_model` resolves ``trainer.model`` for all of them.

Models
------
``dlrm-small`` (:class:`DLRM`), BENCHMARKS.md's reference::

    dense[13] -> Linear 64 -> ReLU -> Linear 16 -> ReLU            (bottom MLP)
    concat(bottom[16], pooled_1[16] .. pooled_26[16]) = 432 inputs
    -> Linear 256 -> ReLU -> Linear 64 -> ReLU -> Linear 1          (top MLP) -> logit

``dcn-v2`` (:class:`DCNv2`, Wang et al. 2021, "stacked" form)::

    x0 = concat(bottom(dense), pooled...)                           d inputs
    x_{l+1} = x0 * (W_l x_l + b_l) + x_l,  l = 0..n_cross-1         full-rank W_l [d, d]
    -> deep MLP (top_mlp, ReLU) -> Linear 1 -> logit

``deepfm`` (:class:`DeepFM`, Guo et al. 2017): a factorization machine beside a deep MLP,
over the same field vectors (every pooled embedding, plus the bottom MLP's output
when there are dense features; all of one width ``k``)::

    fields v_1..v_F [k]            x = concat(v_1..v_F)
    logit = w . x + b                                        first order
          + 1/2 * sum_k[(sum_f v_fk)^2 - sum_f v_fk^2]       pairwise <v_f, v_g>, f < g
          + deep(x)                                          top MLP -> 1

Kelp keeps one row per id, so by default (``first_order: projection``) DeepFM's
per-id first-order weight becomes a learned projection ``w_f . v_f`` of the id's
row. With ``model_args: {first_order: per_id}`` each row carries the weight
itself, as its last element: a table of ``dim`` k + 1 holds the k-wide field
vector and the id's own weight ``w_id``, stored, admitted, evicted and updated
(row-wise Adagrad) with it::

    row_id = [v_id (k), w_id]       logit = sum_f w_{id_f} + b + pairwise(v) + deep(v)

The row has one row-wise Adagrad accumulator, and ``w_id``'s gradient (the
logit's own) starts far larger than any element of ``v_id``'s: unscaled, it
fills the accumulator, shrinks the vector's steps and makes the weight's own
step about ``sqrt(k + 1)`` times a plain Adagrad step. So the weight's gradient
is scaled by ``per_id_grad_scale`` (0.25) on its way back to the row; the logit
is unchanged. Neither form ranks better in general (docs/accuracy.md measures
both, and the scale, on four streams), so ``projection`` stays the default.
On the criteo-attribution and MovieLens streams
the pairwise term is where ``dlrm-small``'s concatenation loses AUC to a plain
FM+MLP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from kelp.config import FeatureSpec, TrainerConfig
from kelp.errors import UserError
from kelp.trainer.model_api import (
    BUILTIN_MODELS,
    ModelContractError,
    ModelInput,
    ModelSpec,
    import_factory,
    model_kwargs,
    one_line,
    resolve_reference,
)

__all__ = [
    "DLRM",
    "MODELS",
    "PER_ID_GRAD_SCALE",
    "CrossNetwork",
    "DCNv2",
    "DeepFM",
    "ModelInputs",
    "build_model",
    "dcn_v2",
    "deepfm",
    "dlrm_small",
    "mlp",
]


@dataclass(frozen=True)
class ModelInputs:
    """What a built-in's forward reads: ``n_dense`` columns and one pooled vector per sparse feature."""

    n_dense: int
    feature_dims: tuple[int, ...]
    names: tuple[str, ...] = ()

    @classmethod
    def from_spec(cls, spec: ModelSpec, model: str = "") -> ModelInputs:
        """Names and dims of the sparse features, in config order.

        A built-in pools every feature, so a sequence feature (``pooling: none``) is
        refused here, at build and validate time, rather than silently dropped.
        """
        if spec.sequences:
            names = ", ".join(repr(n) for n in spec.sequences)
            one = len(spec.sequences) == 1
            which = f"sparse feature {names} has" if one else f"sparse features {names} have"
            raise UserError(
                f"trainer.model {model or 'built-in'!r}: {which} pooling: none (a sequence), which needs a "
                "model plug-in that reads batch.sequences; the built-in models pool every feature "
                "(set pooling: sum or mean, or use your own model, docs/models.md)"
            )
        return cls(
            n_dense=len(spec.dense), feature_dims=tuple(spec.sparse.values()), names=tuple(spec.sparse)
        )

    def pooled(self, batch: ModelInput) -> list[Tensor]:
        """The pooled vectors in config order; a missing or extra feature is a ValueError."""
        if len(batch.sparse) != len(self.names):
            raise ValueError(f"expected {len(self.names)} pooled features, got {len(batch.sparse)}")
        return [batch.sparse[name] for name in self.names]


def mlp(in_features: int, sizes: Sequence[int], *, relu_last: bool) -> nn.Sequential:
    """Linear layers of ``sizes`` with ReLU between them (and after the last if ``relu_last``)."""
    layers: list[nn.Module] = []
    width = in_features
    for i, size in enumerate(sizes):
        layers.append(nn.Linear(width, size))
        if i < len(sizes) - 1 or relu_last:
            layers.append(nn.ReLU())
        width = size
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM with concatenation interaction (``dlrm-small`` with the default config).

    The bottom MLP (ReLU after every layer, as in the DLRM reference) maps the
    dense features to a vector; that vector and every pooled embedding are
    concatenated and fed to the top MLP, whose last layer is a 1-wide logit.
    Embedding widths need not match the bottom output: concatenation does not
    care. With no dense features the bottom MLP is skipped.
    """

    def __init__(self, inputs: ModelInputs, bottom_mlp: Sequence[int], top_mlp: Sequence[int]) -> None:
        super().__init__()
        self.inputs = inputs
        self.bottom = mlp(inputs.n_dense, bottom_mlp, relu_last=True) if inputs.n_dense else None
        bottom_out = bottom_mlp[-1] if inputs.n_dense else 0
        self.interaction_width = bottom_out + sum(inputs.feature_dims)
        self.top = mlp(self.interaction_width, [*top_mlp, 1], relu_last=False)

    def forward(self, batch: ModelInput) -> Tensor:
        """``batch.dense`` f32[B, n_dense], ``batch.sparse`` {name: f32[B, dim_f]} -> logits f32[B]."""
        pooled = self.inputs.pooled(batch)
        parts = [self.bottom(batch.dense)] if self.bottom is not None else []
        x = torch.cat([*parts, *pooled], dim=1)
        return self.top(x).squeeze(1)


class CrossNetwork(nn.Module):
    """DCN-v2 cross layers: ``x_{l+1} = x0 ⊙ (W_l x_l + b_l) + x_l`` with full-rank ``W_l``.

    Each layer adds one degree of explicit feature crossing; the residual keeps
    lower-order terms. Shapes: ``x0`` f32[B, d] -> f32[B, d].
    """

    def __init__(self, width: int, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(n_layers))

    def forward(self, x0: Tensor) -> Tensor:
        x = x0
        for layer in self.layers:
            x = x0 * layer(x) + x
        return x


class DCNv2(nn.Module):
    """DCN-v2, stacked: bottom MLP on dense, cross network over the concatenation, then a deep MLP.

    ``bottom_mlp`` plays the same role as in DLRM (dense -> a vector next to
    the embeddings); ``top_mlp`` is the deep tower after the cross network.
    """

    def __init__(
        self, inputs: ModelInputs, bottom_mlp: Sequence[int], top_mlp: Sequence[int], n_cross: int = 3
    ) -> None:
        super().__init__()
        self.inputs = inputs
        self.bottom = mlp(inputs.n_dense, bottom_mlp, relu_last=True) if inputs.n_dense else None
        bottom_out = bottom_mlp[-1] if inputs.n_dense else 0
        self.interaction_width = bottom_out + sum(inputs.feature_dims)
        self.cross = CrossNetwork(self.interaction_width, n_cross)
        self.deep = mlp(self.interaction_width, [*top_mlp, 1], relu_last=False)

    def forward(self, batch: ModelInput) -> Tensor:
        """``batch.dense`` f32[B, n_dense], ``batch.sparse`` {name: f32[B, dim_f]} -> logits f32[B]."""
        pooled = self.inputs.pooled(batch)
        parts = [self.bottom(batch.dense)] if self.bottom is not None else []
        x0 = torch.cat([*parts, *pooled], dim=1)
        return self.deep(self.cross(x0)).squeeze(1)


FIRST_ORDER = ("projection", "per_id")
"""DeepFM's first-order term: a learned projection of each field vector, or each id's own weight."""

PER_ID_GRAD_SCALE = 0.25
"""What ``first_order: per_id`` multiplies the weight's gradient by before it reaches the row.

The weight shares its row's one Adagrad accumulator with the field vector, and
its gradient is the logit's own, so unscaled it outweighs every vector element
and sets the row's step size alone; about ``1 / sqrt(dim)`` for tables of dim 17
lets both parts move (docs/accuracy.md measures 0.1, 0.25, 0.5 and 1).
"""


def scale_grad(x: Tensor, scale: float) -> Tensor:
    """``x`` unchanged in the forward pass; its gradient times ``scale`` in the backward pass."""
    if scale == 1.0:
        return x
    frozen = x.detach()
    return frozen + scale * (x - frozen)


def pairwise_interaction(fields: Tensor) -> Tensor:
    """FM's second-order term ``sum_{f<g} <v_f, v_g>`` for ``fields`` f32[B, F, k] -> f32[B], in O(F k).

    >>> v = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]])
    >>> pairwise_interaction(v).item()  # 1*3+2*4 + 1*5+2*6 + 3*5+4*6
    67.0
    """
    total = fields.sum(dim=1)
    return 0.5 * (total.square() - fields.square().sum(dim=1)).sum(dim=1)


class DeepFM(nn.Module):
    """FM (first and second order) plus a deep MLP over the same fields; see the module docstring.

    Every field must have one width: each table's ``dim``, and ``bottom_mlp[-1]``
    when there are dense features (the bottom MLP's output is one more field).
    """

    def __init__(
        self,
        inputs: ModelInputs,
        bottom_mlp: Sequence[int],
        top_mlp: Sequence[int],
        first_order: str = "projection",
        per_id_grad_scale: float = PER_ID_GRAD_SCALE,
    ) -> None:
        super().__init__()
        if first_order not in FIRST_ORDER:
            raise UserError(
                f"trainer.model_args.first_order: got {first_order!r}: "
                f"expected one of {', '.join(FIRST_ORDER)}"
            )
        if isinstance(per_id_grad_scale, bool) or not (
            isinstance(per_id_grad_scale, int | float) and 0 < per_id_grad_scale <= 1
        ):
            raise UserError(
                f"trainer.model_args.per_id_grad_scale: got {per_id_grad_scale!r}: "
                "expected a number in (0, 1] (first_order: per_id scales its weight's gradient by it)"
            )
        self.per_id = first_order == "per_id"
        self.per_id_grad_scale = float(per_id_grad_scale)
        extra = 1 if self.per_id else 0  # the row's last element is the id's first-order weight
        widths = {d - extra for d in inputs.feature_dims} | ({bottom_mlp[-1]} if inputs.n_dense else set())
        if len(widths) != 1:
            raise UserError(
                "trainer.model deepfm needs one width for every field: each table's dim"
                + (
                    " minus 1 (first_order: per_id: the row's last element is the id's weight)"
                    if extra
                    else ""
                )
                + (" and bottom_mlp's last layer" if inputs.n_dense else "")
                + f" (got {sorted(widths)})"
            )
        self.inputs = inputs
        self.bottom = mlp(inputs.n_dense, bottom_mlp, relu_last=True) if inputs.n_dense else None
        self.field_width = widths.pop()
        if self.field_width < 1:
            raise UserError("trainer.model deepfm with first_order: per_id needs tables of dim 2 or more")
        self.n_fields = len(inputs.feature_dims) + (1 if inputs.n_dense else 0)
        self.interaction_width = self.field_width * self.n_fields
        # per_id: the ids' own weights replace the projection of the sparse fields; the dense
        # field (the bottom MLP's output) keeps a projection, as it has no id.
        linear_in = (self.field_width if inputs.n_dense else 0) if self.per_id else self.interaction_width
        self.linear = nn.Linear(linear_in, 1) if linear_in else None
        self.bias = nn.Parameter(torch.zeros(1)) if self.linear is None else None
        self.deep = mlp(self.interaction_width, [*top_mlp, 1], relu_last=False)

    def forward(self, batch: ModelInput) -> Tensor:
        """``batch.dense`` f32[B, n_dense], ``batch.sparse`` {name: f32[B, dim]} -> logits f32[B]."""
        pooled = self.inputs.pooled(batch)
        dense = [self.bottom(batch.dense)] if self.bottom is not None else []
        if self.per_id:
            k = self.field_width
            weights = torch.stack([p[:, k] for p in pooled], dim=1)
            first = scale_grad(weights, self.per_id_grad_scale).sum(dim=1)
            pooled = [p[:, :k] for p in pooled]
        fields = [*dense, *pooled]
        x = torch.cat(fields, dim=1)
        pairwise = pairwise_interaction(x.view(x.shape[0], len(fields), self.field_width))
        logit = self.deep(x).squeeze(1) + pairwise
        if not self.per_id:
            return logit + self.linear(x).squeeze(1)
        logit = logit + first
        if self.linear is not None:
            return logit + self.linear(dense[0]).squeeze(1)
        return logit + self.bias


def dlrm_small(
    spec: ModelSpec, bottom_mlp: Sequence[int] = (64, 16), top_mlp: Sequence[int] = (256, 64)
) -> DLRM:
    """``kelp.trainer.models:dlrm_small`` (alias ``dlrm-small``): :class:`DLRM`."""
    return DLRM(ModelInputs.from_spec(spec, "dlrm-small"), bottom_mlp, top_mlp)


def dcn_v2(
    spec: ModelSpec,
    bottom_mlp: Sequence[int] = (64, 16),
    top_mlp: Sequence[int] = (256, 64),
    n_cross: int = 3,
) -> DCNv2:
    """``kelp.trainer.models:dcn_v2`` (alias ``dcn-v2``): :class:`DCNv2`."""
    return DCNv2(ModelInputs.from_spec(spec, "dcn-v2"), bottom_mlp, top_mlp, n_cross)


def deepfm(
    spec: ModelSpec,
    bottom_mlp: Sequence[int] = (64, 16),
    top_mlp: Sequence[int] = (256, 64),
    first_order: str = "projection",
    per_id_grad_scale: float = PER_ID_GRAD_SCALE,
) -> DeepFM:
    """``kelp.trainer.models:deepfm`` (alias ``deepfm``): :class:`DeepFM`.

    ``first_order``: ``projection`` (a learned ``w . x``) or ``per_id`` (each row's last element);
    ``per_id_grad_scale``: with ``per_id``, the weight's gradient multiplier (:data:`PER_ID_GRAD_SCALE`).
    """
    return DeepFM(ModelInputs.from_spec(spec, "deepfm"), bottom_mlp, top_mlp, first_order, per_id_grad_scale)


MODELS: dict[str, str] = dict(BUILTIN_MODELS)
"""Config ``trainer.model`` short name -> the import reference of its factory."""


def build_model(spec: FeatureSpec, config: TrainerConfig) -> nn.Module:
    """The configured model on CPU (move it with ``.to(device)``).

    ``trainer.model`` (an alias or ``package.module:attr``) is imported and
    called as ``factory(ModelSpec, **kwargs)``; a reference that does not import
    is a :class:`~kelp.trainer.model_api.ModelImportError`, a factory that raises
    or returns no ``nn.Module`` a :class:`~kelp.trainer.model_api.ModelContractError`
    (both :class:`UserError`, naming the reference). With ``trainer.seed`` set,
    the initial weights depend only on the config (torch's global generator is
    forked, so nothing else is reseeded).
    """
    reference = resolve_reference(config.model)
    if not spec.sparse and not spec.dense:
        raise UserError("the feature spec has no dense and no sparse features: nothing to train on")
    factory = import_factory(reference)
    kwargs: dict[str, Any] = model_kwargs(config)
    with torch.random.fork_rng(devices=[]):
        if config.seed is not None:
            torch.manual_seed(config.seed)
        try:
            model = factory(ModelSpec.from_features(spec), **kwargs)
        except UserError:
            raise
        except Exception as exc:  # user code may raise anything
            raise ModelContractError(
                f"trainer.model {reference!r}: the factory raised {one_line(exc)}"
            ) from None
    if not isinstance(model, nn.Module):
        raise ModelContractError(
            f"trainer.model {reference!r}: the factory returned {type(model).__name__}, "
            "expected a torch.nn.Module"
        )
    return model

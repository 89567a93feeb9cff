"""``kelp config validate``'s model check: import the configured model and run it once.

A two-sample synthetic :class:`~kelp.trainer.model_api.ModelInput` (random
dense columns, random pooled vectors of each feature's dim, and for each
sequence feature a sequence of two random rows for the first sample and an
empty one for the second, the case a model most easily gets wrong) goes through the
forward in eval mode with no grad; the output must satisfy the contract
(:func:`~kelp.trainer.model_api.to_logits`). Every failure is one
:class:`~kelp.errors.UserError` line naming the reference, so an operator sees
a broken model before the trainer or a replica starts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kelp.config import FeatureSpec, TrainerConfig
from kelp.trainer.model_api import (
    ModelContractError,
    ModelInput,
    ModelSpec,
    SequenceInput,
    model_digest,
    one_line,
    resolve_reference,
    to_logits,
)
from kelp.trainer.models import build_model

__all__ = ["ModelCheck", "check_model", "probe_model"]

PROBE_BATCH = 2
"""Samples in the synthetic batch (two, so a model that squeezes a batch of one is caught)."""

PROBE_SEQUENCE_LENGTHS = (2, 0)
"""Ids per sample of each synthetic sequence feature: the second sample's sequence is empty."""


@dataclass(frozen=True)
class ModelCheck:
    """What the check found: the resolved reference, its dense parameter count and source digest."""

    reference: str
    parameters: int
    digest: str


def check_model(spec: FeatureSpec, config: TrainerConfig) -> ModelCheck:
    """Build ``config.model`` and run one forward on a synthetic batch; raises a one-line UserError."""
    reference = resolve_reference(config.model)
    model = build_model(spec, config)
    probe_model(model, ModelSpec.from_features(spec), reference)
    parameters = sum(p.numel() for p in model.parameters())
    return ModelCheck(reference=reference, parameters=parameters, digest=model_digest(reference))


def probe_model(model: torch.nn.Module, model_spec: ModelSpec, reference: str) -> None:
    """Run ``model`` once on the synthetic batch, in eval mode with no grad; a one-line error if it breaks.

    Used by ``kelp config validate`` on a freshly built model and by a replica on
    a snapshot's model with its weights loaded, before that model takes traffic.
    """
    generator = torch.Generator().manual_seed(0)
    batch = ModelInput(
        dense=torch.randn(PROBE_BATCH, len(model_spec.dense), generator=generator),
        sparse={
            name: torch.randn(PROBE_BATCH, dim, generator=generator)
            for name, dim in model_spec.sparse.items()
        },
        sequences={name: _probe_sequence(dim, generator) for name, dim in model_spec.sequences.items()},
    )
    model.eval()
    try:
        with torch.no_grad():
            output = model(batch)
    except Exception as exc:  # user code may raise anything
        raise ModelContractError(
            f"trainer.model {reference!r}: forward on a {PROBE_BATCH}-sample batch raised {one_line(exc)}"
        ) from None
    try:
        to_logits(output, model_spec, PROBE_BATCH)  # a mapping's keys, and the first task's logits
        for task in model_spec.tasks[1:]:
            to_logits({task: output[task]}, replace(model_spec, tasks=(task,)), PROBE_BATCH)  # type: ignore[index]
    except ModelContractError as exc:
        raise ModelContractError(f"trainer.model {reference!r}: {exc}") from None


def _probe_sequence(dim: int, generator: torch.Generator) -> SequenceInput:
    """A synthetic sequence feature of :data:`PROBE_SEQUENCE_LENGTHS` ids per sample, random rows."""
    lengths = torch.tensor(PROBE_SEQUENCE_LENGTHS, dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return SequenceInput(torch.randn(int(lengths.sum()), dim, generator=generator), offsets)

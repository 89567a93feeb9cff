"""``first_order: per_id``: the id's weight shares its row's Adagrad accumulator, so its gradient is scaled.

The weight's gradient is the logit's own, far larger than any element of the
field vector's; unscaled, it fills the row's one accumulator and starves the
vector's steps. The model scales it on the way back to the row and leaves the
logit as it is.
"""

from __future__ import annotations

import math

import pytest
import torch

from kelp.errors import UserError
from kelp.trainer.models import PER_ID_GRAD_SCALE, build_model

from .conftest import model_input, small_config, small_spec


def _per_id(scale: float | None = None):  # type: ignore[no-untyped-def]
    cfg = small_config(model="deepfm", bottom_mlp=[8, 4])
    cfg.model_args = {"first_order": "per_id"} | ({} if scale is None else {"per_id_grad_scale": scale})
    return build_model(small_spec(n_dense=0, dims=(5, 5, 5)), cfg)


def _logits_and_row_grads(model, pooled):  # type: ignore[no-untyped-def]
    leaves = [p.clone().requires_grad_(True) for p in pooled]
    logits = model(model_input(torch.zeros(len(pooled[0]), 0), leaves))
    logits.sum().backward()
    return logits.detach(), [leaf.grad for leaf in leaves]


def test_per_id_weight_gradient_is_scaled_and_the_logit_is_not() -> None:
    torch.manual_seed(0)
    scaled, raw = _per_id(), _per_id(scale=1.0)
    raw.load_state_dict(scaled.state_dict())
    pooled = [torch.randn(6, 5) * 0.01 for _ in range(3)]  # rows as a new id's: normal(0, 0.01)
    logits, grads = _logits_and_row_grads(scaled, pooled)
    raw_logits, raw_grads = _logits_and_row_grads(raw, pooled)
    assert torch.equal(logits, raw_logits)  # the forward pass is untouched
    assert PER_ID_GRAD_SCALE < 1.0
    for grad, raw_grad in zip(grads, raw_grads, strict=True):
        assert torch.equal(grad[:, :4], raw_grad[:, :4])  # the field vector's gradient is as it was
        torch.testing.assert_close(raw_grad[:, 4], torch.ones(6))  # d logit / d w_id
        torch.testing.assert_close(grad[:, 4], torch.full((6,), PER_ID_GRAD_SCALE))


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, math.nan, "0.25", True])
def test_per_id_grad_scale_is_validated(bad: object) -> None:
    expected = r"trainer\.model_args\.per_id_grad_scale: got .*expected a number in \(0, 1\]"
    with pytest.raises(UserError, match=expected):
        _per_id(scale=bad)  # type: ignore[arg-type]

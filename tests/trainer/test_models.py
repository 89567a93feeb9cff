from __future__ import annotations

import pytest
import torch
from torch import nn

from kelp.config import TrainerConfig
from kelp.consumers.criteo import criteo_feature_spec
from kelp.errors import UserError
from kelp.trainer.models import DLRM, DCNv2, DeepFM, build_model, pairwise_interaction

from .conftest import model_input, small_config, small_spec


def _linear_shapes(module: nn.Module) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in module.modules() if isinstance(m, nn.Linear)]


def test_dlrm_small_matches_benchmarks_md() -> None:
    model = build_model(criteo_feature_spec(), TrainerConfig())
    assert isinstance(model, DLRM)
    assert _linear_shapes(model.bottom) == [(13, 64), (64, 16)]
    assert model.interaction_width == 432  # 16 + 26 * 16
    assert _linear_shapes(model.top) == [(432, 256), (256, 64), (64, 1)]
    # ReLU after both bottom layers, between top layers, none on the logit.
    assert [type(m).__name__ for m in model.bottom] == ["Linear", "ReLU", "Linear", "ReLU"]
    assert [type(m).__name__ for m in model.top] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    bottom = 13 * 64 + 64 + 64 * 16 + 16
    top = 432 * 256 + 256 + 256 * 64 + 64 + 64 + 1
    assert sum(p.numel() for p in model.parameters()) == bottom + top == 129_297


@pytest.mark.parametrize("name", ["dlrm-small", "dcn-v2", "deepfm"])
def test_forward_shapes_and_grad(name: str) -> None:
    spec = small_spec(dims=(4, 4, 4)) if name == "deepfm" else small_spec()
    model = build_model(spec, small_config(model=name))
    b = 5
    pooled = [
        torch.randn(b, t.dim, requires_grad=True) for t in (spec.table(f.table_name) for f in spec.sparse)
    ]
    logits = model(model_input(torch.randn(b, 3), pooled))
    assert logits.shape == (b,)
    logits.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in pooled)


def test_dcn_v2_cross_layers() -> None:
    model = build_model(small_spec(), small_config(model="dcn-v2"))
    assert isinstance(model, DCNv2)
    width = 4 + 4 + 4 + 8
    assert _linear_shapes(model.cross) == [(width, width)] * 3
    assert _linear_shapes(model.deep) == [(width, 16), (16, 8), (8, 1)]


def test_cross_layer_formula() -> None:
    model = build_model(small_spec(), small_config(model="dcn-v2"))
    x0 = torch.randn(2, model.interaction_width)
    layer = model.cross.layers[0]
    one = type(model.cross)(model.interaction_width, 1)
    one.layers[0].load_state_dict(layer.state_dict())
    torch.testing.assert_close(one(x0), x0 * layer(x0) + x0)


def test_without_dense_features() -> None:
    model = build_model(small_spec(n_dense=0), small_config())
    out = model(model_input(torch.zeros(2, 0), [torch.randn(2, d) for d in (4, 4, 8)]))
    assert out.shape == (2,)


def test_unimplemented_model_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"wide-and-deep.*package\.module:attr"):
        # The config refuses such names at load; build_model still guards an unvalidated config.
        build_model(small_spec(), small_config().model_copy(update={"model": "wide-and-deep"}))


def test_pairwise_interaction_is_the_sum_over_field_pairs() -> None:
    fields = torch.randn(3, 5, 4, dtype=torch.float64)
    brute = sum((fields[:, f] * fields[:, g]).sum(1) for f in range(5) for g in range(f + 1, 5))
    torch.testing.assert_close(pairwise_interaction(fields), brute)


def test_deepfm_is_linear_plus_pairwise_plus_deep() -> None:
    spec = small_spec(dims=(4, 4, 4))
    model = build_model(spec, small_config(model="deepfm", bottom_mlp=[8, 4]))
    assert isinstance(model, DeepFM)
    assert model.interaction_width == 4 * 4  # bottom output + three pooled fields
    dense, pooled = torch.randn(2, 3), [torch.randn(2, 4) for _ in range(3)]
    fields = torch.stack([model.bottom(dense), *pooled], dim=1)
    x = fields.flatten(1)
    expected = model.linear(x).squeeze(1) + model.deep(x).squeeze(1) + pairwise_interaction(fields)
    torch.testing.assert_close(model(model_input(dense, pooled)), expected)


def test_deepfm_refuses_fields_of_different_widths() -> None:
    with pytest.raises(UserError, match=r"one width for every field.*\[4, 8\]"):
        build_model(small_spec(dims=(4, 4, 8)), small_config(model="deepfm", bottom_mlp=[8, 4]))


def test_deepfm_per_id_first_order_is_each_rows_last_element() -> None:
    spec = small_spec(dims=(5, 5, 5))  # 4-wide field vectors, each row's fifth element its id's weight
    cfg = small_config(model="deepfm", bottom_mlp=[8, 4])
    cfg.model_args = {"first_order": "per_id"}
    model = build_model(spec, cfg)
    assert isinstance(model, DeepFM) and model.per_id and model.field_width == 4
    dense, pooled = torch.randn(2, 3), [torch.randn(2, 5) for _ in range(3)]
    bottom = model.bottom(dense)
    fields = torch.stack([bottom, *(p[:, :4] for p in pooled)], dim=1)
    x = fields.flatten(1)
    first = sum(p[:, 4] for p in pooled) + model.linear(bottom).squeeze(
        1
    )  # the dense field keeps a projection
    expected = first + model.deep(x).squeeze(1) + pairwise_interaction(fields)
    torch.testing.assert_close(model(model_input(dense, pooled)), expected)
    # An id not admitted reads a zero row: it adds nothing, its weight included.
    zero = [torch.zeros(2, 5), *pooled[1:]]
    no_first = sum(p[:, 4] for p in pooled[1:]) + model.linear(bottom).squeeze(1)
    fields = torch.stack([bottom, torch.zeros(2, 4), *(p[:, :4] for p in pooled[1:])], dim=1)
    expected = no_first + model.deep(fields.flatten(1)).squeeze(1) + pairwise_interaction(fields)
    torch.testing.assert_close(model(model_input(dense, zero)), expected)


def test_deepfm_per_id_needs_rows_one_wider_than_the_fields_and_a_known_form() -> None:
    cfg = small_config(model="deepfm", bottom_mlp=[8, 4])
    cfg.model_args = {"first_order": "per_id"}
    with pytest.raises(UserError, match=r"minus 1 .*bottom_mlp's last layer \(got \[3, 4\]\)"):
        build_model(small_spec(dims=(4, 4, 4)), cfg)
    cfg.model_args = {"first_order": "both"}
    with pytest.raises(UserError, match=r"first_order: got 'both': expected one of projection, per_id"):
        build_model(small_spec(dims=(4, 4, 4)), cfg)


def test_trainer_seed_fixes_the_initial_weights_without_reseeding_torch() -> None:
    spec = small_spec()
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = build_model(spec, small_config(seed=5))
    assert torch.equal(torch.rand(1), expected_next)  # the global generator was left alone
    second = build_model(spec, small_config(seed=5))
    other = build_model(spec, small_config(seed=6))
    for a, b, c in zip(first.parameters(), second.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
        assert not torch.equal(a, c)


def test_wrong_number_of_features() -> None:
    model = build_model(small_spec(), small_config())
    with pytest.raises(ValueError, match="pooled"):
        model(model_input(torch.zeros(2, 3), [torch.zeros(2, 4)]))


def test_config_accepts_exactly_the_models_built_here() -> None:
    """The config's ``trainer.model`` choices (checked at load) are the models :data:`MODELS` builds."""
    from kelp.config import MODEL_NAMES
    from kelp.trainer.models import MODELS

    assert set(MODEL_NAMES) == set(MODELS)
    for name, reference in MODELS.items():
        assert build_model(small_spec(dims=(4, 4, 4)), small_config(model=name)).__class__ is type(
            build_model(small_spec(dims=(4, 4, 4)), small_config(model=reference))
        )

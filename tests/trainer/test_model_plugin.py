"""A model defined outside the kelp package trains through the trainer's step like a built-in."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kelp.bench.baseline import spec_init
from kelp.errors import UserError
from kelp.trainer import (
    ModelContractError,
    ModelImportError,
    ModelSpec,
    build_model,
    config_hash,
    model_digest,
)
from kelp.trainer.model_check import check_model
from kelp.trainer.step import TrainStep

from .conftest import DictStore, random_batch, small_config, small_spec

CPU = torch.device("cpu")
PLUGINS = Path(__file__).parent / "plugin_models"


@pytest.fixture(autouse=True)
def plugins_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))


def _train(model_ref: str, rng: np.random.Generator, steps: int = 5, **model_args):  # type: ignore[no-untyped-def]
    spec = small_spec()
    config = small_config(model=model_ref, model_args=model_args)
    model = build_model(spec, config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    store = DictStore(spec_init(spec))
    step = TrainStep(model, spec, config, CPU)
    for _ in range(steps):
        batch = random_batch(spec, 32, rng)
        result = step(batch, store.pull_many(batch))
        assert result.skipped is None and result.logits.shape == (32,)
        for table, update in result.updates.items():
            store.push(table, *update)
    return model, before, store


def test_a_user_two_tower_model_trains_its_dense_params_and_the_rows(rng: np.random.Generator) -> None:
    model, before, store = _train("tiny_models:TwoTower", rng, user_features=["f0"], width=4)
    assert type(model).__module__ == "tiny_models"
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert set(changed) == set(before)  # every dense parameter moved
    assert store.rows["shared"] and store.rows["t2"]  # and Kelp trained the embedding rows


def test_a_mapping_of_the_one_task_is_accepted(rng: np.random.Generator) -> None:
    model, before, _ = _train("tiny_models:tiny_mlp", rng, hidden=4)
    assert not torch.equal(model.state_dict()["net.0.weight"], before["net.0.weight"])


def test_model_spec_names_features_dims_and_the_label() -> None:
    spec = ModelSpec.from_features(small_spec())
    assert spec.dense == ("d0", "d1", "d2")
    assert dict(spec.sparse) == {"f0": 4, "f1": 4, "f2": 8}
    assert spec.tasks == ("label",)


@pytest.mark.parametrize(
    ("model", "error", "message"),
    [
        ("no_such_module_xyz:model", ModelImportError, "cannot import module 'no_such_module_xyz'"),
        ("tiny_models:missing", ModelImportError, "has no attribute 'missing'"),
        ("tiny_models:raising", ModelContractError, "RuntimeError: this factory always fails"),
        ("tiny_models:not_a_module", ModelContractError, "expected a torch.nn.Module"),
        ("tiny_models:wrong_shape", ModelContractError, r"float32\[2, 1\], expected float32\[2\]"),
        ("tiny_models:wrong_tasks", ModelContractError, r"tasks \['ctr', 'cvr'\], expected \['label'\]"),
    ],
)
def test_a_broken_model_is_one_user_error_naming_the_reference(
    model: str, error: type[UserError], message: str
) -> None:
    with pytest.raises(error, match=message) as info:
        check_model(small_spec(), small_config(model=model))
    assert f"trainer.model {model!r}" in str(info.value) and "\n" not in str(info.value)


def test_the_config_refuses_a_name_that_is_no_reference() -> None:
    with pytest.raises(ValueError, match=r"'dlrm-small', 'dcn-v2', 'deepfm' or an import reference"):
        small_config(model="two-tower")


def test_the_checkpoint_fingerprint_covers_a_plugin_model_source(tmp_path: Path) -> None:
    """Built-in fingerprints are unchanged; a plug-in's covers its arguments and its source."""
    spec = small_spec()
    builtin = small_config()
    legacy = {"features": spec.model_dump(mode="json"), "model": "dlrm-small", "bottom_mlp": [8, 4]}
    legacy["top_mlp"] = builtin.top_mlp
    blob = json.dumps(legacy, sort_keys=True, separators=(",", ":")).encode()
    assert config_hash(spec, builtin) == hashlib.sha256(blob).hexdigest()[:16]
    module = tmp_path / "edited_model.py"
    module.write_text((PLUGINS / "tiny_models.py").read_text())
    sys.path.insert(0, str(tmp_path))
    try:
        config = small_config(model="edited_model:tiny_mlp", model_args={"hidden": 4})
        first, digest = config_hash(spec, config), model_digest(config.model)
        assert (
            config_hash(spec, small_config(model="edited_model:tiny_mlp", model_args={"hidden": 5})) != first
        )
        module.write_text(module.read_text() + "\n# edited\n")
        assert model_digest(config.model) != digest
        assert config_hash(spec, config) != first
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("edited_model", None)


PACKAGE_MODEL = """
from torch import nn

from .layers import head


def make(spec):
    return Model(len(spec.dense) + sum(spec.sparse.values()))


class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.head = head(width)

    def forward(self, batch):
        import torch

        return self.head(torch.cat([batch.dense, *batch.sparse.values()], dim=1)).squeeze(1)
"""


def test_a_model_in_a_package_is_digested_with_its_own_module_only(tmp_path: Path) -> None:
    """Editing the model's module changes the digest; a sibling helper or a file outside does not."""
    package = tmp_path / "user_pkg_digest"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(PACKAGE_MODEL)
    (package / "layers.py").write_text(
        "from torch import nn\n\n\ndef head(width):\n    return nn.Linear(width, 1)\n"
    )
    outside = tmp_path / "unrelated.py"
    outside.write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        reference = "user_pkg_digest.model:make"
        check_model(small_spec(), small_config(model=reference))  # imports, builds and runs it once
        first = model_digest(reference)
        outside.write_text("X = 2\n")
        (package / "extra.py").write_text("# a new module of the package\n")
        layers = package / "layers.py"
        layers.write_text(layers.read_text() + "\n# a sibling's comment\n")
        assert model_digest(reference) == first  # a shape change there shows in the checkpoint's shapes
        model = package / "model.py"
        model.write_text(model.read_text() + "\n# edited\n")
        assert model_digest(reference) != first
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("user_pkg_digest")]:
            sys.modules.pop(name, None)

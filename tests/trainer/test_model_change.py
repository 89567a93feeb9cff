"""What a model is, for its digest and its checkpoints: its own modules, not its package's siblings.

A package holding two models (``two_tower.py`` and ``fm_mlp.py``): editing one
must not make a trainer of the other refuse its checkpoint; editing the model's
own module refuses it with a message naming the model source and the way to
accept the change on purpose, and that way resumes.
"""

from __future__ import annotations

import importlib
import logging
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kelp.daemon.resume import leader_start
from kelp.errors import UserError
from kelp.trainer import build_model, model_digest
from kelp.trainer.checkpoint import config_hash, load_latest, save_checkpoint
from kelp.trainer.fingerprint import fingerprint
from kelp.trainer.step import TrainStep

from .conftest import small_config, small_spec

TWO_TOWER = """
import torch
from torch import nn


class TwoTower(nn.Module):
    def __init__(self, spec, width=4):
        super().__init__()
        self.names = list(spec.sparse)
        self.head = nn.Linear(len(spec.dense) + sum(spec.sparse.values()), width)
        self.out = nn.Linear(width, 1)

    def forward(self, batch):
        x = torch.cat([batch.dense, *(batch.sparse[n] for n in self.names)], dim=1)
        return self.out(torch.relu(self.head(x))).squeeze(1)
"""

FACTORY = """
from .two_tower import TwoTower


def make(spec, width=4):
    return TwoTower(spec, width)
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A fresh package ``(name, folder)``: ``models.make`` builds ``two_tower.TwoTower``; ``fm_mlp``."""
    name = f"user_models_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "two_tower.py").write_text(TWO_TOWER)
    (folder / "models.py").write_text(FACTORY)
    (folder / "fm_mlp.py").write_text("from torch import nn\n\n\nclass FmMlp(nn.Module):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield name, folder
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        sys.modules.pop(module, None)


def _edit(path: Path, text: str = "\n# edited\n") -> None:
    path.write_text(path.read_text() + text)


def test_the_digest_covers_the_model_class_module_not_its_siblings(package: tuple[str, Path]) -> None:
    name, folder = package
    reference = f"{name}.models:make"
    build_model(small_spec(), small_config(model=reference))
    first = model_digest(reference)
    _edit(folder / "fm_mlp.py")
    (folder / "extra.py").write_text("X = 1\n")
    assert model_digest(reference) == first  # another model, a new module: not this model
    _edit(folder / "two_tower.py")  # the class the factory builds
    assert model_digest(reference) != first


def _checkpoint(directory: Path, reference: str, **model_args: int) -> None:
    spec, config = small_spec(), small_config(model=reference, model_args=model_args)
    step = TrainStep(build_model(spec, config), spec, config, torch.device("cpu"))
    save_checkpoint(
        directory,
        step.model,
        step.optimizer,
        step=7,
        config_hash=config_hash(spec, config),
        fingerprint=fingerprint(spec, config),
    )


def _start(directory: Path, reference: str, *, accept: bool = False, **model_args: int):  # type: ignore[no-untyped-def]
    spec, config = small_spec(), small_config(model=reference, model_args=model_args)
    step = TrainStep(build_model(spec, config), spec, config, torch.device("cpu"))
    return leader_start(
        directory,
        step,
        config_hash(spec, config),
        share=False,
        fingerprint=fingerprint(spec, config),
        accept_model_change=accept,
    )


def test_a_model_source_change_is_named_and_can_be_accepted(
    package: tuple[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name, folder = package
    reference = f"{name}.models:make"
    directory = tmp_path / "ckpt"
    _checkpoint(directory, reference)
    _edit(folder / "fm_mlp.py")
    assert _start(directory, reference).step == 7  # a sibling's edit: resumes as before

    _edit(folder / "two_tower.py", "\n# a comment in the model's own module\n")
    with pytest.raises(UserError) as refused:
        _start(directory, reference)
    message = str(refused.value)
    assert f"model source ({name}.models, {name}.two_tower: sha256:" in message
    assert "trainer.accept_model_change: true" in message
    assert "feature/table layout" not in message and "parameter" not in message

    with caplog.at_level(logging.WARNING, logger="kelp.train"):
        assert _start(directory, reference, accept=True).step == 7
    assert "trainer.accept_model_change" in caplog.text and "model source" in caplog.text


def test_a_parameter_shape_change_is_refused_even_when_accepting(
    package: tuple[str, Path], tmp_path: Path
) -> None:
    name, _folder = package
    reference = f"{name}.models:make"
    directory = tmp_path / "ckpt"
    _checkpoint(directory, reference, width=4)
    with pytest.raises(UserError) as refused:
        _start(directory, reference, accept=True, width=6)
    message = str(refused.value)
    assert "parameter names or shapes ('head.bias' [4] -> [6]" in message
    assert "model settings" in message and "model source" not in message
    assert "trainer.accept_model_change cannot help" in message


def test_a_feature_layout_change_is_named(tmp_path: Path) -> None:
    spec, config = small_spec(), small_config()
    model = build_model(spec, config)
    digest, parts = config_hash(spec, config), fingerprint(spec, config)
    save_checkpoint(tmp_path, model, None, step=1, config_hash=digest, fingerprint=parts)
    other = small_spec(n_dense=4)
    layout = r"does not match this trainer: feature/table layout \(features\.dense changed\)"
    with pytest.raises(UserError, match=layout) as refused:
        load_latest(
            tmp_path,
            build_model(other, config),
            fingerprint=fingerprint(other, config),
            accept_model_change=True,
        )
    assert "model source" not in str(refused.value)  # a built-in has no source part


def test_accept_model_change_is_validated() -> None:
    with pytest.raises(ValueError, match="accept_model_change"):
        small_config(accept_model_change="sometimes")


def test_a_checkpoint_from_an_older_kelp_says_the_part_is_unknown_and_can_be_accepted(tmp_path: Path) -> None:
    spec, config = small_spec(), small_config()
    save_checkpoint(tmp_path, build_model(spec, config), None, step=3, config_hash="0ld0ld0ld0ld0ld0")
    here = {"expected_config_hash": config_hash(spec, config), "fingerprint": fingerprint(spec, config)}
    unknown = r"older Kelp that records one fingerprint .*trainer\.accept_model_change"
    with pytest.raises(UserError, match=unknown):
        load_latest(tmp_path, build_model(spec, config), **here)  # type: ignore[arg-type]
    info = load_latest(tmp_path, build_model(spec, config), accept_model_change=True, **here)  # type: ignore[arg-type]
    assert info is not None and info.step == 3 and "records no parts" in info.accepted_changes[0]

"""What a checkpoint was written for, part by part, so a trainer that refuses one says which part differs.

A checkpoint records, beside the one-string ``config_hash``::

    "fingerprint": {
      "features":   {"dense": "3f2a...", "sparse": "..", "tables": "..", ...},  # per FeatureSpec field
      "settings":   "9c01...",   # trainer.model, model_args, bottom_mlp, top_mlp
      "source":     "sha256:..", # model_digest of a plug-in model (None for a built-in)
      "modules":    ["mypkg.two_tower"],   # what "source" covers, for the message
      "class":      "mypkg.two_tower.TwoTower",
      "parameters": {"user.0.weight": [32, 12], ...}   # state_dict names and shapes
    }

On resume :func:`compare` names every part that differs. The feature/table
layout and the parameter names and shapes must match: rows in the store are
laid out by the features, and weights only load into equal shapes. The model
source, class and settings may change on purpose: ``trainer.accept_model_change``
resumes from the checkpoint anyway (the next checkpoint records the new code).
A built-in model has no source part: its code changes only with a Kelp release.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from kelp.config import FeatureSpec, TrainerConfig
from kelp.trainer.model_api import is_builtin, model_digest, model_source_names, resolve_reference

__all__ = ["Difference", "Fingerprint", "compare", "fingerprint", "model_parts"]

ACCEPTABLE = ("source", "class", "settings")
"""Parts ``trainer.accept_model_change`` lets a resume go past (the weights still load)."""

_WHAT = {
    "features": "feature/table layout",
    "settings": "model settings (trainer.model, model_args, bottom_mlp, top_mlp)",
    "source": "model source",
    "class": "model class",
    "parameters": "parameter names or shapes",
}


def _short_hash(payload: object) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class Fingerprint:
    """The config side of a checkpoint's fingerprint; the built model adds the rest (:func:`model_parts`)."""

    features: dict[str, str]
    settings: str
    source: str | None
    modules: tuple[str, ...]

    def record(self, model: nn.Module) -> dict[str, Any]:
        """The JSON a checkpoint stores: these parts plus ``model``'s class and parameter shapes."""
        return {
            "features": self.features,
            "settings": self.settings,
            "source": self.source,
            "modules": list(self.modules),
            **model_parts(model),
        }


def fingerprint(spec: FeatureSpec, trainer: TrainerConfig) -> Fingerprint:
    """The parts of ``spec`` and ``trainer`` a checkpoint is tied to."""
    reference = resolve_reference(trainer.model)
    settings = {
        "model": trainer.model,
        "reference": reference,
        "model_args": trainer.model_args,
        "bottom_mlp": trainer.bottom_mlp,
        "top_mlp": trainer.top_mlp,
    }
    builtin = is_builtin(reference)
    return Fingerprint(
        features={key: _short_hash(value) for key, value in spec.model_dump(mode="json").items()},
        settings=_short_hash(settings),
        source=None if builtin else model_digest(reference),
        modules=() if builtin else tuple(model_source_names(reference)),
    )


def model_parts(model: nn.Module) -> dict[str, Any]:
    """``class`` (module.qualname) and ``parameters`` (state_dict name -> shape) of a built model."""
    kind = type(model)
    return {
        "class": f"{kind.__module__}.{kind.__qualname__}",
        "parameters": {name: list(tensor.shape) for name, tensor in model.state_dict().items()},
    }


@dataclass(frozen=True)
class Difference:
    """One part that differs between a checkpoint and this trainer, with a short human detail."""

    part: str
    detail: str

    @property
    def acceptable(self) -> bool:
        return self.part in ACCEPTABLE

    def describe(self) -> str:
        return f"{_WHAT[self.part]} ({self.detail})"


def _parameter_detail(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> str:
    """The first parameters that are missing, new or reshaped: ``'head.weight' [1, 8] -> [1, 16]``."""
    notes = []
    for name in sorted(set(recorded) | set(here)):
        was, now = recorded.get(name), here.get(name)
        if was != now:
            notes.append(f"{name!r} {was or 'absent'} -> {now or 'absent'}")
    more = f", and {len(notes) - 3} more" if len(notes) > 3 else ""
    return "; ".join(notes[:3]) + more


def compare(recorded: Mapping[str, Any], expected: Fingerprint, model: nn.Module) -> list[Difference]:
    """Every part of a checkpoint's ``recorded`` fingerprint that differs from this trainer's, in order."""
    here = expected.record(model)
    found: list[Difference] = []
    if recorded.get("features") != here["features"]:
        was = recorded.get("features") if isinstance(recorded.get("features"), dict) else {}
        keys = sorted(k for k in set(was) | set(here["features"]) if was.get(k) != here["features"].get(k))
        found.append(Difference("features", ", ".join(f"features.{k}" for k in keys) + " changed"))
    if recorded.get("settings") != here["settings"]:
        found.append(Difference("settings", "trainer.model or its arguments changed"))
    if recorded.get("source") != here["source"]:
        modules = ", ".join(here["modules"]) or "the model's module"
        detail = f"{modules}: {recorded.get('source')} -> {here['source']}"
        found.append(Difference("source", detail))
    if recorded.get("class") != here["class"]:
        found.append(Difference("class", f"{recorded.get('class')} -> {here['class']}"))
    if recorded.get("parameters") != here["parameters"]:
        detail = _parameter_detail(recorded.get("parameters") or {}, here["parameters"])
        found.append(Difference("parameters", detail))
    return found

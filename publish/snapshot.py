"""The dense model snapshot (format version 1): safetensors weights plus a JSON manifest. Never pickle.

A snapshot is two byte strings, stored side by side by a channel:

* **weights**: ``safetensors`` of the model's ``state_dict`` (CPU, contiguous);
* **manifest**: UTF-8 JSON with sorted keys::

    {"format_version": 1,
     "version": 42,                        # monotonic per deployment, allocated by the channel
     "created_at": 1700000000.25,          # unix seconds, when the trainer serialized it
     "step": 1200,                         # trainer step the weights are from
     "offsets": [{"topic": "events", "partition": 0, "offset": 5120}],   # next offset to consume
     "model": {"model": "dlrm-small", "bottom_mlp": [64, 16], "top_mlp": [256, 64],
               "model_args": {}, "reference": "kelp.trainer.models:dlrm_small",
               "digest": "sha256:5d0e..."},   # kelp.trainer.model_digest: the model's source
     "features": {...},                    # the FeatureSpec, as config JSON
     "config_hash": "3f2a...",             # kelp.trainer.config_hash of features + model
     "dense_sha256": "77c4...",            # kelp.trainer.dense_digest of the weights (names + bytes)
     "quality": {"auc": 0.7412, "log_loss": 0.4870,         # progressive validation at publish:
                 "window_auc": 0.7530, "window_log_loss": 0.4791, "samples": 81920},  # null: undefined
     "weights_bytes": 521480,
     "checksum": "sha256:9b1c..."}

``dense_sha256`` and ``quality`` are optional (a manifest written before them
has neither, and its checksum is unchanged): the publisher compares
``dense_sha256`` and ``step`` with the last version to skip an identical
publish, and ``kelp model list`` shows ``step`` and ``quality``.

``checksum`` is SHA-256 over the manifest's canonical JSON *without* the
``checksum`` key, a newline, then the weights. So a flipped byte in either
part, a truncated weights blob, or weights paired with another version's
manifest is detected before anything is deserialized. Sparse rows are never in
a snapshot: serving reads them from the same store the trainer writes.

A weight that is NaN or infinite is refused at both ends: :func:`build_snapshot`
raises :class:`~kelp.trainer.finite.NonFiniteError` (so it is never published),
and :func:`load_model` rejects it as ``nonfinite`` (so a replica never serves
one that got into the channel some other way). The error names the tensor.

The model is code, not data: a replica builds it from ``model.reference`` on
its own Python path. :func:`load_model` refuses a snapshot whose reference it
cannot import (``model_import``) or whose ``digest`` differs from the source
the replica has (``model_digest``), so a replica never loads weights into
other code than the trainer's. A manifest without ``reference``/``digest``
(written before models were plug-ins) is accepted for a built-in model only.

>>> import torch
>>> from kelp.consumers.criteo import criteo_feature_spec
>>> from kelp.config import TrainerConfig
>>> spec, cfg = criteo_feature_spec(), TrainerConfig()
>>> from kelp.trainer import build_model
>>> snap = build_snapshot(build_model(spec, cfg), spec, cfg, version=1, step=0, offsets={})
>>> verify_snapshot(snap.manifest.to_json(), snap.weights).manifest.version
1
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from kelp.config import FeatureSpec, TrainerConfig
from kelp.errors import UserError
from kelp.publish.errors import SnapshotRejectedError
from kelp.trainer.checkpoint import config_hash, dense_digest
from kelp.trainer.evaluation import AucResult, ProgressiveValidator
from kelp.trainer.finite import NonFiniteError, first_nonfinite
from kelp.trainer.model_api import (
    ModelContractError,
    ModelImportError,
    ModelSpec,
    is_builtin,
    model_digest,
    model_record,
    resolve_reference,
)
from kelp.trainer.model_check import probe_model
from kelp.trainer.models import build_model

__all__ = [
    "SNAPSHOT_FORMAT_VERSION",
    "Snapshot",
    "SnapshotManifest",
    "build_snapshot",
    "load_model",
    "snapshot_quality",
    "verify_snapshot",
]

SNAPSHOT_FORMAT_VERSION = 1
_MODEL_KEYS = ("model", "bottom_mlp", "top_mlp")
_MODEL_RECORD_KEYS = ("model_args", "reference", "digest")
_OPTIONAL_KEYS = ("dense_sha256", "quality")


@dataclass(frozen=True)
class SnapshotManifest:
    """What a snapshot says about itself; see the module docstring for the JSON form."""

    version: int
    created_at: float
    step: int
    offsets: dict[tuple[str, int], int]
    model: dict[str, Any]
    features: dict[str, Any]
    config_hash: str
    weights_bytes: int
    checksum: str = ""
    format_version: int = SNAPSHOT_FORMAT_VERSION
    dense_sha256: str | None = None
    quality: dict[str, float | int | None] | None = None

    def _payload(self, with_checksum: bool) -> dict[str, Any]:
        data = asdict(self)
        data["offsets"] = [
            {"topic": t, "partition": int(p), "offset": int(o)} for (t, p), o in sorted(self.offsets.items())
        ]
        for optional in _OPTIONAL_KEYS:  # absent, not null: an older manifest's checksum still holds
            if data[optional] is None:
                data.pop(optional)
        if not with_checksum:
            data.pop("checksum")
        return data

    def canonical(self) -> bytes:
        """The bytes the checksum covers (everything but the checksum itself)."""
        return json.dumps(self._payload(False), sort_keys=True, separators=(",", ":")).encode()

    def to_json(self) -> bytes:
        return json.dumps(self._payload(True), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> SnapshotManifest:
        """Parse a manifest; anything malformed is :class:`SnapshotRejectedError` ``format``."""
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise TypeError("manifest is not a JSON object")
            version = data.get("format_version")
            if version != SNAPSHOT_FORMAT_VERSION:
                raise SnapshotRejectedError(
                    "format",
                    f"snapshot format version {version!r}, this Kelp reads {SNAPSHOT_FORMAT_VERSION}",
                )
            return cls(
                version=int(data["version"]),
                created_at=float(data["created_at"]),
                step=int(data["step"]),
                offsets={(o["topic"], int(o["partition"])): int(o["offset"]) for o in data["offsets"]},
                model={
                    **{k: data["model"][k] for k in _MODEL_KEYS},
                    **{k: data["model"][k] for k in _MODEL_RECORD_KEYS if k in data["model"]},
                },
                features=dict(data["features"]),
                config_hash=str(data["config_hash"]),
                weights_bytes=int(data["weights_bytes"]),
                checksum=str(data["checksum"]),
                dense_sha256=None if data.get("dense_sha256") is None else str(data["dense_sha256"]),
                quality=None if data.get("quality") is None else dict(data["quality"]),
            )
        except SnapshotRejectedError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
            raise SnapshotRejectedError("format", f"unreadable snapshot manifest: {exc}") from None

    def feature_spec(self) -> FeatureSpec:
        return FeatureSpec.model_validate(self.features)

    def trainer_config(self) -> TrainerConfig:
        """A TrainerConfig with the snapshot's model settings (the rest at defaults: unused by serving)."""
        return TrainerConfig(
            **{k: self.model[k] for k in _MODEL_KEYS}, model_args=self.model.get("model_args") or {}
        )


@dataclass(frozen=True)
class Snapshot:
    """A verified (or freshly built) snapshot: manifest plus the safetensors bytes."""

    manifest: SnapshotManifest
    weights: bytes


def _checksum(manifest: SnapshotManifest, weights: bytes) -> str:
    digest = hashlib.sha256(manifest.canonical())
    digest.update(b"\n")
    digest.update(weights)
    return "sha256:" + digest.hexdigest()


def build_snapshot(
    model: nn.Module,
    spec: FeatureSpec,
    trainer_cfg: TrainerConfig,
    *,
    version: int,
    step: int,
    offsets: Mapping[tuple[str, int], int],
    created_at: float | None = None,
    dense_sha256: str | None = None,
    quality: Mapping[str, float | int | None] | None = None,
) -> Snapshot:
    """Serialize ``model`` (any device) into a snapshot of ``version``.

    ``dense_sha256`` is :func:`~kelp.trainer.checkpoint.dense_digest` of
    ``model`` when the caller has it already (computed here otherwise);
    ``quality`` is :func:`snapshot_quality` at publish, when known.
    Raises :class:`~kelp.trainer.finite.NonFiniteError` when a tensor holds NaN or an infinity.
    """
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    bad = first_nonfinite(tensors)
    if bad is not None:
        raise NonFiniteError(f"snapshot v{int(version)} (step {int(step)}) refused", bad)
    weights = st_save(tensors)
    manifest = SnapshotManifest(
        version=int(version),
        created_at=time.time() if created_at is None else float(created_at),
        step=int(step),
        offsets={(str(t), int(p)): int(o) for (t, p), o in offsets.items()},
        model={**{k: getattr(trainer_cfg, k) for k in _MODEL_KEYS}, **model_record(trainer_cfg)},
        features=spec.model_dump(mode="json"),
        config_hash=config_hash(spec, trainer_cfg),
        weights_bytes=len(weights),
        dense_sha256=dense_sha256 or dense_digest(model),
        quality=None if quality is None else dict(quality),
    )
    manifest = replace(manifest, checksum=_checksum(manifest, weights))
    return Snapshot(manifest, weights)


def _finite_or_none(value: float) -> float | None:
    """NaN (undefined: no samples, one class) is JSON ``null``; numbers are rounded for reading."""
    return None if math.isnan(value) else round(float(value), 6)


def snapshot_quality(validator: ProgressiveValidator | None) -> dict[str, float | int | None] | None:
    """The progressive AUC and log loss a manifest records (``quality``): cumulative and windowed.

    Cumulative is every sample since this trainer process started; windowed is
    the last ``trainer.eval_window_batches`` batches, the better view of how
    good the weights being published are. None without a validator.
    """
    if validator is None:
        return None
    total: AucResult = validator.cumulative()
    window: AucResult = validator.windowed()
    return {
        "auc": _finite_or_none(total.auc),
        "log_loss": _finite_or_none(total.log_loss),
        "window_auc": _finite_or_none(window.auc),
        "window_log_loss": _finite_or_none(window.log_loss),
        "samples": int(total.samples),
    }


def verify_snapshot(manifest_raw: bytes, weights: bytes) -> Snapshot:
    """Parse the manifest and check size and checksum; raises :class:`SnapshotRejectedError`."""
    manifest = SnapshotManifest.from_json(manifest_raw)
    if len(weights) != manifest.weights_bytes:
        raise SnapshotRejectedError(
            "checksum",
            f"snapshot v{manifest.version}: weights are {len(weights)} bytes, manifest says "
            f"{manifest.weights_bytes} (partial or corrupt)",
        )
    if _checksum(manifest, weights) != manifest.checksum:
        raise SnapshotRejectedError(
            "checksum", f"snapshot v{manifest.version}: checksum mismatch (corrupt or mixed-up parts)"
        )
    return Snapshot(manifest, weights)


def load_model(
    snapshot: Snapshot, expected_spec: FeatureSpec | None = None, *, allowed_model: str | None = None
) -> nn.Module:
    """Build the snapshot's model on CPU, load its weights, put it in eval mode.

    With ``expected_spec`` (the replica's own config) the snapshot must have
    been trained on exactly those features: serving computes inputs from its
    config, so a mismatch would score garbage. Raises :class:`SnapshotRejectedError`
    ``incompatible`` (spec or shapes differ), ``format`` (unreadable weights) or
    ``nonfinite`` (a weight is NaN or infinite: every score would be NaN),
    ``model_import`` (the model reference does not import here),
    ``model_digest`` (this replica's model source differs from the trainer's) or
    ``model_contract`` (with its weights loaded, the model fails one forward on a
    synthetic batch: it would fail every request).

    With ``allowed_model`` (the replica's ``trainer.model``) a snapshot may name
    a built-in or that model only: a snapshot never makes a replica import and
    call code its own config does not name (``model_import``).
    """
    m = snapshot.manifest
    try:
        spec = m.feature_spec()
        trainer_cfg = m.trainer_config()
    except ValidationError as exc:
        raise SnapshotRejectedError(
            "format", f"snapshot v{m.version}: bad model or feature config: {exc}"
        ) from None
    if expected_spec is not None and spec.model_dump(mode="json") != expected_spec.model_dump(mode="json"):
        raise SnapshotRejectedError(
            "incompatible",
            f"snapshot v{m.version} was trained on other features than this replica's config "
            f"(config hash {m.config_hash})",
        )
    try:
        tensors = st_load(snapshot.weights)
    except (SafetensorError, ValueError) as exc:
        raise SnapshotRejectedError("format", f"snapshot v{m.version}: unreadable weights: {exc}") from None
    bad = first_nonfinite(tensors)
    if bad is not None:
        raise SnapshotRejectedError(
            "nonfinite", f"snapshot v{m.version}: tensor {bad!r} holds a non-finite value (NaN or infinity)"
        )
    _check_model_code(m, trainer_cfg, allowed_model)
    try:
        model = build_model(spec, trainer_cfg)
    except UserError as exc:
        raise SnapshotRejectedError("incompatible", f"snapshot v{m.version}: {exc}") from None
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        raise SnapshotRejectedError(
            "incompatible", f"snapshot v{m.version}: weights do not fit the model: {str(exc)[:300]}"
        ) from None
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        probe_model(model, ModelSpec.from_features(spec), trainer_cfg.model)
    except ModelContractError as exc:
        raise SnapshotRejectedError("model_contract", f"snapshot v{m.version}: {exc}") from None
    return model


def _check_model_code(m: SnapshotManifest, trainer_cfg: TrainerConfig, allowed_model: str | None) -> None:
    """Refuse a snapshot whose model this replica cannot import, or whose source differs from ours."""
    reference = m.model.get("reference") or resolve_reference(trainer_cfg.model)
    if reference != resolve_reference(trainer_cfg.model):
        raise SnapshotRejectedError(
            "format", f"snapshot v{m.version}: model.reference {reference!r} contradicts model.model"
        )
    if (
        allowed_model is not None
        and not is_builtin(reference)
        and reference != resolve_reference(allowed_model)
    ):
        raise SnapshotRejectedError(
            "model_import",
            f"snapshot v{m.version}: model {reference!r} is neither a built-in nor this replica's "
            f"trainer.model {allowed_model!r}",
        )
    try:
        here = model_digest(reference)
    except ModelImportError as exc:
        raise SnapshotRejectedError("model_import", f"snapshot v{m.version}: {exc}") from None
    except UserError as exc:
        raise SnapshotRejectedError("format", f"snapshot v{m.version}: {exc}") from None
    recorded = m.model.get("digest")
    if recorded is None and is_builtin(reference):
        return  # written before models were plug-ins: only built-ins existed
    if recorded != here:
        raise SnapshotRejectedError(
            "model_digest",
            f"snapshot v{m.version}: model {reference!r} source digest {recorded} differs from this "
            f"replica's {here} (deploy the trainer's model code to the replicas)",
        )

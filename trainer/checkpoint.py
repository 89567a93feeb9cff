"""Dense checkpoints: model and dense-optimizer state in safetensors, never pickle.

Embedding rows are not in a checkpoint: they live in the store, which is
durable on its own. A checkpoint restores the dense side and says which
source offsets it covers.

Layout of ``<dir>``::

    ckpt-000000000500.safetensors    one per save; the newest ``keep`` are kept
    ckpt-000000001000.safetensors
    latest                           JSON pointer: {"file", "sha256", "step", "format_version"}

Inside a checkpoint file (format version 1):

* tensors ``model.<state_dict key>``: the model's ``state_dict``;
* tensors ``optim.<param index>.<key>``: every tensor in the optimizer's
  per-parameter state (Adam's ``exp_avg``, ``exp_avg_sq``, ``step``...);
* safetensors metadata ``{"kelp": <JSON>}`` with ``format_version``,
  ``step``, ``config_hash``, ``created_at`` (unix seconds), ``offsets``
  (list of ``{topic, partition, offset}``, the *next* offset to consume,
  Kafka commit semantics), and ``optimizer``: ``class``, ``param_groups``
  and the non-tensor per-parameter state values, so the nested
  ``state_dict`` can be rebuilt without pickle. A trainer group adds
  ``ranks``: per rank ``{rank, offsets, dense_sha256}`` (every rank's
  trained-through offsets, and proof that the dense replicas were equal).
  ``fingerprint`` (:mod:`kelp.trainer.fingerprint`) holds the parts
  ``config_hash`` sums up (features, model settings, model source, class,
  parameter shapes), so a refused resume names the part that differs.

Writes are atomic: bytes go to a temp file in the same directory, which is
fsynced and ``os.replace``-d into place, then the ``latest`` pointer is
replaced the same way. A crash leaves either the old or the new ``latest``,
never a pointer to a partial file; leftover ``*.tmp`` files are ignored and
cleaned up by the next save. ``latest`` carries the file's SHA-256, checked on load.

A checkpoint whose model or optimizer state holds a NaN or an infinity is never
written: :func:`save_checkpoint` raises :class:`~kelp.trainer.finite.NonFiniteError`
naming the first such tensor before touching the directory, so ``latest`` keeps
pointing at the last good checkpoint and a restart never resumes a broken model.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from kelp.config import FeatureSpec, TrainerConfig
from kelp.errors import UserError
from kelp.files import atomic_write
from kelp.trainer.fingerprint import Fingerprint, compare
from kelp.trainer.finite import NonFiniteError, first_nonfinite
from kelp.trainer.model_api import is_builtin, model_record

__all__ = [
    "FORMAT_VERSION",
    "CheckpointInfo",
    "config_hash",
    "dense_digest",
    "load_latest",
    "read_checkpoint",
    "save_checkpoint",
]

FORMAT_VERSION = 1
LATEST = "latest"
_NAME = re.compile(r"^ckpt-(\d{12})\.safetensors$")


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint says about itself (from its metadata)."""

    path: Path
    step: int
    config_hash: str
    created_at: float
    offsets: dict[tuple[str, int], int]
    format_version: int
    accepted_changes: tuple[str, ...] = ()
    """What ``accept_model_change`` let differ from the checkpoint (empty: nothing did)."""


def dense_digest(model: nn.Module) -> str:
    """SHA-256 of the model's state_dict bytes, in key order: equal digests mean bitwise-equal replicas."""
    digest = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        digest.update(key.encode())
        digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def config_hash(spec: FeatureSpec, trainer: TrainerConfig) -> str:
    """SHA-256 (hex, first 16 chars) of what shapes the dense model: features and model settings.

    A plug-in model (``package.module:attr``) adds its reference, ``model_args``
    and source digest, so a checkpoint never resumes into other model code; a
    built-in adds ``model_args`` only when set, so existing checkpoints keep
    their fingerprint.
    """
    payload: dict[str, Any] = {
        "features": spec.model_dump(mode="json"),
        "model": trainer.model,
        "bottom_mlp": trainer.bottom_mlp,
        "top_mlp": trainer.top_mlp,
    }
    if not is_builtin(trainer.model):
        payload.update(model_record(trainer))
    elif trainer.model_args:
        payload["model_args"] = trainer.model_args
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# --------------------------------------------------------------------------- flattening


def _flatten(
    model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, torch.Tensor], Any]:
    tensors = {f"model.{k}": v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    if optimizer is None:
        return tensors, None
    sd = optimizer.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for pid, entry in sd["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{pid}.{key}"] = value.detach().to("cpu").contiguous().clone()
            else:
                scalars.setdefault(str(pid), {})[key] = value
    for group in sd["param_groups"]:
        for key, value in group.items():
            if isinstance(value, torch.Tensor):
                raise ValueError(f"optimizer param_group {key!r} is a tensor; checkpoints need plain numbers")
    meta = {"class": type(optimizer).__name__, "param_groups": sd["param_groups"], "scalars": scalars}
    return tensors, meta


def _unflatten_optimizer(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            pid, key = name[len("optim.") :].split(".", 1)
            state.setdefault(int(pid), {})[key] = value
    for pid, entries in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(entries)
    return {"state": state, "param_groups": meta["param_groups"]}


# --------------------------------------------------------------------------- files


def save_checkpoint(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    step: int,
    config_hash: str,
    offsets: Mapping[tuple[str, int], int] | None = None,
    ranks: Sequence[Mapping[str, Any]] | None = None,
    keep: int = 5,
    fingerprint: Fingerprint | None = None,
) -> Path:
    """Write ``ckpt-<step>.safetensors`` atomically, point ``latest`` at it, keep the newest ``keep``.

    ``ranks`` (a trainer group): one JSON-able entry per rank, with that rank's
    trained-through offsets and the digest of its dense parameters.
    ``fingerprint``: recorded with ``model``'s class and shapes, so a later
    refusal can name what differs (without it only ``config_hash`` is compared).

    Raises :class:`~kelp.trainer.finite.NonFiniteError` (nothing written, the
    previous checkpoint stays ``latest``) when a model or optimizer tensor holds
    NaN or an infinity.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    tensors, optim_meta = _flatten(model, optimizer)
    bad = first_nonfinite(tensors)
    if bad is not None:
        raise NonFiniteError(f"checkpoint at step {int(step)} refused", bad)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        "format_version": FORMAT_VERSION,
        "step": int(step),
        "config_hash": config_hash,
        "created_at": time.time(),
        "offsets": [
            {"topic": topic, "partition": int(partition), "offset": int(offset)}
            for (topic, partition), offset in sorted((offsets or {}).items())
        ],
        "optimizer": optim_meta,
    }
    if ranks is not None:
        meta["ranks"] = list(ranks)
    if fingerprint is not None:
        meta["fingerprint"] = fingerprint.record(model)
    data = st_save(tensors, metadata={"kelp": json.dumps(meta)})
    path = directory / f"ckpt-{int(step):012d}.safetensors"
    atomic_write(path, data)
    pointer = {
        "file": path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "step": int(step),
        "format_version": FORMAT_VERSION,
    }
    atomic_write(directory / LATEST, json.dumps(pointer).encode())
    _prune(directory, keep, current=path.name)
    return path


def _prune(directory: Path, keep: int, current: str) -> None:
    names = sorted(p.name for p in directory.iterdir() if _NAME.match(p.name))
    for name in names[:-keep]:
        if name != current:
            (directory / name).unlink(missing_ok=True)
    for tmp in directory.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


def read_checkpoint(path: str | Path, sha256: str | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """``(tensors on CPU, kelp metadata)`` of one checkpoint file; checks the hash when given."""
    path = Path(path)
    data = path.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise UserError(f"checkpoint {path} does not match the checksum in 'latest' (corrupt or replaced)")
    tensors = st_load(data)
    # safetensors keeps the metadata in its JSON header; read it without a second parse of the tensors.
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    meta = json.loads(header.get("__metadata__", {}).get("kelp", "null"))
    if not isinstance(meta, dict):
        raise UserError(f"{path} is a safetensors file but not a Kelp checkpoint")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise UserError(f"{path}: checkpoint format version {version}, this Kelp reads {FORMAT_VERSION}")
    return tensors, meta


def load_latest(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    expected_config_hash: str | None = None,
    fingerprint: Fingerprint | None = None,
    accept_model_change: bool = False,
) -> CheckpointInfo | None:
    """Restore ``model`` (and ``optimizer``) from the checkpoint ``latest`` names; None if there is none.

    A checkpoint written for another model or layout is a :class:`UserError`
    (silently starting fresh would throw away training). With ``fingerprint``
    the message names each part that differs (:mod:`kelp.trainer.fingerprint`);
    ``accept_model_change`` resumes past a changed model source, class or
    settings whose parameter names and shapes still match, and the info's
    ``accepted_changes`` says what was let through.
    """
    directory = Path(directory)
    pointer_path = directory / LATEST
    if not pointer_path.exists():
        return None
    pointer = json.loads(pointer_path.read_text())
    path = directory / pointer["file"]
    tensors, meta = read_checkpoint(path, pointer.get("sha256"))
    accepted: tuple[str, ...] = ()
    if fingerprint is not None and isinstance(meta.get("fingerprint"), dict):
        accepted = _check_parts(path, meta["fingerprint"], fingerprint, model, accept_model_change)
    elif expected_config_hash is not None and meta["config_hash"] != expected_config_hash:
        accepted = _check_hash(path, meta["config_hash"], expected_config_hash, accept_model_change)
    model_state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    try:
        model.load_state_dict(model_state, strict=True)
    except RuntimeError as exc:  # only reachable when accepting a checkpoint that records no shapes
        raise UserError(
            f"checkpoint {path}: its weights do not fit this model: {' '.join(str(exc).split())[:400]}"
        ) from None
    if optimizer is not None:
        if meta["optimizer"] is None:
            raise UserError(f"checkpoint {path.name} has no optimizer state")
        if meta["optimizer"]["class"] != type(optimizer).__name__:
            raise UserError(
                f"checkpoint {path.name} holds {meta['optimizer']['class']} state, "
                f"the configured dense optimizer is {type(optimizer).__name__}"
            )
        optimizer.load_state_dict(_unflatten_optimizer(tensors, meta["optimizer"]))
    offsets = {(o["topic"], int(o["partition"])): int(o["offset"]) for o in meta["offsets"]}
    return CheckpointInfo(
        path=path,
        step=int(meta["step"]),
        config_hash=meta["config_hash"],
        created_at=float(meta["created_at"]),
        offsets=offsets,
        format_version=int(meta["format_version"]),
        accepted_changes=accepted,
    )


_FRESH = (
    "to start fresh, set another trainer.checkpoint_dir (and deployment, for fresh rows) or remove {dir}; "
    "to resume without it, use the config and model code that wrote it"
)
_ACCEPT = (
    "set trainer.accept_model_change: true (or KELP_TRAINER__ACCEPT_MODEL_CHANGE=true) for one start "
    "to resume from it"
)


def _check_parts(
    path: Path, recorded: Mapping[str, Any], expected: Fingerprint, model: nn.Module, accept: bool
) -> tuple[str, ...]:
    """Refuse, naming each differing part, unless every difference is one ``accept`` may let through."""
    differences = compare(recorded, expected, model)
    if not differences:
        return ()
    described = [d.describe() for d in differences]
    if accept and all(d.acceptable for d in differences):
        return tuple(described)
    if all(d.acceptable for d in differences):
        advice = f"If you changed the model on purpose, {_ACCEPT}"
    else:
        advice = "Its weights cannot resume this model (trainer.accept_model_change cannot help)"
    raise UserError(
        f"trainer.checkpoint_dir {path.parent}: its latest checkpoint {path.name} does not match this "
        f"trainer: {'; '.join(described)}. {advice}; {_FRESH.format(dir=path.parent)}"
    )


def _check_hash(path: Path, recorded: str, expected: str, accept: bool) -> tuple[str, ...]:
    """A checkpoint that records one fingerprint only (an older Kelp's): it cannot say which part differs."""
    what = f"fingerprint {recorded}, this config {expected}"
    if accept:
        return (f"a checkpoint that records no parts ({what}); parameter names and shapes checked on load",)
    raise UserError(
        f"trainer.checkpoint_dir {path.parent}: its latest checkpoint {path.name} was written for another "
        f"model or feature/table layout ({what}); it was written by an older Kelp that records one "
        f"fingerprint for every part, so which part differs is unknown (a plug-in model's source digest "
        f"then covered every module of its package: upgrading Kelp alone changes it). If only the model "
        f"code or Kelp changed, {_ACCEPT}; {_FRESH.format(dir=path.parent)}"
    )

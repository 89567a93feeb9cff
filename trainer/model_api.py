"""The model plug-in contract: what Kelp hands a dense model, what it gets back, and how it is found.

``trainer.model`` is a built-in name (an alias, see :data:`BUILTIN_MODELS`) or an
import reference ``package.module:attr`` resolved on the Python path
(``PYTHONPATH`` honoured). ``attr`` is a factory (a function or a class)::

    attr(spec: ModelSpec, **trainer.model_args) -> torch.nn.Module

and the module's ``forward(batch: ModelInput)`` returns logits ``f32[B]`` (or a
mapping ``{task: f32[B]}`` whose keys are ``spec.tasks``). Kelp owns the
embedding tables (store, hot tier, admission, row-wise optimizer) and pools
each sparse feature before the forward; the module owns only dense
parameters, which the dense optimizer trains and the snapshot carries::

    ModelInput
      dense      f32[B, n_dense]        column j = spec.dense[j]
      sparse     {"C1": f32[B, dim_C1],  one pooled vector per pooled sparse feature,
                  "C2": f32[B, dim_C2],  keys and order = spec.sparse
                  ...}
      sequences  {"hist": SequenceInput}  per ``pooling: none`` feature, keys = spec.sequences:
                    values  f32[N, dim]    every id's row, samples concatenated in order
                    offsets i64[B + 1]     sample i's rows are values[offsets[i]:offsets[i + 1]]

A snapshot records the resolved reference, the arguments and
:func:`model_digest` (SHA-256 of the modules that define the factory and the
model class), so a replica whose code differs refuses it instead of scoring
with other code.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor, nn

from kelp.config import FeatureSpec, TrainerConfig
from kelp.errors import UserError

__all__ = [
    "BUILTIN_MODELS",
    "ModelContractError",
    "ModelFactory",
    "ModelImportError",
    "ModelInput",
    "ModelSpec",
    "SequenceInput",
    "import_factory",
    "is_builtin",
    "model_digest",
    "model_record",
    "model_source_names",
    "one_line",
    "resolve_reference",
    "to_logits",
]

BUILTIN_MODELS: Mapping[str, str] = MappingProxyType(
    {
        "dlrm-small": "kelp.trainer.models:dlrm_small",
        "dcn-v2": "kelp.trainer.models:dcn_v2",
        "deepfm": "kelp.trainer.models:deepfm",
    }
)
"""Short name -> import reference of the models Kelp ships (the config's ``trainer.model`` aliases)."""

_REFERENCE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

ModelFactory = Callable[..., nn.Module]
"""``factory(spec, **model_args) -> nn.Module``."""


class ModelImportError(UserError):
    """The model reference cannot be imported (missing module or attribute, or the module raised)."""


class ModelContractError(UserError):
    """The model was imported but breaks the contract (factory raised, bad output shape or type)."""


@dataclass(frozen=True)
class ModelSpec:
    """What a model factory is told about its inputs.

    * ``dense``: the dense feature names, in column order of ``ModelInput.dense``;
    * ``sparse``: pooled sparse feature name -> embedding dim of its pooled vector, in config order;
    * ``tasks``: the label names the model predicts, in ``features.labels`` order (one: ``features.label``);
    * ``sequences``: sequence feature (``pooling: none``) name -> embedding dim of each of its
      rows, in config order; such a feature is not in ``sparse``.
    """

    dense: tuple[str, ...]
    sparse: Mapping[str, int]
    tasks: tuple[str, ...] = ("label",)
    sequences: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_features(cls, spec: FeatureSpec) -> ModelSpec:
        dims = {f.name: spec.table(f.table_name).dim for f in spec.sparse}
        sequences = {f.name: dims[f.name] for f in spec.sparse if f.pooling == "none"}
        sparse = {name: dim for name, dim in dims.items() if name not in sequences}
        return cls(
            dense=tuple(f.name for f in spec.dense),
            sparse=MappingProxyType(sparse),
            tasks=spec.task_names(),
            sequences=MappingProxyType(sequences),
        )


@dataclass(frozen=True)
class SequenceInput:
    """One sequence feature's rows for a batch, unpooled: ``values`` f32[N, dim], ``offsets`` int64[B + 1].

    Sample *i*'s rows, in the order its ids came in, are ``values[offsets[i]:offsets[i + 1]]``
    (``offsets[0] == 0``, ``offsets[-1] == N``; an empty sequence has equal offsets).
    ``values`` is gathered from the table's rows in the autograd graph, so any
    differentiable use of it trains those rows, as the pooled vectors do.

    The helpers build what attention models need with torch ops only (they run
    on the batch's device and keep gradients flowing to the rows).
    """

    values: Tensor
    offsets: Tensor

    @property
    def size(self) -> int:
        """B, the number of samples."""
        return int(self.offsets.shape[0]) - 1

    @property
    def dim(self) -> int:
        return int(self.values.shape[1])

    def lengths(self) -> Tensor:
        """int64[B]: ids per sample (0 for an empty sequence)."""
        return self.offsets[1:] - self.offsets[:-1]

    def segment_ids(self) -> Tensor:
        """int64[N]: the sample each row of ``values`` belongs to (for ``index_add_``-style reductions)."""
        samples = torch.arange(self.size, device=self.offsets.device)
        return torch.repeat_interleave(samples, self.lengths(), output_size=int(self.values.shape[0]))

    def padded(self, max_len: int | None = None, *, keep: str = "first") -> tuple[Tensor, Tensor]:
        """``(rows f32[B, L, dim], mask bool[B, L])``: each sample's rows left-aligned, zeros after.

        ``L`` is ``max_len`` when given, else the longest sequence in the batch
        (reading it is a device-to-host sync on CUDA; pass ``max_len``, e.g. the
        feature's ``max_ids``, to avoid it and to get a fixed shape). A sequence
        longer than ``L`` keeps its first ``L`` rows, or its last ``L`` with
        ``keep="last"`` (the most recent, when ids come oldest first).
        ``mask[i, j]`` is True where ``rows[i, j]`` is a real row.
        """
        if keep not in ("first", "last"):
            raise ValueError(f"keep must be 'first' or 'last', not {keep!r}")
        lengths = self.lengths()
        if max_len is None:
            max_len = int(lengths.max()) if self.size else 0
        if max_len < 0:
            raise ValueError(f"max_len must be >= 0, not {max_len}")
        n = int(self.values.shape[0])
        positions = torch.arange(max_len, device=self.offsets.device)
        kept = lengths.clamp(max=max_len)
        start = self.offsets[:-1] if keep == "first" else self.offsets[1:] - kept
        mask = positions.unsqueeze(0) < kept.unsqueeze(1)
        # Padding reads an appended zero row (index n): exact zeros, and no gradient reaches a real row.
        index = torch.where(mask, start.unsqueeze(1) + positions.unsqueeze(0), n)
        table = torch.cat([self.values, self.values.new_zeros(1, self.values.shape[1])])
        return table[index], mask


@dataclass(frozen=True)
class ModelInput:
    """One forward pass's inputs, on the model's device.

    * ``dense``: f32[B, n_dense] (``n_dense`` may be 0);
    * ``sparse``: feature name -> pooled embedding f32[B, dim], in ``ModelSpec.sparse`` order;
    * ``sequences``: sequence feature name -> its :class:`SequenceInput`, in
      ``ModelSpec.sequences`` order (empty unless some feature has ``pooling: none``).
    """

    dense: Tensor
    sparse: Mapping[str, Tensor] = field(default_factory=dict)
    sequences: Mapping[str, SequenceInput] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.dense.shape[0])


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line: user code's errors end up in a one-line CLI message or log line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def is_builtin(reference: str) -> bool:
    """True for a built-in short name or the reference it aliases."""
    return reference in BUILTIN_MODELS or reference in BUILTIN_MODELS.values()


def resolve_reference(model: str) -> str:
    """A built-in alias -> its import reference; a reference is checked for the ``module:attr`` form."""
    if model in BUILTIN_MODELS:
        return BUILTIN_MODELS[model]
    if not _REFERENCE.match(model):
        known = ", ".join(repr(n) for n in BUILTIN_MODELS)
        raise UserError(
            f"trainer.model {model!r}: expected {known} or an import reference package.module:attr"
        )
    return model


def import_factory(model: str) -> ModelFactory:
    """Import the factory ``model`` names (alias or reference); a failure is one :class:`ModelImportError`."""
    reference = resolve_reference(model)
    module_name, attr_path = reference.split(":", 1)
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # user code may raise anything at import
        raise ModelImportError(
            f"trainer.model {reference!r}: cannot import module {module_name!r}: {one_line(exc)}"
        ) from None
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise ModelImportError(
                f"trainer.model {reference!r}: module {module_name!r} has no attribute {part!r}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ModelImportError(f"trainer.model {reference!r}: {attr_path!r} is not callable")
    return target


def _named_model_classes(reference: str, factory: object) -> list[str]:
    """Modules defining the ``nn.Module`` classes a factory function names directly, in its own package.

    ``def make(spec): return TwoTower(...)`` with ``TwoTower`` imported from a
    sibling module builds that sibling's class: its module is what the model
    is. Classes from other packages (torch's layers) are libraries, not the
    model, and stay out (a torch upgrade must not refuse every checkpoint).
    """
    code = getattr(factory, "__code__", None)
    scope = getattr(factory, "__globals__", None)
    if code is None or not isinstance(scope, dict):
        return []
    package = reference.split(":", 1)[0].split(".", 1)[0]
    modules: list[str] = []
    for name in code.co_names:
        target = scope.get(name)
        if not (isinstance(target, type) and issubclass(target, nn.Module)):
            continue
        module = target.__module__
        if module.split(".", 1)[0] == package and module not in modules:
            modules.append(module)
    return modules


def _source_files(reference: str, factory: object) -> list[tuple[str, Path]]:
    """``(module name, path)`` of every source file a model's digest covers, in a stable order.

    What the model *is*: the module the reference names, the module defining
    the factory, and the module defining each model class the factory builds
    by name (:func:`_named_model_classes`). Sibling modules of a package are
    not covered: editing another model in the same package (``fm_mlp.py``
    beside ``two_tower.py``) must not make a trainer refuse its own checkpoint.
    A helper whose edit changes the parameters is caught by the checkpoint's
    parameter names and shapes instead (:mod:`kelp.trainer.fingerprint`).
    """
    module_name = reference.split(":", 1)[0]
    names = [module_name]
    defined_in = getattr(factory, "__module__", None)
    if isinstance(defined_in, str) and defined_in not in names:
        names.append(defined_in)
    names += [m for m in _named_model_classes(reference, factory) if m not in names]
    files: list[tuple[str, Path]] = []
    for name in names:
        module = sys.modules.get(name)
        path = inspect.getsourcefile(module) if module is not None else None
        if path:
            files.append((name, Path(path)))
    return files


def model_source_names(model: str) -> list[str]:
    """The modules :func:`model_digest` covers for ``model``, for messages saying what changed."""
    reference = resolve_reference(model)
    return [name for name, _path in _source_files(reference, import_factory(reference))]


_DIGESTS: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}
"""Digests by reference and the (name, mtime, size) of its files: a replica checks every
snapshot it loads, and a large model package need not be re-read while it has not changed."""


def model_digest(model: str) -> str:
    """``sha256:<hex>`` of the source file(s) behind ``model``: equal digests mean the same model code.

    Covers the referenced module, the one defining the factory and those
    defining the model classes it names (:func:`_source_files`). Sibling
    modules and other installed libraries are not covered.
    """
    reference = resolve_reference(model)
    factory = import_factory(reference)
    files = _source_files(reference, factory)
    stamp = tuple((name, (st := path.stat()).st_mtime_ns, st.st_size) for name, path in files)
    key = (reference, stamp)
    cached = _DIGESTS.get(key)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    for _module, path in files:
        # The file name, not the module name, labels each part: a one-file model keeps its digest.
        digest.update(path.name.encode() + b"\n")
        digest.update(path.read_bytes())
    _DIGESTS[key] = "sha256:" + digest.hexdigest()
    return _DIGESTS[key]


def model_kwargs(config: TrainerConfig) -> dict[str, Any]:
    """The factory's keyword arguments: ``model_args``; built-ins also get ``bottom_mlp`` and ``top_mlp``."""
    if is_builtin(config.model):
        return {"bottom_mlp": list(config.bottom_mlp), "top_mlp": list(config.top_mlp), **config.model_args}
    return dict(config.model_args)


def model_record(config: TrainerConfig) -> dict[str, Any]:
    """What a snapshot's manifest says about its model: reference, arguments and source digest."""
    return {
        "reference": resolve_reference(config.model),
        "model_args": dict(config.model_args),
        "digest": model_digest(config.model),
    }


def to_logits(output: object, spec: ModelSpec, batch_size: int) -> Tensor:
    """A forward's output -> logits f32[B]; anything else is a :class:`ModelContractError`.

    A mapping must have exactly ``spec.tasks`` as keys; the first task's logits
    are returned (the trainer reads every task's, see ``kelp.trainer.step.task_logits``).
    """
    if isinstance(output, Mapping):
        if set(output) != set(spec.tasks):
            raise ModelContractError(
                f"model returned tasks {sorted(map(str, output))}, expected {list(spec.tasks)}"
            )
        output = output[spec.tasks[0]]
    if not isinstance(output, Tensor):
        raise ModelContractError(
            f"model returned {type(output).__name__}, expected a tensor f32[B] of logits"
        )
    if output.dtype != torch.float32 or tuple(output.shape) != (batch_size,):
        raise ModelContractError(
            f"model returned {str(output.dtype).removeprefix('torch.')}{list(output.shape)}, "
            f"expected float32[{batch_size}] logits"
        )
    return output

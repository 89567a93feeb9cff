"""Named input tensors -> the batch the scorer takes, by the replica's feature spec.

The inputs a Kelp model takes over the Open Inference Protocol (the model
metadata lists them):

* ``dense``: ``FP32 [B, n_dense]``, the raw dense features in config order
  (``FP16``/``FP64`` are taken too). Or one input per dense feature, named
  after it, ``[B]`` or ``[B, 1]``, which overrides that column. A feature
  given neither way takes its ``default``, as in ``/v1``;
* each sparse feature, named after it: ``INT64``/``UINT64`` (or a narrower
  integer type) ids, or ``BYTES`` ids read by training's one id rule
  (digits are that integer, any other text its xxh3-64 hash):

  * ``[B]``: one id per sample;
  * ``[B, k]``: ``k`` ids per sample;
  * ``[N]`` with an input ``<feature>.lengths`` (``[B]``, integers >= 0
    that sum to ``N``): sample *i* has the next ``lengths[i]`` ids.

  A feature that is not given has no ids (pooled to zeros), as in ``/v1``.

  The metadata lists a sparse feature as ``BYTES``: the config does not say
  whether a feature's ids are numbers or text, and ``BYTES`` is the one
  datatype every id can be sent as (a number as its digits), so a client that
  follows the metadata never hashes an id itself. Its ``parameters.datatypes``
  lists every datatype the input takes.

A name is a feature's first: ``<x>.lengths`` is a lengths input only when no
feature is called that. Every input must agree on ``B``, and the limits of
``/v1`` apply: at most ``serving.max_samples_per_request`` samples (413
``too_many_samples``) and ``min(max_ids, serving.max_ids_per_feature)`` ids
per sample and feature (``too_many_ids``). Other refusals name the input:
``unknown_input``, ``bad_shape``, ``bad_dense``, ``bad_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kelp.consumers.batch import JaggedIds, MicroBatch
from kelp.consumers.ids import str_id
from kelp.serving.errors import BadRequestError, RequestError
from kelp.serving.features import RequestParser
from kelp.serving.oip.tensors import Tensor

__all__ = [
    "DENSE_DATATYPES",
    "DENSE_INPUT",
    "ID_DATATYPES",
    "LENGTHS_DATATYPES",
    "LENGTHS_SUFFIX",
    "TensorInputs",
]

DENSE_INPUT = "dense"
LENGTHS_SUFFIX = ".lengths"

_INTEGER_KINDS = frozenset("iu")
_FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64"})
_INTEGER_TYPES = ("INT64", "UINT64", "INT32", "UINT32", "INT16", "UINT16", "INT8", "UINT8")
ID_DATATYPES = ("BYTES", *_INTEGER_TYPES)
"""What a sparse feature's input takes, the metadata's datatype first: BYTES by the one id rule,
integers as they are (``UINT64`` for ids at or above ``2**63``)."""
DENSE_DATATYPES = ("FP32", "FP16", "FP64")
LENGTHS_DATATYPES = ("INT32", *(t for t in _INTEGER_TYPES if t != "INT32"))


def _refused(reason: str, message: str) -> RequestError:
    return RequestError(reason, message, status=400)


def _described(name: str, datatypes: tuple[str, ...], shape: list[int]) -> dict[str, Any]:
    """One input of the metadata: its datatype (the first of ``datatypes``) and the others it takes."""
    return {
        "name": name,
        "datatype": datatypes[0],
        "shape": shape,
        "parameters": {"datatypes": list(datatypes)},
    }


class TensorInputs:
    """Builds a scorer batch from named tensors, with the checks of :class:`RequestParser`."""

    def __init__(self, parser: RequestParser) -> None:
        self.parser = parser
        self.dense_names = tuple(parser.dense_names)
        self.sparse_names = tuple(parser.sparse_names)
        self._dense = set(self.dense_names)
        self._sparse = set(self.sparse_names)
        # A feature's name wins: `dense` is the matrix input only when no feature is called that.
        self._matrix = bool(self.dense_names) and DENSE_INPUT not in self._dense | self._sparse
        self._per_sample = self._elements_per_sample()
        self._most_per_sample = max(self._per_sample.values(), default=1)

    def _elements_per_sample(self) -> dict[str, int]:
        """The most elements each input may have per sample: its count's bound, before any is read."""
        most: dict[str, int] = {}
        for i, name in enumerate(self.sparse_names):
            most.setdefault(name + LENGTHS_SUFFIX, 1)
            most[name] = max(self.parser.id_limits[i], 1)
        if self._matrix:
            most[DENSE_INPUT] = len(self.dense_names)
        for name in self.dense_names:
            most[name] = 1
        return most

    def check_count(self, name: str, count: int) -> None:
        """413 ``too_many_samples`` for an input with more elements than fit
        ``serving.max_samples_per_request`` samples; called on its shape, before its elements are read."""
        per_sample = self._per_sample.get(name, self._most_per_sample)
        most = self.parser.max_samples * per_sample
        if count > most:
            raise RequestError(
                "too_many_samples",
                f"input {name!r}: {count} elements, more than serving.max_samples_per_request "
                f"({self.parser.max_samples}) samples of {per_sample} can hold",
                status=413,
            )

    def metadata(self) -> list[dict[str, Any]]:
        """The inputs as the model metadata lists them (``-1``: any size): ``datatype`` is the one a
        client should send, ``parameters.datatypes`` every one the input takes (see the module)."""
        described: list[dict[str, Any]] = []
        if self._matrix:
            described.append(_described(DENSE_INPUT, DENSE_DATATYPES, [-1, len(self.dense_names)]))
        for name in self.sparse_names:
            described.append(_described(name, ID_DATATYPES, [-1]))
            lengths = name + LENGTHS_SUFFIX
            if lengths not in self._dense | self._sparse:
                described.append(_described(lengths, LENGTHS_DATATYPES, [-1]))
        return described

    def batch(self, inputs: Mapping[str, Tensor]) -> MicroBatch:
        """The batch ``inputs`` describe; a :class:`RequestError` naming the input when they do not fit."""
        lengths_of: dict[str, Tensor] = {}
        for name, tensor in inputs.items():
            if name in self._dense or name in self._sparse:
                continue
            if name == DENSE_INPUT and self._matrix:
                continue
            owner = name.removesuffix(LENGTHS_SUFFIX)
            if name.endswith(LENGTHS_SUFFIX) and owner in self._sparse:
                lengths_of[owner] = tensor
                continue
            raise _refused(
                "unknown_input",
                f"input {name!r} is not a feature of this model (inputs: dense, a feature's name, "
                f"or <sparse feature>{LENGTHS_SUFFIX})",
            )
        alone = sorted(name for name in lengths_of if name not in inputs)
        if alone:
            raise _refused(
                "bad_shape", f"input {alone[0] + LENGTHS_SUFFIX!r} has no {alone[0]!r} ids to go with"
            )
        size = self._batch_size(inputs, lengths_of)
        dense = np.tile(self.parser.defaults, (size, 1))
        matrix = inputs.get(DENSE_INPUT) if self._matrix else None
        if matrix is not None:
            dense[:, :] = self._dense_values(matrix, (size, len(self.dense_names)))
        for j, name in enumerate(self.dense_names):
            column = inputs.get(name)
            if column is not None:
                dense[:, j] = self._dense_values(column, (size,)).ravel()
        sparse = {  # a feature not given has no ids: the batch fills those in
            name: self._sparse_ids(i, inputs[name], lengths_of.get(name), size)
            for i, name in enumerate(self.sparse_names)
            if name in inputs
        }
        return self.parser.assemble(dense, sparse)

    def _batch_size(self, inputs: Mapping[str, Tensor], lengths_of: Mapping[str, Tensor]) -> int:
        """``B``, which every input must agree on."""
        sizes: dict[str, int] = {}
        for name, tensor in inputs.items():
            if not tensor.shape:
                raise _refused("bad_shape", f"input {name!r}: a scalar; every input has a batch dimension")
            if name in self._sparse and name in lengths_of:
                continue  # [N] ids: B comes from the lengths
            sizes[name] = tensor.shape[0]
        distinct = set(sizes.values())
        if len(distinct) > 1:
            raise _refused("bad_shape", f"inputs disagree on the batch size: {sizes}")
        size = distinct.pop() if distinct else 0
        if size < 1:
            raise _refused("bad_shape", "the batch is empty (every input has 0 samples)")
        if size > self.parser.max_samples:
            raise RequestError(
                "too_many_samples",
                f"{size} samples, at most serving.max_samples_per_request ({self.parser.max_samples})",
                status=413,
            )
        return size

    @staticmethod
    def _dense_values(tensor: Tensor, shape: tuple[int, ...]) -> np.ndarray:
        if tensor.datatype not in _FLOAT_TYPES:
            raise BadRequestError("bad_dense", f"input {tensor.name!r}: {tensor.datatype}, expected FP32")
        if tensor.shape != shape and not (len(shape) == 1 and tensor.shape == (shape[0], 1)):
            raise _refused(
                "bad_shape", f"input {tensor.name!r}: shape {list(tensor.shape)}, expected {list(shape)}"
            )
        values = tensor.data.astype(np.float64).reshape(tensor.shape)
        if not np.isfinite(values).all():
            raise BadRequestError("bad_dense", f"input {tensor.name!r}: values must be finite")
        return values

    def _sparse_ids(self, i: int, tensor: Tensor, lengths: Tensor | None, size: int) -> JaggedIds:
        name, limit = self.sparse_names[i], self.parser.id_limits[i]
        ids = self._ids(tensor)
        if lengths is not None:
            if len(tensor.shape) != 1:
                raise _refused("bad_shape", f"input {name!r}: shape {list(tensor.shape)}; with lengths, [N]")
            counts = self._lengths(lengths, size)
            if int(counts.sum()) != ids.size:
                raise _refused(
                    "bad_shape", f"input {name!r}: {ids.size} ids, but its lengths sum to {int(counts.sum())}"
                )
        elif len(tensor.shape) == 1:
            counts = np.ones(size, np.int64)
        elif len(tensor.shape) == 2:
            counts = np.full(size, tensor.shape[1], np.int64)
        else:
            raise _refused(
                "bad_shape",
                f"input {name!r}: shape {list(tensor.shape)}, expected [B], [B, k] or [N] + lengths",
            )
        most = int(counts.max())
        if most > limit:
            raise BadRequestError("too_many_ids", f"input {name!r}: {most} ids in a sample, at most {limit}")
        return JaggedIds.from_lengths(ids, counts.astype(np.int32))

    @staticmethod
    def _ids(tensor: Tensor) -> np.ndarray:
        data = tensor.data.ravel()
        if tensor.datatype == "BYTES":
            try:
                return np.fromiter((str_id(b.decode("utf-8")) for b in data), np.uint64, count=data.size)
            except UnicodeDecodeError:
                raise BadRequestError("bad_id", f"input {tensor.name!r}: an id is not UTF-8 text") from None
        if data.dtype.kind not in _INTEGER_KINDS:
            raise BadRequestError(
                "bad_id", f"input {tensor.name!r}: {tensor.datatype}, expected INT64, UINT64 or BYTES ids"
            )
        if data.dtype.kind == "i" and data.size and int(data.min()) < 0:
            raise BadRequestError(
                "bad_id", f"input {tensor.name!r}: ids must be >= 0 (use UINT64 above 2**63)"
            )
        return data.astype(np.uint64)

    @staticmethod
    def _lengths(tensor: Tensor, size: int) -> np.ndarray:
        data = tensor.data
        if data.dtype.kind not in _INTEGER_KINDS or tensor.shape != (size,):
            raise _refused(
                "bad_shape", f"input {tensor.name!r}: expected {size} integer lengths, shape [{size}]"
            )
        if data.size and int(data.min()) < 0:
            raise _refused("bad_shape", f"input {tensor.name!r}: lengths must be >= 0")
        return data.astype(np.int64)

"""The model metadata's inputs tell a client the truth: each datatype it lists is one the inputs take.

A sparse feature is listed as ``BYTES`` (every id, string or number, can be
sent as text and is read by the one id rule), with every datatype it takes in
``parameters.datatypes``; each of those is fed to the inputs and must score
the ids it names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kelp.consumers.ids import str_id
from kelp.serving.features import RequestParser
from kelp.serving.oip.inputs import TensorInputs
from kelp.serving.oip.tensors import DTYPES, Tensor

from .helpers import small_config


def _inputs(tmp_path: Path) -> TensorInputs:
    cfg = small_config("redis://127.0.0.1:1", tmp_path)  # never connected: the parser needs only the spec
    return TensorInputs(RequestParser(cfg.features, cfg.serving))


def _tensor(name: str, datatype: str, values: list[object]) -> Tensor:
    dtype = DTYPES[datatype]
    if dtype is None:
        data = np.empty(len(values), dtype=object)
        data[:] = [str(v).encode() for v in values]
    else:
        data = np.array(values, dtype=dtype)
    return Tensor(name, datatype, (len(values),), data)


def test_every_datatype_the_metadata_lists_is_taken(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    described = {t["name"]: t for t in inputs.metadata()}
    assert described["C3"]["datatype"] == "BYTES"  # string ids: sent as text, never hashed by the client
    assert described["dense"]["datatype"] == "FP32" and described["C3.lengths"]["datatype"] == "INT32"
    for name, tensor in described.items():
        taken = tensor["parameters"]["datatypes"]
        assert taken[0] == tensor["datatype"]
        for datatype in taken:
            if name == "dense":
                batch = inputs.batch(
                    {name: Tensor(name, datatype, (1, 2), np.ones((1, 2), DTYPES[datatype]))}
                )
                assert batch.dense.shape == (1, 2), datatype
            elif name.endswith(".lengths"):
                feature = name.removesuffix(".lengths")
                ids = _tensor(feature, "INT64", [5])
                batch = inputs.batch({feature: ids, name: _tensor(name, datatype, [1])})
                assert batch.sparse[feature].values.tolist() == [5], datatype
            else:
                batch = inputs.batch({name: _tensor(name, datatype, [5])})
                assert batch.sparse[name].values.tolist() == [5], datatype
    # BYTES ids follow the id rule: text is hashed as the sources hash it, digits are that integer.
    batch = inputs.batch({"C3": _tensor("C3", "BYTES", ["m318", "007"])})
    assert batch.sparse["C3"].values.tolist() == [str_id("m318"), 7]

"""One id rule in every format: the same logical id reaches the same uint64 row id however it arrives.

Each format is read by its real reader (CSV and Criteo TSV through
:class:`~kelp.consumers.file_source.FileSource`, msgpack single-sample and
columnar messages through :class:`~kelp.consumers.decode.Decoder`, request
bodies through serving's body decoder and
:class:`~kelp.serving.features.RequestParser`) and the resulting ids are
compared with :func:`kelp.consumers.ids.id_of`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kelp.config import (
    BatchingConfig,
    CsvMapping,
    FeatureSpec,
    FileSourceConfig,
    JsonMapping,
    ServingConfig,
    SparseFeature,
)
from kelp.consumers import criteo_feature_spec, encode_columns, encode_sample, hash_str_id
from kelp.consumers.decode import Decoder, Rec
from kelp.consumers.file_source import FileSource
from kelp.consumers.ids import MAX_ID, id_of, str_id
from kelp.consumers.json_events import MappedDecoder
from kelp.serving.body import MSGPACK, decode_body
from kelp.serving.features import RequestParser

SPEC = FeatureSpec(sparse=[SparseFeature(name="item", max_ids=3)])
DIGITS = "258029"
NUMBER = 258029
NAME = "alice"

# (text, its id): digits are the integer, anything else is hashed.
RULE: list[tuple[str, int]] = [
    (DIGITS, NUMBER),
    ("007", 7),
    ("0", 0),
    (str(MAX_ID), MAX_ID),
    (str(MAX_ID + 1), hash_str_id(str(MAX_ID + 1))),  # beyond uint64: a string like any other
    (NAME, hash_str_id(NAME)),
    ("-3", hash_str_id("-3")),
    ("12.0", hash_str_id("12.0")),
    ("0x1f", hash_str_id("0x1f")),
    (" 7", hash_str_id(" 7")),
    ("\u0663", hash_str_id("\u0663")),  # an Arabic-Indic digit: not ASCII
    ("68fd1e64", hash_str_id("68fd1e64")),  # a Criteo hex token
    ("0" * 5000 + "5", 5),  # leading zeros never matter, nor trip int()'s digit limit
    ("9" * 5000, hash_str_id("9" * 5000)),
]


def _decode(*messages: bytes) -> Any:
    chunk = Decoder(SPEC).decode([Rec("t", 0, i, m) for i, m in enumerate(messages)])
    assert not chunk.rejections, [(r.reason, r.detail) for r in chunk.rejections]
    return chunk


@pytest.mark.parametrize(("text", "want"), RULE, ids=[repr(t)[:20] for t, _ in RULE])
def test_the_rule(text: str, want: int) -> None:
    assert str_id(text) == id_of(text) == want


@pytest.mark.parametrize("bad", [-1, 2**64, True, 1.0, None, b"7"])
def test_what_is_no_id(bad: Any) -> None:
    with pytest.raises(ValueError):
        id_of(bad)


@pytest.mark.parametrize(("text", "want"), RULE, ids=[repr(t)[:20] for t, _ in RULE])
def test_msgpack_single_sample_strings_follow_the_rule(text: str, want: int) -> None:
    one = _decode(encode_sample(1, sparse={"item": text}))
    listed = _decode(encode_sample(1, sparse={"item": [text, text]}))
    assert one.values["item"].tolist() == [want]
    assert listed.values["item"].tolist() == [want, want]


@pytest.mark.parametrize(("text", "want"), RULE, ids=[repr(t)[:20] for t, _ in RULE])
def test_msgpack_columnar_strings_follow_the_rule(text: str, want: int) -> None:
    one_each = msgpack.packb({"v": 1, "batch": 2, "label": [1, 0], "sparse": {"item": [text, text]}})
    jagged = msgpack.packb(
        {
            "v": 1,
            "batch": 2,
            "label": [1, 0],
            "sparse": {"item": {"values": [text, text, text], "lengths": [2, 1]}},
        }
    )
    assert _decode(one_each).values["item"].tolist() == [want, want]
    assert _decode(jagged).values["item"].tolist() == [want] * 3


def test_the_same_id_from_every_msgpack_form_is_one_row() -> None:
    """Int or digit string, single-sample or columnar (lists, mixed, packed bin): one uint64 id."""
    messages = [
        encode_sample(1, sparse={"item": NUMBER}),
        encode_sample(1, sparse={"item": DIGITS}),
        encode_sample(1, sparse={"item": [DIGITS, NUMBER]}),
        encode_columns(np.ones(2), sparse={"item": np.array([NUMBER, NUMBER], np.uint64)}),  # packed bin
        encode_columns(np.ones(2), sparse={"item": np.array([NUMBER, NUMBER], np.uint64)}, packed=False),
        msgpack.packb({"v": 1, "batch": 2, "label": [1, 0], "sparse": {"item": [DIGITS, NUMBER]}}),
        msgpack.packb(
            {
                "v": 1,
                "batch": 1,
                "label": [1],
                "sparse": {"item": {"values": [NUMBER, DIGITS], "lengths": [2]}},
            }
        ),
    ]
    for message in messages:
        assert set(_decode(message).values["item"].tolist()) == {NUMBER}


def test_csv_and_criteo_files_follow_the_rule(tmp_path: Path) -> None:
    texts = [t for t, _ in RULE if "," not in t and t.strip() == t]
    csv_path = tmp_path / "rows.csv"
    csv_path.write_text("label,item\n" + "".join(f"1,{t}\n" for t in texts), encoding="utf-8")
    source = FileSourceConfig(
        path=csv_path, format="csv", csv=CsvMapping(label_column="label", sparse_columns={"item": "item"})
    )
    batches = list(FileSource(source, SPEC, BatchingConfig(batch_size=64), CollectorRegistry()))
    assert np.concatenate([b.sparse["item"].values for b in batches]).tolist() == [str_id(t) for t in texts]

    tsv = tmp_path / "criteo.tsv"
    tsv.write_text("".join("1" + "\t" * 13 + f"\t{t}\n" for t in texts), encoding="utf-8")
    criteo = FileSourceConfig(path=tsv, format="criteo_tsv")
    batches = list(
        FileSource(criteo, criteo_feature_spec(), BatchingConfig(batch_size=64), CollectorRegistry())
    )
    assert np.concatenate([b.sparse["C1"].values for b in batches]).tolist() == [str_id(t) for t in texts]


def _json_ids(event: dict[str, Any]) -> int:
    """The id a JSON event's ``item`` field trains (one event, one id)."""
    mapping = JsonMapping(label_field="clicked", sparse_fields={"item": "item"})
    chunk = MappedDecoder(SPEC, mapping).decode([Rec("t", 0, 0, json.dumps(event).encode())])
    return int(chunk.values["item"].tolist()[0])


def _served_ids(body: Any, msgpack_body: bool) -> list[int]:
    """The C1/C2 ids serving would look up for ``body`` sent as JSON or msgpack."""
    parser = RequestParser(SPEC, ServingConfig())
    raw = msgpack.packb(body) if msgpack_body else json.dumps(body).encode()
    decoded = decode_body(raw, MSGPACK if msgpack_body else "application/json")
    batch = parser.candidates(decoded) if "candidates" in decoded else parser.samples(decoded)
    return batch.sparse["item"].values.tolist()


@pytest.mark.parametrize("msgpack_body", [False, True], ids=["json", "msgpack"])
@pytest.mark.parametrize("value", [NUMBER, DIGITS, NAME], ids=["int", "digits", "name"])
def test_serving_scores_the_row_training_wrote(value: Any, msgpack_body: bool) -> None:
    """Every request shape that carries an id: sample, list, user, candidates row-wise and columnar."""
    want = id_of(value)
    trained = {
        "csv": str_id(str(value)),
        "msgpack": _decode(encode_sample(1, sparse={"item": value})).values["item"].tolist()[0],
        "json": _json_ids({"clicked": 1, "item": value}),
    }
    assert trained == {"csv": want, "msgpack": want, "json": want}
    bodies = [
        {"samples": [{"sparse": {"item": value}}]},
        {"samples": [{"sparse": {"item": [value, value]}}]},
        {"user": {"sparse": {"item": value}}, "candidates": [{}, {}]},
        {"candidates": [{"sparse": {"item": value}}, {"sparse": {"item": value}}]},
        {"candidates": [{"sparse": {"item": value}}, {"sparse": {"item": [value]}}]},
        {"candidates": {"count": 2, "sparse": {"item": [value, value]}}},
        {
            "candidates": {
                "count": 2,
                "sparse": {"item": {"values": [value, value, value], "lengths": [1, 2]}},
            }
        },
    ]
    for body in bodies:
        assert set(_served_ids(body, msgpack_body)) == {want}, body


def test_a_string_with_no_utf8_is_a_bad_id_not_a_crash() -> None:
    """A lone surrogate (what a lenient JSON parser makes of ``"\\ud800"``) has no bytes to hash."""
    from kelp.consumers.columns import FieldLayout, ids_from_list
    from kelp.consumers.single import read_singles

    lone = "\ud800"
    with pytest.raises(ValueError):
        id_of(lone)
    ids, bad = ids_from_list([lone, DIGITS])
    assert bad.tolist() == [True, False] and ids[1] == NUMBER
    cols, failures = read_singles(FieldLayout.of(SPEC), [{"label": 1, "sparse": {"item": [lone]}}], [0])
    assert cols.labels.size == 0 and [f.reason for _, f in failures] == ["bad_id"]

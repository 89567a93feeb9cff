"""``kelp store stats`` / ``kelp store inspect`` against a real Redis."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pytest

from kelp.cli.commands import store_cmd
from kelp.config import StoreConfig, TableSpec
from kelp.consumers.codec import hash_str_id
from kelp.consumers.ids import id_of
from kelp.errors import UserError
from kelp.store import build_store


def main(argv: list[str]) -> int:
    """The store sub-command alone (the full CLI is tested by the daemon's tests)."""
    parser = argparse.ArgumentParser(prog="kelp")
    store_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UserError as exc:
        print(f"kelp: error: {exc}", file=sys.stderr)
        return 2


pytestmark = pytest.mark.integration


def test_stats_and_inspect(tmp_path, redis_url: str, capsys) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "kelp.yaml"
    config.write_text(
        "deployment: clitest\n"
        "source: {kind: file, path: x.tsv, format: criteo_tsv}\n"
        f"store: {{backend: redis, urls: ['{redis_url}']}}\n"
        "features: {tables: [{name: ads, dim: 2}]}\n"
    )
    cfg = StoreConfig(backend="redis", urls=[redis_url])
    with build_store(cfg, [TableSpec(name="ads", dim=2)], "clitest") as s:
        rows, state = np.array([[1.5, -2.0]], np.float32), np.array([0.25], np.float32)
        s.push("ads", np.array([7], np.uint64), rows, state)
    assert main(["store", "inspect", "--config", str(config), "ads", "7", "8"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[0]["stored"] and lines[0]["row"] == [1.5, -2.0] and lines[0]["state"] == 0.25
    assert lines[0]["updated_s"] > 0
    assert not lines[1]["stored"]
    assert main(["store", "stats", "--config", str(config)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["backend"] == "redis" and stats["shards"][0]["keys"] == 2  # the row's bucket + layout marker
    assert main(["store", "inspect", "--config", str(config), "nope", "1"]) == 2
    assert "unknown table" in capsys.readouterr().err


@pytest.mark.parametrize("topology", ["standalone", "cluster"])
def test_stats_count_this_deployments_rows_and_counters(  # type: ignore[no-untyped-def]
    tmp_path, topology: str, redis_url: str, clean_redis_cluster, capsys
) -> None:
    backend, urls = (
        ("redis", [redis_url]) if topology == "standalone" else ("redis-cluster", clean_redis_cluster.urls)
    )
    config = tmp_path / "kelp.yaml"
    config.write_text(
        f"deployment: counted-{topology}\n"
        "source: {kind: file, path: x.tsv, format: criteo_tsv}\n"
        f"store: {{backend: {backend}, urls: {json.dumps(urls)}}}\n"
        "publisher: {enabled: false}\n"
        "features: {tables: [{name: ads, dim: 2, admission: {min_count: 2}}]}\n"
    )
    cfg = StoreConfig(backend=backend, urls=urls)
    spec = TableSpec(name="ads", dim=2, admission={"min_count": 2})
    ids = np.arange(1, 6, dtype=np.uint64)
    with (
        build_store(cfg, [spec], f"counted-{topology}") as mine,
        build_store(cfg, [spec], "someone-else") as theirs,
    ):
        mine.pull("ads", ids)
        mine.pull("ads", ids[:3])  # admits 1..3; 4 and 5 keep a counter
        theirs.pull("ads", ids)
        theirs.pull("ads", ids)  # another deployment's rows: not ours to count
    assert main(["store", "stats", "--config", str(config)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["rows"] == {"ads": 3}
    assert stats["admission_counters"] == {"ads": 2}


def test_stats_on_a_memory_store_says_it_cannot_see_the_trainer(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "kelp.yaml"
    config.write_text("source: {kind: file, path: x.tsv, format: criteo_tsv}\npublisher: {enabled: false}\n")
    assert main(["store", "stats", "--config", str(config)]) == 2
    assert "cannot see" in capsys.readouterr().err


def test_inspect_finds_the_row_a_source_stored_for_a_string_id(tmp_path, redis_url: str, capsys) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "kelp.yaml"
    config.write_text(
        "deployment: clitest-strings\n"
        "source: {kind: file, path: x.tsv, format: criteo_tsv}\n"
        f"store: {{backend: redis, urls: ['{redis_url}']}}\n"
        "features: {tables: [{name: ads, dim: 2}]}\n"
    )
    cfg = StoreConfig(backend="redis", urls=[redis_url])
    with build_store(cfg, [TableSpec(name="ads", dim=2)], "clitest-strings") as s:
        # The ids a source stores for the event values "m318" and 7: the one id rule, as the trainer has it.
        ids = np.array([id_of("m318"), id_of(7)], np.uint64)
        rows = np.array([[0.5, 1.0], [2.0, -3.0]], np.float32)
        s.push("ads", ids, rows, np.zeros(2, np.float32))
    assert main(["store", "inspect", "--config", str(config), "ads", "m318", "007", "m319"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [line["given"] for line in lines] == ["m318", "007", "m319"]
    assert lines[0]["id"] == hash_str_id("m318") and lines[0]["stored"] and lines[0]["row"] == [0.5, 1.0]
    assert lines[1]["id"] == 7 and lines[1]["stored"] and lines[1]["row"] == [2.0, -3.0]
    assert lines[2]["id"] == hash_str_id("m319") and not lines[2]["stored"]

"""A trainer rank's host cut off from its group, on the network-namespace rig (real Kafka and Redis).

Two rank hosts run ``kelp train --nnodes ...`` (one torchrun agent each, a
c10d rendezvous served by the agent on the first host) and a services host
runs Apache Kafka and redis-server (``kelp.bench.scale``'s setup). Records
come in lots: the second is produced only once rank 1's host is cut off, so
the group is mid-run at the cut however fast it trains. What must hold:

* a fixed-size group (``--nnodes 2``), rank 1 cut off for a while and healed:
  rank 0 stops within ``trainer.distributed.timeout_s`` (plus a margin for a
  loaded machine), the group of 2 forms again after the heal, and every record
  is committed;
* an elastic group (``--nnodes 1:2``), rank 1 never healed: rank 0 goes on
  alone as a world of 1 and commits every record; then a fresh agent on the
  lost host (a restarted pod) joins, and the group of 2 trains the rest;
* both: every round of the rendezvous forms at its first try, committed
  offsets never go backwards, and every row the records touched is in Redis
  (admission is off in criteo-synth: every id gets a row).

Where network namespaces cannot be made, the rig tests skip with one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from kelp.bench.scale import (
    PARTITIONS,
    OffsetWatch,
    WorkerWatch,
    _children,
    _Setup,
    _stop,
    kelp_train_on_hosts,
)
from kelp.bench.synth import CriteoSynth
from kelp.bench.train import PER_MESSAGE
from kelp.consumers.codec import encode_columns
from kelp.consumers.criteo import SPARSE_NAMES

from .test_train_daemon import _stored_rows

TIMEOUT_S = 8.0
"""``trainer.distributed.timeout_s``: short, so a cut is noticed soon."""
STOP_MARGIN_S = 20.0
"""Beyond the timeout: the failing collective's unwinding and the process exit, on a loaded machine."""
PART = 6
"""Records per lot (256 samples each)."""
_PORTS = iter(range(29610, 29700, 2))


@pytest.fixture(scope="module")
def hosts() -> Iterator[_Setup]:
    from kelp.harness.hosts import available

    ok, why = available()
    if not ok:
        pytest.skip(f"host rig unavailable here: {why}")
    with _Setup(0) as made:
        yield made


def _parts(seed: int, parts: int) -> tuple[list[list[tuple[bytes, int]]], dict[str, np.ndarray]]:
    """``parts`` lots of ``PART`` criteo-synth records, and the ids each sparse table sees in them."""
    cols = CriteoSynth(seed=seed).batch(parts * PART * PER_MESSAGE)
    messages = []
    for lo in range(0, cols.size, PER_MESSAGE):
        hi = lo + PER_MESSAGE
        sparse = {name: cols.sparse[lo:hi, i] for i, name in enumerate(SPARSE_NAMES)}
        encoded = encode_columns(cols.label[lo:hi], cols.dense[lo:hi], sparse, cols.ts[lo:hi])
        messages.append((encoded, hi - lo))
    ids = {name: np.unique(cols.sparse[:, i]) for i, name in enumerate(SPARSE_NAMES)}
    return [messages[i * PART : (i + 1) * PART] for i in range(parts)], ids


def _start(
    setup: _Setup, tmp_path: Path, first: list[tuple[bytes, int]], nnodes: str, rdzv_conf: str = ""
) -> tuple[Any, list[Any], int]:
    """A topic of this test's own with ``first`` in it, the config (small batches, a short collective
    timeout), the agents, and the rendezvous port."""
    setup.topic = f"cut-{uuid.uuid4().hex[:6]}"
    setup.kafka.create_topic(setup.topic, PARTITIONS)
    setup.produce(first)
    config, cfg = setup.config(tmp_path, "cut", TIMEOUT_S)
    cfg.batching.batch_size = 512
    cfg.trainer.distributed.idle_wait_s = 0.25
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    port = next(_PORTS)
    procs = kelp_train_on_hosts(setup.ranks, config, nnodes=nnodes, port=port, tag="t", rdzv_conf=rdzv_conf)
    return cfg, procs, port


def _wait(what: str, predicate: Any, procs: list[Any], logs: Path, timeout_s: float = 240) -> float:
    """Poll ``predicate`` until true; the seconds it took. Fails naming ``what`` and the logs' tails."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s or any(p.poll() is not None for p in procs):
            tails = "\n".join(
                f"--- {f.name}\n{f.read_text(errors='replace')[-2500:]}" for f in logs.glob("t-*")
            )
            pytest.fail(
                f"{what}: not within {timeout_s:g} s (exit codes {[p.poll() for p in procs]})\n{tails}"
            )
        time.sleep(0.25)
    return time.monotonic() - started


def _kill(procs: list[Any]) -> None:
    """SIGKILL what is left of the agents and their workers."""
    for proc in procs:
        if proc.poll() is None:
            for pid in _children(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait(10)


def _assert_formed_at_first_try(setup: _Setup, logs: Path) -> None:
    """Every round formed at its first try: no rank met another round's stale address, or waited
    for a peer that had joined the round under another name."""
    for host in setup.ranks:
        log = (logs / f"t-{host.name}.log").read_text(errors="replace")
        assert "connectFullMesh failed" not in log and "wait timeout after" not in log, log[-3000:]


def _assert_rows_stored(setup: _Setup, cfg: Any, ids: dict[str, np.ndarray]) -> None:
    for table, want in ids.items():
        stored = _stored_rows(setup.redis_url, cfg.deployment, table)
        missing = set(want.tolist()) - set(stored)
        assert not missing, f"{table}: {len(missing)} of {len(want)} rows never reached Redis"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--nnodes", "2:1"], "--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, got '2:1'"),
        (["--nnodes", "1:x"], "--nnodes: expected N or MIN:MAX"),
        (["--nnodes", "1:2"], "--nnodes needs --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "1:2", "--rdzv-endpoint", "host"], "--nnodes needs --rdzv-endpoint HOST:PORT"),
        (["--rdzv-endpoint", "host:29400"], "--rdzv-endpoint needs --nnodes"),
        (["--local-addr", "10.0.0.1"], "--local-addr needs --nnodes"),
    ],
)
def test_group_launch_options_are_checked_before_anything_starts(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from kelp.cli.main import main

    config = Path(__file__).resolve().parents[2] / "examples" / "criteo-synth.yaml"
    assert main(["train", "--config", str(config), *argv]) == 2
    assert error in capsys.readouterr().err


_FAILING_COLLECTIVE = """
import sys
from pathlib import Path
from prometheus_client import CollectorRegistry
from kelp.config import DistributedConfig
from kelp.daemon.group import TrainingGroup, World
from kelp.trainer.metrics import TrainerMetrics

group = TrainingGroup(World(rank=1, size=2), DistributedConfig(), TrainerMetrics(CollectorRegistry()))

def lost_peer():
    raise RuntimeError("Timed out waiting 8000ms for recv operation to complete")

try:
    group._collective("all-reduce", lost_peer)
finally:
    Path(sys.argv[1]).write_text("a final write-back ran")
"""


def test_a_rank_whose_collective_fails_exits_without_writing_anything_more(tmp_path: Path) -> None:
    """What stands for the hot tier's final write-back (a ``finally`` on the way out) never runs."""
    marker = tmp_path / "written"
    done = subprocess.run(
        [sys.executable, "-c", _FAILING_COLLECTIVE, str(marker)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "kelp: error: rank 1: the trainer group's all-reduce failed (Timed out waiting" in done.stderr
    assert not marker.exists()


@pytest.mark.integration
def test_a_cut_off_rank_stops_within_the_timeout_and_the_group_rejoins(hosts: _Setup, tmp_path: Path) -> None:
    (first, second), ids = _parts(seed=11, parts=2)
    cfg, procs, _ = _start(hosts, tmp_path, first, "2")
    offsets = OffsetWatch(hosts.kafka.bootstrap, cfg.source.group_id, hosts.topic)
    rank1 = hosts.ranks[1]
    try:
        _wait("the first half committed", lambda: offsets.total() >= PART, procs, tmp_path)
        workers = WorkerWatch(procs)
        hosts.rig.partition(rank1)
        hosts.produce(second)
        stopped_s = _wait(
            "rank 0's worker to stop", lambda: workers.note() or 0 in workers.stopped, procs, tmp_path
        )
        hosts.rig.heal(rank1)
        log0 = tmp_path / f"t-{hosts.ranks[0].name}.log"
        rejoined = lambda: log0.read_text(errors="replace").count("rank 0 of 2 joined the trainer group") >= 2  # noqa: E731
        rejoined_s = _wait("the group of 2 to form again", rejoined, procs, tmp_path)
        _wait("every record committed", lambda: offsets.total() >= 2 * PART, procs, tmp_path)
        _stop(procs)
    finally:
        hosts.rig.heal(rank1)
        offsets.close()
        _kill(procs)
    print(
        f"rank 0 stopped {stopped_s:.1f} s after the cut; the group formed {rejoined_s:.1f} s after the heal"
    )
    assert stopped_s <= TIMEOUT_S + STOP_MARGIN_S
    _assert_formed_at_first_try(hosts, tmp_path)
    assert offsets.regressions == []
    assert offsets.total() == 2 * PART
    _assert_rows_stored(hosts, cfg, ids)


@pytest.mark.integration
def test_the_surviving_rank_goes_on_alone_while_a_host_stays_away(hosts: _Setup, tmp_path: Path) -> None:
    """Elastic: rank 0 trains alone while rank 1's host is cut off; a fresh agent on that host (a
    restarted pod) then joins the running group, whose agent restarted for a failure and so counts
    its attempts differently."""
    (first, second, third), ids = _parts(seed=12, parts=3)
    # The lost host counts as gone after 2 missed heartbeats of 2 s; the survivor then waits 1 s for more.
    conf = "last_call_timeout=1,keep_alive_interval=2,keep_alive_max_attempt=2"
    cfg, procs, port = _start(hosts, tmp_path, first, "1:2", rdzv_conf=conf)
    offsets = OffsetWatch(hosts.kafka.bootstrap, cfg.source.group_id, hosts.topic)
    rank1 = hosts.ranks[1]
    try:
        _wait("the first lot committed", lambda: offsets.total() >= PART, procs, tmp_path)
        hosts.rig.partition(rank1)
        hosts.produce(second)
        alone_s = _wait(
            "rank 0 alone committing every record", lambda: offsets.total() >= 2 * PART, procs[:1], tmp_path
        )
        _kill(procs[1:])  # the lost host's agent is gone for good: nothing of it writes after the heal
        hosts.rig.heal(rank1)
        procs[1:] = kelp_train_on_hosts(
            hosts.ranks, tmp_path / "kelp.yaml", nnodes="1:2", port=port, tag="t", rdzv_conf=conf, nodes=[1]
        )
        log1 = tmp_path / f"t-{rank1.name}.log"
        joined = lambda: "rank 1 of 2 joined the trainer group" in log1.read_text(errors="replace")  # noqa: E731
        rejoined_s = _wait("the new agent to join the group", joined, procs, tmp_path)
        hosts.produce(third)
        _wait(
            "every record committed by the group of 2", lambda: offsets.total() >= 3 * PART, procs, tmp_path
        )
        _stop(procs)
    finally:
        _kill(procs)
        hosts.rig.heal(rank1)
        offsets.close()
    _assert_formed_at_first_try(hosts, tmp_path)
    print(f"rank 0 alone had every record {alone_s:.1f} s after the cut; rank 1 back in {rejoined_s:.1f} s")
    assert offsets.regressions == []
    assert offsets.total() == 3 * PART
    _assert_rows_stored(hosts, cfg, ids)

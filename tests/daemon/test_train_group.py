"""Several trainers, one model: ``kelp train`` ranks under torchrun, on real Tansu and Redis.

Each test launches ``python -m torch.distributed.run --standalone
--nproc-per-node 2 -m kelp.cli train`` (gloo on CPU) and watches the Kafka
group's committed offsets. What must hold:

* committed offsets add up to every record (nothing skipped);
* the dense parameters are bitwise equal on both ranks (the final checkpoint
  records each rank's digest);
* uneven partitions do not hang anybody;
* kill -9 of one rank: torchrun restarts the group and every record is
  still committed in the end (records after the last commit retrained).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaProducer

from kelp.config import KelpConfig, load_config
from kelp.consumers.produce import file_messages, produce
from kelp.harness import KafkaBroker, free_port
from kelp.trainer.checkpoint import read_checkpoint

from .conftest import (
    CRITEO,
    CRITEO_ROWS,
    PARTITIONS,
    base_config,
    group_offsets,
    on_kafka,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration


def _group_config(tmp_path: Path, kafka_broker: KafkaBroker, topic: str, redis_url: str) -> Path:
    cfg: KelpConfig = on_kafka(
        base_config(tmp_path, checkpoint_every_steps=10), kafka_broker, topic, redis_url
    )
    cfg.batching.batch_size = 64
    cfg.trainer.torch_threads = 1  # two ranks on two cores
    cfg.trainer.distributed.timeout_s = 30
    cfg.metrics.port = free_port(also_free_offset=1)  # rank 1 serves on port + 1
    return write_config(cfg, tmp_path / "kelp.yaml")


def _launch(config: Path, log: Path, max_restarts: int = 0) -> subprocess.Popen[bytes]:
    """``kelp train --nproc 2`` (torchrun's launcher in-process), output into ``log``, in its own session."""
    with log.open("wb") as out:
        command = ["train", "--config", str(config), "--nproc", "2", "--max-restarts", str(max_restarts)]
        return subprocess.Popen(
            [sys.executable, "-m", "kelp.cli", *command],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            start_new_session=True,
        )


def _all_committed(kafka_broker: KafkaBroker, group: str, topic: str, proc: subprocess.Popen[bytes]) -> bool:
    """True once the group committed every record; also True if the launcher died (checked after)."""
    return sum(group_offsets(kafka_broker, group, topic)) == CRITEO_ROWS or proc.poll() is not None


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 90) -> int:
    """SIGTERM the launcher (torchrun's agent forwards it to the ranks, which drain); its exit status."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _final_checkpoint(cfg: KelpConfig) -> dict:
    pointer = json.loads((cfg.trainer.checkpoint_dir / "latest").read_text())
    _, meta = read_checkpoint(cfg.trainer.checkpoint_dir / pointer["file"])
    return meta


def _assert_group_checkpoint(cfg: KelpConfig, committed: list[int], log: str) -> None:
    meta = _final_checkpoint(cfg)
    ranks = meta["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1], ranks
    assert len({r["dense_sha256"] for r in ranks}) == 1, f"dense replicas differ: {ranks}\n{log[-3000:]}"
    trained = {o["partition"]: o["offset"] for o in meta["offsets"]}
    assert [trained.get(p, 0) for p in range(PARTITIONS)] == committed


def _produce_skewed(kafka_broker: KafkaBroker, topic: str, share_on_0: float) -> None:
    """The fixture's rows, ``share_on_0`` of them on partition 0 and the rest on partition 1."""
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all", linger_ms=20)
    try:
        for i, (value, _) in enumerate(file_messages(CRITEO, "criteo_tsv", 1)):
            partition = 0 if (i % 100) < share_on_0 * 100 else 1
            producer.send(topic, value, partition=partition)
        producer.flush()
    finally:
        producer.close()


def _train_group_to_the_end(
    tmp_path: Path, kafka_broker: KafkaBroker, topic: str, redis_url: str
) -> tuple[KelpConfig, list[int]]:
    """``kelp train --nproc 2`` until the group committed every record, then SIGTERM (exit 0).

    Returns the config and the committed offsets; checks both ranks drained and
    the final checkpoint's dense digests are equal.
    """
    config = _group_config(tmp_path, kafka_broker, topic, redis_url)
    cfg = load_config(config)
    log_path = tmp_path / "group.log"
    proc = _launch(config, log_path)
    try:
        wait_for(lambda: _all_committed(kafka_broker, cfg.source.group_id, topic, proc), 150, "every record")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert _stop(proc) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = log_path.read_text()
    assert "(rank 0 of 2)" in log and "(rank 1 of 2)" in log, log[-3000:]
    committed = group_offsets(kafka_broker, cfg.source.group_id, topic)
    _assert_group_checkpoint(cfg, committed, log)
    return cfg, committed


def test_two_ranks_train_the_topic_with_bitwise_equal_dense_replicas(
    tmp_path: Path, kafka_broker: KafkaBroker, criteo_topic: str, redis_url: str
) -> None:
    _, committed = _train_group_to_the_end(tmp_path, kafka_broker, criteo_topic, redis_url)
    assert sum(committed) == CRITEO_ROWS


def test_uneven_partitions_finish_without_a_hang(
    tmp_path: Path, kafka_broker: KafkaBroker, redis_url: str
) -> None:
    topic = f"skewed-{time.monotonic_ns()}"
    kafka_broker.create_topic(topic, partitions=PARTITIONS)
    _produce_skewed(kafka_broker, topic, share_on_0=0.9)
    _, committed = _train_group_to_the_end(tmp_path, kafka_broker, topic, redis_url)
    assert committed == [1800, 200]


def _workers(proc: subprocess.Popen[bytes]) -> list[int]:
    """The rank processes torchrun started (its direct children), oldest first."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(proc.pid)], check=False, capture_output=True, text=True
    )
    return sorted(int(pid) for pid in out.stdout.split())


def test_kill_9_of_one_rank_restarts_the_group_and_loses_nothing(
    tmp_path: Path, kafka_broker: KafkaBroker, redis_url: str
) -> None:
    topic = f"killed-{time.monotonic_ns()}"
    kafka_broker.create_topic(topic, partitions=PARTITIONS)
    config = _group_config(tmp_path, kafka_broker, topic, redis_url)
    cfg = load_config(config)
    log_path = tmp_path / "group.log"
    proc = _launch(config, log_path, max_restarts=3)
    killed = threading.Event()

    def messages():  # the second half waits for the kill, so the restarted group has records to train
        for i, message in enumerate(file_messages(CRITEO, "criteo_tsv", 1)):
            if i == CRITEO_ROWS // 2:
                killed.wait(120)
            yield message

    producer = threading.Thread(  # records keep arriving while a rank dies
        target=produce,
        args=({"bootstrap_servers": kafka_broker.bootstrap}, topic, messages()),
        kwargs={"rate": 300.0, "quiet": True},
        daemon=True,
    )
    try:
        producer.start()
        seen: list[int] = []

        def committed() -> int:
            seen.append(sum(group_offsets(kafka_broker, cfg.source.group_id, topic)))
            return seen[-1]

        wait_for(lambda: committed() >= 300 or proc.poll() is not None, 120, "300 records committed")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        victim = _workers(proc)[-1]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        killed.set()
        rejoined = lambda: log_path.read_text().count("joined the trainer group") >= 4  # noqa: E731
        wait_for(rejoined, 90, "the group to restart")
        restarted_s = time.monotonic() - killed_at
        wait_for(lambda: committed() == CRITEO_ROWS or proc.poll() is not None, 150, "every record committed")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert _stop(proc) == 0, log_path.read_text()[-3000:]
    finally:
        killed.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        producer.join(30)
    log = log_path.read_text()
    assert seen == sorted(seen), f"committed offsets went backwards: {seen}"
    assert restarted_s < 90
    final = group_offsets(kafka_broker, cfg.source.group_id, topic)
    assert sum(final) == CRITEO_ROWS
    _assert_group_checkpoint(cfg, final, log)


def test_two_torchrun_agents_meet_through_a_c10d_rendezvous(
    tmp_path: Path, kafka_broker: KafkaBroker, criteo_topic: str, redis_url: str
) -> None:
    """What the Helm chart runs per pod: one torchrun agent per node, ``--nnodes=2`` and a c10d endpoint.

    Both "pods" are on loopback here; ``--local-addr`` orders the node ranks as in the chart.
    """
    config = _group_config(tmp_path, kafka_broker, criteo_topic, redis_url)
    cfg = load_config(config)
    endpoint = f"127.0.0.1:{free_port()}"
    agents = []
    for node, addr in enumerate(("127.0.0.1", "localhost")):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
        command += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=kelp-test"]
        command += [f"--local-addr={addr}", "--monitor-interval=0.5"]
        command += ["-m", "kelp.cli", "train", "--config", str(config)]
        with (tmp_path / f"node{node}.log").open("wb") as out:
            agents.append(
                subprocess.Popen(
                    command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    # One host plays two pods: each "pod" needs its own metrics port.
                    env={**os.environ, "OMP_NUM_THREADS": "1", "KELP_METRICS__PORT": str(free_port())},
                    start_new_session=True,
                )
            )
    logs = lambda: "".join((tmp_path / f"node{n}.log").read_text() for n in (0, 1))  # noqa: E731
    try:
        wait_for(
            lambda: _all_committed(kafka_broker, cfg.source.group_id, criteo_topic, agents[0]),
            150,
            "every record",
        )
        assert all(a.poll() is None for a in agents), logs()[-3000:]
        for agent in agents:
            agent.send_signal(signal.SIGTERM)
        for agent in agents:
            agent.wait(timeout=90)
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
    assert "rank 0 of 2 joined" in logs() and "rank 1 of 2 joined" in logs(), logs()[-3000:]
    committed = group_offsets(kafka_broker, cfg.source.group_id, criteo_topic)
    assert sum(committed) == CRITEO_ROWS
    _assert_group_checkpoint(cfg, committed, logs())

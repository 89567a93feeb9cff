"""The trainer group's pieces that need no second process: torchrun's env, a world of 1, the rank label."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from kelp.config import DistributedConfig
from kelp.daemon.group import TrainingGroup, launched_world
from kelp.errors import KelpError
from kelp.metrics import LabelledRegistry
from kelp.trainer.metrics import TrainerMetrics


def test_launched_world_reads_torchruns_environment() -> None:
    world = launched_world({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "3"})
    assert (world.rank, world.local_rank, world.size) == (2, 0, 3)
    assert launched_world({}).size == 1  # a plain process is rank 0 of 1


@pytest.mark.parametrize("env", [{"RANK": "3", "WORLD_SIZE": "2"}, {"RANK": "x", "WORLD_SIZE": "2"}])
def test_a_broken_torchrun_environment_is_one_clear_error(env: dict[str, str]) -> None:
    with pytest.raises(KelpError, match="torchrun environment"):
        launched_world(env)


def test_a_world_of_one_exchanges_nothing_and_leaves_gradients_alone() -> None:
    group = TrainingGroup(launched_world({}), DistributedConfig(), TrainerMetrics(CollectorRegistry()))
    model = torch.nn.Linear(3, 1)
    model(torch.ones(2, 3)).sum().backward()
    before = model.weight.grad.clone()
    group.start(model, torch.device("cpu"))
    agreed = group.exchange(2, stop=True, exhausted=False, checkpoint=False)
    assert (agreed.samples, agreed.stop, agreed.exhausted) == (2, True, False)
    assert torch.equal(model.weight.grad, before)
    assert group.gather({"a": 1}) == [{"a": 1}] and group.is_leader


def test_every_served_series_carries_the_rank_label() -> None:
    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry)
    metrics.steps.inc()
    text = generate_latest(LabelledRegistry(registry, {"rank": "1"})).decode()
    assert 'kelp_trainer_steps_total{rank="1"} 1.0' in text
    assert 'kelp_trainer_world_size{rank="1"}' in text

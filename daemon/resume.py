"""Where a trainer's dense state starts: the latest checkpoint, read by the leader and shared.

Alone, the trainer restores its own checkpoint. In a group only rank 0 reads
one (each pod may have its own volume), and :class:`StartState` travels to
every rank in one broadcast, dense tensors included, so all ranks begin equal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kelp.trainer.checkpoint import load_latest
from kelp.trainer.fingerprint import Fingerprint
from kelp.trainer.step import TrainStep

__all__ = ["StartState", "adopt", "leader_start"]

log = logging.getLogger("kelp.train")


@dataclass
class StartState:
    """The step and trained-through offsets to continue from; the dense state when shared with followers."""

    step: int = 0
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    path: str | None = None
    created_at: float | None = None
    model: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None


def leader_start(
    checkpoint_dir: Path,
    step: TrainStep,
    config_hash: str,
    *,
    share: bool,
    fingerprint: Fingerprint | None = None,
    accept_model_change: bool = False,
) -> StartState:
    """Restore the latest checkpoint into ``step`` (if any); with ``share``, carry the dense state along.

    ``fingerprint`` lets a refusal name the part that differs, and
    ``accept_model_change`` (``trainer.accept_model_change``) resume past a
    deliberate model code change; what was accepted is logged as a warning.
    """
    info = load_latest(
        checkpoint_dir,
        step.model,
        step.optimizer,
        expected_config_hash=config_hash,
        fingerprint=fingerprint,
        accept_model_change=accept_model_change,
    )
    if info is not None and info.accepted_changes:
        log.warning(
            "resuming %s written by other model code (trainer.accept_model_change): %s; remove the "
            "setting once the next checkpoint is written",
            info.path.name,
            "; ".join(info.accepted_changes),
        )
    start = StartState()
    if info is not None:
        log.info("resumed dense model from %s (step %d)", info.path.name, info.step)
        start = StartState(info.step, dict(info.offsets), str(info.path), info.created_at)
    else:
        log.info("no checkpoint in %s: starting a fresh model", checkpoint_dir)
    if share:  # followers copy it; the leader's own fresh model is the group's start too
        start.model = {k: v.detach().to("cpu") for k, v in step.model.state_dict().items()}
        start.optimizer = step.optimizer.state_dict()
    return start


def adopt(start: StartState, step: TrainStep, *, is_leader: bool) -> None:
    """A follower loads the leader's dense model and optimizer state (the leader already has them)."""
    if is_leader or start.model is None:
        return
    step.model.load_state_dict(start.model)
    if start.optimizer is not None and start.optimizer["state"]:
        step.optimizer.load_state_dict(start.optimizer)

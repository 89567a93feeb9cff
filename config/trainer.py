"""The trainer's slice: model, device, optimizers, checkpoints, pipeline depths and budgets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from kelp.config.base import StrictModel

__all__ = ["MODEL_NAMES", "DenseOptimizerSpec", "DistributedConfig", "SparseOptimizerSpec", "TrainerConfig"]

MODEL_NAMES = ("dlrm-small", "dcn-v2", "deepfm")
"""The built-in models' short names (a test keeps this equal to ``kelp.trainer.models.MODELS``)."""

_MODEL_REFERENCE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class SparseOptimizerSpec(StrictModel):
    kind: Literal["rowwise_adagrad"] = "rowwise_adagrad"
    lr: float = Field(0.05, gt=0)
    eps: float = Field(1e-8, gt=0)
    initial_accumulator: float = Field(0.0, ge=0)


class DenseOptimizerSpec(StrictModel):
    kind: Literal["adam", "adagrad", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)


class DistributedConfig(StrictModel):
    """How ranks launched by ``torchrun`` (``WORLD_SIZE`` > 1) form one process group.

    The world itself (rank, world size, rendezvous) comes from ``torchrun``'s
    environment, never from this file, so one config serves every rank.
    """

    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="Collective backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl."
    )
    timeout_s: float = Field(
        120.0,
        gt=0,
        description="A collective that waits longer than this fails the rank (a dead or stuck peer), "
        "so torchrun restarts the group instead of hanging.",
    )
    dense_lr_scaling: Literal["linear", "none"] = Field(
        "linear",
        description="A group step averages the dense gradient over every rank's batch, so N ranks take N "
        "times fewer dense steps per record: linear multiplies dense_optimizer.lr by the world size "
        "(measured on criteo-synth: it recovers most of the AUC that larger steps lose); none keeps it.",
    )
    idle_wait_s: float = Field(
        0.25,
        gt=0,
        le=5,
        description="While no rank has a batch, ranks meet this often to agree on stop and checkpoints.",
    )


class TrainerConfig(StrictModel):
    model: str = Field(
        "dlrm-small",
        description="A built-in model: dlrm-small (concatenation, the benchmark reference), dcn-v2 (cross "
        "network) or deepfm (factorization machine + MLP; needs one dim for every table); or your own, as "
        "an import reference package.module:attr found on the Python path (docs/models.md). Hazard: the "
        "trainer and every serving replica must have the same source, or replicas refuse its snapshots.",
        json_schema_extra={"pattern": f"^({'|'.join(MODEL_NAMES)}|{_MODEL_REFERENCE.pattern[1:-1]})$"},
    )
    model_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the model's factory, attr(spec, **model_args); JSON values only. "
        "Built-ins also get bottom_mlp and top_mlp (a model_args key overrides them).",
    )
    seed: int | None = Field(
        0,
        ge=0,
        description="Seeds the dense model's initial weights, so two runs of one config start alike. "
        "None: fresh random weights every start (a resumed run uses its checkpoint either way).",
    )
    bottom_mlp: list[int] = Field(default_factory=lambda: [64, 16], min_length=1)
    top_mlp: list[int] = Field(default_factory=lambda: [256, 64], min_length=1)
    device: str = Field("auto", description="auto (cuda when available, else cpu), cpu, cuda or cuda:N.")
    sparse_optimizer: SparseOptimizerSpec = Field(default_factory=SparseOptimizerSpec)
    dense_optimizer: DenseOptimizerSpec = Field(default_factory=DenseOptimizerSpec)
    checkpoint_dir: Path | None = Field(
        None,
        description="Dense checkpoints (safetensors). Default: runs/<deployment>/checkpoints next to the "
        "config file, so two deployments never resume each other's model.",
    )
    accept_model_change: bool = Field(
        False,
        description="Resume from a checkpoint written by other model code (model source, class or "
        "trainer.model/model_args) when its parameter names and shapes still match. Off: such a "
        "checkpoint is refused, naming the part that differs. Set it for the one start after a deliberate "
        "model change (KELP_TRAINER__ACCEPT_MODEL_CHANGE=true), then remove it: the next checkpoint "
        "records the new code. A changed feature/table layout or parameter shape is always refused.",
    )
    checkpoint_every_steps: int = Field(500, ge=1)
    max_model_error_batches: int = Field(
        3,
        ge=1,
        description="Batches in a row on which the model raises on every sample before kelp train stops "
        "with one line (a broken model rather than a bad sample). Such batches are held uncommitted, never "
        "dead-lettered, so they are read again once the model is fixed. A model that raises on some samples "
        "only trains on the others; those are dead-lettered as model_error (docs/trainer.md).",
    )
    checkpoint_every_s: float = Field(60.0, gt=0)
    prefetch_batches: int = Field(
        2, ge=0, le=16, description="Batches whose rows are pulled ahead; 0 = strictly sequential steps."
    )
    push_queue_batches: int = Field(
        2, ge=1, le=16, description="Write-behind depth: trained batches whose pushes may still be in flight."
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Intra-op threads for CPU training. Default: one core fewer than the machine has when "
        "prefetching (the prefetch and push threads need a core), else all.",
    )
    max_store_outage_s: float = Field(
        60.0,
        gt=0,
        description="A store outage during the run is retried this long, then the trainer exits non-zero "
        "(at start-up, startup_timeout_s applies instead).",
    )
    startup_timeout_s: float = Field(
        10.0,
        gt=0,
        description="At start-up, the store, the snapshot channel's Redis and the Kafka bootstrap servers "
        "must answer within this long, else `kelp train` exits with one line naming the endpoint. "
        "Hazard: too short where Redis or Kafka start together with the trainer (Kubernetes restarts it).",
    )
    eval_window_batches: int = Field(50, ge=1, description="Window of the windowed progressive AUC.")
    log_every_s: float = Field(
        10.0, gt=0, description="A progress line at least this often (and at every 5% of a file source)."
    )
    progress_every_s: float = Field(
        10.0,
        gt=0,
        description="A point of the run's learning record (checkpoint_dir/progress.jsonl, drawn by "
        "kelp report) at least this often, and at every 1% of a file source.",
    )
    progress_every_samples: int | None = Field(
        None,
        ge=1,
        description="A point of the learning record also every this many trained samples. Unset (the "
        "default): adaptive, a point whenever the samples trained have grown by 5% since the last point "
        "(about 47 points per tenfold), so a replay over before progress_every_s still draws a curve and a "
        "long run's points thin out to the progress_every_s ones. Hazard: a small fixed value writes a "
        "line per few batches for as long as the trainer runs.",
    )
    drain_timeout_s: float = Field(
        30.0, gt=0, description="SIGTERM drain budget; match the pod's grace period."
    )
    max_steps: int | None = Field(None, ge=1, description="Stop after this many steps (demos, tests).")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v in MODEL_NAMES or _MODEL_REFERENCE.match(v):
            return v
        names = ", ".join(repr(n) for n in MODEL_NAMES)
        raise ValueError(f"expected {names} or an import reference package.module:attr")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v in {"auto", "cpu", "cuda"} or re.fullmatch(r"cuda:\d+", v):
            return v
        raise ValueError("expected auto, cpu, cuda or cuda:N")

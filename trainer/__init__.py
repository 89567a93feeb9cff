"""The trainer's compute core: models, pooling, optimizers, progressive eval, checkpoints.

Pure compute, no network I/O; the ``kelp train`` daemon wires it to a source
and a store. (The in-memory oracle the benchmarks compare against lives in
``kelp.bench.baseline``.) Modules, one job each:

* :mod:`~kelp.trainer.device`: the ``trainer.device`` setting -> ``torch.device``;
* :mod:`~kelp.trainer.model_api`: the model plug-in contract (``ModelSpec``, ``ModelInput``,
  ``SequenceInput``, references);
* :mod:`~kelp.trainer.models`: ``dlrm-small``, ``dcn-v2`` and ``deepfm`` (dense parameters only);
* :mod:`~kelp.trainer.embedding`: micro-batch -> device tensors -> pooled features and sequences;
* :mod:`~kelp.trainer.optim`: row-wise Adagrad for rows, Adam/Adagrad/SGD for dense;
* :mod:`~kelp.trainer.evaluation`: progressive validation (binned AUC, log loss);
* :mod:`~kelp.trainer.finite`: NaN/inf guards for steps, checkpoints and snapshots;
* :mod:`~kelp.trainer.step`: one step on pulled rows -> updates to push (a non-finite one is skipped);
* :mod:`~kelp.trainer.isolate`: the samples a model raises on, found by halving the batch;
* :mod:`~kelp.trainer.checkpoint`: atomic safetensors checkpoints of the dense side.
"""

from kelp.trainer.checkpoint import CheckpointInfo, config_hash, load_latest, save_checkpoint
from kelp.trainer.device import resolve_device
from kelp.trainer.embedding import BatchTensors, pool_features
from kelp.trainer.evaluation import AucResult, ProgressiveValidator, exact_auc
from kelp.trainer.finite import NonFiniteError, first_nonfinite
from kelp.trainer.model_api import (
    BUILTIN_MODELS,
    ModelContractError,
    ModelImportError,
    ModelInput,
    ModelSpec,
    SequenceInput,
    model_digest,
    model_record,
)
from kelp.trainer.models import DLRM, MODELS, DCNv2, build_model
from kelp.trainer.optim import RowWiseAdagrad, SparseUpdate, build_dense_optimizer
from kelp.trainer.step import PulledRows, StepResult, TrainStep

__all__ = [
    "BUILTIN_MODELS",
    "DLRM",
    "MODELS",
    "AucResult",
    "BatchTensors",
    "CheckpointInfo",
    "DCNv2",
    "ModelContractError",
    "ModelImportError",
    "ModelInput",
    "ModelSpec",
    "NonFiniteError",
    "ProgressiveValidator",
    "PulledRows",
    "RowWiseAdagrad",
    "SequenceInput",
    "SparseUpdate",
    "StepResult",
    "TrainStep",
    "build_dense_optimizer",
    "build_model",
    "config_hash",
    "exact_auc",
    "first_nonfinite",
    "load_latest",
    "model_digest",
    "model_record",
    "pool_features",
    "resolve_device",
    "save_checkpoint",
]

"""DeepFM's two first-order forms on several streams, with and without admission, beside the reference.

``first_order: per_id`` was once recommended for long-tail streams from one
stream's figures. This comparison measures it on every stream the accuracy
suite has: Taobao UserBehavior (real, long tail, 11% positives), the synthetic
long-tail click stream of :mod:`kelp.bench.longtail` (0.3% positives, planted
per-id effects and interactions), MovieLens-100k and criteo-attribution (real,
no long tail). Per stream,
``min_count`` and seed, one pass in time order with the suite's settings
(batch 256, 16-wide field vectors, row-wise Adagrad 0.05, Adam 1e-3):

* ``projection``: Kelp's ``deepfm`` as shipped (tables of dim 16);
* ``per_id``: each row's last element is its id's weight (dim 17), its
  gradient scaled by the default ``per_id_grad_scale``;
* ``per_id_unscaled``: the same with ``per_id_grad_scale: 1`` (the weight's
  gradient as it is, sharing the row's Adagrad accumulator);
* ``reference``: the plain FM + MLP of :mod:`kelp.bench.reference` (a per-id
  weight table of its own, zero-initialised, its own accumulator).

Kelp trains on the trainer's step and an in-memory store
(:func:`kelp.bench.accuracy.train_on_event_time`), reading the stream as JSON
Lines written here from the :class:`~kelp.bench.streams.Stream` (ids as digit
strings), so every stream takes the same path; the seed is ``trainer.seed``
and the row-init seed's offset for Kelp, the torch seed for the reference.
Each cell is the median over the seeds of exact progressive AUC and log loss.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from kelp.bench.accuracy_kelp import Trained, example_data
from kelp.bench.reference import ReferenceOptions, train_reference
from kelp.bench.runner import progress
from kelp.bench.streams import CRITEO_ATTRIBUTION, Stream
from kelp.config import KelpConfig, parse_config
from kelp.trainer.evaluation import exact_auc, log_loss_from_logits

__all__ = ["VARIANTS", "first_order_comparison", "stream_config"]

VARIANTS = ("projection", "per_id", "per_id_unscaled", "reference")
COUNTER_TTL_S = 1e9
"""Counters that outlive every stream here: admission by occurrence count alone."""


def _events(stream: Stream, work: Path) -> Path:
    """The stream as JSON Lines (one object a sample: each feature's id as a string, ``label``)."""
    path = work / f"{stream.name}-{len(stream.labels)}-first-order.jsonl"
    if path.exists():
        return path
    with path.open("w", encoding="utf-8") as f:
        for row, label in zip(stream.ids.tolist(), stream.labels.tolist(), strict=True):
            event: dict[str, Any] = {name: str(i) for name, i in zip(stream.features, row, strict=True)}
            event["label"] = label
            f.write(json.dumps(event) + "\n")
    return path


def stream_config(
    stream: Stream, work: Path, variant: str, *, min_count: int, seed: int, data_dir: Path
) -> KelpConfig:
    """Kelp's ``deepfm`` in ``variant``'s first-order form on ``stream``, tables admitting at ``min_count``.

    The shipped criteo-attribution example's tables, optimizers and batching (the suite's settings).
    """
    data = example_data(CRITEO_ATTRIBUTION, data_dir, work, None, model="deepfm")
    data["deployment"] = f"first-order-{stream.name}"
    features = data["features"]
    features["label"] = {"name": "label", "kind": "binary"}
    features["sparse"] = [{"name": name} for name in stream.features]
    defaults = features["table_defaults"]
    defaults["admission"] = {"min_count": min_count, "counter_ttl_s": COUNTER_TTL_S}
    defaults["init"] = {**defaults.get("init", {}), "seed": defaults.get("init", {}).get("seed", 0) + seed}
    args: dict[str, Any] = {"first_order": "projection"}
    if variant != "projection":
        defaults["dim"] += 1  # the field vectors stay as wide as the reference's
        args = {"first_order": "per_id"}
        if variant == "per_id_unscaled":
            args["per_id_grad_scale"] = 1.0
    data["trainer"]["model_args"] = args
    data["trainer"]["seed"] = seed
    data["source"] = {
        "kind": "file",
        "format": "json",
        "path": str(_events(stream, work)),
        "json": {"label_field": "label", "sparse_fields": list(stream.features)},
    }
    return parse_config(data, f"bench accuracy first order {stream.name}", environ={})


def _one(
    stream: Stream,
    variant: str,
    min_count: int,
    seed: int,
    *,
    work: Path,
    data_dir: Path,
    train: Callable[[KelpConfig], Trained],
) -> tuple[float, float]:
    if variant == "reference":
        ref = train_reference(stream, ReferenceOptions(kind="deepfm", min_count=min_count, seed=seed))
        return exact_auc(ref.labels, ref.logits), float(log_loss_from_logits(ref.labels, ref.logits).mean())
    run = train(stream_config(stream, work, variant, min_count=min_count, seed=seed, data_dir=data_dir))
    return run.auc, run.log_loss


def first_order_comparison(
    streams: Iterable[Stream],
    *,
    work: Path,
    data_dir: Path,
    train: Callable[[KelpConfig], Trained],
    min_counts: Sequence[int] = (1, 3),
    seeds: Sequence[int] = (0, 1, 2),
) -> list[dict[str, Any]]:
    """One entry per (stream, ``min_count``, variant): the median AUC and log loss over ``seeds``."""
    out: list[dict[str, Any]] = []
    for stream in streams:
        for k in min_counts:
            for variant in VARIANTS:
                runs = [_one(stream, variant, k, s, work=work, data_dir=data_dir, train=train) for s in seeds]
                entry = {
                    "stream": stream.name,
                    "samples": len(stream.labels),
                    "positive_rate": round(float(stream.labels.mean()), 5),
                    "min_count": k,
                    "variant": variant,
                    "auc": round(statistics.median(a for a, _ in runs), 4),
                    "log_loss": round(statistics.median(loss for _, loss in runs), 5),
                    "seed_aucs": [round(a, 4) for a, _ in runs],
                }
                progress(
                    f"  {stream.name} min_count {k} {variant}: AUC {entry['auc']} "
                    f"(seeds {entry['seed_aucs']}), log loss {entry['log_loss']}"
                )
                out.append(entry)
    return out

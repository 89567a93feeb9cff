"""The chaos bench's poisoned-row pieces on a real redis-server: the snapshot auditor and the bad values.

The fault itself runs inside ``kelp bench chaos`` (not part of the suite); what
it relies on is checked here: the auditor finds a non-finite tensor in a
snapshot that reached the channel (whoever wrote it), and the values it writes
are exactly what the store must quarantine.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from serving.helpers import small_config

from kelp.bench.chaos_load import score_request
from kelp.bench.chaos_poison import SnapshotAuditor, _bad_values, _is_bad, poison_targets
from kelp.consumers.criteo import SPARSE_NAMES
from kelp.publish import build_snapshot
from kelp.publish.publisher import build_channel
from kelp.publish.snapshot import Snapshot
from kelp.store.rows.codec import FAULT_REASONS, RowCodec
from kelp.trainer import build_model

pytestmark = pytest.mark.integration


def test_the_auditor_counts_a_published_nonfinite_snapshot(redis_url: str, tmp_path: Path) -> None:
    cfg = small_config(redis_url, tmp_path, publisher={"channel": "redis"})
    channel = build_channel(cfg.publisher, cfg.store, cfg.deployment)
    model = build_model(cfg.features, cfg.trainer)
    first = channel.next_version()
    good = build_snapshot(model, cfg.features, cfg.trainer, version=first, step=1, offsets={})
    channel.write(good)
    # a second version written straight to the channel with one NaN: what a publisher without guards would do
    tensors = st_load(good.weights)
    name = sorted(tensors)[0]
    tensors[name].view(-1)[0] = float("nan")
    weights = st_save(tensors)
    version = channel.next_version()
    channel.write(Snapshot(replace(good.manifest, version=version, weights_bytes=len(weights)), weights))
    channel.close()

    auditor = SnapshotAuditor(cfg, interval_s=0.05)
    auditor.start()
    report = auditor.finish()

    assert report["snapshots_audited"] == 2
    assert report["nonfinite_published"] == 1
    assert report["nonfinite_snapshot_details"] == {str(version): name}


def test_the_poisoned_values_are_what_the_store_quarantines() -> None:
    codec = RowCodec(dim=16, dtype="float32")
    good = codec.encode(np.ones((1, 16), np.float32), np.ones(1, np.float32), count=3)[0]
    kind, nan_row = _bad_values(good, codec.nbytes, wrong_length=False)
    assert kind == "nonfinite" and len(nan_row) == codec.nbytes and nan_row[:16] == good[:16]
    kind, short = _bad_values(good, codec.nbytes, wrong_length=True)
    assert kind == "wrong_length" and len(short) != codec.nbytes

    decoded = codec.decode([good, nan_row, short])
    assert [FAULT_REASONS[f] for f in decoded.fault.tolist()] == ["", "nonfinite", "wrong_length"]
    assert [_is_bad(v, codec) for v in (good, nan_row, short, None)] == [False, True, True, False]


def test_the_targets_cover_every_feature_and_the_scoring_request() -> None:
    targets = poison_targets(score_request())
    assert set(targets) == set(SPARSE_NAMES)
    assert all(len(ids) >= 1 for ids in targets.values())

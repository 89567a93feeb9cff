"""criteo-synth: shapes, determinism, label rate, skew."""

from __future__ import annotations

import numpy as np

from kelp.bench.synth import CriteoSynth


def test_shapes_and_determinism() -> None:
    a, b = CriteoSynth(seed=3).batch(2000), CriteoSynth(seed=3).batch(2000)
    assert a.sparse.shape == (2000, 26) and a.sparse.dtype == np.uint64
    assert a.dense.shape == (2000, 13) and (a.dense >= 0).all()
    np.testing.assert_array_equal(a.sparse, b.sparse)
    np.testing.assert_array_equal(a.label, b.label)
    assert not np.array_equal(a.sparse, CriteoSynth(seed=4).batch(2000).sparse)


def test_positive_rate_and_zipf_skew() -> None:
    cols = CriteoSynth(seed=0).batch(40_000)
    assert 0.2 < cols.label.mean() < 0.3
    _, counts = np.unique(cols.sparse[:, 0], return_counts=True)
    top = np.sort(counts)[::-1]
    assert top[0] > 20 * np.median(counts)  # heavy head
    assert 0.2 < len(counts) / 40_000 < 0.9  # long tail of rare ids


def test_label_depends_on_features() -> None:
    synth = CriteoSynth(seed=0)
    cols = synth.batch(20_000)
    logit = synth._logit(cols.dense, cols.sparse)
    assert cols.label[logit > np.median(logit)].mean() > cols.label[logit <= np.median(logit)].mean() + 0.1

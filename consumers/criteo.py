"""The Criteo display-advertising format: its column names and the feature spec that reads it.

Criteo's TSV rows are ``label, I1..I13, C1..C26``: 13 integer count features
and 26 categorical features hashed to 8 hex digits (``68fd1e64``; read as ids
by :func:`kelp.consumers.ids.str_id` like any string id, so a token of digits
only is that integer and any other its xxh3-64 hash). The same names describe
the synthetic ``criteo-synth`` benchmark stream (``kelp.bench.synth``), so one
spec serves the real sample, the synthetic stream and serving requests.

>>> spec = criteo_feature_spec()
>>> len(spec.dense), len(spec.sparse), spec.sparse[0].table_name
(13, 26, 'C1')
"""

from __future__ import annotations

from kelp.config import ClipTransform, DenseFeature, FeatureSpec, Log1pTransform, SparseFeature

__all__ = ["DENSE_NAMES", "SPARSE_NAMES", "criteo_feature_spec"]

DENSE_NAMES: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
SPARSE_NAMES: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))


def criteo_feature_spec(max_ids: int = 1) -> FeatureSpec:
    """Features of Criteo TSV and criteo-synth: label, I1..I13 (clip 0, log1p), C1..C26 (own tables)."""
    # Criteo's integer columns have a few negatives (I2 = -1...): clip at 0 before log1p.
    return FeatureSpec(
        dense=[
            DenseFeature(name=n, transforms=[ClipTransform(min=0), Log1pTransform()]) for n in DENSE_NAMES
        ],
        sparse=[SparseFeature(name=n, max_ids=max_ids) for n in SPARSE_NAMES],
    )

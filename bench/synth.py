"""``criteo-synth``: the reference synthetic CTR stream every benchmark shares (load generation).

The workload is fixed by BENCHMARKS.md so numbers from ``store``, ``ingest``,
``train`` and ``freshness`` compare:

* 26 sparse features ``C1..C26``, exactly one id per feature per sample;
* 13 dense features ``I1..I13``, non-negative and log-normal-like (floored
  counts, like Criteo's integer columns);
* ids per feature drawn Zipf-like (exponent 1.1) over 10^6 ranks, with a fixed
  seed; rank *r* of feature *f* maps to a well-mixed 64-bit id
  ``splitmix64(f << 40 | r)``, so ids look like hashes and spread over shards;
* the label comes from a hidden logistic model over a few sparse features and
  dense features; its bias is calibrated so about 25% of samples are positive.

Sampling is vectorised: ranks come from one ``searchsorted`` over a
precomputed CDF (no Python per id), and the
hidden per-id weights are a hash of the id, so no table is ever built.

Optional drift (``drift_per_sample``) shifts every feature's rank window as the
stream goes on, so new ids keep appearing and old ones fade; admission and
eviction tests use it. It is off by default (the benchmark stream is
stationary). The stream is labelled *synthetic* wherever it is reported.

Example::

    >>> synth = CriteoSynth(seed=0)
    >>> cols = synth.batch(4)
    >>> cols.sparse.shape, cols.sparse.dtype, cols.dense.shape, cols.label.dtype
    ((4, 26), dtype('uint64'), (4, 13), dtype('float32'))
    >>> CriteoSynth(seed=0).batch(4).sparse.tolist() == cols.sparse.tolist()
    True
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from kelp.consumers.codec import encode_columns, encode_sample
from kelp.consumers.criteo import DENSE_NAMES, SPARSE_NAMES, criteo_feature_spec
from kelp.store.rows.hashing import splitmix64

if TYPE_CHECKING:
    from kelp.config import FeatureSpec
    from kelp.consumers.batch import MicroBatch

__all__ = ["CriteoSynth", "SynthColumns", "synth_messages"]


@lru_cache(maxsize=8)
def _zipf_cdf(n_ids: int, exponent: float) -> np.ndarray:
    """float64[n_ids]: cumulative probability of ranks 1..n_ids under p(r) ~ r**-exponent."""
    weights = np.arange(1, n_ids + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return cdf


@dataclass(frozen=True)
class SynthColumns:
    """``n`` samples of criteo-synth as plain columns (no config needed to use them).

    * ``label``: float32[n], 0.0 or 1.0;
    * ``dense``: float32[n, 13], columns ``I1..I13``;
    * ``sparse``: uint64[n, 26], columns ``C1..C26`` (one id each);
    * ``ts``: float64[n], unix seconds at generation time.
    """

    label: np.ndarray
    dense: np.ndarray
    sparse: np.ndarray
    ts: np.ndarray

    @property
    def size(self) -> int:
        return int(self.label.shape[0])


class CriteoSynth:
    """Seeded, stateful generator of the criteo-synth stream.

    Each call to :meth:`batch` continues the stream (the RNG advances), so
    ``CriteoSynth(seed=0).batch(1000)`` always yields the same 1000 samples,
    and two generators with the same seed yield the same sequence of batches.
    """

    def __init__(
        self,
        seed: int = 0,
        n_ids: int = 1_000_000,
        exponent: float = 1.1,
        positive_rate: float = 0.25,
        drift_per_sample: float = 0.0,
    ) -> None:
        if n_ids < 1:
            raise ValueError(f"n_ids must be >= 1, got {n_ids}")
        if exponent <= 0:
            raise ValueError(f"exponent must be > 0, got {exponent}")
        if not 0 < positive_rate < 1:
            raise ValueError(f"positive_rate must be in (0, 1), got {positive_rate}")
        if drift_per_sample < 0:
            raise ValueError(f"drift_per_sample must be >= 0, got {drift_per_sample}")
        self.seed = seed
        self.n_ids = n_ids
        self.exponent = exponent
        self.positive_rate = positive_rate
        self.drift_per_sample = drift_per_sample
        self._cdf = _zipf_cdf(n_ids, exponent)
        self._rng = np.random.default_rng(seed)
        self._generated = 0
        # The hidden model does not depend on the stream seed: the same ids mean the same thing.
        hidden = np.random.default_rng(0x6B656C70)
        self._dense_mu = hidden.uniform(0.0, 3.0, size=len(DENSE_NAMES))
        self._dense_sigma = hidden.uniform(0.5, 1.5, size=len(DENSE_NAMES))
        self._dense_w = hidden.normal(0.0, 0.25, size=len(DENSE_NAMES))
        self._sparse_used = np.arange(0, len(SPARSE_NAMES), 3)  # C1, C4, C7, ... carry signal
        self._bias = 0.0
        self._bias = self._calibrate_bias()

    # ------------------------------------------------------------------ sampling

    def _ranks(self, shape: tuple[int, ...]) -> np.ndarray:
        u = self._rng.random(shape)
        return np.searchsorted(self._cdf, u, side="right").astype(np.uint64)  # 0-based rank

    def _ids(self, ranks: np.ndarray, start: int) -> np.ndarray:
        n = ranks.shape[0]
        if self.drift_per_sample:
            shift = (np.arange(start, start + n, dtype=np.float64) * self.drift_per_sample).astype(np.uint64)
            ranks = ranks + shift[:, None]
        feature = np.arange(len(SPARSE_NAMES), dtype=np.uint64) << np.uint64(40)
        return splitmix64(ranks | feature[None, :])

    def _logit(self, dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
        # Per-id weight: a hash of the id mapped to roughly N(0, 1) via a sum of two uniforms.
        used = sparse[:, self._sparse_used]
        h = splitmix64(used ^ np.uint64(0xA5A5A5A5))
        u1 = (h & np.uint64(0xFFFFFFFF)).astype(np.float64) / 2.0**32
        u2 = (h >> np.uint64(32)).astype(np.float64) / 2.0**32
        w = (u1 + u2 - 1.0) * 2.2
        return (
            self._bias + w.sum(axis=1) / np.sqrt(used.shape[1]) * 1.6 + np.log1p(dense) @ self._dense_w * 0.3
        )

    def _calibrate_bias(self) -> float:
        rng_state = self._rng.bit_generator.state
        dense, sparse = self._features(20_000, 0)
        self._rng.bit_generator.state = rng_state
        base = self._logit(dense, sparse)
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            rate = float(np.mean(1.0 / (1.0 + np.exp(-(base + mid)))))
            lo, hi = (mid, hi) if rate < self.positive_rate else (lo, mid)
        return (lo + hi) / 2

    def _features(self, n: int, start: int) -> tuple[np.ndarray, np.ndarray]:
        dense = np.floor(self._rng.lognormal(self._dense_mu, self._dense_sigma, size=(n, len(DENSE_NAMES))))
        sparse = self._ids(self._ranks((n, len(SPARSE_NAMES))), start)
        return dense.astype(np.float32), sparse

    def batch(self, n: int) -> SynthColumns:
        """The next ``n`` samples as columns (see :class:`SynthColumns` for shapes)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        dense, sparse = self._features(n, self._generated)
        p = 1.0 / (1.0 + np.exp(-self._logit(dense, sparse)))
        label = (self._rng.random(n) < p).astype(np.float32)
        self._generated += n
        ts = np.full(n, time.time(), dtype=np.float64)
        return SynthColumns(label=label, dense=dense, sparse=sparse, ts=ts)

    def microbatch(self, n: int, spec: FeatureSpec | None = None) -> MicroBatch:
        """The next ``n`` samples as a :class:`~kelp.consumers.batch.MicroBatch` (default spec: criteo)."""
        from kelp.consumers.batch import MicroBatch

        cols = self.batch(n)
        return MicroBatch.from_columns(
            spec or criteo_feature_spec(),
            labels=cols.label,
            dense=cols.dense,
            sparse={name: cols.sparse[:, i] for i, name in enumerate(SPARSE_NAMES)},
            event_ts=cols.ts,
        )

    def messages(self, n: int, per_message: int = 256, packed: bool = True) -> list[bytes]:
        """The next ``n`` samples encoded as schema-v1 msgpack messages.

        ``per_message=1`` gives single-sample messages; larger values give
        columnar batch messages (``packed`` = typed binary arrays, the fast form).
        """
        cols = self.batch(n)
        out: list[bytes] = []
        if per_message == 1:
            for i in range(n):
                out.append(
                    encode_sample(
                        label=float(cols.label[i]),
                        dense=cols.dense[i].tolist(),
                        sparse=dict(zip(SPARSE_NAMES, cols.sparse[i].tolist(), strict=True)),
                        ts=float(cols.ts[i]),
                    )
                )
            return out
        for lo in range(0, n, per_message):
            hi = min(n, lo + per_message)
            out.append(
                encode_columns(
                    labels=cols.label[lo:hi],
                    dense=cols.dense[lo:hi],
                    sparse={name: cols.sparse[lo:hi, i] for i, name in enumerate(SPARSE_NAMES)},
                    ts=cols.ts[lo:hi],
                    packed=packed,
                )
            )
        return out


def synth_messages(
    samples: int, batch_size: int, seed: int = 0, step: int = 65_536
) -> Iterator[tuple[bytes, int]]:
    """(message, samples in it) for ``samples`` criteo-synth samples, generated in vectorised steps.

    What ``kelp produce --synth criteo`` and the benchmarks write to Kafka:
    ``batch_size == 1`` gives single-sample messages, larger sizes packed
    columnar messages.
    """
    synth = CriteoSynth(seed=seed)
    done = 0
    step = max(step - step % batch_size, batch_size)
    while done < samples:
        n = min(step, samples - done)
        if batch_size == 1:
            for m in synth.messages(n, per_message=1):
                yield m, 1
        else:
            cols = synth.batch(n)
            for lo in range(0, n, batch_size):
                hi = min(n, lo + batch_size)
                yield (
                    encode_columns(
                        cols.label[lo:hi],
                        cols.dense[lo:hi],
                        {name: cols.sparse[lo:hi, i] for i, name in enumerate(SPARSE_NAMES)},
                        cols.ts[lo:hi],
                    ),
                    hi - lo,
                )
        done += n

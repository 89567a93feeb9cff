"""A synthetic long-tail click stream with a rare positive class, generated deterministically.

The real streams of ``kelp bench accuracy`` lack one shape a company's ad log
has: a label that is rare (a few positives per thousand) on ids with a long
tail. This module generates one, so any option recommended for long-tail
streams is measured on more than one of them and anyone can rerun it
(no data file, the same stream for the same :class:`LongTailSpec`)::

    user ~ Zipf(user_zipf) over user_vocab ids     (the long tail: most users seen once)
    ad   ~ Zipf(ad_zipf) over ad_vocab ids
    site ~ Zipf(site_zipf) over site_vocab ids
    logit = base + b_user + b_ad + b_site                      planted per-id effects
          + <u_user, a_ad> + <c_ad, d_site>                    planted interactions
    label ~ Bernoulli(sigmoid(logit))                          base: positive_rate on average

Each id's bias ``b`` is drawn once, ``normal(0, bias_std)`` of its feature, and
the vectors ``u``, ``a`` ``normal(0, interaction_std)``, ``c``, ``d``
``normal(0, site_interaction_std)``; ``base`` is solved so the expected
share of positives is ``positive_rate``. By default most of the signal is in
the interactions (as in an ad log whose ad-site fit matters more than any
one id's own rate), which the field vectors learn, and the per-id biases are
small; the spec's fields move that balance. Ids are large, scattered
integers (distinct random ids below 2**40, one per rank of each feature),
events are in time order, one a second. Label such a stream as synthetic wherever it is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kelp.bench.streams import Stream

__all__ = ["LONGTAIL", "LongTailSpec", "longtail_stream"]

LONGTAIL = "synthetic-longtail"
FEATURES = ("user", "ad", "site")


@dataclass(frozen=True)
class LongTailSpec:
    """The stream's shape; the defaults give 0.3% positives and most users seen once."""

    n_events: int = 200_000
    seed: int = 0
    positive_rate: float = 0.003
    user_vocab: int = 200_000
    ad_vocab: int = 20_000
    site_vocab: int = 500
    user_zipf: float = 1.05
    ad_zipf: float = 1.1
    site_zipf: float = 1.2
    user_bias_std: float = 0.3
    ad_bias_std: float = 0.3
    site_bias_std: float = 0.5
    interaction_dim: int = 4
    interaction_std: float = 1.0
    site_interaction_std: float = 2.0


def _zipf_ranks(rng: np.random.Generator, vocab: int, exponent: float, n: int) -> np.ndarray:
    """int64[n] ranks in [0, vocab), rank r drawn with probability proportional to (r + 1) ** -exponent."""
    weights = np.arange(1, vocab + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights)
    return np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right").astype(np.int64)


def _base_logit(effects: np.ndarray, positive_rate: float) -> float:
    """The offset that makes ``mean(sigmoid(base + effects))`` equal ``positive_rate`` (bisection)."""
    lo, hi = -30.0, 30.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if (1.0 / (1.0 + np.exp(-(mid + effects)))).mean() < positive_rate:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def longtail_stream(spec: LongTailSpec = LongTailSpec()) -> Stream:
    """The stream of ``spec``: features user, ad and site, label ``click``, one event a second."""
    rng = np.random.default_rng(spec.seed)
    vocabs = (spec.user_vocab, spec.ad_vocab, spec.site_vocab)
    exponents = (spec.user_zipf, spec.ad_zipf, spec.site_zipf)
    bias_stds = (spec.user_bias_std, spec.ad_bias_std, spec.site_bias_std)
    ranks = [_zipf_ranks(rng, v, s, spec.n_events) for v, s in zip(vocabs, exponents, strict=True)]
    effects = np.zeros(spec.n_events)
    for r, vocab, std in zip(ranks, vocabs, bias_stds, strict=True):
        effects += rng.normal(0.0, std, vocab)[r]
    user_vec = rng.normal(0.0, spec.interaction_std, (spec.user_vocab, spec.interaction_dim))
    ad_vec = rng.normal(0.0, spec.interaction_std, (spec.ad_vocab, spec.interaction_dim))
    effects += np.einsum("nd,nd->n", user_vec[ranks[0]], ad_vec[ranks[1]])
    ad_site = rng.normal(0.0, spec.site_interaction_std, (spec.ad_vocab, spec.interaction_dim))
    site_vec = rng.normal(0.0, spec.site_interaction_std, (spec.site_vocab, spec.interaction_dim))
    effects += np.einsum("nd,nd->n", ad_site[ranks[1]], site_vec[ranks[2]])
    base = _base_logit(effects, spec.positive_rate)
    labels = (rng.random(spec.n_events) < 1.0 / (1.0 + np.exp(-(base + effects)))).astype(np.float32)
    # scattered ids, as a hashed company id looks: rank r of feature f is id ids_f[r]
    ids = np.stack(
        [
            rng.choice(np.int64(2**40), size=vocab, replace=False)[r]
            for r, vocab in zip(ranks, vocabs, strict=True)
        ],
        axis=1,
    )
    ts = 1.7e9 + np.arange(spec.n_events, dtype=np.float64)
    return Stream(LONGTAIL, FEATURES, ids, labels, ts, "click")

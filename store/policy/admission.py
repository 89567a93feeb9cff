"""Admission policies: when an id earns a stored row (Kraken, Monolith), as small strategy classes.

A policy decides, for one table, which ids *without* a stored row are admitted
by a training pull (``count=True``). The shared pull/push flow
(:mod:`kelp.store.flow`) asks it and calls the backend primitives it needs;
no backend branches on the rule itself:

====================================  ================  ========================  ======================
policy                                counts sightings  stores the init row now   a push of an unstored
                                                                                   id is
====================================  ================  ========================  ======================
:class:`AlwaysAdmit` (the default)    no                no (the first push does)  stored
:class:`AdmitAfterCount` (k, ttl)     yes, for ttl s    yes (``SET NX``)          discarded (``SET XX``)
:class:`AdmitByChance` (p)            no                yes                       discarded
====================================  ================  ========================  ======================

A new rule (such as per-sample counts or hashed fallback rows) is a new
subclass plus a line in :func:`build_admission`, not a new branch in the backends.

>>> AdmitAfterCount(min_count=3).admit(4, np.array([1, 2, 3, 4])).tolist()
[False, False, True, True]
>>> AlwaysAdmit().admit(2, None).tolist()
[True, True]
"""

from __future__ import annotations

import abc
import threading

import numpy as np

from kelp.config import AdmissionSpec

__all__ = ["AdmissionPolicy", "AdmitAfterCount", "AdmitByChance", "AlwaysAdmit", "Draws", "build_admission"]


class Draws:
    """Uniform [0, 1) draws from one seeded generator, safe from several threads (pulls may overlap)."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()

    def uniform(self, n: int) -> np.ndarray:
        with self._lock:
            return self._rng.random(n)


class AdmissionPolicy(abc.ABC):
    """One table's admission rule. Subclasses set the three class attributes and implement :meth:`admit`."""

    counter_ttl_s: float | None = None
    """Seconds a sighting counter lives; None: the policy counts no sightings (``admit`` gets None)."""

    stores_on_admit: bool = True
    """Admitted ids get their init row stored at once (``SET NX``), so a later push is kept."""

    push_creates_rows: bool = False
    """A push of an id without a stored row stores it (True), or is discarded and counted (False)."""

    counts_occurrences: bool = False
    """A pull adds each id's occurrences in the batch to its counter (True), or one per pull (False)."""

    @abc.abstractmethod
    def admit(self, n: int, sightings: np.ndarray | None) -> np.ndarray:
        """bool[n]: which of ``n`` ids without a stored row are admitted by this sighting.

        ``sightings``: int64[n] counts including this sighting when :attr:`counter_ttl_s` is set, else None.
        """


class AlwaysAdmit(AdmissionPolicy):
    """Every id is admitted on sight (admission off): nothing is counted or written on pull."""

    stores_on_admit = False
    push_creates_rows = True

    def admit(self, n: int, sightings: np.ndarray | None) -> np.ndarray:
        return np.ones(n, dtype=bool)

    def __repr__(self) -> str:
        return "AlwaysAdmit()"


class AdmitAfterCount(AdmissionPolicy):
    """Admit on the ``min_count``-th sighting; a counter lives ``counter_ttl_s`` from its first sighting.

    ``occurrences=True`` (the config default): a sighting is one occurrence of
    the id in a trained sample, so an id in 3 samples of one batch is admitted
    by that batch at ``min_count: 3``. ``False``: one sighting per pull.
    """

    def __init__(self, min_count: int, counter_ttl_s: float = 86_400.0, *, occurrences: bool = False) -> None:
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        if counter_ttl_s <= 0:
            raise ValueError(f"counter_ttl_s must be > 0, got {counter_ttl_s}")
        self.min_count = min_count
        self.counter_ttl_s = counter_ttl_s
        self.counts_occurrences = occurrences

    def admit(self, n: int, sightings: np.ndarray | None) -> np.ndarray:
        if sightings is None or len(sightings) != n:
            raise ValueError(f"AdmitAfterCount needs {n} sighting counts")
        return np.asarray(sightings) >= self.min_count

    def __repr__(self) -> str:
        return (
            f"AdmitAfterCount(min_count={self.min_count}, counter_ttl_s={self.counter_ttl_s:g}, "
            f"occurrences={self.counts_occurrences})"
        )


class AdmitByChance(AdmissionPolicy):
    """Admit each sighting with probability ``probability`` (a client-side draw)."""

    def __init__(self, probability: float, draws: Draws) -> None:
        if not 0 < probability <= 1:
            raise ValueError(f"probability must be in (0, 1], got {probability}")
        self.probability = probability
        self.draws = draws

    def admit(self, n: int, sightings: np.ndarray | None) -> np.ndarray:
        return self.draws.uniform(n) < self.probability

    def __repr__(self) -> str:
        return f"AdmitByChance(probability={self.probability:g})"


def build_admission(spec: AdmissionSpec, draws: Draws) -> AdmissionPolicy:
    """The policy a table's ``admission`` settings ask for (``draws``: the store's shared generator)."""
    if spec.min_count > 1 and spec.probability < 1:
        raise ValueError("admission: set min_count > 1 or probability < 1, not both")
    if spec.min_count > 1:
        return AdmitAfterCount(spec.min_count, spec.counter_ttl_s, occurrences=spec.count == "occurrences")
    if spec.probability < 1:
        return AdmitByChance(spec.probability, draws)
    return AlwaysAdmit()

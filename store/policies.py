"""Admission policy: when an id earns a stored row (Kraken, Monolith).

A small strategy object per table, built from :class:`~kelp.config.schema.AdmissionSpec`.
Backends ask it two questions: is admission off (every id admitted at once), and,
given sighting counts or a random draw, which ids qualify now.

>>> policy = AdmissionPolicy(min_count=3)
>>> policy.qualifies_by_count(np.array([1, 2, 3, 4])).tolist()
[False, False, True, True]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from kelp.config import AdmissionSpec

__all__ = ["AdmissionPolicy"]


@dataclass(frozen=True)
class AdmissionPolicy:
    """``min_count`` sightings (counters live ``counter_ttl_s``) or probability ``p`` per sighting."""

    min_count: int = 1
    probability: float = 1.0
    counter_ttl_s: float = 86_400.0

    def __post_init__(self) -> None:
        if self.min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {self.min_count}")
        if not 0 < self.probability <= 1:
            raise ValueError(f"probability must be in (0, 1], got {self.probability}")
        if self.min_count > 1 and self.probability < 1:
            raise ValueError("use either min_count > 1 or probability < 1, not both")

    @classmethod
    def from_spec(cls, spec: AdmissionSpec) -> AdmissionPolicy:
        return cls(spec.min_count, spec.probability, spec.counter_ttl_s)

    @property
    def off(self) -> bool:
        """Every id is admitted on sight; nothing is counted."""
        return self.min_count == 1 and self.probability >= 1.0

    @property
    def counts(self) -> bool:
        """Admission keeps sighting counters (as opposed to a coin flip)."""
        return self.min_count > 1

    def qualifies_by_count(self, counts: np.ndarray) -> np.ndarray:
        """bool[n]: an id is admitted on the sighting that brings its count to ``min_count``."""
        return np.asarray(counts) >= self.min_count

    def qualifies_by_chance(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.random(n) < self.probability

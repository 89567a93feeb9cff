"""The source interface every trainer reads from, and the types that go with it.

A source yields :class:`~kelp.consumers.batch.MicroBatch` es. When the caller
has made a batch durable (the store acknowledged every update derived from
it) it calls :meth:`Source.commit`; the source then commits, per partition,
the highest offset below which *every* batch is durable. Delivery is at least
once: after a crash or a rebalance, batches not committed are read again.

::

    with build_source(cfg.source, cfg.features, cfg.batching) as source:
        for batch in source:
            train_on(batch)
            store.flush()
            source.commit(batch)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator

from kelp.closing import Closeable
from kelp.consumers.batch import MicroBatch, SourceRange

__all__ = ["Source", "ranges_of"]


def ranges_of(batch_or_sources: MicroBatch | Iterable[SourceRange]) -> list[SourceRange]:
    """The source ranges of a batch, or the ranges themselves."""
    if isinstance(batch_or_sources, MicroBatch):
        return list(batch_or_sources.sources)
    return list(batch_or_sources)


class Source(Closeable, ABC):
    """An iterator of micro-batches with explicit, at-least-once commits."""

    @abstractmethod
    def poll(self, timeout_s: float | None = None) -> MicroBatch | None:
        """The next batch, or None if none arrived within ``timeout_s`` (None = wait).

        Raises :class:`~kelp.consumers.errors.SourceClosedError` once the source
        is closed or exhausted (file sources) and every batch was handed out.
        """

    @abstractmethod
    def commit(self, batch_or_sources: MicroBatch | Iterable[SourceRange], wait: bool = False) -> None:
        """Declare a batch durable. Never blocks on the broker unless ``wait``.

        Ranges of partitions this source no longer owns are ignored.
        """

    @abstractmethod
    def close(self) -> None:
        """Commit what is committable, then release the broker connection or file."""

    def not_ready_reason(self) -> str | None:
        """Why the source cannot deliver samples now (a topic it reads is gone), or None.

        The trainer answers ``/readyz`` with it. It is a state the source leaves
        by itself (the topic comes back), not an error: nothing is raised.
        """
        return None

    def expected_samples(self) -> int | None:
        """About how many samples a finite input holds (for progress lines); None for a stream (Kafka)."""
        return None

    def __iter__(self) -> Iterator[MicroBatch]:
        from kelp.consumers.errors import SourceClosedError

        while True:
            try:
                batch = self.poll(None)
            except SourceClosedError:
                return
            if batch is not None:
                yield batch

"""The waiting store as the next step must see it while earlier steps' changes are still unapplied.

The process decides a step while the previous step's labelled events are on
their way to Kafka. That step's state changes may be applied only once Kafka
acknowledged its events (a crash in between must find the state as it was,
so the replayed records are decided again), yet the step being decided must
read the state as if they were applied: an impression closed one step ago is
not waiting any more, a click one step ago already marked its candidate.

:class:`PendingState` is that view: the backing store plus the staged
:class:`~kelp.join.state.Changes` of the steps not yet applied, newest first.
It reads like the store will read once they are applied, and nothing it stages
reaches the store before :meth:`PendingState.apply`, oldest first. Every
impression it hands out is a copy: the step that reads one changes it, and the
staged change it came from must still write what its own step decided.
"""

from __future__ import annotations

import heapq
from collections import Counter

from kelp.join.records import Action
from kelp.join.state import Changes, Waiting, WaitingStore

__all__ = ["PendingState"]


class PendingState:
    """A :class:`~kelp.join.state.WaitingStore` over ``store`` with staged, unapplied changes on top."""

    def __init__(self, store: WaitingStore) -> None:
        self.store = store
        self._staged: list[Changes] = []

    @property
    def staged(self) -> int:
        """Steps decided and not yet applied."""
        return len(self._staged)

    def stage(self, changes: Changes) -> None:
        """Reads see ``changes`` from now on; the store gets them at :meth:`apply`."""
        self._staged.append(changes)

    def apply(self, changes: Changes) -> None:
        """Write the oldest staged step's ``changes`` to the store (steps apply in the order decided)."""
        if self._staged and self._staged[0] is changes:
            self.store.apply(changes)
            self._staged.pop(0)
            return
        if any(staged is changes for staged in self._staged):  # by identity: Changes hold arrays
            raise RuntimeError("join: a step's changes are applied before an earlier step's")
        self.store.apply(changes)  # never staged (a step decided on the store itself)

    def discard(self) -> None:
        """Forget every staged step (its records are read again after a restart)."""
        self._staged.clear()

    # -- reads -------------------------------------------------------------------------------------

    def load(self, request_ids: list[str], tasks: list[str]) -> dict[str, Waiting]:
        found: dict[str, Waiting] = {}
        rest: list[str] = []
        for rid in request_ids:
            hit, waiting = self._impression(rid)
            if not hit:
                rest.append(rid)
            elif waiting is not None:
                found[rid] = waiting.copy()
        found.update(self.store.load(rest, tasks))
        return found

    def _impression(self, rid: str) -> tuple[bool, Waiting | None]:
        """``(True, w)``: a staged step put ``w``; ``(True, None)``: one deleted it; else not staged."""
        for changes in reversed(self._staged):
            if rid in changes.delete:  # applied after the puts, as the store applies them
                return True, None
            put = changes.put.get(rid)
            if put is not None:
                return True, put[0]
        return False, None

    def load_early(self, request_ids: list[str]) -> dict[str, list[Action]]:
        found: dict[str, list[Action]] = {}
        rest: list[str] = []
        for rid in request_ids:
            hit, actions = self._early(rid)
            if not hit:
                rest.append(rid)
            elif actions is not None:
                found[rid] = list(actions)
        found.update(self.store.load_early(rest))
        return found

    def _early(self, rid: str) -> tuple[bool, list[Action] | None]:
        for changes in reversed(self._staged):
            if rid in changes.early_delete:
                return True, None
            put = changes.early_put.get(rid)
            if put is not None:
                return True, put[0]
        return False, None

    def due(self, watermark: float, limit: int) -> list[str]:
        return [rid for _, rid in self.due_scored(watermark, limit)]

    def early_due(self, watermark: float, limit: int) -> list[str]:
        return [rid for _, rid in self.due_scored(watermark, limit, early=True)]

    def due_scored(self, watermark: float, limit: int, *, early: bool = False) -> list[tuple[float, str]]:
        """The store's deadlines with the staged ones in their place, earliest first.

        A staged step may move, add or drop a deadline: the store is asked for as many more as
        there are staged deadline changes, so the ``limit`` earliest are right after the merge.
        """
        staged = self._staged_deadlines(early)
        if not staged:
            return self.store.due_scored(watermark, limit, early=early)
        stored = [
            (d, rid)
            for d, rid in self.store.due_scored(watermark, limit + len(staged), early=early)
            if rid not in staged
        ]
        mine = sorted((d, rid) for rid, d in staged.items() if d is not None and d <= watermark)
        return list(heapq.merge(stored, mine))[:limit]

    def _staged_deadlines(self, early: bool) -> dict[str, float | None]:
        """Per request whose deadline a staged step changed, the deadline after them (None: removed)."""
        out: dict[str, float | None] = {}
        for changes in self._staged:
            if early:
                out.update({rid: put[1] for rid, put in changes.early_put.items()})
                out.update(dict.fromkeys(changes.early_delete))
            else:
                out.update({rid: put[1] for rid, put in changes.put.items()})
                out.update(dict.fromkeys(changes.delete))
                out.update(dict.fromkeys(changes.forget))
        return out

    def watermark(self) -> float | None:
        for changes in reversed(self._staged):
            if changes.watermark is not None:
                return changes.watermark
        return self.store.watermark()

    def counts(self) -> tuple[int, int, int]:
        return self.store.counts()

    def take_corrupt(self) -> Counter[str]:
        return self.store.take_corrupt()

    def close(self) -> None:
        self.store.close()

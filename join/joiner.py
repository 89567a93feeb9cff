"""The join's decisions: one step turns input records and the state they touch into outputs and changes.

A step is pure apart from reading the :class:`~kelp.join.state.WaitingStore`:
it returns what to send (:class:`Output`), what to dead-letter, and the
:class:`~kelp.join.state.Changes` to apply once the sends are acknowledged.
The process (:mod:`kelp.join.process`) owns Kafka, acknowledgements and commits.

Per impression, task and candidate (docs/join.md draws the timeline):

* an action inside the task's window makes the candidate POSITIVE for the task
  (once: a repeat is counted and ignored);
* when the watermark passes ``ts + window`` the task's window closes, and every
  candidate still UNDECIDED becomes NEGATIVE for it;
* a candidate is emitted once every task is decided: at its positive when
  there is one task, at the last window's close otherwise;
* an action inside its window that arrives after the candidate was emitted
  with a negative is *late*: with ``late_actions: correct`` the candidate is
  emitted again with that task positive and ``join.late`` set;
* an action whose impression is not there yet waits ``action_grace_s`` of
  event time, then is an orphan;
* a candidate with every label 0 is kept with probability ``negative_keep_rate``
  (decided by a hash of its sample id) and weighs ``1 / negative_keep_rate``;
* an event time more than ``max_future_skew_s`` past the wall clock is a dead
  letter (``future_ts``) and is never seen by the watermark, and every TTL is
  bounded by the windows plus that skew.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import xxhash

from kelp.config import JoinConfig
from kelp.join.records import Action, Impression, InputError, read_action, sample_id
from kelp.join.state import NEGATIVE, POSITIVE, UNDECIDED, Changes, Waiting, WaitingStore
from kelp.join.watermark import Watermark

__all__ = ["InputRecord", "Joiner", "Output", "Rejected", "Step"]

_DUE_PER_STEP = 5000
"""Impressions closed per step at most: a watermark jump (a replay catching up) is spread over steps."""


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One record read from an input topic."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Output:
    """One labelled event to send: its key (the request id) and value, and what it counts as.

    ``labels[task]`` is f32 per emitted candidate; ``knowable_at`` the event time at
    which its labels could first be known (the action, or the window's close), for
    the label-delay histogram. ``source`` is the impression as read: what is
    dead-lettered instead when Kafka refuses the event for good.
    """

    key: bytes
    value: bytes
    rows: int
    labels: dict[str, np.ndarray]
    late: bool
    knowable_at: float
    source: bytes = b""


@dataclass(frozen=True, slots=True)
class Rejected:
    """An input record the joiner could not read, for the dead-letter topic."""

    record: InputRecord
    input: str
    reason: str
    detail: str


@dataclass
class Step:
    """What one step decided."""

    outputs: list[Output] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    changes: Changes = field(default_factory=Changes)
    impressions: Counter[str] = field(default_factory=Counter)
    actions: Counter[tuple[str, str]] = field(default_factory=Counter)
    negatives_dropped: int = 0
    watermark: float | None = None


@dataclass
class _Work:
    """What one step has read and changed so far."""

    step: Step
    waiting: dict[str, Waiting]
    early: dict[str, list[Action]]
    touched: dict[str, Waiting] = field(default_factory=dict)
    early_changed: set[str] = field(default_factory=set)
    to_emit: dict[tuple[str, bool], tuple[list[np.ndarray], float]] = field(default_factory=dict)
    """(request id, late) -> rows to emit and when their labels became knowable: one event each."""
    decoded: dict[str, Impression] = field(default_factory=dict)

    def impression(self, w: Waiting) -> Impression:
        """The stored impression's message, decoded once per step."""
        imp = self.decoded.get(w.request_id)
        if imp is None:
            imp = self.decoded[w.request_id] = Impression.stored(w.raw, w.request_id, w.ts, w.n, w.msg)
        return imp

    def emit(self, w: Waiting, rows: np.ndarray, *, late: bool, knowable_at: float) -> None:
        parts, known = self.to_emit.get((w.request_id, late), ([], knowable_at))
        parts.append(rows)
        self.to_emit[(w.request_id, late)] = (parts, max(known, knowable_at))


class Joiner:
    """Decides steps for one ``join`` config against one store; keeps only the watermark in memory."""

    def __init__(self, config: JoinConfig, tasks: list[str], store: WaitingStore) -> None:
        self.config = config
        self.tasks = tasks
        self.store = store
        self.windows = config.windows()
        self._streams = {a.topic: a for a in config.actions}
        self._keep = config.negative_keep_rate
        self._keep_below = int(self._keep * 2**64) if self._keep < 1 else None
        self._expire_after = config.longest_window_s + config.late_horizon_s
        self.watermark = Watermark(config.allowed_lateness_s, config.advance_when_idle, store.watermark())

    def step(
        self,
        records: list[InputRecord],
        now: float,
        assigned: list[Hashable] | None = None,
        idle: set[Hashable] | None = None,
    ) -> Step:
        """Decide ``records`` (in the order read) and close what the watermark now allows.

        ``assigned`` are the input partitions as ``(topic, partition)`` (None: those of
        ``records``); ``idle`` the ones that stop holding the watermark back.
        """
        step = Step()
        impressions: list[Impression] = []
        actions: list[Action] = []
        order: list[Impression | Action] = []
        for rec in records:
            item = self._read(rec, step, now)
            if item is None:
                continue
            self.watermark.observe((rec.topic, rec.partition), item.ts)
            order.append(item)
            (impressions if isinstance(item, Impression) else actions).append(item)
        rids = list(dict.fromkeys(i.request_id for i in order))
        work = _Work(step, self.store.load(rids, self.tasks), self.store.load_early(rids))
        for item in order:
            if isinstance(item, Impression):
                self._impression(item, work)
            else:
                self._action(item, work)
        if assigned is None:
            assigned = list(dict.fromkeys((r.topic, r.partition) for r in records))
        wm = self.watermark.advance(assigned, idle or set(), now)
        step.watermark = wm
        if wm is not None:
            self._close_due(wm, work)
            self._orphans(wm, work)
            step.changes.watermark = wm
        for (rid, late), (parts, knowable_at) in work.to_emit.items():
            w = work.waiting[rid]
            # One part is already ascending and distinct (every row set is cut from an ascending one).
            rows = parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))
            self._emit(w, work.impression(w), rows, step, late=late, knowable_at=knowable_at)
        self._stage(now, work)
        return step

    # -- reading -----------------------------------------------------------------------------------

    def _read(self, rec: InputRecord, step: Step, now: float) -> Impression | Action | None:
        try:
            item: Impression | Action
            if rec.topic == self.config.impressions_topic:
                if rec.value is None:
                    raise InputError("bad_payload", "the record has no value")
                item = Impression.from_raw(rec.value, rec.timestamp_ms)
                item.check_columns(self.config.item_feature)
            else:
                item = read_action(self._streams[rec.topic], rec.value, rec.timestamp_ms)
            self._not_future(item.ts, now)
            return item
        except InputError as exc:
            kind = "impressions" if rec.topic == self.config.impressions_topic else "actions"
            step.rejected.append(Rejected(rec, kind, exc.reason, exc.detail))
            return None

    def _not_future(self, ts: float, now: float) -> None:
        """Refuse an event time past the wall clock by more than ``max_future_skew_s``.

        The watermark takes each partition's newest time, so one far-future time on a partition
        that others' idleness lets lead would close every window at once, for good (the watermark
        is stored and never moves back).
        """
        skew = self.config.max_future_skew_s
        if ts > now + skew:
            raise InputError(
                "future_ts",
                f"event time {ts:.3f} is {ts - now:.0f} s past the wall clock (max_future_skew_s {skew:g})",
            )

    # -- impressions and actions -------------------------------------------------------------------

    def _impression(self, imp: Impression, work: _Work) -> None:
        if imp.request_id in work.waiting:
            work.step.impressions["duplicate"] += 1  # read again after a restart, or a request id reused
            # Staged again as it is: a step whose apply did not finish left it without its deadline
            # at worst, and rewriting it (same state, same deadline) puts that back.
            work.touched.setdefault(imp.request_id, work.waiting[imp.request_id])
            return
        w = Waiting.new(imp.request_id, imp.ts, imp.raw, imp.n, self.tasks, msg=imp.msg)
        work.waiting[imp.request_id] = work.touched[imp.request_id] = w
        work.decoded[imp.request_id] = imp  # read once: its rows are cut from this same message
        work.step.impressions["new"] += 1
        for action in work.early.pop(imp.request_id, []):
            work.early_changed.add(imp.request_id)
            self._apply(action, w, work, matched_as="early")

    def _action(self, action: Action, work: _Work) -> None:
        w = work.waiting.get(action.request_id)
        if w is None:
            work.early.setdefault(action.request_id, []).append(action)
            work.early_changed.add(action.request_id)
            work.step.actions[(action.task, "waiting")] += 1
            return
        self._apply(action, w, work, matched_as="matched")

    def _apply(self, action: Action, w: Waiting, work: _Work, matched_as: str) -> None:
        step = work.step
        if action.ts - w.ts > action.window_s:
            step.actions[(action.task, "outside_window")] += 1
            return
        if action.item is None:
            rows = np.arange(w.n)
        else:
            rows = work.impression(w).rows_of_item(self.config.item_feature or "", action.item)
        if len(rows) == 0:
            step.actions[(action.task, "no_candidate")] += 1
            return
        labels = w.labels[action.task]
        fresh = rows[labels[rows] != POSITIVE]
        if len(fresh) == 0:
            step.actions[(action.task, "repeat")] += 1
            return
        work.touched[w.request_id] = w
        was_emitted = fresh[w.emitted[fresh] == 1]
        labels[fresh] = POSITIVE
        if len(was_emitted):
            step.actions[(action.task, "late")] += 1
            if self.config.late_actions == "correct":
                work.emit(w, was_emitted, late=True, knowable_at=action.ts)
            return
        step.actions[(action.task, matched_as)] += 1
        ready = fresh[self._decided(w, fresh)]
        if len(ready):
            w.emitted[ready] = 1
            work.emit(w, ready, late=False, knowable_at=action.ts)

    def _decided(self, w: Waiting, rows: np.ndarray) -> np.ndarray:
        done = np.ones(len(rows), dtype=bool)
        for task in self.tasks:
            done &= w.labels[task][rows] != UNDECIDED
        return done

    # -- windows closing ---------------------------------------------------------------------------

    def _close_due(self, wm: float, work: _Work) -> None:
        waiting = work.waiting
        due = self.store.due(wm, _DUE_PER_STEP)
        missing = [r for r in due if r not in waiting]
        waiting.update(self.store.load(missing, self.tasks))
        for rid in due:
            w = waiting.get(rid)
            if w is None:  # expired by its TTL since it was listed: its deadline goes too
                work.step.changes.forget.add(rid)
                continue
            work.touched[rid] = w
            newly_closed = [t for t in self.tasks if t not in w.closed and w.ts + self.windows[t] <= wm]
            if not newly_closed:
                continue
            for task in newly_closed:
                labels = w.labels[task]
                labels[labels == UNDECIDED] = NEGATIVE
                w.closed.add(task)
            pending = np.flatnonzero(w.emitted == 0)
            ready = pending[self._decided(w, pending)]
            if len(ready):
                w.emitted[ready] = 1
                knowable = w.ts + max(self.windows[t] for t in newly_closed)
                work.emit(w, ready, late=False, knowable_at=knowable)

    def _orphans(self, wm: float, work: _Work) -> None:
        grace = self.config.action_grace_s
        for rid in self.store.early_due(wm, _DUE_PER_STEP):
            if rid in work.early_changed and rid not in work.early:
                continue  # its impression came in this step
            waiting = work.early.get(rid)
            if waiting is None:
                waiting = self.store.load_early([rid]).get(rid, [])
            expired = [a for a in waiting if a.ts + grace <= wm]
            for action in expired:
                work.step.actions[(action.task, "orphan")] += 1
            work.early[rid] = [a for a in waiting if a.ts + grace > wm]
            work.early_changed.add(rid)

    # -- emitting ----------------------------------------------------------------------------------

    def _emit(
        self, w: Waiting, imp: Impression, rows: np.ndarray, step: Step, *, late: bool, knowable_at: float
    ) -> None:
        labels = {t: (w.labels[t][rows] == POSITIVE).astype(np.float32) for t in self.tasks}
        weight = None
        if self._keep_below is not None:
            negative = np.ones(len(rows), dtype=bool)
            for col in labels.values():
                negative &= col == 0
            hashes = [xxhash.xxh3_64_intdigest(sample_id(w.request_id, int(r)).encode()) for r in rows]
            keep = ~negative | (np.array(hashes, dtype=np.uint64) < np.uint64(self._keep_below))
            step.negatives_dropped += int((~keep).sum())
            rows = rows[keep]
            if len(rows) == 0:
                return
            labels = {t: col[keep] for t, col in labels.items()}
            weight = np.where(negative[keep], 1.0 / self._keep, 1.0).astype(np.float32)
        step.outputs.append(
            Output(
                key=w.request_id.encode(),
                value=imp.labelled(rows, labels, weight, late),
                rows=len(rows),
                labels=labels,
                late=late,
                knowable_at=knowable_at,
                source=w.raw,
            )
        )

    # -- the step's changes ------------------------------------------------------------------------

    def _stage(self, now: float, work: _Work) -> None:
        step, ch = work.step, work.step.changes
        margin = self.config.state_ttl_margin_s
        for rid, w in work.touched.items():
            open_ends = [w.ts + self.windows[t] for t in self.tasks if t not in w.closed]
            if open_ends:
                deadline = min(open_ends)
            else:
                deadline = w.ts + self._expire_after
                if step.watermark is not None and deadline <= step.watermark:
                    ch.delete[rid] = w
                    continue
            ttl = self._ttl(self._expire_after, w.ts + self._expire_after - now) + margin
            ch.put[rid] = (w, deadline, ttl)
        for rid in work.early_changed:
            actions = work.early.get(rid)
            if actions:
                deadline = min(a.ts for a in actions) + self.config.action_grace_s  # the first to expire
                last = max(a.ts for a in actions) + self.config.action_grace_s
                ttl = self._ttl(self.config.action_grace_s, last - now) + margin
                ch.early_put[rid] = (actions, deadline, ttl)
            else:
                ch.early_delete.add(rid)

    def _ttl(self, window_s: float, left_s: float) -> float:
        """Seconds state must outlive the wall clock: what is ``left_s`` of its life, at least its
        ``window_s``, and at most that plus ``max_future_skew_s`` (no time read is later than that)."""
        return min(max(window_s, left_s), window_s + self.config.max_future_skew_s)

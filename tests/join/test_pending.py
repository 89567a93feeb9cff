"""A step decided over the previous step's unapplied changes decides exactly what it would after them.

The process sends a step's events, decides the next step while Kafka acknowledges them, and applies
the first step's state only then. These tests run one stream of impressions, clicks, early clicks and
purchases twice, once applying each step before the next and once one step behind through
:class:`~kelp.join.pending.PendingState`, and compare every output and the final state.
"""

from __future__ import annotations

import numpy as np

from kelp.config import JoinConfig
from kelp.join import InputRecord, Joiner, MemoryWaitingStore, Step
from kelp.join.pending import PendingState
from kelp.join.state import Changes, Waiting

from .helpers import T0, impression
from .test_joiner import BUYS, CLICKS, IMP, NOW, action

TOPICS = (IMP, CLICKS, BUYS)


def _config() -> JoinConfig:
    return JoinConfig(
        impressions_topic=IMP,
        item_feature="item",
        allowed_lateness_s=0,
        late_actions="correct",
        actions=[
            {"topic": CLICKS, "task": "click", "window_s": 30, "item_field": "item"},
            {"topic": BUYS, "task": "buy", "window_s": 90, "item_field": "item"},
        ],
    )


def _stream(seed: int, steps: int) -> list[list[InputRecord]]:
    """Batches of records: impressions, clicks and purchases on them (some before their impression,
    some after their window), time moving forward by 1 s to past the longest window per batch."""
    rng = np.random.default_rng(seed)
    offsets = dict.fromkeys(TOPICS, 0)
    batches, made = [], []
    ts = T0

    def rec(topic: str, value: bytes) -> InputRecord:
        offsets[topic] += 1
        return InputRecord(topic, 0, offsets[topic] - 1, value, int(NOW * 1000))

    for b in range(steps):
        ts += float(rng.choice([1.0, 5.0, 35.0, 95.0]))  # some jumps close the last batch's windows
        batch = []
        for i in range(int(rng.integers(0, 4))):
            rid = f"r{b}-{i}"
            made.append((rid, ts))
            if rng.random() < 0.2:  # its click is read before the impression
                batch.append(rec(CLICKS, action(rid, ts + 1, item=102)))
            batch.append(rec(IMP, impression(rid, ts)))
        for rid, t in [made[j] for j in rng.integers(0, len(made), size=3)] if made else []:
            topic = CLICKS if rng.random() < 0.7 else BUYS
            at = min(ts, t + float(rng.uniform(0.0, 120.0)))  # in its window, or late
            batch.append(rec(topic, action(rid, at, item=int(rng.choice([101, 102, 103])))))
        if rng.random() < 0.4:  # a click for the next batch's first impression, one step early
            batch.append(rec(CLICKS, action(f"r{b + 1}-0", ts + 1.5, item=101)))
        batch.append(rec(IMP, impression(f"hb{b}", ts)))
        for topic in (CLICKS, BUYS):  # every partition reaches ts, so the watermark moves
            batch.append(rec(topic, action(f"hb{b}", ts)))
        batches.append(batch)
    return batches


def _outputs(step: Step) -> list[tuple[bytes, bytes, bool]]:
    return [(o.key, o.value, o.late) for o in step.outputs]


def _state(store: MemoryWaitingStore) -> tuple:
    return (store._blobs, store._due, store._early, store._early_due, store._watermark)


def _assigned() -> list[tuple[str, int]]:
    return [(t, 0) for t in TOPICS]


def test_deciding_one_step_behind_gives_the_same_outputs_and_state_as_applying_each_step() -> None:
    batches = _stream(seed=7, steps=60)
    tasks = ["click", "buy"]

    plain = MemoryWaitingStore()
    joiner = Joiner(_config(), tasks, plain)
    expected = []
    for batch in batches:
        step = joiner.step(batch, NOW, _assigned(), idle=set())
        plain.apply(step.changes)
        expected.append(_outputs(step))

    behind = MemoryWaitingStore()
    pending = PendingState(behind)
    joiner = Joiner(_config(), tasks, pending)
    got, previous = [], None
    for batch in batches:
        step = joiner.step(batch, NOW, _assigned(), idle=set())
        pending.stage(step.changes)
        if previous is not None:
            pending.apply(previous.changes)  # the earlier step lands only after this one was decided
        got.append(_outputs(step))
        previous = step
    assert previous is not None
    pending.apply(previous.changes)

    assert sum(len(o) for o in expected) > 50  # the stream made outputs, late ones among them
    assert any(late for step in expected for *_, late in step)
    assert got == expected
    assert _state(behind) == _state(plain)


def test_a_staged_impression_is_handed_out_as_a_copy() -> None:
    store = MemoryWaitingStore()
    pending = PendingState(store)
    w = Waiting.new("r1", T0, impression("r1", T0), 3, ["click"])
    changes = Changes(put={"r1": (w, T0 + 60, 120.0)})
    pending.stage(changes)
    loaded = pending.load(["r1"], ["click"])["r1"]
    loaded.emitted[:] = 1  # the next step changes what it read
    assert not w.emitted.any()  # the staged change still writes what its own step decided
    assert store.load(["r1"], ["click"]) == {}  # and nothing reached the store before apply
    pending.apply(changes)
    assert not store.load(["r1"], ["click"])["r1"].emitted.any()


def test_a_staged_impression_reads_as_the_store_will_hold_it_and_apart_from_it() -> None:
    """The copy a staged impression is handed out as equals what the store reads back once it is
    written (byte count included), and changing its labels or closed tasks leaves the staged one."""
    pending = PendingState(MemoryWaitingStore())
    w = Waiting.new("r1", T0, impression("r1", T0), 3, ["click"])
    w.labels["click"][1] = 1
    w.emitted[1] = 1
    w.closed.add("click")
    pending.stage(Changes(put={"r1": (w, T0 + 60, 120.0)}))
    loaded = pending.load(["r1"], ["click"])["r1"]
    stored = Waiting.unpack("r1", w.pack(), ["click"])
    assert (loaded.ts, loaded.raw, loaded.n, loaded.closed) == (
        stored.ts,
        stored.raw,
        stored.n,
        stored.closed,
    )
    assert loaded.labels["click"].tolist() == stored.labels["click"].tolist()
    assert loaded.emitted.tolist() == stored.emitted.tolist()
    assert loaded.stored_bytes == stored.stored_bytes == len(w.pack())
    loaded.labels["click"][:] = 2
    loaded.closed.clear()
    assert w.labels["click"].tolist() == [0, 1, 0] and w.closed == {"click"}


def test_deadlines_merge_staged_moves_deletes_and_forgets_within_the_limit() -> None:
    store = MemoryWaitingStore()
    ws = {r: Waiting.new(r, T0, impression(r, T0), 1, ["click"]) for r in "abcdef"}
    store.apply(Changes(put={r: (ws[r], T0 + i, 60.0) for i, r in enumerate("abcde")}))
    pending = PendingState(store)
    pending.stage(
        Changes(
            put={
                "a": (ws["a"], T0 + 10, 60.0),
                "f": (Waiting.new("f", T0, b"raw", 1, ["click"]), T0 + 0.5, 60.0),
            },
            delete={"b": ws["b"]},
            forget={"c"},
        )
    )
    assert pending.due(T0 + 100, 3) == ["f", "d", "e"]
    assert pending.due(T0 + 100, 10) == ["f", "d", "e", "a"]
    assert pending.due(T0 + 3, 10) == ["f", "d"]
    assert pending.load(["a", "b", "c"], ["click"]).keys() == {"a", "c"}  # forget keeps the impression


def test_changes_apply_in_the_order_their_steps_were_decided() -> None:
    pending = PendingState(MemoryWaitingStore())
    first, second = Changes(watermark=T0), Changes(watermark=T0 + 1)
    pending.stage(first)
    pending.stage(second)
    assert pending.watermark() == T0 + 1
    try:
        pending.apply(second)
    except RuntimeError as exc:
        assert "before an earlier step" in str(exc)
    else:
        raise AssertionError("applying out of order was accepted")
    pending.apply(first)
    pending.apply(second)
    assert pending.staged == 0 and pending.store.watermark() == T0 + 1

"""The join's semantics on the in-memory waiting store: windows, late and early actions, sampling.

Every test drives :class:`Joiner` with records the way the process hands them
over, and reads its outputs back through Kelp's own event decoder, so what is
checked is what ``kelp train`` would train on.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import orjson
import pytest

from kelp.config import FeatureSpec, JoinConfig, SparseFeature
from kelp.consumers.decode import Decoder, Rec
from kelp.join import InputRecord, Joiner, MemoryWaitingStore, Step, Waiting
from kelp.join.state import Changes
from kelp.serving.request_log import MAX_REQUEST_ID_BYTES

from .helpers import T0, impression

IMP, CLICKS, BUYS = "requests", "clicks", "buys"
NOW = T0 + 86_400.0
"""The wall clock of a fed step: a day past the tests' event times, so none of them is in the future."""


def action(rid: str, ts: float, item: Any = None) -> bytes:
    doc: dict[str, Any] = {"request_id": rid, "ts": ts}
    if item is not None:
        doc["item"] = item
    return orjson.dumps(doc)


class Rig:
    """A joiner over a memory store, with offsets per topic and every step's outputs kept."""

    def __init__(self, tasks: tuple[str, ...] = ("click",), **join: Any) -> None:
        actions = [{"topic": CLICKS, "task": "click", "window_s": 60, "item_field": "item"}]
        if "buy" in tasks:
            actions.append({"topic": BUYS, "task": "buy", "window_s": 600, "item_field": "item"})
        self.config = JoinConfig(
            impressions_topic=IMP, item_feature="item", allowed_lateness_s=0, actions=actions, **join
        )
        self.spec = FeatureSpec(
            labels=[{"name": t} for t in tasks],
            dense=[{"name": "price"}],
            sparse=[SparseFeature(name="user"), SparseFeature(name="item")],
        )
        self.store = MemoryWaitingStore()
        self.joiner = Joiner(self.config, list(tasks), self.store)
        self.offsets: dict[str, int] = {}
        self.steps: list[Step] = []

    def feed(self, *records: tuple[str, bytes], now: float = NOW) -> Step:
        recs = []
        for topic, value in records:
            offset = self.offsets.get(topic, 0)
            self.offsets[topic] = offset + 1
            recs.append(InputRecord(topic, 0, offset, value, int(now * 1000)))
        assigned = [(t, 0) for t in (IMP, *(a.topic for a in self.config.actions))]
        step = self.joiner.step(recs, now, assigned, idle=set())
        self.store.apply(step.changes)
        self.steps.append(step)
        return step

    def tick(self, event_ts: float) -> Step:
        """Every input partition has reached ``event_ts``: the watermark moves there."""
        for topic in (IMP, *(a.topic for a in self.config.actions)):
            self.joiner.watermark.observe((topic, 0), event_ts)
        return self.feed()

    def emitted(self) -> list[dict[str, Any]]:
        """Every output so far as the trainer's decoder reads it: one dict per sample."""
        out = []
        for step in self.steps:
            for o in step.outputs:
                chunk = Decoder(self.spec).decode([Rec("train", 0, 0, o.value)])
                assert not chunk.rejections, chunk.rejections
                msg = msgpack.unpackb(o.value)
                items = np.frombuffer(msg["sparse"]["item"]["values"], "<u8")
                for i, sid in enumerate(msg["join"]["sample_ids"]):
                    labels = {self.spec.tasks[0].name: float(chunk.labels[i])}
                    labels.update({t: float(c[i]) for t, c in chunk.extra_labels.items()})
                    out.append(
                        {
                            "id": sid,
                            "item": int(items[i]),
                            "labels": labels,
                            "late": msg["join"]["late"],
                            "weight": 1.0 if chunk.weight is None else float(chunk.weight[i]),
                            "ts": float(chunk.ts[i]),
                        }
                    )
        return out


def test_a_click_in_the_window_is_a_positive_at_once_and_the_rest_negatives_at_close() -> None:
    rig = Rig()
    rig.feed((IMP, impression("r1", T0)))
    rig.feed((CLICKS, action("r1", T0 + 5, item=102)))
    first = rig.emitted()
    assert [(e["id"], e["item"], e["labels"]) for e in first] == [("r1/1", 102, {"click": 1.0})]
    rig.tick(T0 + 59)
    assert len(rig.emitted()) == 1  # the window is still open
    rig.tick(T0 + 60)
    later = rig.emitted()[1:]
    assert sorted((e["id"], e["labels"]["click"]) for e in later) == [("r1/0", 0.0), ("r1/2", 0.0)]
    assert all(e["ts"] == T0 and not e["late"] and e["weight"] == 1.0 for e in rig.emitted())


def test_no_click_makes_negatives_only_after_the_window() -> None:
    rig = Rig()
    rig.feed((IMP, impression("r1", T0)))
    rig.tick(T0 + 30)
    assert rig.emitted() == []
    rig.tick(T0 + 61)
    assert sorted(e["id"] for e in rig.emitted()) == ["r1/0", "r1/1", "r1/2"]
    assert {e["labels"]["click"] for e in rig.emitted()} == {0.0}


def test_a_repeated_click_is_one_positive() -> None:
    rig = Rig()
    rig.feed((IMP, impression("r1", T0)))
    rig.feed((CLICKS, action("r1", T0 + 1, item=101)), (CLICKS, action("r1", T0 + 2, item=101)))
    assert [e["id"] for e in rig.emitted()] == ["r1/0"]
    assert rig.steps[-1].actions[("click", "repeat")] == 1


def test_a_click_after_its_window_is_outside_it() -> None:
    rig = Rig()
    rig.feed((IMP, impression("r1", T0)))
    rig.feed((CLICKS, action("r1", T0 + 61, item=101)))
    assert rig.steps[-1].actions[("click", "outside_window")] == 1
    rig.tick(T0 + 100)
    assert {e["labels"]["click"] for e in rig.emitted()} == {0.0}


@pytest.mark.parametrize("late_actions", ["correct", "drop"])
def test_a_late_click_is_corrected_or_dropped(late_actions: str) -> None:
    rig = Rig(late_actions=late_actions)
    rig.feed((IMP, impression("r1", T0)))
    rig.tick(T0 + 120)  # the window closed: three negatives went out
    assert len(rig.emitted()) == 3
    step = rig.feed((CLICKS, action("r1", T0 + 30, item=103)))  # inside the window, but late
    assert step.actions[("click", "late")] == 1
    extra = rig.emitted()[3:]
    if late_actions == "drop":
        assert extra == []
    else:
        assert [(e["id"], e["labels"], e["late"]) for e in extra] == [("r1/2", {"click": 1.0}, True)]
    rig.feed((CLICKS, action("r1", T0 + 31, item=103)))
    assert rig.steps[-1].actions[("click", "repeat")] == 1  # corrected once only


def test_an_action_before_its_impression_waits_for_it_within_the_grace() -> None:
    rig = Rig(action_grace_s=30)
    step = rig.feed((CLICKS, action("r1", T0 + 3, item=101)))
    assert step.actions[("click", "waiting")] == 1
    rig.feed((IMP, impression("r1", T0)))
    assert [(e["id"], e["labels"]["click"]) for e in rig.emitted()] == [("r1/0", 1.0)]
    assert rig.steps[-1].actions[("click", "early")] == 1


def test_an_action_whose_impression_never_comes_is_an_orphan_after_the_grace() -> None:
    rig = Rig(action_grace_s=30)
    rig.feed((CLICKS, action("ghost", T0, item=101)))
    assert rig.tick(T0 + 29).actions[("click", "orphan")] == 0
    assert rig.tick(T0 + 31).actions[("click", "orphan")] == 1
    assert rig.store.counts() == (0, 0, 0)


def test_an_impression_is_kept_for_late_actions_then_deleted() -> None:
    rig = Rig(late_horizon_s=100)
    rig.feed((IMP, impression("r1", T0)))
    rig.tick(T0 + 61)
    assert rig.store.counts()[0] == 1
    rig.tick(T0 + 159)
    assert rig.store.counts()[0] == 1
    rig.tick(T0 + 160)
    assert rig.store.counts()[0] == 0


def test_an_impression_read_twice_is_joined_once() -> None:
    rig = Rig()
    rig.feed((IMP, impression("r1", T0)))
    step = rig.feed((IMP, impression("r1", T0)))
    assert step.impressions["duplicate"] == 1
    rig.tick(T0 + 61)
    assert sorted(e["id"] for e in rig.emitted()) == ["r1/0", "r1/1", "r1/2"]


def test_an_action_without_item_labels_every_candidate_and_a_string_item_matches_its_id() -> None:
    rig = Rig()
    rig.config.actions[0].item_field = None
    rig.joiner = Joiner(rig.config, ["click"], rig.store)
    rig.feed((IMP, impression("r1", T0)))
    rig.feed((CLICKS, action("r1", T0 + 1)))
    assert sorted(e["id"] for e in rig.emitted()) == ["r1/0", "r1/1", "r1/2"]
    rig2 = Rig()
    rig2.feed((IMP, impression("r2", T0)))
    rig2.feed((CLICKS, action("r2", T0 + 1, item="102")))  # the one id rule: "102" is 102
    assert [e["id"] for e in rig2.emitted()] == ["r2/1"]


def test_negative_down_sampling_keeps_a_stable_share_weighted_by_its_inverse() -> None:
    rig = Rig(negative_keep_rate=0.25)
    for i in range(200):
        rig.feed((IMP, impression(f"r{i}", T0)))
    rig.feed((CLICKS, action("r0", T0 + 1, item=101)))
    rig.tick(T0 + 61)
    out = rig.emitted()
    negatives = [e for e in out if e["labels"]["click"] == 0.0]
    positives = [e for e in out if e["labels"]["click"] == 1.0]
    assert [e["weight"] for e in positives] == [1.0]
    assert {e["weight"] for e in negatives} == {4.0}
    assert 0.18 < len(negatives) / 599 < 0.32
    dropped = sum(s.negatives_dropped for s in rig.steps)
    assert dropped + len(negatives) == 599
    again = Rig(negative_keep_rate=0.25)  # a replay keeps the same negatives
    for i in range(200):
        again.feed((IMP, impression(f"r{i}", T0)))
    again.feed((CLICKS, action("r0", T0 + 1, item=101)))
    again.tick(T0 + 61)
    assert sorted(e["id"] for e in again.emitted()) == sorted(e["id"] for e in out)


def test_several_tasks_emit_once_every_window_is_decided() -> None:
    rig = Rig(tasks=("click", "buy"))
    rig.feed((IMP, impression("r1", T0)))
    rig.feed((CLICKS, action("r1", T0 + 5, item=101)))
    assert rig.emitted() == []  # buy is still open
    rig.feed((BUYS, action("r1", T0 + 300, item=101)))
    assert [(e["id"], e["labels"]) for e in rig.emitted()] == [("r1/0", {"click": 1.0, "buy": 1.0})]
    rig.tick(T0 + 60)
    assert len(rig.emitted()) == 1  # clicks closed; buy still open for the other two
    rig.tick(T0 + 600)
    rest = sorted((e["id"], tuple(e["labels"].values())) for e in rig.emitted()[1:])
    assert rest == [("r1/1", (0.0, 0.0)), ("r1/2", (0.0, 0.0))]


def test_bad_inputs_are_rejected_with_a_reason_and_nothing_else_changes() -> None:
    rig = Rig()
    step = rig.feed(
        (IMP, b"\xc1not msgpack"),
        (IMP, msgpack.packb({"v": 1, "batch": 1, "label": b"\0\0\0\0"})),
        (CLICKS, b"{not json"),
        (CLICKS, orjson.dumps({"ts": T0})),
        (CLICKS, orjson.dumps({"request_id": "r", "ts": "yesterday", "item": 1})),
        (CLICKS, orjson.dumps({"request_id": "r", "ts": T0, "item": -4})),
    )
    assert [(r.input, r.reason) for r in step.rejected] == [
        ("impressions", "bad_msgpack"),
        ("impressions", "missing_field"),
        ("actions", "bad_payload"),
        ("actions", "missing_field"),
        ("actions", "bad_type"),
        ("actions", "bad_id"),
    ]
    assert step.outputs == [] and rig.store.counts() == (0, 0, 0)


def test_the_watermark_waits_for_every_partition_and_never_goes_back() -> None:
    rig = Rig()
    rig.feed((IMP, impression("r1", T0)))
    rig.feed((IMP, impression("r2", T0 + 500)))
    assert rig.joiner.watermark.value is None  # the click partition has said nothing yet
    rig.feed((CLICKS, action("r1", T0 + 100, item=999)))
    assert rig.joiner.watermark.value == T0 + 100
    assert sorted(e["id"] for e in rig.emitted()) == ["r1/0", "r1/1", "r1/2"]
    assert rig.steps[-1].actions[("click", "no_candidate")] == 0  # 100 s after r1: outside the window
    assert rig.steps[-1].actions[("click", "outside_window")] == 1
    rig.joiner.watermark.observe((CLICKS, 0), T0)  # an older event does not move it back
    rig.feed()
    assert rig.joiner.watermark.value == T0 + 100


def test_idle_partitions_stop_holding_the_watermark_and_all_idle_follows_the_clock() -> None:
    rig = Rig()
    rig.feed((IMP, impression("r1", T0)))
    assigned = [(IMP, 0), (CLICKS, 0)]
    step = rig.joiner.step([], T0 + 10, assigned, idle={(CLICKS, 0)})
    assert step.watermark == T0
    step = rig.joiner.step([], T0 + 70, assigned, idle=set(assigned))
    assert step.watermark == T0 + 70
    assert len(step.outputs) == 1


def test_each_early_action_expires_on_its_own_time() -> None:
    rig = Rig(action_grace_s=30)
    rig.feed((CLICKS, action("r1", T0, item=101)))
    rig.feed((CLICKS, action("r1", T0 + 20, item=102)))
    assert rig.tick(T0 + 31).actions[("click", "orphan")] == 1  # the first one's grace is over
    rig.feed((IMP, impression("r1", T0 + 15)))
    assert [(e["id"], e["labels"]["click"]) for e in rig.emitted()] == [("r1/1", 1.0)]


def test_no_assigned_partition_moves_no_watermark() -> None:
    rig = Rig(advance_when_idle=True)
    step = rig.joiner.step([], T0 + 1000, assigned=[], idle=set())
    assert step.watermark is None


# -- hostile inputs: event times, request ids, corrupt state ------------------------------------------

FAR_FUTURE = 4_102_444_800.0  # 2100-01-01


def _with_ts(rid: str, ts: Any) -> bytes:
    """An impression whose ``ts`` is ``ts`` as given (a scalar, a packed column or a list)."""
    msg = msgpack.unpackb(impression(rid, T0))
    msg["ts"] = ts
    return msgpack.packb(msg, use_bin_type=True)


def test_a_far_future_action_is_dead_lettered_and_never_moves_the_watermark() -> None:
    """The impressions partition idle, one click dated 2100 would set the watermark there for good."""
    rig = Rig()
    imp_idle = {(IMP, 0)}
    assigned = [(IMP, 0), (CLICKS, 0)]
    ghost = InputRecord(CLICKS, 0, 0, action("ghost", FAR_FUTURE, item=101), int(NOW * 1000))
    step = rig.joiner.step([ghost], NOW, assigned, idle=imp_idle)
    rig.store.apply(step.changes)
    assert [(r.input, r.reason) for r in step.rejected] == [("actions", "future_ts")]
    assert step.watermark is None and rig.store.watermark() is None
    assert step.actions[("click", "waiting")] == 0 and rig.store.counts() == (0, 0, 0)
    # The join goes on: an impression of now and its click make a positive, the rest wait.
    rig.feed((IMP, impression("r1", NOW - 20)), (CLICKS, action("r1", NOW - 19, item=102)))
    assert [(e["id"], e["labels"]["click"]) for e in rig.emitted()] == [("r1/1", 1.0)]


def test_a_far_future_impression_is_dead_lettered_while_the_actions_are_idle() -> None:
    rig = Rig()
    assigned = [(IMP, 0), (CLICKS, 0)]
    record = InputRecord(IMP, 0, 0, impression("r9", FAR_FUTURE), int(NOW * 1000))
    step = rig.joiner.step([record], NOW, assigned, idle={(CLICKS, 0)})
    assert [(r.input, r.reason) for r in step.rejected] == [("impressions", "future_ts")]
    assert step.watermark is None and step.changes.put == {}


def test_an_event_time_within_the_skew_is_read_and_past_it_is_not() -> None:
    rig = Rig(max_future_skew_s=30)
    step = rig.feed((IMP, impression("r1", NOW + 29)), (IMP, impression("r2", NOW + 31)))
    assert step.impressions["new"] == 1
    assert [(r.reason, "31 s past the wall clock" in r.detail) for r in step.rejected] == [
        ("future_ts", True)
    ]


@pytest.mark.parametrize(
    "ts",
    [
        math.inf,
        -math.inf,
        math.nan,
        -1.0,
        1e300,
        2**64 - 1,
        np.array([math.nan] * 3, "<f8").tobytes(),
        np.array([math.inf] * 3, "<f8").tobytes(),
        [math.nan, 1.0, 1.0],
    ],
    ids=["inf", "-inf", "nan", "negative", "1e300", "u64", "nan-column", "inf-column", "nan-list"],
)
def test_an_impression_time_that_is_no_time_is_bad_type_and_nothing_is_stored(ts: Any) -> None:
    rig = Rig()
    step = rig.feed((IMP, _with_ts("r1", ts)))
    assert [(r.input, r.reason) for r in step.rejected] == [("impressions", "bad_type")]
    assert rig.store.counts() == (0, 0, 0)


def test_an_action_time_that_is_no_time_is_bad_type_in_every_place_a_time_is_read() -> None:
    rig = Rig()
    rig.config.actions[0].format = "msgpack"  # JSON has no NaN; msgpack does
    rig.joiner = Joiner(rig.config, ["click"], rig.store)
    nan_ts = msgpack.packb({"request_id": "r1", "ts": math.nan, "item": 101})
    step = rig.feed((CLICKS, nan_ts), (CLICKS, msgpack.packb({"request_id": "r1", "ts": -5, "item": 101})))
    assert [r.reason for r in step.rejected] == ["bad_type", "bad_type"]
    # The record's timestamp, when it is the event time, is checked the same way.
    rig.config.actions[0].ts_field = None
    rig.joiner = Joiner(rig.config, ["click"], rig.store)
    no_time = InputRecord(CLICKS, 0, 9, msgpack.packb({"request_id": "r1", "item": 101}), -1)
    step = rig.joiner.step([no_time], NOW, [(IMP, 0), (CLICKS, 0)], idle=set())
    assert [r.reason for r in step.rejected] == ["bad_type"]
    assert rig.store.counts() == (0, 0, 0)


def test_a_request_id_past_the_shared_rule_is_dead_lettered_and_nothing_is_stored() -> None:
    rig = Rig()
    huge = "x" * 1_000_000
    step = rig.feed(
        (IMP, impression(huge, T0)),
        (CLICKS, action(huge, T0 + 1, item=101)),
        (CLICKS, action("has space", T0 + 1, item=101)),
        (IMP, impression("x" * MAX_REQUEST_ID_BYTES, T0)),  # the longest id that is one
    )
    assert [(r.input, r.reason) for r in step.rejected] == [
        ("impressions", "bad_request_id"),
        ("actions", "bad_request_id"),
        ("actions", "bad_request_id"),
    ]
    assert all(len(r.detail) < 300 for r in step.rejected)
    assert step.impressions["new"] == 1 and rig.store.counts()[0] == 1 and rig.store.counts()[2] == 0


def test_every_ttl_stays_within_the_windows_and_the_skew() -> None:
    """An impression or early action dated as late as allowed still expires within its window's bound."""
    rig = Rig(max_future_skew_s=300, late_horizon_s=100, state_ttl_margin_s=10)
    step = rig.feed(
        (IMP, impression("r1", NOW + 299)),
        (CLICKS, action("r2", NOW + 299, item=101)),
        (CLICKS, action("r3", FAR_FUTURE, item=101)),
    )
    assert [r.reason for r in step.rejected] == ["future_ts"]
    ((_, _, ttl),) = step.changes.put.values()
    assert ttl <= 60 + 100 + 300 + 10
    assert list(step.changes.early_put) == ["r2"]
    ((_, _, early_ttl),) = step.changes.early_put.values()
    assert early_ttl <= rig.config.action_grace_s + 300 + 10


def test_a_corrupt_stored_impression_or_early_list_is_dropped_counted_and_the_join_goes_on() -> None:
    rig = Rig()
    rig.store.put_raw("r1", b"\xc1 not msgpack", T0 + 60)
    rig.store.put_raw("r2", msgpack.packb({"ts": math.nan, "raw": b"x", "n": 1}), T0 + 60)
    rig.store.put_raw("r3", b"\x93\x01\x02", T0 + 60, early=True)
    step = rig.feed(
        (IMP, impression("r1", T0)),
        (CLICKS, action("r3", T0 + 1, item=101)),
    )
    assert step.impressions["new"] == 1  # the corrupt one is gone: r1 is joined afresh
    assert rig.store.take_corrupt() == {"impression": 1, "early_actions": 1}
    rig.tick(T0 + 100)  # r2's deadline passes: it is listed, read, found corrupt and dropped
    assert rig.store.take_corrupt() == {"impression": 1}
    assert rig.store.due(math.inf, 10) == ["r1"] and rig.store.load(["r2"], ["click"]) == {}
    assert sorted(e["id"] for e in rig.emitted()) == ["r1/0", "r1/1", "r1/2"]


def test_a_stored_impression_whose_message_does_not_decode_is_dropped_and_the_join_goes_on() -> None:
    """A waiting entry whose raw impression starts as a msgpack map but is cut short: found when it is
    loaded (by an item's action, or by its deadline), not when its message is first used mid-step."""
    rig = Rig()
    cut = {"ts": T0, "raw": b"\x81", "n": 3, "labels": {}, "emitted": b"\0\0\0", "closed": []}
    rig.store.put_raw("r1", msgpack.packb(cut), T0 + 60)
    rig.store.put_raw("r2", msgpack.packb(cut), T0 + 60)
    step = rig.feed((IMP, impression("r3", T0)), (CLICKS, action("r2", T0 + 1, item=101)))
    assert step.actions[("click", "waiting")] == 1  # r2 is gone: its click waits for an impression
    assert rig.store.take_corrupt() == {"impression": 1}
    rig.tick(T0 + 100)  # r1's deadline passes: it is listed, read, found corrupt and dropped
    assert rig.store.take_corrupt() == {"impression": 1}
    assert rig.store.load(["r1", "r2"], ["click"]) == {}
    assert sorted(e["id"] for e in rig.emitted()) == ["r3/0", "r3/1", "r3/2"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("dense", b"\0" * 5), ("sparse", {"item": {"values": b"\0" * 7, "lengths": b"\1\0\0\0" * 3}})],
    ids=["dense-short", "item-values-short"],
)
def test_an_impression_whose_columns_do_not_fit_its_batch_is_a_dead_letter_at_read(
    field: str, value: Any
) -> None:
    """Read as it is, it would fail the step that closes its window, at every restart."""
    msg = msgpack.unpackb(impression("r1", T0))
    msg[field] = value
    rig = Rig()
    step = rig.feed((IMP, msgpack.packb(msg, use_bin_type=True)))
    assert [(r.input, r.reason) for r in step.rejected] == [("impressions", "bad_shape")]
    rig.tick(T0 + 100)
    assert rig.emitted() == [] and rig.store.counts() == (0, 0, 0)


def test_state_stored_under_an_id_the_rule_now_refuses_still_closes() -> None:
    """Stored impressions whose id fails the current rule (an id with a space) are still closed and
    emitted, not re-judged."""
    rig = Rig()
    rid = "old id"
    waiting = Waiting.new(rid, T0, impression(rid, T0), 3, ["click"])
    rig.store.apply(Changes(put={rid: (waiting, T0 + 60, 600.0)}))
    rig.tick(T0 + 61)
    assert sorted(e["id"] for e in rig.emitted()) == ["old id/0", "old id/1", "old id/2"]


def test_a_one_row_event_holds_the_same_row_as_the_general_cut() -> None:
    """A positive's event is cut out of its impression by byte slices where every row holds one id
    (the request log's shape); ragged columns take the array path. Either way row r is row r."""
    from kelp.consumers.codec import encode_request_record
    from kelp.join.records import Impression

    rng = np.random.default_rng(5)
    n = 6
    ragged = rng.integers(0, 3, size=n).astype(np.int32)
    record = encode_request_record(
        request_id="q-cut",
        model_version=1,
        ts=100.0,
        dense=rng.random((n, 2)).astype(np.float32),
        sparse={
            "user": (np.arange(n, dtype=np.uint64) + 10, np.ones(n, dtype=np.int32)),
            "tags": (rng.integers(0, 99, size=int(ragged.sum())).astype(np.uint64), ragged),
        },
        scores={"click": rng.random(n).astype(np.float32)},
    )
    imp = Impression.from_raw(record)

    def cut(rows: list[int]) -> dict:
        labels = {"click": np.ones(len(rows), np.float32)}
        return msgpack.unpackb(imp.labelled(np.array(rows), labels, None, False))

    for r in range(n):
        one, two = cut([r]), cut([r, (r + 1) % n])
        for name in ("user", "tags"):
            lens = np.frombuffer(two["sparse"][name]["lengths"], "<i4")
            ids = np.frombuffer(two["sparse"][name]["values"], "<u8")[: lens[0]]
            assert np.frombuffer(one["sparse"][name]["lengths"], "<i4").tolist() == lens[:1].tolist()
            assert np.frombuffer(one["sparse"][name]["values"], "<u8").tolist() == ids.tolist()
        assert one["dense"] == two["dense"][: len(one["dense"])]
        assert one["request"]["scores"]["click"] == two["request"]["scores"]["click"][:4]


def test_a_cut_of_several_rows_keeps_each_sparse_columns_own_ids() -> None:
    """Columns of one packed id per row are cut together; a ragged column, a one-id column in list
    form and one whose lengths are not all 1 are cut on their own. Each keeps its own rows, in the
    order the impression lists them."""
    from kelp.join.records import Impression

    n, rows = 7, [0, 2, 3, 6]
    ones = np.ones(n, "<i4").tobytes()
    packed = {name: np.arange(n, dtype="<u8") + base for name, base in (("a", 100), ("b", 200), ("c", 300))}
    ragged = np.array([1, 0, 2, 1, 1, 0, 3], "<i4")
    sparse: dict[str, Any] = {name: {"values": v.tobytes(), "lengths": ones} for name, v in packed.items()}
    sparse["tags"] = {"values": np.arange(ragged.sum(), dtype="<u8").tobytes(), "lengths": ragged.tobytes()}
    sparse["listed"] = {"values": list(range(10, 10 + n)), "lengths": [1] * n}
    sparse = {
        "b": sparse["b"],
        "tags": sparse["tags"],
        "a": sparse["a"],
        "listed": sparse["listed"],
        "c": sparse["c"],
    }
    raw = msgpack.packb(
        {"v": 1, "batch": n, "ts": T0, "request": {"id": "r"}, "sparse": sparse}, use_bin_type=True
    )
    imp = Impression.from_raw(raw)
    out = msgpack.unpackb(
        imp.labelled(np.array(rows), {"click": np.ones(len(rows), np.float32)}, None, False)
    )
    assert list(out["sparse"]) == ["b", "tags", "a", "listed", "c"]
    for name, values in packed.items():
        assert np.frombuffer(out["sparse"][name]["values"], "<u8").tolist() == values[rows].tolist()
        assert np.frombuffer(out["sparse"][name]["lengths"], "<i4").tolist() == [1] * len(rows)
    starts = np.concatenate(([0], np.cumsum(ragged)[:-1]))
    tags = [int(starts[r]) + k for r in rows for k in range(int(ragged[r]))]
    assert np.frombuffer(out["sparse"]["tags"]["values"], "<u8").tolist() == tags
    assert out["sparse"]["listed"] == {"values": [10 + r for r in rows], "lengths": [1] * len(rows)}
    assert out["join"]["sample_ids"] == [f"r/{r}" for r in rows]


def test_rows_of_an_item_with_one_or_several_ids_per_candidate() -> None:
    """An item column with one id per candidate and one with several (a candidate naming an item
    twice counts once) give the same ascending rows."""
    import msgpack

    from kelp.join.records import Impression

    def raw(values: list[int], lengths: list[int]) -> bytes:
        col = {"values": np.array(values, "<u8").tobytes(), "lengths": np.array(lengths, "<i4").tobytes()}
        n = len(lengths)
        return msgpack.packb(
            {"v": 1, "batch": n, "ts": T0, "request": {"id": "r"}, "sparse": {"item": col}}, use_bin_type=True
        )

    one = Impression.from_raw(raw([5, 7, 5, 9], [1, 1, 1, 1]), 0)
    assert one.rows_of_item("item", 5).tolist() == [0, 2]
    several = Impression.from_raw(raw([5, 5, 7, 9, 5, 1], [2, 0, 1, 3]), 0)
    assert several.rows_of_item("item", 5).tolist() == [0, 3]
    assert several.rows_of_item("item", 4).tolist() == []


def test_sample_ids_name_every_row_whatever_the_sizes_cut_before() -> None:
    """The rows' names come from a table sized by the largest row asked for: a cut of a larger
    request after smaller ones, one row, and no rows still name each row as :func:`sample_id` does."""
    from kelp.join.records import sample_id, sample_ids

    for rows in ([0], [1, 2], [3, 63, 64], list(range(100)), [999, 5], []):
        picked = np.array(rows, dtype=np.int64)
        assert sample_ids("q-7", picked) == [sample_id("q-7", r) for r in rows]

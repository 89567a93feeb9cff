"""The join's semantics on the in-memory waiting store: windows, late and early actions, sampling.

Every test drives :class:`Joiner` with records the way the process hands them
over, and reads its outputs back through Kelp's own event decoder, so what is
checked is what ``kelp train`` would train on.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import orjson
import pytest

from kelp.config import FeatureSpec, JoinConfig, SparseFeature
from kelp.consumers.decode import Decoder, Rec
from kelp.join import InputRecord, Joiner, MemoryWaitingStore, Step

from .helpers import T0, impression

IMP, CLICKS, BUYS = "requests", "clicks", "buys"


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

    def feed(self, *records: tuple[str, bytes], now: float = T0) -> Step:
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

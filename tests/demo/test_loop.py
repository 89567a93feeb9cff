"""`kelp demo --loop` closes the loop on real services: served, clicked, joined, trained, served better."""

from __future__ import annotations

import pytest

from kelp.demo.loop import CANDIDATES, run_loop
from kelp.harness import KafkaBroker

pytestmark = pytest.mark.integration


def test_the_loop_learns_what_users_click_from_what_it_served(
    kafka_broker: KafkaBroker, redis_url: str
) -> None:
    lines: list[str] = []
    report = run_loop(out=lines.append, seconds=18.0, period_s=6.0, services=(kafka_broker, redis_url))
    assert report.exits == {"train": 0, "serve": 0, "join": 0}, "\n".join(lines)
    assert report.requests > 0 and report.clicks > 0
    candidates = report.requests * CANDIDATES
    joined = report.joined["positive"] + report.joined["negative"]
    # Every served candidate was labelled (the last windows closed before the count), each click once.
    assert joined == candidates, "\n".join(lines)
    assert 0.9 * report.clicks <= report.joined["positive"] <= report.clicks
    # The trainer learned from the joined events (beside its seeded history) and published as it went.
    assert report.trained_samples >= joined
    assert report.versions[-1] > report.versions[0]
    first, last = report.periods[0], report.periods[-1]
    assert last.gap > first.gap + 0.1, "\n".join(lines)

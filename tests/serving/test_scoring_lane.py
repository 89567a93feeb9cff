"""The scoring lane: what ``run_in_executor`` on one thread gave the score routes, for less CPU.

Results and exceptions reach the caller (awaiting on the event loop or blocking on a thread of
its own), calls run one at a time in arrival order on the one named thread, and neither a caller
that gave up (a cancelled task) nor a loop that closed stops the lane for the calls after it.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from kelp.serving.dispatch import ScoringLane
from kelp.serving.errors import BadRequestError


def _fail() -> None:
    raise BadRequestError("bad_id", "no such id")


def test_results_and_errors_reach_the_caller_in_order_on_one_thread() -> None:
    lane = ScoringLane()
    seen: list[tuple[int, str]] = []

    def work(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i * 2

    async def main() -> list[int]:
        got = await asyncio.gather(*(lane.run(work, i) for i in range(20)))
        with pytest.raises(BadRequestError, match="no such id"):
            await lane.run(_fail)
        return list(got)

    try:
        assert asyncio.run(main()) == [i * 2 for i in range(20)]
        assert [i for i, _ in seen] == list(range(20))  # arrival order, one call at a time
        assert {name for _, name in seen} == {"kelp-score_0"}
        assert lane.run_blocking(work, 21) == 42
        with pytest.raises(BadRequestError):
            lane.run_blocking(_fail)
    finally:
        lane.close()


def test_a_cancelled_caller_or_a_closed_loop_does_not_stop_the_lane() -> None:
    lane = ScoringLane()
    release = threading.Event()

    async def cancelled() -> None:
        task = asyncio.ensure_future(lane.run(release.wait, 10.0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def abandoned() -> None:
        left.append(asyncio.ensure_future(lane.run(release.wait, 10.0)))  # its loop closes first
        await asyncio.sleep(0)

    async def then(values: tuple[int, int]) -> int:
        return await asyncio.wait_for(lane.run(sum, values), 60)  # a dead lane fails here, not hangs

    left: list[asyncio.Future[bool]] = []
    try:
        asyncio.run(cancelled())
        asyncio.run(abandoned())
        release.set()
        assert asyncio.run(then((1, 2))) == 3
        lane.close()
        assert asyncio.run(then((3, 4))) == 7  # a call after close starts the lane again
    finally:
        release.set()
        lane.close()

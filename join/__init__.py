"""``kelp join``: served requests and later actions in, labelled training events out.

:class:`~kelp.join.joiner.Joiner` decides (windows on event time, late and early
actions, negative down-sampling); :mod:`kelp.join.state` keeps what waits between
steps (Redis, or memory for tests); :class:`~kelp.join.process.JoinProcess` runs
the loop that sends, acknowledges, applies and commits in that order. The
semantics, with a timeline, are in docs/join.md.
"""

from kelp.join.joiner import InputRecord, Joiner, Output, Step
from kelp.join.process import JoinProcess
from kelp.join.records import Action, Impression, InputError, sample_id
from kelp.join.state import MemoryWaitingStore, RedisWaitingStore, Waiting

__all__ = [
    "Action",
    "Impression",
    "InputError",
    "InputRecord",
    "JoinProcess",
    "Joiner",
    "MemoryWaitingStore",
    "Output",
    "RedisWaitingStore",
    "Step",
    "Waiting",
    "sample_id",
]

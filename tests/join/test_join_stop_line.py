"""The line ``kelp join`` leaves when a signal stops it: what the run did and what it committed."""

from __future__ import annotations

from kelp.cli.commands.join_cmd import stopped_line
from kelp.join import JoinProcess

from .helpers import join_config

TOPICS = {"imp": "imp", "clicks": "clicks", "out": "out", "dlq": "dlq"}


def test_the_stop_line_names_the_signal_the_steps_committed_and_the_counts() -> None:
    process = JoinProcess(join_config("127.0.0.1:9", "redis://127.0.0.1:9", TOPICS))  # opens nothing
    m = process.metrics
    for seconds in (0.01, 0.02, 0.03):
        m.step_seconds.observe(seconds)
    m.impressions.labels(result="new").inc(40)
    m.impressions.labels(result="duplicate").inc(2)
    m.actions.labels(task="click", result="matched").inc(7)
    m.samples.labels(task="click", label="positive").inc(7)
    m.samples.labels(task="click", label="negative").inc(113)
    line = stopped_line(process, "SIGTERM")
    assert line.startswith("join stopped on SIGTERM: 3 steps finished")
    assert "offsets committed" in line and "commit failures" not in line
    assert "42 impressions and 7 actions read, 120 labelled samples emitted" in line
    m.commit_failures.inc()
    assert "(commit failures: 1, their records are read again)" in stopped_line(process, "SIGTERM")

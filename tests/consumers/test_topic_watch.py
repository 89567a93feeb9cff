"""TopicWatch's reading of successive metadata views (no broker: views are plain mappings)."""

from __future__ import annotations

import logging

import pytest

from kelp.consumers.topic_watch import TopicWatch, commit_metadata, committed_topic_id


def test_one_absence_is_not_missing_but_stops_commits() -> None:
    """The first refresh after subscribing may not have asked for the topic yet."""
    w = TopicWatch(["ev", "other"])
    w.observe({"other": ("o", 1)})
    assert w.missing == frozenset() and w.absent == frozenset({"ev"})
    assert w.changes() == [] and w.not_ready_reason() is None
    w.observe({"ev": ("e", 2), "other": ("o", 1)})
    assert w.absent == frozenset() and w.changes() == []


def test_missing_is_reported_once_and_named_in_the_reason() -> None:
    w = TopicWatch(["b", "a"])
    w.observe({"a": ("ida", 1), "b": ("idb", 1)})
    for _ in range(5):
        w.observe({})
    assert [(c.topic, c.kind) for c in w.changes()] == [("b", "missing"), ("a", "missing")]
    assert w.not_ready_reason() == "source topics missing from the cluster: a, b"
    w.observe({"a": ("ida", 1)})
    assert [(c.topic, c.kind) for c in w.changes()] == [("a", "back")]  # same id: not recreated
    assert w.not_ready_reason() == "source topic missing from the cluster: b"


def test_recreated_without_being_seen_missing_and_brokers_without_ids() -> None:
    w = TopicWatch(["ev"])
    w.observe({"ev": ("id-1", 2)})
    w.observe({"ev": ("id-2", 2)})
    assert [(c.kind, c.old_id, c.new_id) for c in w.changes()] == [("recreated", "id-1", "id-2")]
    assert w.topic_id("ev") == "id-2"
    no_ids = TopicWatch(["ev"])
    no_ids.observe({"ev": (None, 2)})
    no_ids.observe({"ev": (None, 3)})
    assert [(c.kind, c.before, c.partitions) for c in no_ids.changes()] == [("grew", 2, 3)]
    assert no_ids.topic_id("ev") is None


def test_commit_metadata_round_trip() -> None:
    assert committed_topic_id(commit_metadata("abc")) == "abc"
    assert commit_metadata(None) == ""
    assert committed_topic_id(None) is None and committed_topic_id("something else") is None


def test_kafka_lines_about_a_gone_topic_are_hidden_for_watched_topics_only(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kafka.structs import OffsetAndMetadata, TopicPartition

    cluster, coordinator = logging.getLogger("kafka.cluster"), logging.getLogger("kafka.coordinator.consumer")
    # Kelp's logging set-up (configure_logging, run by any earlier in-process CLI call) lowers some of
    # these lines for every topic; this test is about TopicWatch alone.
    for logger in (cluster, coordinator):
        monkeypatch.setattr(logger, "filters", [])
    commit_failed = "Group %s failed to commit partition %s at offset %s: %s"
    om = OffsetAndMetadata(5, "", -1)
    w = TopicWatch(["ev"])
    w.quiet()
    try:
        with caplog.at_level(logging.ERROR):
            cluster.error("Topic %s not found in cluster metadata", "ev")
            cluster.error("Topic %s not found in cluster metadata", "elsewhere")
            cluster.error("Topic %s is not authorized for this client", "ev")
            coordinator.error(commit_failed, "g", TopicPartition("ev", 0), om, "UnknownTopicOrPartitionError")
            coordinator.error(commit_failed, "g", TopicPartition("ev", 0), om, "KafkaStorageError")
    finally:
        w.unquiet()
    cluster.error("Topic %s not found in cluster metadata", "ev")  # shown again once unquieted
    assert [r.getMessage() for r in caplog.records] == [
        "Topic elsewhere not found in cluster metadata",
        "Topic ev is not authorized for this client",
        f"Group g failed to commit partition {TopicPartition('ev', 0)} at offset {om}: KafkaStorageError",
        "Topic ev not found in cluster metadata",
    ]


def test_consumer_settings_refresh_metadata_often_and_never_create_the_topic() -> None:
    from kelp.config import KafkaSourceConfig
    from kelp.consumers.kafka_client import consumer_settings

    settings = consumer_settings(KafkaSourceConfig(bootstrap_servers=["b:9092"], topics=["ev"]))
    assert settings["metadata_max_age_ms"] == 30_000  # kafka-python's own 5 min left new partitions unread
    assert settings["allow_auto_create_topics"] is False
    tuned = KafkaSourceConfig(bootstrap_servers=["b:9092"], topics=["ev"], metadata_max_age_ms=500)
    assert consumer_settings(tuned)["metadata_max_age_ms"] == 500

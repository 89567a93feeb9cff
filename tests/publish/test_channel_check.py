"""The eviction check of ``kelp config validate`` without a server: what it checks."""

from __future__ import annotations

import pytest

from kelp.config import PublisherConfig, StoreConfig
from kelp.publish.channel_check import check_channel_eviction, evicts_channel_keys


@pytest.mark.parametrize(
    ("policy", "evicts"),
    [("noeviction", False), ("volatile-lfu", False), ("volatile-ttl", False), ("allkeys-lru", True)],
)
def test_only_policies_that_evict_keys_without_a_ttl_count(policy: str, evicts: bool) -> None:
    assert evicts_channel_keys(policy) is evicts


@pytest.mark.parametrize(
    ("publisher", "store"),
    [
        (
            PublisherConfig(channel="filesystem", path="snapshots"),
            StoreConfig(backend="redis", urls=["redis://127.0.0.1:1"]),
        ),
        (PublisherConfig(enabled=False), StoreConfig(backend="redis", urls=["redis://127.0.0.1:1"])),
        (PublisherConfig(), StoreConfig(backend="memory")),
    ],
    ids=["filesystem-channel", "publishing-off", "no-redis-at-all"],
)
def test_nothing_to_check_says_nothing(publisher: PublisherConfig, store: StoreConfig) -> None:
    assert check_channel_eviction(publisher, store) is None

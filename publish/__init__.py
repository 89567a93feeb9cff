"""Publishing dense model snapshots from trainers to serving replicas.

The trainer calls :func:`build_publisher` once and ``maybe_publish`` after each
step; replicas read the same channel (:func:`build_channel`). Modules:

* :mod:`~kelp.publish.snapshot`: the snapshot format (safetensors + JSON manifest, checksum);
* :mod:`~kelp.publish.base`: the channel interface;
* :mod:`~kelp.publish.redis_channel`, :mod:`~kelp.publish.fs_channel`: the two channels;
* :mod:`~kelp.publish.publisher`: the interval/force logic and metrics;
* :mod:`~kelp.publish.errors`: the error tree (channel failures, rejected snapshots).
* :mod:`~kelp.publish.channel_check`: may the channel's Redis evict its keys (``kelp config validate``).

Sparse rows are never published: serving reads the store the trainer writes.

The error tree is imported at once; the other names are resolved on first use
(:mod:`kelp.lazy`): the snapshot format imports torch, which takes seconds, and
every ``kelp`` command imports the error tree, including the ones that never
touch a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kelp.lazy import lazy_exports
from kelp.publish.errors import (
    REJECT_REASONS,
    ChannelError,
    ChannelStateError,
    ChannelUnavailableError,
    SnapshotError,
    SnapshotMissingError,
    SnapshotNotStoredError,
    SnapshotRejectedError,
)

if TYPE_CHECKING:
    from kelp.publish.base import SnapshotChannel, Subscription
    from kelp.publish.metrics import PublisherMetrics
    from kelp.publish.publisher import Publisher, build_channel, build_publisher
    from kelp.publish.snapshot import (
        SNAPSHOT_FORMAT_VERSION,
        Snapshot,
        SnapshotManifest,
        build_snapshot,
        load_model,
        verify_snapshot,
    )

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "kelp.publish.base": ("SnapshotChannel", "Subscription"),
        "kelp.publish.metrics": ("PublisherMetrics",),
        "kelp.publish.publisher": ("Publisher", "build_channel", "build_publisher"),
        "kelp.publish.snapshot": (
            "SNAPSHOT_FORMAT_VERSION",
            "Snapshot",
            "SnapshotManifest",
            "build_snapshot",
            "load_model",
            "verify_snapshot",
        ),
    },
)

__all__ = [
    "REJECT_REASONS",
    "SNAPSHOT_FORMAT_VERSION",
    "ChannelError",
    "ChannelStateError",
    "ChannelUnavailableError",
    "Publisher",
    "PublisherMetrics",
    "Snapshot",
    "SnapshotChannel",
    "SnapshotError",
    "SnapshotManifest",
    "SnapshotMissingError",
    "SnapshotNotStoredError",
    "SnapshotRejectedError",
    "Subscription",
    "build_channel",
    "build_publisher",
    "build_snapshot",
    "load_model",
    "verify_snapshot",
]

"""The filesystem snapshot channel (``publisher.channel: filesystem``, ``publisher.path``).

Layout of ``publisher.path`` (a directory shared by the trainer and the
replicas, e.g. a ReadWriteMany volume)::

    snap-000000000041.safetensors   weights of version 41
    snap-000000000041.json          its manifest
    snap-000000000042.safetensors
    snap-000000000042.json
    latest                          JSON {"version": 42}
    pin                             JSON {"version": 40}, while an operator pins one

Every file is written atomically (temp file in the same directory, fsync,
``os.replace``, fsync of the directory), in the order weights, manifest,
``latest``: a reader that follows ``latest`` always finds both parts whole.
A crash leaves at most an orphan ``.*.tmp`` (removed by the next publish) or a
version that ``latest`` does not point at yet.

There is no notification: :class:`FilesystemSubscription` checks the identity
(inode, mtime) of ``latest`` and ``pin`` every ``check_every_s`` (0.1 s), a
``stat`` call each, so replicas still notice a new version or a new pin within
a fraction of a second.

One publisher per directory: versions are ``max(stored, latest) + 1``, where
"stored" counts any ``snap-*`` file (a crash's orphan weights included), so a
number is never handed out twice. Version files are written once: a write
whose files already exist, or whose version is not above every stored one and
``latest``, is refused with :class:`~kelp.publish.errors.ChannelStateError`.
A directory found empty by a publisher that already published (``floor``: it
was wiped or another one mounted) is refused the same way, and an empty one
otherwise starts at 1 with a warning. A ``latest`` that is not Kelp's JSON is
reported by :meth:`FilesystemChannel.latest_version` (a replica logs it once)
and replaced by the next publish.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kelp.files import atomic_write
from kelp.publish.base import SnapshotChannel, Subscription
from kelp.publish.errors import (
    ChannelError,
    ChannelStateError,
    ChannelUnavailableError,
    SnapshotMissingError,
)
from kelp.publish.snapshot import Snapshot

__all__ = ["FilesystemChannel", "FilesystemSubscription", "translate_os_errors"]

log = logging.getLogger("kelp.publish")

LATEST = "latest"
PIN = "pin"
_MANIFEST = re.compile(r"^snap-(\d{12})\.json$")
_ANY_PART = re.compile(r"^snap-(\d{12})\.(?:json|safetensors)$")


@contextmanager
def translate_os_errors(where: str) -> Iterator[None]:
    """``PermissionError``: a :class:`ChannelError` (will not heal); other ``OSError``: retriable."""
    try:
        yield
    except PermissionError as exc:
        raise ChannelError(f"snapshot channel {where}: {exc}") from exc
    except OSError as exc:
        raise ChannelUnavailableError(f"snapshot channel {where}: {exc}") from exc


def _stat_id(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


class FilesystemSubscription(Subscription):
    """Waits for one of ``paths`` (``latest``, ``pin``) to change, checking every ``check_every_s``."""

    def __init__(self, *paths: Path, check_every_s: float = 0.1) -> None:
        self._paths = paths
        self._every = check_every_s
        self._seen = [_stat_id(p) for p in paths]

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            now = [_stat_id(p) for p in self._paths]
            if now != self._seen:
                self._seen = now
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self._every, left))


class FilesystemChannel(SnapshotChannel):
    """Snapshots as files in one directory; see the module docstring."""

    name = "filesystem"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        with translate_os_errors(str(self.path)):
            self.path.mkdir(parents=True, exist_ok=True)

    def _weights(self, version: int) -> Path:
        return self.path / f"snap-{version:012d}.safetensors"

    def _manifest(self, version: int) -> Path:
        return self.path / f"snap-{version:012d}.json"

    def next_version(self, floor: int = 0) -> int:
        high, _ = self._highest(_ANY_PART)
        if high < floor:
            raise ChannelStateError(
                f"snapshot channel {self.path}: this publisher already published v{floor} but the directory "
                f"holds nothing above v{high} (wiped, or another directory mounted?); refusing to publish "
                "rather than reuse a version number: restore the directory, or write "
                f'{{"version": N}} into {LATEST} there, N at least the highest version any replica serves'
            )
        if high == 0:
            log.warning(
                "snapshot channel %s holds no snapshots: numbering starts at v1 (a new deployment; if this "
                "deployment published before, its files were removed, and replicas keep serving their "
                "version until the new numbering passes it)",
                self.path,
            )
        return high + 1

    def write(self, snapshot: Snapshot) -> None:
        version = snapshot.manifest.version
        with translate_os_errors(str(self.path)):
            if self._weights(version).exists() or self._manifest(version).exists():
                raise ChannelStateError(
                    f"snapshot channel {self.path}: v{version} already exists and versions are written once; "
                    "refusing to overwrite it"
                )
            high, garbled = self._highest(_MANIFEST)
            if version <= high:
                raise ChannelStateError(
                    f"snapshot channel {self.path}: v{version} is not above v{high}, which the directory "
                    "holds (a publisher is ahead); not written"
                )
            atomic_write(self._weights(version), snapshot.weights)
            atomic_write(self._manifest(version), snapshot.manifest.to_json())
            atomic_write(self.path / LATEST, json.dumps({"version": version}).encode())
            for tmp in self.path.glob(".*.tmp"):
                if time.time() - tmp.stat().st_mtime > 60:  # a crashed writer's leftovers
                    tmp.unlink(missing_ok=True)
        if garbled is not None:
            log.warning("%s; the publish of v%d replaced it", garbled, version)

    def _highest(self, files: re.Pattern[str]) -> tuple[int, str | None]:
        """The highest version among the ``files`` present and ``latest`` (0: none), and ``latest``'s problem.

        A ``latest`` that is not Kelp's JSON is left out: the files are the record.
        """
        with translate_os_errors(str(self.path)):
            names = os.listdir(self.path)
        high = max([int(m.group(1)) for n in names if (m := files.match(n))], default=0)
        try:
            return max(high, self.latest_version() or 0), None
        except ChannelStateError as exc:
            return high, str(exc)

    def versions(self) -> list[int]:
        with translate_os_errors(str(self.path)):
            names = os.listdir(self.path)
        return sorted(int(m.group(1)) for n in names if (m := _MANIFEST.match(n)))

    def latest_version(self) -> int | None:
        return self._version_file(self.path / LATEST, "the trainer's next publish rewrites it")

    def _version_file(self, path: Path, repair: str) -> int | None:
        """The version in ``path`` (``latest``, ``pin``); None when it is absent."""
        with translate_os_errors(str(self.path)):
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                return None
        try:
            version = json.loads(raw)["version"]
        except (ValueError, TypeError, KeyError):
            version = None
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            text = raw[:40].decode(errors="replace") + ("..." if len(raw) > 40 else "")
            raise ChannelStateError(f'snapshot channel {path} holds {text!r}, not {{"version": N}}; {repair}')
        return version

    def pinned_version(self) -> int | None:
        return self._version_file(self.path / PIN, "`kelp model pin N` or `kelp model unpin` rewrites it")

    def set_pin(self, version: int | None) -> None:
        with translate_os_errors(str(self.path)):
            if version is None:
                (self.path / PIN).unlink(missing_ok=True)
                return
            if not self._manifest(version).exists():
                raise SnapshotMissingError(f"snapshot v{version} is not in {self.path}; nothing pinned")
            atomic_write(self.path / PIN, json.dumps({"version": version}).encode())

    def read_manifest_raw(self, version: int) -> bytes:
        with translate_os_errors(str(self.path)):
            try:
                return self._manifest(version).read_bytes()
            except FileNotFoundError:
                raise SnapshotMissingError(f"snapshot v{version} is not in {self.path} (pruned?)") from None

    def read_raw(self, version: int) -> tuple[bytes, bytes]:
        with translate_os_errors(str(self.path)):
            try:
                return self._manifest(version).read_bytes(), self._weights(version).read_bytes()
            except FileNotFoundError:
                raise SnapshotMissingError(f"snapshot v{version} is not in {self.path} (pruned?)") from None

    def delete(self, versions: list[int]) -> None:
        try:
            pin = self.pinned_version()
        except ChannelStateError:
            return  # what is pinned is unknown: delete nothing
        with translate_os_errors(str(self.path)):
            for v in versions:
                if v == pin:
                    continue
                self._manifest(v).unlink(missing_ok=True)  # manifest first: readers list manifests
                self._weights(v).unlink(missing_ok=True)

    def subscribe(self) -> FilesystemSubscription:
        return FilesystemSubscription(self.path / LATEST, self.path / PIN)

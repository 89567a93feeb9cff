"""Where snapshot objects are kept: a directory, or an S3-compatible bucket.

Both behind one small interface of whole objects named by ``/``-separated
paths (``<deployment>/<snapshot_id>/shards/<table>.<part>.<seq>.safetensors``):
a snapshot is written once and read whole, so no seek, append or rename is
needed, and the same code runs on a laptop's disk and on object storage.

* A directory (a plain path or ``file://``): each object is a file written
  atomically (temp file in the same directory, fsync, rename), so a reader or
  a killed writer never leaves half an object under its real name; temp files
  are never listed.
* ``s3://bucket/prefix`` through boto3 (the optional extra ``kelp[s3]``),
  against AWS or any S3-compatible server (MinIO, Ceph, s3proxy) at
  ``s3_endpoint`` or ``AWS_ENDPOINT_URL``. Credentials come from boto3's usual
  chain (environment, shared files, instance role); none is ever logged.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from kelp.files import atomic_write
from kelp.redaction import redact_url
from kelp.store.snapshots.errors import MissingObjectError, SnapshotError

__all__ = [
    "FileStorage",
    "S3Storage",
    "SnapshotStorage",
    "check_object_name",
    "check_prefix",
    "open_storage",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_DELETE_BATCH = 1000
"""The most keys one S3 DeleteObjects request takes."""


class SnapshotStorage(Protocol):
    """Whole objects under ``/``-separated names; every method is safe to call from several threads."""

    def put(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``name``, replacing it; readers see the old object or the new one whole."""
        ...

    def get(self, name: str) -> bytes:
        """The bytes of ``name``; :class:`MissingObjectError` when there is no such object."""
        ...

    def names(self, prefix: str) -> list[str]:
        """Every object name that starts with ``prefix``, sorted (never a temp file or a folder marker)."""
        ...

    def delete(self, prefix: str) -> int:
        """Delete every object whose name starts with ``prefix`` (not empty); returns how many."""
        ...

    def describe(self) -> str:
        """Where the objects are, for logs and errors (secrets redacted)."""
        ...


def check_object_name(name: str) -> str:
    """``name`` if it is a relative ``/``-path with no empty, ``.``-led or ``..`` part, else one error line.

    Object names come partly from users (a snapshot id on the command line, a
    table name), so one that could leave the storage's root is refused.
    """
    parts = name.split("/")
    if not name or any(not p or p.startswith(".") or "\\" in p for p in parts):
        raise SnapshotError(
            f"invalid snapshot object name {name!r}: expected a/b/c with no empty or '.'-led part"
        )
    return name


def check_prefix(prefix: str) -> str:
    """``prefix`` if every part of it is a valid name part (the last one may be partial or empty)."""
    *folders, last = prefix.split("/")
    if prefix and (any(not p or p.startswith(".") or "\\" in p for p in folders) or last.startswith(".")):
        raise SnapshotError(f"invalid snapshot object prefix {prefix!r}: expected a/b/ with no '.'-led part")
    return prefix


def open_storage(url: str, *, s3_endpoint: str | None = None) -> SnapshotStorage:
    """The storage a ``snapshots.rows.url`` names: a path, ``file://path`` or ``s3://bucket/prefix``."""
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise SnapshotError(f"snapshot url {redact_url(url)}: s3:// needs a bucket (s3://bucket/prefix)")
        endpoint = s3_endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return S3Storage(bucket, prefix, endpoint=endpoint or None)
    if url.startswith("file://"):
        return FileStorage(Path(url[len("file://") :]))
    if _SCHEME.match(url):
        raise SnapshotError(
            f"snapshot url {redact_url(url)}: expected a directory, file://... or s3://bucket/prefix"
        )
    if not url.strip():
        raise SnapshotError("snapshot url is empty: expected a directory, file://... or s3://bucket/prefix")
    return FileStorage(Path(url))


class FileStorage:
    """Objects as files under ``root``; written with :func:`kelp.files.atomic_write`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, name: str) -> Path:
        return self.root / check_object_name(name)

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        except OSError as exc:
            raise SnapshotError(f"cannot write {name} in {self.describe()}: {exc.strerror or exc}") from None

    def get(self, name: str) -> bytes:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            raise MissingObjectError(f"no object {name} in {self.describe()}") from None
        except OSError as exc:
            raise SnapshotError(f"cannot read {name} in {self.describe()}: {exc.strerror or exc}") from None

    def names(self, prefix: str) -> list[str]:
        return sorted(n for n, _ in self._files(check_prefix(prefix)) if not _is_temp(n))

    def delete(self, prefix: str) -> int:
        """Remove every file under ``prefix``, a killed writer's temp files too, then emptied folders."""
        if not prefix:
            raise SnapshotError(f"refusing to delete everything in {self.describe()}: give a prefix")
        count = 0
        for name, path in list(self._files(check_prefix(prefix))):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise SnapshotError(
                    f"cannot delete {name} in {self.describe()}: {exc.strerror or exc}"
                ) from None
            count += not _is_temp(name)
        self._prune(prefix)
        return count

    def describe(self) -> str:
        return str(self.root)

    def _files(self, prefix: str) -> Iterator[tuple[str, Path]]:
        """``(name, path)`` of every file whose name starts with ``prefix``; only its folder is walked."""
        folder = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        if not folder.is_dir():
            return
        for dirpath, _dirs, files in os.walk(folder):
            for leaf in files:
                path = Path(dirpath) / leaf
                name = path.relative_to(self.root).as_posix()
                if name.startswith(prefix):
                    yield name, path

    def _prune(self, prefix: str) -> None:
        """Remove the folders that deleting ``prefix`` left empty, deepest first, never the root."""
        folder = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        if not folder.is_dir():
            return
        for dirpath, _dirs, _files in sorted(os.walk(folder), key=lambda w: -len(w[0])):
            path = Path(dirpath)
            if path != self.root and path.relative_to(self.root).as_posix().startswith(prefix.rstrip("/")):
                with contextlib.suppress(OSError):
                    path.rmdir()


def _is_temp(name: str) -> bool:
    """A temp file of :func:`kelp.files.atomic_write` (``.<leaf>.<random>.tmp``); no object name has one."""
    return name.rpartition("/")[2].startswith(".")


class S3Storage:
    """Objects in ``bucket`` under ``prefix`` through one thread-safe boto3 client."""

    def __init__(
        self, bucket: str, prefix: str = "", *, endpoint: str | None = None, max_attempts: int = 5
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.endpoint = endpoint
        self._client = _s3_client(endpoint, max_attempts)

    def put(self, name: str, data: bytes) -> None:
        with self._errors("write", name):
            self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def get(self, name: str) -> bytes:
        with self._errors("read", name):
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(name))
            return bytes(response["Body"].read())

    def names(self, prefix: str) -> list[str]:
        return sorted(k[len(self.prefix) :] for k in self._keys(prefix) if not k.endswith("/"))

    def delete(self, prefix: str) -> int:
        """Delete in batches of 1000 keys: the objects, then any folder markers left under the prefix.

        Markers go last because some servers (s3proxy's filesystem backend)
        stall on deleting a marker whose folder still holds objects.
        """
        if not prefix:
            raise SnapshotError(f"refusing to delete everything in {self.describe()}: give a prefix")
        keys = self._keys(prefix)
        objects = [k for k in keys if not k.endswith("/")]
        self._delete_keys(objects, prefix)
        if len(objects) < len(keys):
            markers = [k for k in self._keys(prefix) if k.endswith("/")]
            self._delete_keys(sorted(markers, key=len, reverse=True), prefix)
        return len(objects)

    def _delete_keys(self, keys: list[str], prefix: str) -> None:
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = {"Objects": [{"Key": k} for k in keys[start : start + _DELETE_BATCH]], "Quiet": True}
            with self._errors("delete", prefix):
                response = self._client.delete_objects(Bucket=self.bucket, Delete=batch)
            if errors := response.get("Errors"):
                first = errors[0]
                raise SnapshotError(
                    f"cannot delete {first.get('Key')} in {self.describe()}: {first.get('Code')} "
                    f"({len(errors)} key(s) not deleted)"
                )

    def describe(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}"
        return f"{where} at {redact_url(self.endpoint)}" if self.endpoint else where

    def _key(self, name: str) -> str:
        return self.prefix + check_object_name(name)

    def _keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        with self._errors("list", prefix or "/"):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + check_prefix(prefix)
            )
            for page in pages:
                keys.extend(obj["Key"] for obj in page.get("Contents", ()))
        return keys

    @contextlib.contextmanager
    def _errors(self, action: str, name: str) -> Iterator[None]:
        """botocore's errors as one :class:`SnapshotError` line naming the object and the url."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
        )

        where = self.describe()
        try:
            yield
        except ClientError as exc:
            raise _client_error(exc, action, name, where) from None
        except EndpointConnectionError:
            raise SnapshotError(f"cannot {action} {name}: S3 endpoint unreachable for {where}") from None
        except NoCredentialsError:
            raise SnapshotError(
                f"cannot {action} {name} in {where}: no AWS credentials "
                "(set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or an instance role)"
            ) from None
        except BotoCoreError as exc:
            raise SnapshotError(f"cannot {action} {name} in {where}: {_one_line(exc)}") from None


def _client_error(exc: Any, action: str, name: str, where: str) -> SnapshotError:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code == "NoSuchBucket":
        return SnapshotError(f"cannot {action} {name}: no such bucket for {where}")
    if code in ("NoSuchKey", "404") or (action == "read" and status == 404):
        return MissingObjectError(f"no object {name} in {where}")
    if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403") or status == 403:
        return SnapshotError(
            f"cannot {action} {name}: access denied ({code or status}) for {where}; check credentials"
        )
    return SnapshotError(f"cannot {action} {name} in {where}: {code or status} {_one_line(exc)}")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _s3_client(endpoint: str | None, max_attempts: int) -> Any:
    """A boto3 S3 client that S3-compatible servers accept as well as AWS does.

    Recent botocore adds CRC32 checksum headers to every upload and to
    DeleteObjects; many S3-compatible servers refuse headers they do not know.
    Uploads skip them (each shard carries its own sha256 in the manifest), and
    DeleteObjects, which must carry some checksum, sends the classic
    Content-MD5 that every S3 implementation accepts.
    """
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise SnapshotError("s3:// snapshot urls need boto3: pip install 'kelp[s3]'") from None
    options: dict[str, Any] = {
        "retries": {"mode": "standard", "max_attempts": max_attempts},
        "connect_timeout": 10,
        "read_timeout": 120,
        "max_pool_connections": 32,
    }
    if endpoint:  # S3-compatible servers are reached by path, not by a bucket's own host name
        options["s3"] = {"addressing_style": "path"}
    try:
        config = Config(
            **options,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
    except TypeError:  # botocore before flexible checksums: nothing to turn off
        config = Config(**options)
    client = boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)
    client.meta.events.register("before-sign.s3.DeleteObjects", _content_md5_instead_of_crc)
    return client


def _content_md5_instead_of_crc(request: Any, **_kwargs: Any) -> None:
    """Replace DeleteObjects' flexible checksum headers by Content-MD5 (before signing)."""
    headers = request.headers
    flexible = [
        h
        for h in headers
        if h.lower().startswith("x-amz-checksum-") or h.lower() == "x-amz-sdk-checksum-algorithm"
    ]
    if not flexible:
        return
    for header in flexible:
        del headers[header]
    body = request.body if isinstance(request.body, bytes) else (request.body or b"")
    if isinstance(body, str):
        body = body.encode()
    headers["Content-MD5"] = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode(
        "ascii"
    )

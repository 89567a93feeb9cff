"""File and replay sources: Criteo TSV, generic CSV (header mapped by config), msgpack event log, JSON Lines.

All go through the same :class:`~kelp.consumers.decode.Decoder` as Kafka
(rows become schema-v1 samples; JSON Lines are read by the ``json`` mapping,
:mod:`~kelp.consumers.json_events`), so validation, transforms and the
``kelp_records_rejected_total`` counter behave identically; rejected rows are
counted and logged (there is no dead-letter topic for files) with the place a
person can open: ``source=FILE:LINE`` (1-based; a CSV header is line 1) for
text formats, ``source=FILE record N`` (1-based) for a msgpack log. Batches carry
``SourceRange(topic=<file path>, partition=0, offsets=row or message index)``
and ``commit`` only advances :attr:`FileSource.committed`.

Criteo TSV: ``label, I1..I13, C1..C26``, tab-separated, no header. Empty
fields are missing (dense -> the feature's default, sparse -> no id); short
rows are padded with empty fields. The categorical values (8 hex digits,
``68fd1e64``) are ids by the one rule of every format
(:func:`~kelp.consumers.ids.str_id`): a token of digits only (``12345678``)
is that integer, any other the xxh3-64 hash of its text, so a client scores
the raw token as a string and hits the row training wrote. Files ending in
``.gz`` are read through gzip.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgpack
from prometheus_client import CollectorRegistry

from kelp.config import BatchingConfig, FeatureSpec, FileSourceConfig
from kelp.consumers.base import Source, ranges_of
from kelp.consumers.batch import MicroBatch, SourceRange
from kelp.consumers.batcher import Batcher
from kelp.consumers.criteo import DENSE_NAMES, SPARSE_NAMES
from kelp.consumers.csv_rows import iter_csv_numbered, parse_number
from kelp.consumers.deadletter import LogDeadLetter
from kelp.consumers.decode import Rec
from kelp.consumers.errors import SourceClosedError, SourceUserError
from kelp.consumers.formats import record_decoder
from kelp.consumers.ids import str_id
from kelp.consumers.json_events import iter_json_lines
from kelp.consumers.metrics import ConsumerMetrics
from kelp.consumers.offsets import OffsetTracker
from kelp.consumers.textfiles import open_binary, open_text
from kelp.progress import bar

__all__ = ["FileSource", "iter_criteo_tsv", "iter_msgpack_log"]

log = logging.getLogger(__name__)

_RUN = 4096  # records decoded together


def _pack(sample: dict[str, Any]) -> bytes:
    return msgpack.packb(sample, use_bin_type=True)


def iter_criteo_tsv(path: Path, label: str = "label") -> Iterator[bytes]:
    """Schema-v1 messages, one per Criteo TSV row."""
    with open_text(path) as fh:
        for line in fh:
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) < 40:
                fields += [""] * (40 - len(fields))
            dense = {n: parse_number(v) for n, v in zip(DENSE_NAMES, fields[1:14], strict=True) if v != ""}
            # The id itself, not the token: plain int messages take the decoder's fast paths.
            sparse = {n: str_id(v) for n, v in zip(SPARSE_NAMES, fields[14:40], strict=True) if v != ""}
            sample: dict[str, Any] = {"v": 1, "dense": dense, "sparse": sparse}
            if fields[0] != "":
                sample[label] = parse_number(fields[0])
            yield _pack(sample)


def iter_msgpack_log(path: Path) -> Iterator[bytes]:
    """The raw bytes of each message in a file of concatenated schema-v1 msgpack messages."""
    with open_binary(path) as fh:
        data = fh.read()
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    start = 0
    while True:
        try:
            unpacker.skip()
        except msgpack.OutOfData:
            break
        except Exception:  # a corrupt tail: hand it to the decoder, which rejects it
            yield data[start:]
            return
        end = unpacker.tell()
        yield data[start:end]
        start = end
    if start < len(data):
        yield data[start:]


class FileSource(Source):
    """Replays a file as micro-batches; single-threaded, ends with :class:`SourceClosedError`."""

    def __init__(
        self,
        cfg: FileSourceConfig,
        spec: FeatureSpec,
        batching: BatchingConfig | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.cfg = cfg
        self.spec = spec
        self.batching = batching or BatchingConfig()
        self.metrics = ConsumerMetrics(registry)
        self.dead_letter = _FileDeadLetter(self.metrics, self._where)
        self.topic = str(cfg.path)
        self._run_lines: list[int] = []  # the line (or record number) of each record of the run in hand
        self._run_first = 0  # the record offset of the run's first record
        if not Path(cfg.path).exists():
            raise SourceUserError(f"{cfg.path}: no such file")
        self._decoder = record_decoder(cfg, spec)
        self._batcher = Batcher(spec, self.batching.batch_size, math.inf)
        self._tracker = OffsetTracker()
        self._messages = self._iter_messages()
        self._exhausted = False
        self._closed = False
        self._samples = 0
        self._next_offset = 0
        self._total = _estimated_records(Path(cfg.path), cfg)
        # Rows read, on stderr when it is a terminal (kelp.progress); cleared when the file ends.
        self._bar = bar(
            total=self._total, desc=Path(cfg.path).name, unit="rows", unit_scale=True, leave=False
        )
        self.committed: int = 0
        """Records (rows or messages) of the file known durable: the next record to replay from."""

    def _iter_messages(self) -> Iterator[tuple[int, bytes]]:
        """``(line or record number, message)``, both 1-based (CSV: the line its row starts on)."""
        path = Path(self.cfg.path)
        if self.cfg.format == "criteo_tsv":
            return enumerate(iter_criteo_tsv(path, self.spec.label.name), 1)
        if self.cfg.format == "csv":
            if self.cfg.csv is None:
                raise SourceUserError(f"{path}: format csv needs a csv mapping")
            return iter_csv_numbered(path, self.cfg.csv, self.spec.label.name)
        if self.cfg.format == "json":
            return iter_json_lines(path)
        return enumerate(iter_msgpack_log(path), 1)

    def _where(self, rejection: Any) -> str:
        """``FILE:LINE`` (text formats) or ``FILE record N`` (msgpack) of a rejected record of this run."""
        at = rejection.offset - self._run_first
        number = self._run_lines[at] if 0 <= at < len(self._run_lines) else rejection.offset + 1
        return f"{self.topic} record {number}" if self.cfg.format == "msgpack" else f"{self.topic}:{number}"

    def _fill(self) -> None:
        """Decode the next run of records into the batcher (sets ``_exhausted`` at the end or the limit)."""
        records: list[Rec] = []
        lines: list[int] = []
        offset = self._next_offset
        for line, value in self._messages:
            records.append(Rec(self.topic, 0, offset, value))
            lines.append(line)
            offset += 1
            if len(records) >= _RUN:
                break
        self._bar.update(offset - self._next_offset)
        self._run_first, self._run_lines = self._next_offset, lines
        self._next_offset = offset
        if not records:
            self._exhausted = True
            self._bar.close()
            return
        chunk = self._decoder.decode(records)
        for rejection in chunk.rejections:
            self.dead_letter.reject(rejection)
        limit = self.cfg.limit
        if limit is not None and self._samples + chunk.size >= limit:
            keep = limit - self._samples
            chunk = _truncate(chunk, keep)
            self._exhausted = True
            self._bar.close()
        self._samples += chunk.size
        self.metrics.records.labels(topic="file").inc(chunk.last_offset - chunk.first_offset + 1)
        self.metrics.samples.labels(topic="file").inc(chunk.size)
        self.metrics.bytes.labels(topic="file").inc(chunk.nbytes)
        self._batcher.add(chunk)

    def poll(self, timeout_s: float | None = None) -> MicroBatch | None:
        if self._closed:
            raise SourceClosedError(f"{self.topic}: source is closed")
        while True:
            while not self._exhausted and self._batcher.rows < self.batching.batch_size:
                self._fill()
            emitted = self._batcher.take(force=self._exhausted)
            if emitted is None:
                raise SourceClosedError(f"{self.topic}: end of file")
            ranges = emitted.batch.sources if emitted.batch is not None else emitted.handled
            for r in ranges:
                self._tracker.register((r.topic, r.partition), r.last_offset)
            if emitted.batch is None:
                self.commit(ranges)
                continue
            self.metrics.batches.inc()
            return emitted.batch

    def commit(self, batch_or_sources: MicroBatch | Iterable[SourceRange], wait: bool = False) -> None:
        for r in ranges_of(batch_or_sources):
            self._tracker.mark_durable((r.topic, r.partition), r.last_offset)
        pos = self._tracker.positions().get((self.topic, 0))
        if pos is not None:
            self.committed = pos
            self.metrics.committed.labels(topic="file", partition="0").set(pos)

    def close(self) -> None:
        self._closed = True
        self._bar.close()

    def expected_samples(self) -> int | None:
        """The file's records (its lines; the limit when smaller), one sample each; None when unknown."""
        return self._total or None


class _FileDeadLetter(LogDeadLetter):
    """The log sink, naming a rejected record by its line (or record number) in the file."""

    def __init__(self, metrics: ConsumerMetrics, locate: Callable[[Any], str]) -> None:
        super().__init__(metrics)
        self._locate = locate

    def where(self, rejection: Any) -> str:
        return self._locate(rejection)


_COUNT_LINES_UP_TO = 1 << 30  # bytes on disk; bigger files report no progress rather than read twice
_COUNT_GZIP_UP_TO = 64 << 20  # compressed bytes: counting inflates the whole file, far slower per byte


def _estimated_records(path: Path, cfg: FileSourceConfig) -> int | None:
    """Records in a line-per-record file (TSV rows; CSV rows after its header), capped by ``limit``.

    An estimate for progress lines only (a quoted CSV field with a newline counts twice).
    """
    size = path.stat().st_size
    gz = path.suffix == ".gz"
    if cfg.format == "msgpack" or size > (_COUNT_GZIP_UP_TO if gz else _COUNT_LINES_UP_TO):
        return cfg.limit
    lines = 0
    with open_binary(path) as fh:
        while block := fh.read(1 << 20):
            lines += block.count(b"\n")
    has_header = cfg.format == "csv" and cfg.csv is not None and cfg.csv.columns is None
    records = max(0, lines - 1) if has_header else lines
    return min(records, cfg.limit) if cfg.limit is not None else records


def _truncate(chunk: Any, keep: int) -> Any:
    """The first ``keep`` samples of a chunk; its offset range ends at the last kept row's record."""
    from dataclasses import replace

    import numpy as np

    if keep >= chunk.size:
        return chunk
    values, lengths = {}, {}
    for name, ln in chunk.lengths.items():
        n_ids = int(np.sum(ln[:keep], dtype=np.int64))
        values[name] = chunk.values[name][:n_ids]
        lengths[name] = ln[:keep]
    last = int(chunk.row_offsets[keep - 1]) if keep else chunk.first_offset
    return replace(
        chunk,
        last_offset=max(last, chunk.first_offset),
        labels=chunk.labels[:keep],
        dense=chunk.dense[:keep],
        ts=chunk.ts[:keep],
        values=values,
        lengths=lengths,
        row_offsets=chunk.row_offsets[:keep],
        extra_labels={t: col[:keep] for t, col in chunk.extra_labels.items()},
        weight=None if chunk.weight is None else chunk.weight[:keep],
    )

"""Executor side: Arrow record batches to Hive-partitioned Parquet files with Delta statistics.

Runs inside Spark's Python workers. It must not import deltalake or pyspark (worker start-up
time matters) and never touches the Delta log: it only writes files and describes them in
:class:`WrittenFile` records that travel back to the driver in the commit message.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pyarrow.types as pat

from deltaflow.config.locations import join

__all__ = [
    "HIVE_NULL",
    "PartitionedFileWriter",
    "WrittenFile",
    "escape_path_component",
    "partition_dir",
    "stats_json",
    "unescape_path_component",
    "writer_process",
]

#: Hive's default directory name for a NULL partition value (Spark and delta-rs use it too).
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

#: Rows buffered per open file before a row group is written. pyarrow writes one row group per
#: call, and Spark hands over 10k-row batches: 1M-row groups keep footers small and scans fast.
ROW_GROUP_ROWS = 1_048_576
#: ... or this many bytes of Arrow data, whichever comes first (bounds memory per file).
ROW_GROUP_BYTES = 128 * 1024 * 1024
#: All buffers of one task together; above it the largest buffer is flushed (many partitions).
TASK_BUFFER_BYTES = 512 * 1024 * 1024

# Characters Hive (and Spark) percent-escape in partition directory names.
_ESCAPE = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(chr(c) for c in range(0x20))


def escape_path_component(value: str) -> str:
    """Percent-escape a partition value for a directory name, the way Hive and Spark do."""
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPE else ch for ch in value)


_ESCAPED = re.compile(r"%([0-9A-Fa-f]{2})")


def unescape_path_component(name: str) -> str:
    """The partition value of a directory name: ``%xx`` decoded the way Spark's
    ``unescapePathName`` does (each escape is one character; a ``%`` not followed by two hex
    digits stays as it is)."""
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), name)


def partition_value(value: Any) -> str | None:
    """The string form the Delta protocol stores for a partition value."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _dt.date):
        return value.isoformat()
    return str(value)


def partition_dir(columns: Sequence[str], values: Sequence[str | None]) -> str:
    """``col=value/...`` for the given partition values (escaped as on disk)."""
    return "/".join(
        f"{escape_path_component(c)}={HIVE_NULL if v is None else escape_path_component(v)}"
        for c, v in zip(columns, values, strict=True)
    )


@dataclass(frozen=True)
class WrittenFile:
    """One Parquet file a task wrote: what the Delta ``add`` action needs."""

    path: str  # relative to the table root, as on disk (not percent-encoded)
    size: int
    partition_values: dict[str, str | None]
    num_records: int
    stats: str
    modification_time: int  # ms since the epoch


def writer_process() -> str:
    """The executor process a task writes from: its host and its Python daemon (one per
    executor). Commits record how many wrote their files (``deltaflow.writers``)."""
    import os
    import socket

    return f"{socket.gethostname()}:{os.getppid()}"


# ---------------------------------------------------------------------------------------------
# Statistics


def _iso_ms(micros: int, round_up: bool) -> str:
    """Delta's timestamp stat format: ISO-8601 UTC with milliseconds.

    Delta stores timestamp stats at millisecond precision. Truncating a maximum would make it
    smaller than the real one and let readers skip a file that holds matching rows, so maxima
    are rounded up and minima down: the stats stay valid bounds.
    """
    millis = micros // 1000 if not round_up else -((-micros) // 1000)
    value = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC) + _dt.timedelta(milliseconds=millis)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


#: Microseconds per unit of a timestamp (``ns`` divides, exactly, in integers).
_TS_FACTOR = {"s": 1_000_000, "ms": 1000, "us": 1}


def _stat_value(t: pa.DataType, value: Any, raw: Any, is_max: bool) -> Any:
    """JSON value of one Parquet min/max statistic, or ``None`` to leave it out."""
    if pat.is_timestamp(t):
        if t.unit == "ns":  # integer arithmetic: a float loses the last digits of 1.7e18
            micros = -((-int(raw)) // 1000) if is_max else int(raw) // 1000
        else:
            micros = int(raw) * _TS_FACTOR[t.unit]
        return _iso_ms(micros, round_up=is_max)
    if pat.is_date(t):
        return value.isoformat()
    if pat.is_integer(t):
        return int(value)
    if pat.is_floating(t):
        f = float(value)
        return f if math.isfinite(f) else None
    if pat.is_string(t) or pat.is_large_string(t) or pat.is_string_view(t):
        return value if isinstance(value, str) else None
    return None  # booleans, decimals, binary: no min/max (delta-rs does the same for binary)


def stats_json(metadata: pq.FileMetaData, schema: pa.Schema, indexed_columns: int) -> str:
    """Delta ``stats`` for a file from its Parquet footer.

    Args:
        metadata: The footer of the written file.
        schema: The file's Arrow schema (top-level columns, partition columns excluded).
        indexed_columns: ``delta.dataSkippingNumIndexedCols``: how many leading columns get
            min/max/nullCount (-1 = all).
    """
    limit = len(schema) if indexed_columns < 0 else indexed_columns
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    positions = (
        {groups[0].column(ci).path_in_schema: ci for ci in range(groups[0].num_columns)} if groups else {}
    )
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for f in list(schema)[:limit]:
        if pat.is_nested(f.type) or f.name not in positions:
            continue
        ci = positions[f.name]
        stats = [rg.column(ci).statistics for rg in groups]
        if any(st is None or not st.has_null_count for st in stats):
            continue  # no reliable counts: leave the column out entirely
        nulls[f.name] = sum(st.null_count for st in stats)
        bounds = []
        for rg, st in zip(groups, stats, strict=True):
            if st.has_min_max:
                bounds.append(
                    (
                        _stat_value(f.type, st.min, st.min_raw, is_max=False),
                        _stat_value(f.type, st.max, st.max_raw, is_max=True),
                    )
                )
            elif rg.num_rows > st.null_count:
                bounds.append((None, None))  # values without bounds: no min/max at all
        if bounds and all(lo is not None and hi is not None for lo, hi in bounds):
            mins[f.name] = min(lo for lo, _ in bounds)
            maxs[f.name] = max(hi for _, hi in bounds)
    return json.dumps(
        {"numRecords": metadata.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        separators=(",", ":"),
    )


# ---------------------------------------------------------------------------------------------
# Writing


@dataclass
class _OpenFile:
    rel_path: str
    partition_values: dict[str, str | None]
    stream: Any
    writer: pq.ParquetWriter
    rows: int = 0
    buffered: list[pa.RecordBatch] = field(default_factory=list)
    buffered_rows: int = 0
    buffered_bytes: int = 0


class PartitionedFileWriter:
    """Writes one task's batches into Parquet files, split by partition and rolled by size.

    File names carry the batch id, the Spark partition and the task attempt, so files of a
    replayed batch or a failed attempt can be told apart from committed ones.
    """

    def __init__(
        self,
        *,
        fs: pafs.FileSystem,
        root: str,
        schema: pa.Schema,
        partition_columns: Sequence[str],
        compression: str,
        target_file_size: int,
        max_records_per_file: int,
        file_prefix: str,
        indexed_columns: int = 32,
    ) -> None:
        self._fs = fs
        self._root = root
        self._schema = schema
        self._partition_columns = list(partition_columns)
        self._file_schema = pa.schema([f for f in schema if f.name not in set(partition_columns)])
        self._compression = None if compression == "none" else compression
        self._target = target_file_size
        self._max_records = max_records_per_file
        self._prefix = file_prefix
        self._indexed = indexed_columns
        self._open: dict[tuple[str | None, ...], _OpenFile] = {}
        self._done: list[WrittenFile] = []
        self._made_dirs: set[str] = set()
        self._seq = 0

    # -- input -----------------------------------------------------------------------------

    def write_batches(self, batches: Iterable[pa.RecordBatch]) -> list[WrittenFile]:
        """Write every batch, close all files and return their descriptions."""
        try:
            for batch in batches:
                self.write(batch)
            return self.close()
        except BaseException:
            self.discard()
            raise

    def write(self, batch: pa.RecordBatch) -> None:
        """Route one record batch to its partition file(s)."""
        if batch.num_rows == 0:
            return
        if batch.schema != self._schema:
            batch = _conform(batch, self._schema)
        if not self._partition_columns:
            self._append((), batch)
            return
        for key, part in self._split(batch):
            self._append(key, part)

    def _split(self, batch: pa.RecordBatch) -> Iterator[tuple[tuple[str | None, ...], pa.RecordBatch]]:
        table = pa.Table.from_batches([batch])
        keys = table.select(self._partition_columns).group_by(self._partition_columns).aggregate([])
        if keys.num_rows == 1:
            row = keys.to_pylist()[0]
            yield tuple(partition_value(row[c]) for c in self._partition_columns), batch
            return
        for row in keys.to_pylist():
            mask = None
            for c in self._partition_columns:
                v = row[c]
                m = pc.is_null(batch.column(c)) if v is None else pc.equal(batch.column(c), v)
                m = pc.fill_null(m, False)
                mask = m if mask is None else pc.and_(mask, m)
            yield tuple(partition_value(row[c]) for c in self._partition_columns), batch.filter(mask)

    def _append(self, key: tuple[str | None, ...], batch: pa.RecordBatch) -> None:
        if self._partition_columns:
            batch = batch.select(self._file_schema.names)
        while batch.num_rows:
            f = self._open.get(key) or self._new_file(key)
            room = batch.num_rows
            if self._max_records:
                room = min(room, self._max_records - f.rows - f.buffered_rows)
            part, batch = batch.slice(0, room), batch.slice(room)
            f.buffered.append(part)
            f.buffered_rows += part.num_rows
            f.buffered_bytes += part.nbytes
            full = self._max_records and f.rows + f.buffered_rows >= self._max_records
            if full or f.buffered_rows >= ROW_GROUP_ROWS or f.buffered_bytes >= ROW_GROUP_BYTES:
                self._flush(key, f, roll_if_full=True)
        if sum(f.buffered_bytes for f in self._open.values()) > TASK_BUFFER_BYTES:
            biggest = max(self._open.items(), key=lambda kv: kv[1].buffered_bytes)
            self._flush(biggest[0], biggest[1], roll_if_full=True)

    # -- files -----------------------------------------------------------------------------

    def _new_file(self, key: tuple[str | None, ...]) -> _OpenFile:
        self._seq += 1
        name = f"{self._prefix}-{self._seq:04d}-{uuid.uuid4().hex[:12]}"
        codec = self._compression or "uncompressed"
        name += f".{codec}.parquet"
        values = dict(zip(self._partition_columns, key, strict=True))
        rel_dir = partition_dir(self._partition_columns, key) if self._partition_columns else ""
        rel_path = f"{rel_dir}/{name}" if rel_dir else name
        directory = join(self._root, rel_dir) if rel_dir else self._root
        if directory not in self._made_dirs:
            self._fs.create_dir(directory, recursive=True)
            self._made_dirs.add(directory)
        stream = self._fs.open_output_stream(join(self._root, rel_path))
        writer = pq.ParquetWriter(
            stream,
            self._file_schema,
            compression=self._compression or "none",
            use_deprecated_int96_timestamps=False,
            coerce_timestamps="us",
            allow_truncated_timestamps=False,
            write_statistics=True,
        )
        f = _OpenFile(rel_path=rel_path, partition_values=values, stream=stream, writer=writer)
        self._open[key] = f
        return f

    def _flush(self, key: tuple[str | None, ...], f: _OpenFile, *, roll_if_full: bool) -> None:
        if f.buffered:
            table = pa.Table.from_batches(f.buffered, schema=self._file_schema)
            f.writer.write_table(table, row_group_size=max(table.num_rows, 1))
            f.rows += f.buffered_rows
            f.buffered, f.buffered_rows, f.buffered_bytes = [], 0, 0
        if not roll_if_full:
            return
        too_big = f.stream.tell() >= self._target
        too_many = bool(self._max_records) and f.rows >= self._max_records
        if too_big or too_many:
            self._finish(key, f)

    def _finish(self, key: tuple[str | None, ...], f: _OpenFile) -> None:
        f.writer.close()
        size = f.stream.tell()
        f.stream.close()
        del self._open[key]
        stats = stats_json(f.writer.writer.metadata, self._file_schema, self._indexed)
        self._done.append(
            WrittenFile(
                path=f.rel_path,
                size=size,
                partition_values=f.partition_values,
                num_records=f.rows,
                stats=stats,
                modification_time=int(time.time() * 1000),
            )
        )

    def close(self) -> list[WrittenFile]:
        """Flush and close every open file; return all files written."""
        for key, f in list(self._open.items()):
            self._flush(key, f, roll_if_full=False)
            self._finish(key, f)
        return list(self._done)

    def discard(self) -> None:
        """Best effort: close and delete every file of this task (used when the task fails)."""
        for f in self._open.values():
            with contextlib.suppress(Exception):  # cleanup must not mask the original error
                f.stream.close()
        paths = [f.rel_path for f in self._open.values()] + [w.path for w in self._done]
        self._open.clear()
        delete_files(self._fs, self._root, paths)


def delete_files(fs: pafs.FileSystem, root: str, rel_paths: Iterable[str]) -> int:
    """Delete files under ``root``; missing files are ignored. Returns how many were deleted."""
    deleted = 0
    for rel in rel_paths:
        try:
            fs.delete_file(join(root, rel))
            deleted += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            if "not found" not in str(exc).lower() and "no such file" not in str(exc).lower():
                raise
    return deleted


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Cast a batch to the declared schema (Spark may send large or view string types)."""
    if batch.schema.names != schema.names:
        batch = batch.select(schema.names)
    return batch.cast(schema)

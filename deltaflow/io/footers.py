"""Existing Parquet files as they are: finding them, their Hive partition values, their footers.

``deltaflow add-files`` and ``deltaflow convert`` register files without reading their data:
everything a Delta ``add`` action needs (size, modification time, row count, min/max/nullCount)
comes from the store's listing and the Parquet footer. pyarrow only (no delta-rs, no Spark), so
the same functions can run wherever the files are.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from deltaflow.io.parquet import HIVE_NULL, WrittenFile, stats_json, unescape_path_component

__all__ = [
    "FOOTER_THREADS",
    "Footer",
    "FoundFile",
    "find_files",
    "hive_partitions",
    "is_hidden",
    "modification_time_ms",
    "named_relative",
    "read_footer",
    "read_footers",
    "same_file",
]

#: Footers read at once. Reading one is a few small ranged reads (latency-bound on object
#: stores, ~10-30 ms each) and pyarrow releases the GIL while it waits, so many threads overlap
#: the waits on 2 cores; more than this mostly queues at the store.
FOOTER_THREADS = 16

_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class FoundFile:
    """A Parquet file found under one of the paths asked for."""

    #: Path in the filesystem (no scheme: ``bucket/key`` on S3, absolute on local disk).
    path: str
    #: The part of ``path`` that keeps its meaning elsewhere: below the folder or glob base it was
    #: found under, or its name for a file named directly, with the ``col=value`` folders right
    #: above (those of the base or of the file).
    relative: str
    size: int
    modification_time: int  # ms since the epoch


@dataclass(frozen=True)
class Footer:
    """A file's footer, read: its Arrow schema and the Delta ``add`` it makes."""

    file: WrittenFile
    schema: pa.Schema
    #: Nulls per top-level column from the row groups' statistics, all columns (not only the
    #: indexed ones); ``None``: not known (a row group without a null count, a nested column).
    null_counts: dict[str, int | None] = field(default_factory=dict)


def _hidden(name: str) -> bool:
    # Spark's and Hive's rule: `_SUCCESS`, `_delta_log/`, `.crc` files, `_temporary/` are not data.
    return name.startswith(("_", "."))


def is_hidden(relative: str) -> bool:
    """Whether a path below a searched folder is not data (a component starts with ``_`` or
    ``.``: ``_delta_log/``, ``_SUCCESS``, ``.crc`` files, ``_temporary/``)."""
    return any(_hidden(part) for part in relative.strip("/").split("/"))


def modification_time_ms(info: pafs.FileInfo) -> int:
    """The file's modification time in whole milliseconds (Delta's ``modificationTime``): the
    store's nanoseconds floored, as ``st_mtime_ns // 10**6``; through a float of seconds a time
    within half a microsecond of a millisecond boundary would land on the next one."""
    if info.mtime_ns is not None:
        return int(info.mtime_ns) // 1_000_000
    mtime = info.mtime
    if isinstance(mtime, _dt.datetime):
        if mtime.tzinfo is None:
            mtime = mtime.replace(tzinfo=_dt.UTC)
        return int(mtime.timestamp() * 1000)
    return int(time.time() * 1000)


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """``*`` and ``?`` within one path component, ``**`` across components, ``[...]`` classes."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(ch))
            else:
                body = pattern[i + 1 : end]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _walk(fs: pafs.FileSystem, base: str) -> list[pafs.FileInfo]:
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return [
        i
        for i in infos
        if i.type == pafs.FileType.File and not is_hidden(i.path[len(base) :]) and i.path.endswith(".parquet")
    ]


def _hive_tail(path: str) -> str:
    """The trailing ``col=value`` folders of ``path`` (``a/b=1/c=2`` -> ``b=1/c=2``)."""
    keep: list[str] = []
    for part in reversed(path.split("/")):
        if "=" not in part:
            break
        keep.insert(0, part)
    return "/".join(keep)


def named_relative(path: str) -> str:
    """The ``relative`` of a file named directly: its name with the ``col=value`` folders above."""
    parent, _, name = path.rpartition("/")
    return "/".join(p for p in (_hive_tail(parent), name) if p)


def _below(base: str, path: str) -> str:
    """``path`` relative to the folder ``base``, with ``base``'s own ``col=value`` folders."""
    return "/".join(p for p in (_hive_tail(base), path[len(base) :].strip("/")) if p)


def find_files(fs: pafs.FileSystem, paths: Iterable[str]) -> tuple[list[FoundFile], list[str]]:
    """The Parquet files named by ``paths`` (files, folders searched recursively, globs), each
    once, in a stable order; and the paths that matched nothing.

    In folders and globs only ``*.parquet`` files count, and names starting with ``_`` or ``.``
    (``_SUCCESS``, ``_delta_log/``, ``.crc`` files) are skipped, as Spark skips them. A file
    named directly is taken whatever its name. A path that exists is taken literally even when it
    holds glob characters (``events[2024]``).
    """
    found: dict[str, FoundFile] = {}
    unmatched = []
    for raw in paths:
        path = raw.rstrip("/")
        matched: list[FoundFile] = []
        glob = _GLOB_CHARS.search(path)
        if glob and fs.get_file_info(path).type != pafs.FileType.NotFound:
            glob = None  # a folder or file whose name holds `[` or `*`: taken literally first
        if glob:
            base = path[: glob.start()].rsplit("/", 1)[0]
            pattern = _glob_regex(path)
            for info in _walk(fs, base):
                if pattern.match(info.path):
                    rel = _below(base, info.path)
                    matched.append(FoundFile(info.path, rel, info.size, modification_time_ms(info)))
        else:
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.Directory:
                for child in _walk(fs, path):
                    rel = _below(path, child.path)
                    matched.append(FoundFile(child.path, rel, child.size, modification_time_ms(child)))
            elif info.type == pafs.FileType.File:
                matched.append(FoundFile(path, named_relative(path), info.size, modification_time_ms(info)))
        if not matched:
            unmatched.append(raw)
        for f in matched:
            found.setdefault(f.path, f)
    return sorted(found.values(), key=lambda f: f.path), unmatched


def hive_partitions(relative: str) -> list[tuple[str, str | None]]:
    """The ``col=value`` directories of a file's path, in order, values unescaped as Spark does
    (``%3A`` is ``:``); Hive's null directory gives ``None``."""
    out: list[tuple[str, str | None]] = []
    for part in relative.split("/")[:-1]:
        key, sep, value = part.partition("=")
        if not sep or not key:
            continue
        text = unescape_path_component(value)
        out.append((unescape_path_component(key), None if text == HIVE_NULL else text))
    return out


def _arrow_schema(metadata: pq.FileMetaData) -> pa.Schema:
    """The file's Arrow schema; INT96 columns (Spark's default timestamps, UTC instants) as
    ``timestamp[us, UTC]`` rather than pyarrow's zone-less nanoseconds."""
    schema = metadata.schema.to_arrow_schema()
    int96 = {
        metadata.schema.column(i).path
        for i in range(len(metadata.schema))
        if metadata.schema.column(i).physical_type == "INT96"
    }
    if not int96:
        return schema
    return pa.schema(
        [f.with_type(pa.timestamp("us", tz="UTC")) if f.name in int96 else f for f in schema],
        metadata=schema.metadata,
    )


def same_file(fs: pafs.FileSystem, path: str, other_fs: pafs.FileSystem, other: str) -> bool:
    """Whether two Parquet files are copies of each other, as far as size and footer tell (the
    footer holds every row group's offsets, sizes and statistics)."""
    infos = fs.get_file_info(path), other_fs.get_file_info(other)
    if any(i.type != pafs.FileType.File for i in infos) or infos[0].size != infos[1].size:
        return False
    with fs.open_input_file(path) as a, other_fs.open_input_file(other) as b:
        return bool(pq.read_metadata(a).equals(pq.read_metadata(b)))


def read_footer(
    fs: pafs.FileSystem,
    file: FoundFile,
    *,
    path: str,
    partition_values: dict[str, str | None],
    stats_columns: Callable[[pa.Schema], pa.Schema],
    indexed_columns: int,
) -> Footer:
    """Read one footer: the ``add`` for ``file`` at ``path`` (relative to the table root)."""
    with fs.open_input_file(file.path) as handle:
        size = handle.size()  # of the file this footer is read from (the listing may be older)
        metadata = pq.read_metadata(handle)
    schema = _arrow_schema(metadata)
    stats = stats_json(metadata, stats_columns(schema), indexed_columns)
    added = WrittenFile(
        path=path,
        size=size,
        partition_values=partition_values,
        num_records=metadata.num_rows,
        stats=stats,
        modification_time=file.modification_time,
    )
    return Footer(added, schema, _null_counts(metadata, schema))


def _null_counts(metadata: pq.FileMetaData, schema: pa.Schema) -> dict[str, int | None]:
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    positions = {metadata.schema.column(i).path: i for i in range(len(metadata.schema))}
    out: dict[str, int | None] = {}
    for f in schema:
        ci = positions.get(f.name)  # nested columns have dotted leaf paths only: unknown
        if ci is None:
            out[f.name] = None if groups and any(g.num_rows for g in groups) else 0
            continue
        stats = [g.column(ci).statistics for g in groups]
        known = all(st is not None and st.has_null_count for st in stats)
        out[f.name] = sum(st.null_count for st in stats if st is not None) if known else None
    return out


def read_footers(
    read: Callable[[int], Footer],
    count: int,
    *,
    threads: int = FOOTER_THREADS,
    progress: Callable[[int, int], None] | None = None,
) -> list[Footer]:
    """``read(i)`` for ``i`` in ``range(count)`` on a thread pool, results in order;
    ``progress(done, total)`` after each."""
    if count == 0:
        return []
    results: list[Footer | None] = [None] * count
    pool = ThreadPoolExecutor(max_workers=max(1, min(threads, count)))
    try:
        futures: dict[Future[Footer], int] = {pool.submit(read, i): i for i in range(count)}
        for done, future in enumerate(as_completed(futures), start=1):
            results[futures[future]] = future.result()
            if progress is not None:
                progress(done, count)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # a failed read stops the others
    return [r for r in results if r is not None]

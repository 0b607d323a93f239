"""Reading the Delta log: loading a table (storage errors classified), table settings.

Every write goes through :mod:`deltaflow.delta.commit`. Facts from measurements of delta-rs 1.6
(``DELTA_NOTES.md``) this module serves:

* The log does not order ``txn`` versions, so callers compare before committing.
* A ``DeltaTable`` object does not advance with its own commits: every commit loads the table
  afresh (cheap with checkpoints, which are on by default).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar
from urllib.parse import unquote

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.exceptions import TableNotFoundError as _DeltaTableNotFound

from deltaflow.config.locations import join
from deltaflow.errors import ConfigError, DataFilesGoneError, storage_error
from deltaflow.io.storage import filesystem

__all__ = [
    "TABLE_THREADS",
    "active_paths",
    "bytes_per_row",
    "check_files_present",
    "check_version_readable",
    "is_delta_rs_error",
    "indexed_columns",
    "load",
    "missing_files",
    "rows_committed_since",
    "side_by_side",
    "timestamp_millis",
    "version_as_of",
]

logger = logging.getLogger(__name__)

#: Tables loaded, made or claimed at once by :func:`side_by_side` (each mostly waits on the store).
TABLE_THREADS = 8

T = TypeVar("T")
R = TypeVar("R")

#: Delta's default number of leading columns that get file statistics.
DEFAULT_INDEXED_COLUMNS = 32


def is_delta_rs_error(error: BaseException) -> bool:
    """Whether ``error`` is one of delta-rs' own errors (e.g. a commit that lost a race)."""
    return isinstance(error, DeltaError)


def load(table_uri: str, storage_options: Mapping[str, str]) -> DeltaTable | None:
    """The table at its latest version, or ``None`` when there is no table at ``table_uri``.

    Raises:
        StorageUnavailableError: the store failed or did not answer (transient).
        StorageAccessError: the store refused access (terminal: credentials, permissions).
    """
    try:
        return DeltaTable(table_uri, storage_options=dict(storage_options) or None)
    except _DeltaTableNotFound:
        return None
    except (DeltaError, OSError) as exc:
        raise storage_error(exc, table_uri, "reading the Delta log of") from exc


def rows_committed_since(
    table_uri: str, storage_options: Mapping[str, str], pipeline_id: str, version: int
) -> int:
    """The rows the commits after ``version`` (-1: every commit) recorded for ``pipeline_id``
    (their ``deltaflow.rows``): what a pipeline committed where the commits ran in another
    process (a Spark Connect server's Python workers), read from the log."""
    table = load(table_uri, storage_options)
    if table is None or table.version() <= version:
        return 0
    return sum(
        int(info.get("deltaflow.rows") or 0)
        for info in table.history(table.version() - version)
        if info.get("deltaflow.pipeline_id") == pipeline_id and int(info.get("version", -1)) > version
    )


def side_by_side(fn: Callable[[T], R], items: Sequence[T], *, name: str = "tables") -> list[R]:
    """``fn`` over ``items`` in up to :data:`TABLE_THREADS` threads (in one when there is one
    item), results in their order; the first error is raised. For work on many tables that
    mostly waits on the store (loads, creations, claims): an ingest of hundreds of topics does
    it for a table each, at start and in every batch's plan."""
    if len(items) <= 1:
        return [fn(i) for i in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(TABLE_THREADS, len(items)), thread_name_prefix=name) as pool:
        return list(pool.map(fn, items))


def indexed_columns(table: DeltaTable | None, properties: Mapping[str, str] | None = None) -> int:
    """``delta.dataSkippingNumIndexedCols`` of the table (or of properties about to be set)."""
    config: Mapping[str, str | None] = (
        table.metadata().configuration if table is not None else (properties or {})
    )
    raw = config.get("delta.dataSkippingNumIndexedCols")
    try:
        return int(raw) if raw is not None else DEFAULT_INDEXED_COLUMNS
    except ValueError:
        return DEFAULT_INDEXED_COLUMNS


def active_paths(table: DeltaTable | None) -> set[str]:
    """The table's data files, relative to its root as on disk (the log percent-encodes them)."""
    if table is None:
        return set()
    import pyarrow as pa

    paths = pa.table(table.get_add_actions(flatten=False))["path"].to_pylist()
    return {unquote(p) for p in paths}


def missing_files(table_uri: str, storage_options: Mapping[str, str], paths: Iterable[str]) -> list[str]:
    """Those of ``paths`` (relative to the table root, as the log holds them) that storage does
    not have, in their order. A path is there when it exists as written or percent-decoded (the
    log encodes paths; a file another tool wrote may hold a ``%`` in its name on disk).

    Raises:
        StorageUnavailableError / StorageAccessError: storage could not be asked.
    """
    import pyarrow.fs as pafs

    fs, root = filesystem(table_uri, storage_options)
    wanted = list(dict.fromkeys(paths))
    candidates = [[join(root, p)] + ([join(root, unquote(p))] if unquote(p) != p else []) for p in wanted]
    try:
        infos = iter(fs.get_file_info([c for group in candidates for c in group]))
    except OSError as exc:
        raise storage_error(exc, table_uri, "looking for the data files of") from exc
    missing = []
    for path, group in zip(wanted, candidates, strict=True):
        if all(next(infos).type == pafs.FileType.NotFound for _ in group):
            missing.append(path)
    return missing


def check_files_present(
    table_uri: str,
    storage_options: Mapping[str, str],
    paths: Iterable[str],
    *,
    doing: str,
    of: str,
    instead: str,
) -> None:
    """Stop with :class:`~deltaflow.errors.DataFilesGoneError` when any of ``paths`` is gone.

    Reading or restoring a version whose files were vacuumed fails deep inside a reader (delta-rs,
    DataFusion, pyarrow) with a storage error that reads like an outage; this says what it is.
    ``doing`` ("read version 3 of 't'"), ``of`` ("that version") and ``instead`` ("Read a newer
    version") make the message.
    """
    wanted = list(paths)
    missing = missing_files(table_uri, storage_options, wanted)
    if missing:
        raise DataFilesGoneError(table_uri, doing, missing, len(set(wanted)), of=of, instead=instead)


def check_version_readable(
    table_uri: str, storage_options: Mapping[str, str], version: int, paths: Iterable[str]
) -> None:
    """Stop with :class:`~deltaflow.errors.DataFilesGoneError` when any data file of ``version``
    (``paths``, as the log holds them) is gone: a read of a vacuumed version says so."""
    check_files_present(
        table_uri,
        storage_options,
        paths,
        doing=f"read version {version} of {table_uri!r}",
        of="that version",
        instead="Read a newer version",
    )


def bytes_per_row(table: DeltaTable | None, files: int = 50) -> float | None:
    """Parquet bytes per row of a typical new file: the median, over the table's ``files``
    newest data files (by modification time) whose statistics count rows, of size / rows;
    ``None`` when no file counts rows.

    An estimate of what rows of a stream will take once written (footers and compression
    included). The median keeps an outlier out: a compaction's big file (fewer bytes per row)
    among a stream's small ones, or another writer's file.
    """
    if table is None:
        return None
    import statistics

    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(table.get_add_actions(flatten=True))
    if "num_records" not in actions.column_names or actions.num_rows == 0:
        return None
    actions = actions.filter(pc.greater(actions["num_records"], 0))
    if actions.num_rows == 0:
        return None
    newest = actions.sort_by([("modification_time", "descending")]).slice(0, files)
    ratios = pc.divide(pc.cast(newest["size_bytes"], pa.float64()), newest["num_records"])
    return float(statistics.median(ratios.to_pylist()))


def timestamp_millis(timestamp: str, name: str = "timestamp") -> float:
    """``timestamp`` (ISO 8601, a date or a time; UTC unless it says otherwise) in milliseconds
    since the epoch, as the log's commit timestamps count.

    Raises:
        ConfigError: not an ISO-8601 time or date (``name`` is the option that held it).
    """
    import datetime as dt

    try:
        when = dt.datetime.fromisoformat(timestamp.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{name} {timestamp!r} is not an ISO-8601 time or date", value=timestamp) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp() * 1000


def version_as_of(table: DeltaTable, timestamp: str, table_uri: str, name: str = "timestamp") -> int:
    """The last version committed at or before ``timestamp``: time travel by time (restore,
    reads as of a time, delta-spark's ``timestampAsOf``), by the commit timestamps ``history``
    shows.

    A time before the earliest version still in the log has no version: delta-rs' own lookup
    answers the earliest one (version 0, the empty CREATE), and a restore to it empties the
    table. Refused, as delta-spark refuses it, naming the earliest time that has one.

    Raises:
        ConfigError: ``timestamp`` is not an ISO-8601 time, or it is before the earliest
            version still in the log (the table did not exist yet, or the log was cleaned up).
    """
    import datetime as dt

    ms = timestamp_millis(timestamp, name)
    versions = sorted((int(h["version"]), int(h["timestamp"])) for h in table.history() if "timestamp" in h)
    before = [v for v, stamp in versions if stamp <= ms]
    if before:
        return before[-1]
    if not versions:
        raise ConfigError(f"{name} {timestamp}: {table_uri!r} has no commit in its log", table_uri=table_uri)
    first, first_ms = versions[0]
    earliest = dt.datetime.fromtimestamp(first_ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    why = "the table did not exist yet" if first == 0 else "older versions were cleaned up from the log"
    raise ConfigError(
        f"{name} {timestamp} is before the earliest version of {table_uri!r} (version {first}, "
        f"committed at {earliest}): there is no version as of then ({why}). Use a timestamp at or "
        f"after {earliest}",
        table_uri=table_uri,
        earliest_version=first,
        earliest_timestamp=earliest,
    )

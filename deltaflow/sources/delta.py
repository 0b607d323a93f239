"""A Delta table as a Spark source (``deltaflow-delta``, and ``delta`` when deltaflow serves that
format), on delta-rs: no JVM jar.

Streaming offsets are positions in the log: ``{"version": v, "index": i, "snapshot": s}``.
``index`` -1 means every data file of version ``v`` has been read; ``i >= 0`` means its files
``0..i`` (in commit order; for the snapshot, in path order) have. ``snapshot`` 1 means the stream
is still reading the table's snapshot at version ``v`` (``-1``: not chosen yet). Offsets written
before ``index`` existed read as ``index`` -1.

* Without ``starting_version``/``starting_timestamp`` the stream first reads the table's snapshot
  at the version it plans (its whole content), then the commits after it. ``starting_version``
  ``latest`` reads only the commits after the version current when the query starts.
* A commit's data files (``add`` actions with ``dataChange=true``) are the batch's rows; a
  commit that only rearranges files (OPTIMIZE, ``dataChange=false``) adds nothing.
* A commit that removes data stops the stream with a clear error, unless ``ignore_deletes``
  (commits that only remove files, e.g. a dropped partition), ``ignore_changes`` (also commits
  that rewrite files: their new files are read, so unchanged rows come again) or
  ``skip_change_commits`` (every commit that removes data is passed over whole).
* ``max_files_per_trigger`` / ``max_bytes_per_trigger`` cap a micro-batch at file granularity,
  the snapshot included (bytes is a soft cap: at least one file, and the file that crosses it
  is in); ``max_versions_per_trigger`` caps it at whole versions.
* ``read_change_feed``: rows come from the table's Change Data Feed (delta-rs ``load_cdf``),
  with ``_change_type``, ``_commit_version`` and ``_commit_timestamp``; the first batch
  without a starting version is the snapshot as ``insert`` rows. Limits admit whole versions.

Batch reads (:class:`DeltaBatchReader`) read a version (``version_as_of`` /
``timestamp_as_of``, default the latest) or, with ``read_change_feed``, the Change Data Feed of
a range of versions.

Files are read by the executors with pyarrow (one input partition per file); partition
values are added back as columns and every file is cast to the schema the query planned with.
Tables with deletion vectors or column mapping are refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self
from urllib.parse import unquote

import pyarrow as pa
from pydantic import Field, field_validator
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from deltaflow.config.locations import normalize_uri
from deltaflow.config.models import JsonObject, SparkOptions
from deltaflow.errors import ConfigError, DeltaSourceError, TableNotFoundError
from deltaflow.io import logs
from deltaflow.io.storage import filesystem

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql.types import StructType

__all__ = [
    "CDF_COLUMNS",
    "DeltaBatchReader",
    "DeltaReadOptions",
    "DeltaStreamOptions",
    "DeltaStreamReader",
    "DeltaTableDataSource",
    "FORMAT_NAME",
    "read_schema",
]

logger = logging.getLogger(__name__)

FORMAT_NAME = "deltaflow-delta"
CDF_COLUMNS = (
    ("_change_type", pa.string()),
    ("_commit_version", pa.int64()),
    ("_commit_timestamp", pa.timestamp("us", tz="UTC")),
)

Offset = dict[str, int]


class _TableOptions(SparkOptions):
    """What every read of a Delta table needs (``path`` is accepted for ``table_uri``)."""

    table_uri: str = Field(min_length=1)
    read_change_feed: bool = False
    storage_options: JsonObject = Field(default_factory=dict)

    @field_validator("table_uri")
    @classmethod
    def _normalized(cls, value: str) -> str:
        return normalize_uri(value)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Self:
        """From Spark's data-source options."""
        return cls.from_spark_options(options, aliases={"path": "table_uri"})


class DeltaStreamOptions(_TableOptions):
    """Options of the Delta streaming source."""

    what: ClassVar[str] = "the Delta source"

    starting_version: int | Literal["latest"] | None = None
    starting_timestamp: str | None = None
    ignore_deletes: bool = False
    ignore_changes: bool = False
    skip_change_commits: bool = False
    max_versions_per_trigger: int | None = Field(default=None, ge=1)
    max_files_per_trigger: int | None = Field(default=None, ge=1)
    max_bytes_per_trigger: int | None = Field(default=None, ge=1)

    @field_validator("starting_version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "latest":
            return "latest"
        if value is not None and int(value) < 0:
            raise ValueError("must be a version (0 or more) or 'latest'")
        return value


class DeltaReadOptions(_TableOptions):
    """Options of a batch read: a version of the table, or a range of its Change Data Feed."""

    what: ClassVar[str] = "the Delta source (batch read)"

    version_as_of: int | None = Field(default=None, ge=0)
    timestamp_as_of: str | None = None
    starting_version: int | None = Field(default=None, ge=0)
    ending_version: int | None = Field(default=None, ge=0)
    starting_timestamp: str | None = None
    ending_timestamp: str | None = None


@dataclass(frozen=True)
class _FileTask(InputPartition):
    """One data file to read (``path`` relative to the table root, decoded)."""

    table_uri: str
    path: str
    partition_values: Mapping[str, str | None]
    storage_options: Mapping[str, str]
    schema: pa.Schema
    change: tuple[str, int, int] | None = None  # CDF snapshot rows: (type, version, timestamp ms)


@dataclass(frozen=True)
class _CdfTask(InputPartition):
    """Change Data Feed rows of versions ``first..last``."""

    table_uri: str
    first: int
    last: int
    storage_options: Mapping[str, str]
    schema: pa.Schema


def _load(options: _TableOptions) -> DeltaTable:
    from deltaflow.delta import log as delta_log

    table = delta_log.load(options.table_uri, options.storage_options)
    if table is None:
        raise TableNotFoundError(
            f"the Delta source table {options.table_uri!r} does not exist", table_uri=options.table_uri
        )
    _check_readable(table, options.table_uri)
    return table


def _check_readable(table: DeltaTable, uri: str) -> None:
    protocol = table.protocol()
    features = set(protocol.reader_features or ())
    if "deletionVectors" in features:
        raise DeltaSourceError(
            f"the Delta source table {uri!r} uses deletion vectors, which deltaflow's Delta source "
            "cannot apply when reading files; disable them (delta.enableDeletionVectors=false) and "
            "purge them, or read the table with Spark and delta-spark",
            table_uri=uri,
        )
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode not in ("none", None):
        raise DeltaSourceError(
            f"the Delta source table {uri!r} uses column mapping ({mode}), which deltaflow's Delta "
            "source does not read",
            table_uri=uri,
        )


def table_arrow_schema(table: DeltaTable) -> pa.Schema:
    """The table's schema with plain (not view) Arrow types."""
    from deltaflow.delta.schema import plain_schema

    return plain_schema(pa.schema(table.schema().to_arrow()))


def read_schema(options: Mapping[str, Any]) -> pa.Schema:
    """The schema a read of the table gets: the table's (at ``version_as_of`` /
    ``timestamp_as_of`` when given) plus the Change Data Feed columns with ``read_change_feed``.

    ``options`` are either kind of read's (Spark asks for the schema before it says which)."""
    lowered = {str(k).lower(): v for k, v in options.items()}
    base = _TableOptions.model_validate(
        {
            "table_uri": lowered.get("table_uri") or lowered.get("path") or "",
            "storage_options": lowered.get("storage_options") or {},
            "read_change_feed": str(lowered.get("read_change_feed", "false")).lower() == "true",
        }
    )
    table = _load(base)
    version = lowered.get("version_as_of")
    stamp = lowered.get("timestamp_as_of")
    if version is not None or stamp is not None:
        at = int(version) if version is not None else _version_as_of(table, base.table_uri, str(stamp))
        table = _at_version(base, table, at)
    schema = table_arrow_schema(table)
    if base.read_change_feed:
        schema = pa.schema([*schema, *(pa.field(n, t) for n, t in CDF_COLUMNS)])
    return schema


def _at_version(options: _TableOptions, table: DeltaTable, version: int) -> DeltaTable:
    from deltalake import DeltaTable

    if version > table.version():
        raise ConfigError(
            f"version {version} of {options.table_uri!r} does not exist yet (latest: {table.version()})",
            table_uri=options.table_uri,
        )
    try:
        old = DeltaTable(
            options.table_uri, version=version, storage_options=dict(options.storage_options) or None
        )
    except Exception as exc:  # noqa: BLE001 - delta-rs raises its own types; say what is needed
        raise DeltaSourceError(
            f"cannot load version {version} of {options.table_uri!r}: {exc} (log retention or "
            "vacuum may have removed it)",
            table_uri=options.table_uri,
        ) from None
    _check_readable(old, options.table_uri)
    return old


class DeltaTableDataSource(DataSource):
    """Spark data source ``deltaflow-delta``: streaming and batch reads of a Delta table."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(read_schema(self.options))

    def reader(self, schema: StructType) -> DeltaBatchReader:
        from deltaflow.delta.schema import spark_to_arrow

        return DeltaBatchReader(DeltaReadOptions.from_options(self.options), spark_to_arrow(schema))

    def streamReader(self, schema: StructType) -> DeltaStreamReader:  # noqa: N802
        from deltaflow.delta.schema import spark_to_arrow

        return DeltaStreamReader(DeltaStreamOptions.from_options(self.options), spark_to_arrow(schema))


@dataclass(frozen=True)
class _File:
    """A data file of the table: its path (decoded, relative to the root) and what planning needs."""

    path: str
    partition_values: Mapping[str, str | None]
    size: int


def _offset(version: int, index: int = -1, snapshot: int = 0) -> Offset:
    return {"version": version, "index": index, "snapshot": snapshot}


def _position(offset: Offset) -> tuple[int, int, int]:
    return int(offset["version"]), int(offset.get("index", -1)), int(offset.get("snapshot", 0))


@dataclass
class _Budget:
    """What one micro-batch may still take: files, bytes (soft: the file that crosses it is in)."""

    files: int | None
    bytes_: int | None
    taken: int = 0
    taken_bytes: int = 0

    def full(self) -> bool:
        """No room left (never before the first file)."""
        return bool(self.taken) and (
            (self.files is not None and self.taken >= self.files)
            or (self.bytes_ is not None and self.taken_bytes >= self.bytes_)
        )

    def admit(self, f: _File) -> bool:
        """Take ``f`` if the batch has room."""
        if self.full():
            return False
        self.taken += 1
        self.taken_bytes += f.size
        return True


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans batches from the table's log on the driver; executors read the files."""

    def __init__(self, options: DeltaStreamOptions, schema: pa.Schema) -> None:
        logs.configure_worker()  # planned in a Python worker Spark starts
        self._options = options
        self._schema = schema
        self._table: DeltaTable | None = None
        self._target: int | None = None  # availableNow: never plan beyond this version
        self._versions: dict[int, list[_File]] = {}  # the data files of each commit read so far
        self._snapshot_files: tuple[int, list[_File]] | None = None
        if options.read_change_feed and (options.ignore_changes or options.skip_change_commits):
            raise ConfigError(
                "read_change_feed already carries every change; ignore_changes and "
                "skip_change_commits do not apply"
            )

    def _current(self) -> DeltaTable:
        if self._table is None:
            self._table = _load(self._options)
        else:
            self._table.update_incremental()
        return self._table

    def initialOffset(self) -> Offset:  # noqa: N802
        opts = self._options
        table = self._current()
        if opts.starting_version == "latest":
            return _offset(table.version())
        if opts.starting_version is not None:
            if opts.starting_version > table.version() + 1:
                raise ConfigError(
                    f"starting_version {opts.starting_version} is beyond the table's latest version "
                    f"{table.version()} (+1)",
                    table_uri=opts.table_uri,
                )
            return _offset(opts.starting_version - 1)
        if opts.starting_timestamp is not None:
            return _offset(_version_at(table, opts.starting_timestamp) - 1)
        return _offset(-1, -1, 1)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = self._current().version()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        opts = self._options
        if opts.max_files_per_trigger:
            return ReadMaxFiles(opts.max_files_per_trigger)
        if opts.max_bytes_per_trigger:
            return ReadMaxBytes(opts.max_bytes_per_trigger)
        if opts.max_versions_per_trigger:
            return ReadMaxRows(opts.max_versions_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802
        latest = self._target if self._target is not None else self._current().version()
        version, index, snapshot = _position(start)
        for old in [v for v in self._versions if v < version]:
            del self._versions[old]
        opts = self._options
        unlimited = isinstance(limit, ReadAllAvailable)
        budget = None
        if not unlimited and (opts.max_files_per_trigger or opts.max_bytes_per_trigger):
            budget = _Budget(opts.max_files_per_trigger, opts.max_bytes_per_trigger)
        if snapshot:
            at = version if version >= 0 else latest
            files = self._snapshot(at)
            first = index + 1 if version >= 0 else 0
            taken = len(files) - first
            if budget is not None:
                taken = sum(1 for f in files[first:] if budget.admit(f))  # admit stops at the cap
            if first + taken >= len(files):
                return _offset(at)
            return _offset(at, first + taken - 1, 1)
        if latest <= version and index < 0:
            return start
        if unlimited or budget is None:
            end = max(version, latest)
            if not unlimited and opts.max_versions_per_trigger:
                end = min(end, version + opts.max_versions_per_trigger)
            return _offset(end)
        if opts.read_change_feed:  # whole versions, until the cap is reached
            current = version
            while current < latest and not budget.full():
                current += 1
                for f in self._commit(current):
                    budget.taken, budget.taken_bytes = budget.taken + 1, budget.taken_bytes + f.size
            return _offset(current)
        current, skip = (version, index + 1) if index >= 0 else (version + 1, 0)
        while current <= latest:
            files = self._commit(current)
            for position in range(skip, len(files)):
                if not budget.admit(files[position]):
                    return _offset(current, position - 1) if position > 0 else _offset(current - 1)
            current, skip = current + 1, 0
        return _offset(latest)

    def reportLatestOffset(self) -> Offset | None:  # noqa: N802
        return _offset(self._table.version()) if self._table is not None else None

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        opts = self._options
        version, index, snapshot = _position(start)
        last_version, last_index, _ = _position(end)
        if snapshot:
            files = self._snapshot(last_version)
            first = index + 1 if version >= 0 else 0
            last = len(files) - 1 if last_index < 0 else last_index
            change = None
            if opts.read_change_feed:
                table = _at_version(opts, self._current(), last_version)
                change = ("insert", last_version, int(table.history(1)[0].get("timestamp", 0)))
            return [self._task(f, change) for f in files[first : last + 1]]
        first_version = version if index >= 0 else version + 1
        if last_version < first_version:
            return []
        if opts.read_change_feed:
            return [
                _CdfTask(
                    opts.table_uri, first_version, last_version, dict(opts.storage_options), self._schema
                )
            ]
        tasks: list[InputPartition] = []
        for current in range(first_version, last_version + 1):
            files = self._commit(current)
            low = index + 1 if current == version and index >= 0 else 0
            high = last_index if current == last_version and last_index >= 0 else len(files) - 1
            tasks.extend(self._task(f) for f in files[low : high + 1])
        return tasks

    def _task(self, f: _File, change: tuple[str, int, int] | None = None) -> _FileTask:
        opts = self._options
        return _FileTask(
            opts.table_uri, f.path, dict(f.partition_values), dict(opts.storage_options), self._schema, change
        )

    def _snapshot(self, version: int) -> list[_File]:
        """The data files of the table at ``version``, in path order (the same on every call)."""
        if self._snapshot_files is not None and self._snapshot_files[0] == version:
            return self._snapshot_files[1]
        files = _files_at(_at_version(self._options, self._current(), version))
        logger.info(
            "Delta source %s: snapshot of version %d, %d file(s)",
            self._options.table_uri,
            version,
            len(files),
        )
        self._snapshot_files = (version, files)
        return files

    def _commit(self, version: int) -> list[_File]:
        """The new data files of commit ``version``, in the commit's order (cached)."""
        if version not in self._versions:
            self._versions[version] = self._commit_files(version)
        return self._versions[version]

    def _commit_files(self, version: int) -> list[_File]:
        opts = self._options
        fs, root = filesystem(opts.table_uri, opts.storage_options)
        path = f"{root}/_delta_log/{version:020d}.json"
        try:
            with fs.open_input_stream(path) as stream:
                lines = stream.read().decode().splitlines()
        except FileNotFoundError:
            raise DeltaSourceError(
                f"commit {version} of the Delta source table {opts.table_uri!r} is gone from its "
                "log (log retention removed it before the stream read it); restart the pipeline "
                "from a newer starting_version with a new checkpoint",
                table_uri=opts.table_uri,
                version=version,
            ) from None
        adds, removes, has_dv = [], 0, False
        for line in lines:
            if not line.strip():
                continue
            action = json.loads(line)
            if "add" in action and action["add"].get("dataChange", True):
                adds.append(action["add"])
                has_dv = has_dv or bool(action["add"].get("deletionVector"))
            elif "remove" in action and action["remove"].get("dataChange", True):
                removes += 1
            elif "metaData" in action:
                self._check_metadata(action["metaData"], version)
        if removes and opts.skip_change_commits:
            logger.info(
                "Delta source %s: commit %d removes data: skipped whole (skip_change_commits)",
                opts.table_uri,
                version,
            )
            return []
        if has_dv:
            raise DeltaSourceError(
                f"commit {version} of {opts.table_uri!r} carries deletion vectors, which the Delta "
                "source cannot apply",
                table_uri=opts.table_uri,
            )
        if removes and not opts.read_change_feed:
            kind = "rewrites files (UPDATE, MERGE or DELETE of rows)" if adds else "deletes data"
            allowed = opts.ignore_changes or (not adds and opts.ignore_deletes)
            if not allowed:
                hint = "ignore_changes" if adds else "ignore_deletes (or ignore_changes)"
                raise DeltaSourceError(
                    f"commit {version} of the Delta source table {opts.table_uri!r} {kind}; a stream "
                    f"of its new rows cannot follow that. Set {hint} to go on (see the docs for what "
                    "each does), skip_change_commits to pass such commits over, or read_change_feed "
                    "to stream the changes themselves",
                    table_uri=opts.table_uri,
                    version=version,
                )
            logger.info(
                "Delta source %s: commit %d %s: %s",
                opts.table_uri,
                version,
                kind,
                "its new files are read again" if adds else "skipped",
            )
        return [
            _File(unquote(add["path"]), dict(add.get("partitionValues") or {}), int(add.get("size") or 0))
            for add in adds
        ]

    def _check_metadata(self, metadata: Mapping[str, Any], version: int) -> None:
        """A commit changing the table's metadata: refuse column mapping; new columns restart
        the query so that its schema (fixed at start) takes them."""
        from deltaflow.errors import SchemaEvolvedError

        uri = self._options.table_uri
        mode = (metadata.get("configuration") or {}).get("delta.columnMapping.mode", "none")
        if mode not in ("none", None):
            raise DeltaSourceError(
                f"commit {version} of the Delta source table {uri!r} enables column mapping ({mode}), "
                "which deltaflow's Delta source does not read",
                table_uri=uri,
            )
        fields = json.loads(metadata.get("schemaString") or "{}").get("fields", [])
        have = {f.name for f in self._schema}
        new = [str(f["name"]) for f in fields if f["name"] not in have]
        if new:
            raise SchemaEvolvedError(
                f"commit {version} of the Delta source table {uri!r} adds column(s) {', '.join(new)}; "
                "restarting the query to read them (nothing of this batch was committed; a sink in "
                "strict schema mode then needs schema_mode merge)",
                table_uri=uri,
                version=version,
            )

    def commit(self, end: Offset) -> None:
        pass

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _CdfTask):
            yield from _read_cdf(partition)
            return
        assert isinstance(partition, _FileTask)
        yield from _read_file(partition)


def _read_file(task: _FileTask) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq

    fs, root = filesystem(task.table_uri, task.storage_options)
    cdf = {name for name, _ in CDF_COLUMNS} if task.change is not None else set()
    data_names = [f.name for f in task.schema if f.name not in cdf]
    with fs.open_input_file(f"{root}/{task.path}") as handle:
        parquet = pq.ParquetFile(handle)
        present = set(parquet.schema_arrow.names)
        for batch in parquet.iter_batches(columns=[n for n in data_names if n in present]):
            columns = []
            for f in task.schema:
                if f.name in present:
                    columns.append(batch.column(f.name).cast(f.type))
                elif f.name in task.partition_values:
                    columns.append(_partition_column(task.partition_values[f.name], f.type, batch.num_rows))
                elif task.change is not None and f.name == "_change_type":
                    columns.append(pa.array([task.change[0]] * batch.num_rows, f.type))
                elif task.change is not None and f.name == "_commit_version":
                    columns.append(pa.array([task.change[1]] * batch.num_rows, f.type))
                elif task.change is not None and f.name == "_commit_timestamp":
                    columns.append(
                        pa.array([task.change[2] * 1000] * batch.num_rows, pa.int64()).cast(f.type)
                    )
                else:
                    columns.append(pa.nulls(batch.num_rows, f.type))
            yield pa.RecordBatch.from_arrays(columns, schema=task.schema)


def _partition_column(raw: str | None, dtype: pa.DataType, rows: int) -> pa.Array:
    """A partition value (the log's string form) as a column of ``rows`` values of ``dtype``.

    Timestamps are written as ``2026-11-22 08:00:00.000000`` in UTC, without a zone."""
    values = pa.array([raw] * rows, pa.string())
    if pa.types.is_timestamp(dtype):
        try:
            return values.cast(pa.timestamp("us")).cast(dtype)
        except pa.ArrowInvalid:  # with a zone offset (delta-rs' snapshot actions): parse it
            return values.cast(pa.timestamp("us", tz="UTC")).cast(dtype)
    return values.cast(dtype)


def _read_cdf(task: _CdfTask) -> Iterator[pa.RecordBatch]:
    from deltalake import DeltaTable

    table = DeltaTable(task.table_uri, storage_options=dict(task.storage_options) or None)
    try:
        reader = table.load_cdf(starting_version=task.first, ending_version=task.last)
    except Exception as exc:  # noqa: BLE001 - delta-rs raises its own types; say what is needed
        raise DeltaSourceError(
            f"cannot read the Change Data Feed of {task.table_uri!r} for versions {task.first}.."
            f"{task.last}: {exc}. read_change_feed needs delta.enableChangeDataFeed=true on the "
            "table since before those versions",
            table_uri=task.table_uri,
        ) from None
    for batch in pa.RecordBatchReader.from_stream(reader):
        columns = []
        for f in task.schema:
            idx = batch.schema.get_field_index(f.name)
            columns.append(batch.column(idx).cast(f.type) if idx >= 0 else pa.nulls(batch.num_rows, f.type))
        yield pa.RecordBatch.from_arrays(columns, schema=task.schema)


def _version_at(table: DeltaTable, timestamp: str) -> int:
    """The first version committed at or after ``timestamp`` (ISO 8601)."""
    from deltaflow.delta import log as delta_log

    ms = delta_log.timestamp_millis(timestamp, "starting_timestamp")
    versions = sorted((int(h["version"]), int(h["timestamp"])) for h in table.history())
    if versions and versions[0][0] > 0 and ms < versions[0][1]:
        raise ConfigError(
            f"starting_timestamp {timestamp} is before the oldest commit still in the log (version "
            f"{versions[0][0]}); the versions before it are gone: start from version {versions[0][0]}",
        )
    for version, stamp in versions:
        if stamp >= ms:
            return version
    return versions[-1][0] + 1 if versions else 0


def _version_as_of(table: DeltaTable, table_uri: str, timestamp: str, name: str = "timestamp_as_of") -> int:
    """The last version committed at or before ``timestamp`` (``timestampAsOf``)."""
    from deltaflow.delta import log as delta_log

    return delta_log.version_as_of(table, timestamp, table_uri, name)


def _files_at(table: DeltaTable) -> list[_File]:
    """Every data file of ``table`` (at its loaded version), in path order."""
    actions = pa.table(table.get_add_actions(flatten=True))
    parts = [n for n in actions.column_names if n.startswith("partition.")]
    files = []
    for row in actions.select(["path", "size_bytes", *parts]).to_pylist():
        values = {name.removeprefix("partition."): row[name] for name in parts}
        files.append(
            _File(
                unquote(row["path"]),  # as in the log: URI-encoded
                {k: None if v is None else str(v) for k, v in values.items()},
                int(row["size_bytes"] or 0),
            )
        )
    return sorted(files, key=lambda f: f.path)


@dataclass(frozen=True)
class _NothingTask(InputPartition):
    """The one partition of a read that has no file to read."""

    schema: pa.Schema


class DeltaBatchReader(DataSourceReader):
    """A batch read: the table at a version, or its Change Data Feed over a range of versions."""

    def __init__(self, options: DeltaReadOptions, schema: pa.Schema) -> None:
        self._options = options
        self._schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self._options
        table = _load(opts)
        if opts.read_change_feed:
            first = opts.starting_version
            if first is None:
                assert opts.starting_timestamp is not None
                first = _version_at(table, opts.starting_timestamp)
            last = opts.ending_version
            if last is None and opts.ending_timestamp is not None:
                last = _version_as_of(table, opts.table_uri, opts.ending_timestamp, "ending_timestamp")
            last = table.version() if last is None else min(last, table.version())
            if last < first:
                return [_NothingTask(self._schema)]
            return [_CdfTask(opts.table_uri, first, last, dict(opts.storage_options), self._schema)]
        travelled = opts.version_as_of is not None or opts.timestamp_as_of is not None
        if travelled:
            at = opts.version_as_of
            if at is None:
                assert opts.timestamp_as_of is not None
                at = _version_as_of(table, opts.table_uri, opts.timestamp_as_of)
            table = _at_version(opts, table, at)
        files = _files_at(table)
        if travelled:
            # An earlier version's files may have been vacuumed: say so before a task fails on
            # one with a storage error that reads like an outage (DataFilesGoneError, terminal).
            from deltaflow.delta import log as delta_log

            delta_log.check_version_readable(
                opts.table_uri, opts.storage_options, table.version(), [f.path for f in files]
            )
        tasks: list[InputPartition] = [
            _FileTask(
                opts.table_uri, f.path, dict(f.partition_values), dict(opts.storage_options), self._schema
            )
            for f in files
        ]
        return tasks or [_NothingTask(self._schema)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _CdfTask):
            yield from _read_cdf(partition)
        elif isinstance(partition, _FileTask):
            yield from _read_file(partition)

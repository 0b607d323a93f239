"""A Delta table as a Spark streaming source (``deltaflow-delta``), on delta-rs: no JVM jar.

Offsets are table versions: ``{"version": v}`` means every commit up to ``v`` has been read.

* Without ``starting_version``/``starting_timestamp`` the first micro-batch reads the table's
  snapshot at the version it plans (its whole content), later batches the commits after it.
* With them, the stream reads the commits from that version on.
* A commit's data files (``add`` actions with ``dataChange=true``) are the batch's rows; a
  commit that only rearranges files (OPTIMIZE, ``dataChange=false``) adds nothing.
* A commit that removes data stops the stream with a clear error, unless ``ignore_deletes``
  (commits that only remove files, e.g. a dropped partition) or ``ignore_changes`` (also
  commits that rewrite files: their new files are read, so unchanged rows come again).
* ``read_change_feed``: rows come from the table's Change Data Feed (delta-rs ``load_cdf``),
  with ``_change_type``, ``_commit_version`` and ``_commit_timestamp``; the first batch
  without a starting version is the snapshot as ``insert`` rows.

Files are read by the executors with pyarrow (one input partition per file); partition
values are added back as columns and every file is cast to the stream's schema (the table's
schema when the query started). Tables with deletion vectors or column mapping are refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import unquote

import pyarrow as pa
from pydantic import Field, field_validator
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from deltaflow.config.locations import normalize_uri
from deltaflow.config.models import SparkOptions
from deltaflow.errors import ConfigError, DeltaSourceError, TableNotFoundError
from deltaflow.io.storage import filesystem

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql.types import StructType

__all__ = ["CDF_COLUMNS", "DeltaStreamOptions", "DeltaTableDataSource", "FORMAT_NAME"]

logger = logging.getLogger(__name__)

FORMAT_NAME = "deltaflow-delta"
CDF_COLUMNS = (
    ("_change_type", pa.string()),
    ("_commit_version", pa.int64()),
    ("_commit_timestamp", pa.timestamp("us", tz="UTC")),
)

Offset = dict[str, int]


class DeltaStreamOptions(SparkOptions):
    """Options of the Delta streaming source (``path`` is accepted for ``table_uri``)."""

    what: ClassVar[str] = "the Delta source"

    table_uri: str = Field(min_length=1)
    starting_version: int | None = Field(default=None, ge=0)
    starting_timestamp: str | None = None
    ignore_deletes: bool = False
    ignore_changes: bool = False
    read_change_feed: bool = False
    max_versions_per_trigger: int | None = Field(default=None, ge=1)
    storage_options: dict[str, str] = Field(default_factory=dict)

    @field_validator("table_uri")
    @classmethod
    def _normalized(cls, value: str) -> str:
        return normalize_uri(value)

    @field_validator("storage_options", mode="before")
    @classmethod
    def _json(cls, value: Any) -> Any:
        return json.loads(value or "{}") if isinstance(value, str) else value

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> DeltaStreamOptions:
        """From Spark's data-source options."""
        return cls.from_spark_options(options, aliases={"path": "table_uri"})


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


def _load(options: DeltaStreamOptions) -> DeltaTable:
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


class DeltaTableDataSource(DataSource):
    """Spark data source ``deltaflow-delta`` (streaming reads of a Delta table)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        options = DeltaStreamOptions.from_options(self.options)
        schema = table_arrow_schema(_load(options))
        if options.read_change_feed:
            schema = pa.schema([*schema, *(pa.field(n, t) for n, t in CDF_COLUMNS)])
        return from_arrow_schema(schema)

    def streamReader(self, schema: StructType) -> DeltaStreamReader:  # noqa: N802
        from deltaflow.delta.schema import spark_to_arrow

        return DeltaStreamReader(DeltaStreamOptions.from_options(self.options), spark_to_arrow(schema))


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans batches from the table's log on the driver; executors read the files."""

    def __init__(self, options: DeltaStreamOptions, schema: pa.Schema) -> None:
        self._options = options
        self._schema = schema
        self._table: DeltaTable | None = None
        self._target: int | None = None  # availableNow: never plan beyond this version
        if options.read_change_feed and options.ignore_changes:
            raise ConfigError("read_change_feed already carries every change; ignore_changes does not apply")

    def _current(self) -> DeltaTable:
        if self._table is None:
            self._table = _load(self._options)
        else:
            self._table.update_incremental()
        return self._table

    def initialOffset(self) -> Offset:  # noqa: N802
        opts = self._options
        table = self._current()
        if opts.starting_version is not None:
            if opts.starting_version > table.version() + 1:
                raise ConfigError(
                    f"starting_version {opts.starting_version} is beyond the table's latest version "
                    f"{table.version()} (+1)",
                    table_uri=opts.table_uri,
                )
            return {"version": opts.starting_version - 1, "snapshot": 0}
        if opts.starting_timestamp is not None:
            return {"version": _version_at(table, opts.starting_timestamp) - 1, "snapshot": 0}
        return {"version": -1, "snapshot": 1}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = self._current().version()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self._options.max_versions_per_trigger:
            return ReadMaxRows(self._options.max_versions_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802
        latest = self._target if self._target is not None else self._current().version()
        begin = int(start["version"])
        if start.get("snapshot") and begin < 0:
            return {"version": latest, "snapshot": 0}  # the snapshot batch is never split
        end = max(begin, latest)
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {"version": end, "snapshot": 0}

    def reportLatestOffset(self) -> Offset | None:  # noqa: N802
        return {"version": self._table.version(), "snapshot": 0} if self._table is not None else None

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        opts = self._options
        first, last = int(start["version"]) + 1, int(end["version"])
        if start.get("snapshot") and first == 0:
            return self._snapshot(last)
        if last < first:
            return []
        if opts.read_change_feed:
            return [_CdfTask(opts.table_uri, first, last, dict(opts.storage_options), self._schema)]
        tasks: list[InputPartition] = []
        fs, root = filesystem(opts.table_uri, opts.storage_options)
        for version in range(first, last + 1):
            tasks.extend(self._commit_files(fs, root, version))
        return tasks

    def _snapshot(self, version: int) -> list[InputPartition]:
        from deltalake import DeltaTable

        opts = self._options
        table = DeltaTable(
            opts.table_uri, version=version, storage_options=dict(opts.storage_options) or None
        )
        _check_readable(table, opts.table_uri)
        actions = pa.table(table.get_add_actions(flatten=True))
        parts = [n for n in actions.column_names if n.startswith("partition.")]
        change = None
        if opts.read_change_feed:
            stamp = int(table.history(1)[0].get("timestamp", 0))
            change = ("insert", version, stamp)
        tasks: list[InputPartition] = []
        for row in actions.select(["path", *parts]).to_pylist():
            values = {name.removeprefix("partition."): row[name] for name in parts}
            tasks.append(
                _FileTask(
                    opts.table_uri,
                    unquote(row["path"]),  # as in the log: URI-encoded
                    {k: None if v is None else str(v) for k, v in values.items()},
                    dict(opts.storage_options),
                    self._schema,
                    change,
                )
            )
        logger.info(
            "Delta source %s: snapshot of version %d, %d file(s)", opts.table_uri, version, len(tasks)
        )
        return tasks

    def _commit_files(self, fs: Any, root: str, version: int) -> list[InputPartition]:
        opts = self._options
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
        if has_dv:
            raise DeltaSourceError(
                f"commit {version} of {opts.table_uri!r} carries deletion vectors, which the Delta "
                "source cannot apply",
                table_uri=opts.table_uri,
            )
        if removes:
            kind = "rewrites files (UPDATE, MERGE or DELETE of rows)" if adds else "deletes data"
            allowed = opts.ignore_changes or (not adds and opts.ignore_deletes)
            if not allowed:
                hint = "ignore_changes" if adds else "ignore_deletes (or ignore_changes)"
                raise DeltaSourceError(
                    f"commit {version} of the Delta source table {opts.table_uri!r} {kind}; a stream "
                    f"of its new rows cannot follow that. Set {hint} to go on (see the docs for what "
                    "each does), or read_change_feed to stream the changes themselves",
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
            _FileTask(
                opts.table_uri,
                unquote(add["path"]),
                dict(add.get("partitionValues") or {}),
                dict(opts.storage_options),
                self._schema,
            )
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
    import datetime as dt

    try:
        when = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"starting_timestamp {timestamp!r} is not an ISO-8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    ms = when.timestamp() * 1000
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

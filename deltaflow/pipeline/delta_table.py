"""delta-spark's Python ``DeltaTable`` API, on delta-rs: ``from deltaflow.tables import DeltaTable``
is the only line a job written for ``delta.tables`` changes.

Reads go through deltaflow's Delta source (a Spark DataFrame); MERGE, DELETE, UPDATE, OPTIMIZE,
VACUUM and RESTORE run on the driver with delta-rs (:mod:`deltaflow.ops`), each one commit under
the commit rule. A MERGE collects its source DataFrame to Arrow once, so nondeterministic
columns (``rand()``, ``current_timestamp()``) are evaluated once and every row is merged as
Spark computed it (delta-spark evaluates the source twice and warns about it).

What differs from delta-spark (documented in the README):

* conditions and expressions are SQL strings (or Spark ``Column`` objects, turned into SQL) that
  delta-rs evaluates: the usual comparisons, ``AND``/``OR``, arithmetic, literals and casts;
* ``forName`` resolves ``[db.]table`` under the session's warehouse directory
  (``spark.sql.warehouse.dir``; ``db.db/table`` for another database), without a metastore;
* a MERGE source is collected to the driver: size it as a micro-batch, not as a table.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from deltaflow.config.locations import normalize_uri
from deltaflow.errors import ConfigError, TableNotFoundError
from deltaflow.ops import dml

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["DeltaMergeBuilder", "DeltaOptimizeBuilder", "DeltaTable"]

logger = logging.getLogger(__name__)

_IDENT = re.compile(r"^`?([A-Za-z_][\w]*)`?(?:\.`?([A-Za-z_][\w]*)`?)?$")


#: Spark ``Column`` nodes whose ``sql()`` is plain SQL (``F.expr``, ``F.lit``, ``F.col``).
_SQL_NODES = frozenset({"SqlExpression", "Literal", "UnresolvedAttribute"})


def _sql(expression: str | Column | None, what: str) -> str | None:
    """A condition or expression as SQL text: a string as it is; a Spark ``Column`` made by
    ``F.expr(...)``, ``F.lit(...)`` or ``F.col(...)`` as its SQL. Other ``Column`` trees
    (``F.col("a") == 1``) print in Spark's internal notation, not SQL: they are refused."""
    if expression is None or isinstance(expression, str):
        return expression
    try:
        node = getattr(expression, "_jc").node()  # noqa: B009 - the JVM twin of a classic Column
        kind = str(node.getClass().getSimpleName())
        text = str(node.sql()) if kind in _SQL_NODES else None
    except Exception:  # noqa: BLE001 - a Spark Connect column has no JVM twin
        text = None
    if text is None:
        raise ConfigError(
            f'{what}: give the condition or expression as a SQL string (e.g. "id = 2") or '
            f'F.expr("id = 2"); this Column cannot be handed to delta-rs as SQL: {expression!r}'
        )
    return text


def _sql_map(values: Mapping[str, str | Column] | None, what: str) -> dict[str, str]:
    if not values:
        raise ConfigError(f"{what} needs a {{column: expression}} mapping")
    return {str(k): str(_sql(v, what)) for k, v in values.items()}


class DeltaTable:
    """A Delta table, with delta-spark's Python methods."""

    def __init__(
        self,
        spark: SparkSession,
        uri: str,
        *,
        alias: str | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        self._spark = spark
        self._uri = normalize_uri(uri)
        self._alias = alias
        self._storage = dict(storage_options or {})

    # -- finding tables ------------------------------------------------------------------------

    @classmethod
    def forPath(  # noqa: N802 - delta-spark's name
        cls,
        sparkSession: SparkSession,  # noqa: N803
        path: str,
        hadoopConf: Mapping[str, str] | None = None,  # noqa: N803
        *,
        storage_options: Mapping[str, str] | None = None,
    ) -> DeltaTable:
        """The table at ``path``. ``hadoopConf`` is refused (pass ``storage_options``)."""
        if hadoopConf:
            raise ConfigError(
                "hadoopConf is not used by deltaflow (no Hadoop filesystem): pass the store's "
                "credentials as storage_options={...} (delta-rs names)"
            )
        from deltaflow.ops import open_table

        open_table(path, storage_options)  # TableNotFoundError naming the path
        cls._register(sparkSession)
        return cls(sparkSession, path, storage_options=storage_options)

    @classmethod
    def forName(cls, sparkSession: SparkSession, tableOrViewName: str) -> DeltaTable:  # noqa: N802, N803
        """The table ``[db.]name`` under the session's warehouse directory."""
        path = _warehouse_path(sparkSession, tableOrViewName)
        if not _is_delta_table(path):
            raise TableNotFoundError(
                f"{tableOrViewName!r} is not a Delta table: nothing at {path!r} (deltaflow resolves "
                "names under spark.sql.warehouse.dir, without a metastore)",
                table_uri=path,
            )
        cls._register(sparkSession)
        return cls(sparkSession, path)

    @classmethod
    def isDeltaTable(cls, sparkSession: SparkSession, identifier: str) -> bool:  # noqa: N802, N803
        """Whether ``identifier`` (a path, or ``[db.]name`` under the warehouse) is a Delta table."""
        if _IDENT.match(identifier) and not os.path.exists(identifier):
            return _is_delta_table(_warehouse_path(sparkSession, identifier))
        return _is_delta_table(normalize_uri(identifier))

    @staticmethod
    def _register(spark: SparkSession) -> None:
        from deltaflow.pipeline.api import register

        register(spark)

    # -- reading -------------------------------------------------------------------------------

    def toDF(self) -> DataFrame:  # noqa: N802
        """The table's current content as a Spark DataFrame (aliased when :meth:`alias` was used)."""
        from deltaflow.sources.delta import FORMAT_NAME

        reader = self._spark.read.format(FORMAT_NAME)
        if self._storage:
            import json

            reader = reader.option("storage_options", json.dumps(self._storage))
        df = reader.load(self._uri)
        return df.alias(self._alias) if self._alias else df

    def alias(self, aliasName: str) -> DeltaTable:  # noqa: N803
        """The same table, referred to as ``aliasName`` in merge conditions."""
        return DeltaTable(self._spark, self._uri, alias=aliasName, storage_options=self._storage)

    # -- changing rows -------------------------------------------------------------------------

    def merge(self, source: DataFrame, condition: str | Column) -> DeltaMergeBuilder:
        """Start a MERGE of ``source`` (aliased with ``DataFrame.alias`` as in delta-spark)."""
        return DeltaMergeBuilder(self, source, str(_sql(condition, "merge condition")))

    def delete(self, condition: str | Column | None = None) -> None:
        """Delete the rows where ``condition`` holds (all rows without one)."""
        metrics = dml.delete(self._uri, _sql(condition, "delete condition"), storage_options=self._storage)
        logger.info("deleted %s row(s) from %s", metrics.get("num_deleted_rows"), self._uri)

    def update(
        self,
        condition: str | Column | None = None,
        set: Mapping[str, str | Column] | None = None,
    ) -> None:
        """Set columns (``set={column: expression}``) where ``condition`` holds."""
        dml.update(
            self._uri,
            _sql_map(set, "update"),
            _sql(condition, "update condition"),
            storage_options=self._storage,
        )

    # -- the log and maintenance ---------------------------------------------------------------

    def history(self, limit: int | None = None) -> DataFrame:
        """Commits, newest first, with delta-spark's columns."""
        from deltaflow.ops import history

        rows = []
        for entry in history(self._uri, limit=limit, storage_options=self._storage):
            stamp = entry.get("timestamp")
            rows.append(
                (
                    int(entry.get("version", 0)),
                    dt.datetime.fromisoformat(stamp) if stamp else None,
                    entry.get("operation"),
                    {str(k): _text(v) for k, v in (entry.get("operationParameters") or {}).items()},
                    entry.get("readVersion"),
                    entry.get("isolationLevel"),
                    entry.get("isBlindAppend"),
                    {str(k): _text(v) for k, v in (entry.get("operationMetrics") or {}).items()},
                    entry.get("userMetadata"),
                    entry.get("engineInfo") or entry.get("clientVersion"),
                )
            )
        schema = (
            "version long, timestamp timestamp, operation string, operationParameters map<string,string>, "
            "readVersion long, isolationLevel string, isBlindAppend boolean, "
            "operationMetrics map<string,string>, userMetadata string, engineInfo string"
        )
        return self._spark.createDataFrame(rows, schema)

    def detail(self) -> DataFrame:
        """One row: format, id, location, partitioning, files, size, properties, protocol."""
        from deltaflow.ops import describe

        d = describe(self._uri, storage_options=self._storage)
        protocol = d["protocol"]
        row = (
            "delta",
            d["id"],
            d["name"],
            d["description"],
            d["table_uri"],
            dt.datetime.fromisoformat(d["created"]) if d["created"] else None,
            list(d["partition_columns"]),
            int(d["files"]["count"]),
            int(d["files"]["bytes"]),
            dict(d["properties"]),
            int(protocol["min_reader_version"]),
            int(protocol["min_writer_version"]),
            sorted({*protocol["reader_features"], *protocol["writer_features"]}),
        )
        schema = (
            "format string, id string, name string, description string, location string, "
            "createdAt timestamp, partitionColumns array<string>, numFiles long, sizeInBytes long, "
            "properties map<string,string>, minReaderVersion int, minWriterVersion int, "
            "tableFeatures array<string>"
        )
        return self._spark.createDataFrame([row], schema)

    def optimize(self) -> DeltaOptimizeBuilder:
        """Start an OPTIMIZE: ``.where(partition filter)``, then ``executeCompaction()`` or
        ``executeZOrderBy(columns)``."""
        return DeltaOptimizeBuilder(self)

    def vacuum(self, retentionHours: float | None = None) -> DataFrame:  # noqa: N803
        """Delete data files no version within the retention needs (the table's
        ``delta.deletedFileRetentionDuration``, 7 days by default). A shorter retention is refused
        unless ``spark.databricks.delta.retentionDurationCheck.enabled`` is ``false``, as in
        delta-spark. Returns the deleted files' paths."""
        from deltaflow.ops import vacuum

        check = self._spark.conf.get("spark.databricks.delta.retentionDurationCheck.enabled", "true")
        result = vacuum(
            self._uri,
            retention_hours=None if retentionHours is None else int(retentionHours),
            dry_run=False,
            force=str(check).lower() == "false",
            storage_options=self._storage,
        )
        return self._spark.createDataFrame([(f,) for f in result.files], "path string")

    def restoreToVersion(self, version: int) -> DataFrame:  # noqa: N802
        """Make the table's content that of ``version`` again (a new commit)."""
        return self._restore(version=int(version))

    def restoreToTimestamp(self, timestamp: str) -> DataFrame:  # noqa: N802
        """Make the table's content that of its last version at ``timestamp`` again."""
        return self._restore(timestamp=str(timestamp))

    def _restore(self, **at: Any) -> DataFrame:
        from deltaflow.ops import restore

        result = restore(self._uri, storage_options=self._storage, **at)
        m = result.metrics

        def metric(*names: str) -> int | None:
            value = next((m[n] for n in names if m.get(n) is not None), None)
            return None if value is None else int(value)

        row = (
            metric("numRestoredFile", "numRestoredFiles", "num_restored_file"),
            metric("numRemovedFile", "numRemovedFiles", "num_removed_file"),
            metric("restoredFilesSize"),
            metric("removedFilesSize"),
        )
        return self._spark.createDataFrame(
            [row],
            "num_restored_files long, num_removed_files long, restored_files_size long, "
            "removed_files_size long",
        )

    def generate(self, mode: str) -> None:
        """``symlink_format_manifest``: a manifest per partition listing its data files, for
        readers such as Presto/Athena (``_symlink_format_manifest/``)."""
        if mode != "symlink_format_manifest":
            raise ConfigError(f"generate({mode!r}): the only mode is 'symlink_format_manifest'")
        from deltaflow.ops.manifest import symlink_format_manifest

        symlink_format_manifest(self._uri, storage_options=self._storage)

    def __repr__(self) -> str:
        return f"DeltaTable({self._uri!r})"


class DeltaMergeBuilder:
    """delta-spark's ``DeltaMergeBuilder``: ``when*`` clauses in order, then :meth:`execute`."""

    def __init__(self, table: DeltaTable, source: DataFrame, condition: str) -> None:
        self._table = table
        self._source = source
        self._condition = condition
        self._clauses: list[dml.MergeClause] = []

    def _add(
        self, kind: dml.ClauseKind, condition: Any = None, values: Any = None, what: str = ""
    ) -> DeltaMergeBuilder:
        takes_values = kind in ("matched_update", "not_matched_insert", "not_matched_by_source_update")
        mapping = _sql_map(values, what) if takes_values else {}
        self._clauses.append(dml.MergeClause(kind, _sql(condition, what), mapping))
        return self

    def whenMatchedUpdate(self, condition: Any = None, set: Any = None) -> DeltaMergeBuilder:  # noqa: N802
        return self._add("matched_update", condition, set, "whenMatchedUpdate")

    def whenMatchedUpdateAll(self, condition: Any = None) -> DeltaMergeBuilder:  # noqa: N802
        return self._add("matched_update_all", condition, what="whenMatchedUpdateAll")

    def whenMatchedDelete(self, condition: Any = None) -> DeltaMergeBuilder:  # noqa: N802
        return self._add("matched_delete", condition, what="whenMatchedDelete")

    def whenNotMatchedInsert(self, condition: Any = None, values: Any = None) -> DeltaMergeBuilder:  # noqa: N802
        return self._add("not_matched_insert", condition, values, "whenNotMatchedInsert")

    def whenNotMatchedInsertAll(self, condition: Any = None) -> DeltaMergeBuilder:  # noqa: N802
        return self._add("not_matched_insert_all", condition, what="whenNotMatchedInsertAll")

    def whenNotMatchedBySourceUpdate(self, condition: Any = None, set: Any = None) -> DeltaMergeBuilder:  # noqa: N802
        return self._add("not_matched_by_source_update", condition, set, "whenNotMatchedBySourceUpdate")

    def whenNotMatchedBySourceDelete(self, condition: Any = None) -> DeltaMergeBuilder:  # noqa: N802
        return self._add("not_matched_by_source_delete", condition, what="whenNotMatchedBySourceDelete")

    def execute(self) -> DataFrame:
        """Run the MERGE: the source is evaluated once (collected to Arrow), then one commit.

        Returns delta-spark's metrics row: ``num_affected_rows``, ``num_updated_rows``,
        ``num_deleted_rows``, ``num_inserted_rows``."""
        table = self._table
        data = self._source.toArrow()
        metrics = dml.merge(
            table._uri,
            data,
            condition=self._condition,
            clauses=self._clauses,
            source_alias=_alias_of(self._source) or "source",
            target_alias=table._alias,
            storage_options=table._storage,
        )
        updated = int(metrics.get("num_target_rows_updated", 0) or 0)
        deleted = int(metrics.get("num_target_rows_deleted", 0) or 0)
        inserted = int(metrics.get("num_target_rows_inserted", 0) or 0)
        logger.info(
            "merged %d source row(s) into %s: %d updated, %d deleted, %d inserted",
            data.num_rows,
            table._uri,
            updated,
            deleted,
            inserted,
        )
        return table._spark.createDataFrame(
            [(updated + deleted + inserted, updated, deleted, inserted)],
            "num_affected_rows long, num_updated_rows long, num_deleted_rows long, num_inserted_rows long",
        )


class DeltaOptimizeBuilder:
    """delta-spark's ``DeltaOptimizeBuilder``."""

    def __init__(self, table: DeltaTable) -> None:
        self._table = table
        self._where: str | None = None

    def where(self, partitionFilter: str) -> DeltaOptimizeBuilder:  # noqa: N803
        """Only the partitions matching ``partitionFilter`` (``date = '2021-11-18'``)."""
        self._where = partitionFilter
        return self

    def executeCompaction(self) -> DataFrame:  # noqa: N802
        return self._run(())

    def executeZOrderBy(self, *cols: str | list[str]) -> DataFrame:  # noqa: N802
        names = [c for group in cols for c in ([group] if isinstance(group, str) else group)]
        if not names:
            raise ConfigError("executeZOrderBy needs at least one column")
        return self._run(tuple(names))

    def _run(self, zorder: tuple[str, ...]) -> DataFrame:
        from deltaflow.ops import optimize

        table = self._table
        result = optimize(table._uri, where=self._where, zorder=zorder, storage_options=table._storage)
        return table._spark.createDataFrame(
            [
                (
                    table._uri,
                    (
                        result.files_added,
                        result.files_removed,
                        result.bytes_added,
                        result.bytes_removed,
                        result.partitions_optimized,
                    ),
                )
            ],
            "path string, metrics struct<numFilesAdded:long, numFilesRemoved:long, "
            "totalFilesSizeAdded:long, totalFilesSizeRemoved:long, partitionsOptimized:long>",
        )


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    import json

    return json.dumps(value, default=str)


def _alias_of(df: DataFrame) -> str | None:
    """The name ``df.alias(name)`` gave the DataFrame, else ``None``."""
    connect_plan = getattr(df, "_plan", None)  # Spark Connect: the plan is built in Python
    if connect_plan is not None and not hasattr(df, "_jdf"):
        alias = (
            getattr(connect_plan, "_alias", None) if type(connect_plan).__name__ == "SubqueryAlias" else None
        )
        return str(alias) if alias else None
    try:
        plan = df._jdf.queryExecution().logical()
        if plan.nodeName() == "SubqueryAlias":
            return str(plan.alias())
    except Exception:  # noqa: BLE001 - no plan to look at: the caller uses its default alias
        return None
    return None


def _warehouse_path(spark: SparkSession, name: str) -> str:
    match = _IDENT.match(name.strip())
    if not match:
        raise ConfigError(f"{name!r} is not a table name ([database.]table)")
    first, second = match.groups()
    database, table = (first, second) if second else ("default", first)
    warehouse = str(spark.conf.get("spark.sql.warehouse.dir", "spark-warehouse"))
    parsed = urlparse(warehouse)
    root = parsed.path if parsed.scheme == "file" else warehouse
    folder = table if database.lower() == "default" else os.path.join(f"{database}.db", table)
    return normalize_uri(os.path.join(root, folder))


def _is_delta_table(uri: str) -> bool:
    from deltaflow.delta import log as delta_log

    try:
        return delta_log.load(uri, {}) is not None
    except Exception:  # noqa: BLE001 - not a table, whatever the reason
        return False

"""``format("delta")`` without a jar: deltaflow serves Delta Lake's own format name.

Jobs written against delta-spark (``spark.readStream.format("delta")``,
``df.write.format("delta").option("txnAppId", ...)``, ...) run unchanged on a session without
delta-spark on its classpath once :func:`serve_delta` ran (``deltaflow.spark_session()`` and
``deltaflow.register(spark)`` call it). Delta's option names are translated by
:mod:`deltaflow.config.delta_compat`; reads go to deltaflow's Delta source, writes to its sink.

Two things of ``DataFrameWriter`` never reach a Python data source in Spark 4: the partition
columns (``partitionBy``: a batch write fails Spark's own check, a stream drops them) and the
save modes ``errorifexists`` (the default) and ``ignore`` (Spark refuses them). For ``delta`` the
Python writers therefore keep them and hand them over as options (:func:`_install_writer_shim`,
classic sessions): the partition columns as ``__partition_columns``; for the two modes the
table's existence is checked first, as delta-spark does (a write whose ``txnAppId`` /
``txnVersion`` the table already holds is skipped before that check).
"""

from __future__ import annotations

import functools
import json
import logging
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource

from deltaflow.config.delta_compat import (
    batch_read_options,
    batch_write_options,
    stream_read_options,
    stream_write_options,
)
from deltaflow.config.locations import normalize_uri
from deltaflow.config.sink import SinkOptions
from deltaflow.errors import ConfigError, DeltaflowError
from deltaflow.sinks.datasource import DeltaBatchWriter, QueryTxnStreamWriter
from deltaflow.sources.delta import (
    DeltaBatchReader,
    DeltaReadOptions,
    DeltaStreamOptions,
    DeltaStreamReader,
    read_schema,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = ["DELTA_FORMAT", "DeltaFormatDataSource", "TableExistsError", "delta_spark_present", "serve_delta"]

logger = logging.getLogger(__name__)

DELTA_FORMAT = "delta"

#: A class every delta-spark release ships: its presence means delta-spark serves ``delta``.
_DELTA_SPARK_CLASS = "org.apache.spark.sql.delta.sources.DeltaDataSource"


class TableExistsError(DeltaflowError):
    """A write in ``errorifexists`` mode (the default) found a table at its path."""


class DeltaFormatDataSource(DataSource):
    """Spark data source ``delta``: Delta Lake's option names over deltaflow's source and sink."""

    @classmethod
    def name(cls) -> str:
        return DELTA_FORMAT

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        lowered = {k.lower(): v for k, v in self.options.items()}
        wanted = {
            "path": lowered.get("path", ""),
            "version_as_of": lowered.get("versionasof"),
            "timestamp_as_of": lowered.get("timestampasof"),
            "read_change_feed": lowered.get("readchangefeed", lowered.get("readchangedata", "false")),
        }
        return from_arrow_schema(read_schema({k: v for k, v in wanted.items() if v is not None}))

    def reader(self, schema: StructType) -> DeltaBatchReader:
        from deltaflow.delta.schema import spark_to_arrow

        options = DeltaReadOptions.model_validate(batch_read_options(self.options))
        return DeltaBatchReader(options, spark_to_arrow(schema))

    def streamReader(self, schema: StructType) -> DeltaStreamReader:  # noqa: N802
        from deltaflow.delta.schema import spark_to_arrow

        options = DeltaStreamOptions.model_validate(stream_read_options(self.options))
        return DeltaStreamReader(options, spark_to_arrow(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DeltaBatchWriter:
        values = batch_write_options(self.options)
        for name, delta_name in (("overwrite_schema", "overwriteSchema"), ("replace_where", "replaceWhere")):
            if values.get(name) and not overwrite:
                raise ConfigError(f"{delta_name} applies to .mode('overwrite') only")
        if values.get("overwrite_schema") and values.get("replace_where"):
            raise ConfigError("overwriteSchema replaces the whole table: it cannot go with replaceWhere")
        values.pop("save_mode", None)  # handled by the writer shim before Spark started the write
        app = values.pop("txn_app_id", None)
        if app is not None:
            values["pipeline_id"] = app
        options = _sink_options(values, overwrite)
        return DeltaBatchWriter.for_options(options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> QueryTxnStreamWriter:  # noqa: N802
        return QueryTxnStreamWriter(
            _sink_options(stream_write_options(self.options), overwrite), schema, overwrite
        )


def _sink_options(values: dict[str, Any], overwrite: bool) -> SinkOptions:
    """Translated Delta options as the sink's: ``mergeSchema`` is schema mode ``merge``; without
    ``partitionBy`` an existing table keeps its own partitioning (as delta-spark does)."""
    values["schema_mode"] = "merge" if values.pop("merge_schema", False) else "subset"
    if "partition_columns" not in values:
        from deltaflow.delta import log as delta_log

        table = delta_log.load(normalize_uri(values["table_uri"]), {})
        if table is not None:
            values["partition_columns"] = tuple(table.metadata().partition_columns)
    if overwrite:
        values["write_mode"] = "overwrite"
    return SinkOptions.build(values)


def delta_spark_present(spark: SparkSession) -> bool:
    """Whether delta-spark's data source is on the session's classpath."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: the server's classpath is not visible from here
        return False
    try:
        jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(_DELTA_SPARK_CLASS)
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        return False
    return True


def serve_delta(spark: SparkSession) -> bool:
    """Register :class:`DeltaFormatDataSource` as ``delta`` unless delta-spark serves it.

    Returns whether deltaflow serves ``delta`` in this session."""
    if delta_spark_present(spark):
        logger.info(
            "delta-spark is on the classpath: format('delta') stays delta-spark's; deltaflow's "
            "formats are 'deltaflow' and 'deltaflow-delta'"
        )
        return False
    spark.dataSource.register(DeltaFormatDataSource)
    spark._deltaflow_serves_delta = True  # type: ignore[attr-defined]
    _SERVED["delta"] = True
    _install_writer_shim()
    logger.info("no delta-spark on the classpath: format('delta') is served by deltaflow")
    return True


#: Whether :func:`serve_delta` registered ``delta`` in this process. Sessions Spark derives from
#: a served one (the session a ``foreachBatch`` function gets) share its data sources but are
#: new Python objects, so the writers look here as well as at their own session.
_SERVED = {"delta": False}


def _serves_delta(writer: Any) -> bool:
    spark = getattr(writer, "_spark", None) or getattr(writer, "_session", None)
    return _SERVED["delta"] or bool(getattr(spark, "_deltaflow_serves_delta", False))


def _is_delta(writer: Any) -> bool:
    fmt = writer.__dict__.get("_deltaflow_format")
    return isinstance(fmt, str) and fmt.lower() == DELTA_FORMAT and _serves_delta(writer)


@functools.cache
def _install_writer_shim() -> None:
    """Record ``format``, ``mode``, options and ``partitionBy`` on the Python writers (classic
    sessions), so that a ``delta`` write hands them to deltaflow instead of to Spark's checks.
    Writes in any other format reach Spark exactly as before."""
    from pyspark.sql.readwriter import DataFrameWriter
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    for cls in (DataFrameWriter, DataStreamWriter):
        original_format = cls.format
        original_option = cls.option
        original_options = cls.options

        def option(self: Any, key: str, value: Any, _original: Any = original_option) -> Any:
            self.__dict__.setdefault("_deltaflow_options", {})[key] = value
            return _original(self, key, value)

        def options(self: Any, _original: Any = original_options, **values: Any) -> Any:
            self.__dict__.setdefault("_deltaflow_options", {}).update(values)
            return _original(self, **values)

        def format_(self: Any, source: str, _original: Any = original_format) -> Any:
            self.__dict__["_deltaflow_format"] = source
            return _original(self, source)

        _patch(cls, option=option, options=options, format=format_)

    batch_partition_by = DataFrameWriter.partitionBy
    stream_partition_by = DataStreamWriter.partitionBy
    original_mode = DataFrameWriter.mode
    original_save = DataFrameWriter.save
    original_start = DataStreamWriter.start

    def record_partitions(self: Any, cols: tuple[Any, ...]) -> list[str]:
        if len(cols) == 1 and isinstance(cols[0], list | tuple):
            cols = tuple(cols[0])
        names = [str(c) for c in cols]
        self.__dict__["_deltaflow_partition_by"] = names
        return names

    def partition_batch(self: Any, *cols: Any) -> Any:
        names = record_partitions(self, cols)
        if _is_delta(self):
            return self  # Spark's check would refuse them: deltaflow takes them at save()
        self.__dict__["_deltaflow_partitions_in_spark"] = True
        return batch_partition_by(self, *names)

    def partition_stream(self: Any, *cols: Any) -> Any:
        # Spark drops a stream's partition columns for Python sinks (no check): pass them on.
        return stream_partition_by(self, *record_partitions(self, cols))

    def mode(self: Any, save_mode: str | None) -> Any:
        if save_mode is not None:
            self.__dict__["_deltaflow_mode"] = save_mode
        return original_mode(self, save_mode)

    def save(
        self: Any,
        path: str | None = None,
        format: str | None = None,
        mode: str | None = None,
        partitionBy: str | list[str] | None = None,  # noqa: N803 - pyspark's own parameter name
        **options: Any,
    ) -> None:
        if format is not None:
            self.format(format)
        if not _is_delta(self):
            return original_save(self, path, None, mode, partitionBy, **options)
        if mode is not None:
            self.mode(mode)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        self.options(**options)
        if self.__dict__.pop("_deltaflow_partitions_in_spark", False):
            # partitionBy came before format("delta"): start over from a writer without them.
            self._jwrite = self._df._jdf.write().format(DELTA_FORMAT)
            for key, value in self.__dict__.get("_deltaflow_options", {}).items():
                original_option(self, key, value)
        cols = self.__dict__.get("_deltaflow_partition_by")
        if cols is not None:
            original_option(self, "__partition_columns", json.dumps(cols))
        wanted = str(self.__dict__.get("_deltaflow_mode") or "errorifexists").lower()
        if wanted in ("errorifexists", "error", "default", "ignore"):
            if path is None:
                raise ConfigError("format('delta') served by deltaflow writes to a path: .save(path)")
            if _skip_write(_writer_options(self), path, wanted):
                return None
            wanted = "append"
        original_mode(self, wanted)
        return original_save(self, path)

    def start(self: Any, path: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("format") is not None:
            self.format(kwargs.pop("format"))
        if kwargs.get("partitionBy") is not None:
            self.partitionBy(kwargs.pop("partitionBy"))
        cols = self.__dict__.get("_deltaflow_partition_by")
        if _is_delta(self) and cols is not None:
            self.option("__partition_columns", json.dumps(cols))
        return original_start(self, path, *args, **kwargs)

    _patch(DataFrameWriter, partitionBy=partition_batch, mode=mode, save=save)
    _patch(DataStreamWriter, partitionBy=partition_stream, start=start)
    try:
        _install_connect_shim()
    except ImportError:  # Spark Connect's client libraries (gRPC) are not installed
        logger.debug("no Spark Connect client: format('delta') shim for classic sessions only")


def _install_connect_shim() -> None:
    """The same for Spark Connect's writers, whose state lives in Python (the plan to send)."""
    from pyspark.sql.connect.readwriter import DataFrameWriter
    from pyspark.sql.connect.streaming.readwriter import DataStreamWriter

    original_save = DataFrameWriter.save
    original_start = DataStreamWriter._start_internal

    def is_delta(writer: Any, source: str | None) -> bool:
        return isinstance(source, str) and source.lower() == DELTA_FORMAT and _serves_delta(writer)

    def save(
        self: Any,
        path: str | None = None,
        format: str | None = None,
        mode: str | None = None,
        partitionBy: str | list[str] | None = None,  # noqa: N803 - pyspark's own parameter name
        **options: Any,
    ) -> None:
        if format is not None:
            self.format(format)
        if not is_delta(self, self._write.source):
            return original_save(self, path, None, mode, partitionBy, **options)
        self.mode(mode).options(**options)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        write = self._write
        if write.partitioning_cols:
            write.options["__partition_columns"] = json.dumps([str(c) for c in write.partitioning_cols])
            write.partitioning_cols = []
        wanted = str(write.mode or "errorifexists").lower()
        if wanted in ("errorifexists", "error", "default", "ignore"):
            if path is None:
                raise ConfigError("format('delta') served by deltaflow writes to a path: .save(path)")
            if _skip_write(dict(write.options), path, wanted):
                return None
            write.mode = "append"
        return original_save(self, path)

    def start_internal(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("format") is not None:
            self.format(kwargs.pop("format"))
        if kwargs.get("partitionBy") is not None:
            self.partitionBy(kwargs.pop("partitionBy"))
        proto = self._write_proto
        if is_delta(self, proto.format) and len(proto.partitioning_column_names):
            proto.options["__partition_columns"] = json.dumps(list(proto.partitioning_column_names))
        return original_start(self, *args, **kwargs)

    _patch(DataFrameWriter, save=save)
    _patch(DataStreamWriter, _start_internal=start_internal)


def _patch(cls: type, **methods: Any) -> None:
    for name, method in methods.items():
        setattr(cls, name, method)


def _skip_write(writer_options: dict[str, Any], path: str, mode: str) -> bool:
    """``errorifexists`` / ``ignore`` against the table at ``path``, as delta-spark decides:
    a write the table already holds (``txnAppId``/``txnVersion``) is skipped; else an existing
    table fails the write (``errorifexists``) or skips it (``ignore``)."""
    from deltaflow.delta import log as delta_log
    from deltaflow.delta.progress import is_committed

    uri = normalize_uri(path)
    table = delta_log.load(uri, {})
    if table is None:
        return False
    options = {str(k).lower(): v for k, v in writer_options.items()}
    app, version = options.get("txnappid"), options.get("txnversion")
    if (
        app is not None
        and version is not None
        and is_committed(table, uri, str(app), int(version), streaming=False)
    ):
        logger.info("write to %s skipped: txn (%s, %s) is already in the table", uri, app, version)
        return True
    if mode == "ignore":
        logger.info("write to %s skipped: the table exists and the save mode is 'ignore'", uri)
        return True
    raise TableExistsError(
        f"a Delta table already exists at {uri!r}, and the save mode is 'errorifexists' (the "
        "default), which refuses to write to it, as delta-spark does: use .mode('append') to add "
        "to it or .mode('overwrite') to replace it",
        table_uri=uri,
    )


def _writer_options(writer: Any) -> dict[str, Any]:
    """The options set so far on a writer (as the shim recorded them)."""
    return dict(writer.__dict__.get("_deltaflow_options", {}))

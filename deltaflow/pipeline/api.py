"""The Python entry points: :func:`write`, :func:`write_stream` and :func:`register`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deltaflow.config.locations import normalize_uri
from deltaflow.config.sink import SinkOptions, StreamSinkOptions, for_stream
from deltaflow.delta.layout import checkpoint_dir
from deltaflow.errors import ConfigError, TableNotFoundError
from deltaflow.pipeline.interrupts import stoppable
from deltaflow.sinks.datasource import FORMAT_NAME, DeltaflowDataSource

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["default_checkpoint_location", "register", "write", "write_stream"]

logger = logging.getLogger(__name__)

#: Folder inside a local table that holds deltaflow's own state. Delta readers and vacuum
#: ignore folders whose name starts with ``_``.


def register(spark: SparkSession) -> None:
    """Register deltaflow's data sources with ``spark``, once per session.

    ``deltaflow`` (the Delta sink), ``deltaflow-kafka`` (the Kafka source),
    ``deltaflow-kafka-ingest`` (the Arrow ingest path's source), ``deltaflow-delta`` (a Delta
    table as a stream), ``postgres-cdc`` (PostgreSQL change data capture) and
    ``deltaflow-generator`` (synthetic events); and ``delta`` itself, with Delta Lake's option
    names, unless delta-spark is on the session's classpath
    (:mod:`deltaflow.pipeline.delta_format`).

    The streams deltaflow's pipelines read register their source again, each its own
    registration (:mod:`deltaflow.sources.streams`: queries of one registration starting at
    once can corrupt it).
    """
    if getattr(spark, "_deltaflow_registered", False):
        return
    from deltaflow.sources.delta import DeltaTableDataSource
    from deltaflow.sources.generator import GeneratorDataSource
    from deltaflow.sources.kafka import KafkaDataSource
    from deltaflow.sources.kafka_ingest import KafkaIngestDataSource
    from deltaflow.sources.postgres_cdc import PostgresCdcDataSource

    spark.dataSource.register(DeltaflowDataSource)
    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(KafkaIngestDataSource)
    spark.dataSource.register(DeltaTableDataSource)
    spark.dataSource.register(GeneratorDataSource)
    spark.dataSource.register(PostgresCdcDataSource)
    from deltaflow.pipeline.delta_format import serve_delta

    serve_delta(spark)
    spark._deltaflow_registered = True  # type: ignore[attr-defined]


def default_checkpoint_location(options: SinkOptions) -> str:
    """``<table>/_deltaflow/checkpoints/<pipeline_id>`` for local tables.

    Spark writes checkpoints through Hadoop, which has no object-store connector here, so a
    table on an object store needs an explicit (local or HDFS) ``checkpoint_location``.
    """
    pipeline_id = for_stream(options).pipeline_id
    if not options.is_local:
        raise ConfigError(
            f"table {options.table_uri!r} is not on the local filesystem: pass "
            "checkpoint_location= (a local or HDFS path that survives restarts)",
            table_uri=options.table_uri,
        )
    return checkpoint_dir(normalize_uri(options.table_uri), pipeline_id)


def _prepare_table(df: DataFrame, options: SinkOptions, *, adopt_partitioning: bool = False) -> SinkOptions:
    """Validate the DataFrame against the sink options and the table; create the table.

    Runs on the driver before anything is written, so bad input fails with nothing on disk.
    Returns the options to write with: with ``adopt_partitioning``, an existing table's
    partitioning when none was given (as delta-spark's append and ``deltaflow ingest`` take it).
    """
    from deltaflow.delta.schema import spark_to_arrow

    return _prepare_table_schema(spark_to_arrow(df.schema), options, adopt_partitioning=adopt_partitioning)


def _prepare_table_schema(
    schema: pa.Schema, options: SinkOptions, *, adopt_partitioning: bool = False
) -> SinkOptions:
    """:func:`_prepare_table` for rows of the Arrow ``schema``."""
    from deltaflow.delta import commit
    from deltaflow.delta import log as delta_log
    from deltaflow.delta.schema import check_against_table, check_partition_columns

    uri = normalize_uri(options.table_uri)
    table = delta_log.load(uri, options.storage_options)
    if table is not None and adopt_partitioning and not options.partition_columns:
        have = list(table.metadata().partition_columns)
        if have:
            logger.info("table %s is partitioned by %s: writing with its partitioning", uri, have)
            options = options.model_copy(update={"partition_columns": tuple(have)})
    check_partition_columns(schema, options.partition_columns, uri)
    if table is None:
        if not options.auto_create_table:
            raise TableNotFoundError(
                f"no Delta table at {uri!r} and auto_create_table is off; create the table "
                "or set auto_create_table=true",
                table_uri=uri,
            )
        commit.create_table(
            uri,
            schema,
            partition_by=options.partition_columns,
            properties=options.table_properties,
            storage_options=options.storage_options,
        )
        return options
    check_against_table(
        table,
        schema,
        partition_columns=options.partition_columns,
        schema_mode=options.schema_mode,
        table_uri=uri,
    )
    return options


#: The writer epoch this process claimed per (table, pipeline id): a query the daemon restarts
#: (or a job started again in the same process) keeps it, so a process claims a pipeline on a
#: table once, not once per start. Taken over meanwhile, it is fenced at its next batch as before.
_CLAIMS: dict[tuple[str, str], int] = {}
_CLAIMS_LOCK = threading.Lock()
_CLAIM_LOCKS: dict[tuple[str, str], threading.Lock] = {}


def _claim(options: SinkOptions) -> StreamSinkOptions:
    """Become the pipeline's only writer of the table (see :func:`deltaflow.delta.commit.claim_writer`),
    once per process: the options with the writer epoch every commit of this stream carries."""
    from deltaflow.delta import commit

    options = for_stream(options)
    key = (normalize_uri(options.table_uri), options.pipeline_id)
    with _CLAIMS_LOCK:
        lock = _CLAIM_LOCKS.setdefault(key, threading.Lock())
    with lock:  # one claim per table at a time; tables are claimed side by side (claim_all)
        epoch = _CLAIMS.get(key)
        if epoch is None:
            fence = commit.claim_writer(
                key[0],
                options.storage_options,
                options.pipeline_id,
                policy=commit.RetryPolicy(max_retries=options.max_commit_retries),
            )
            epoch = _CLAIMS[key] = fence.epoch
    return options.model_copy(update={"writer_epoch": epoch})


def claim_all(
    options: Sequence[SinkOptions], *, claimed: Mapping[str, int] | None = None
) -> list[StreamSinkOptions]:
    """:func:`_claim` for many tables, side by side (one ingest of many topics claims each).

    ``claimed``: tables (normalised URI -> epoch) whose creation in this process claimed them
    already (:func:`deltaflow.delta.commit.create_claimed_table`): no claim commit of their own.
    """
    from deltaflow.delta.log import side_by_side

    for opts in options:
        epoch = (claimed or {}).get(normalize_uri(opts.table_uri))
        if epoch is not None and opts.pipeline_id:
            with _CLAIMS_LOCK:
                _CLAIMS[normalize_uri(opts.table_uri), opts.pipeline_id] = epoch
    return side_by_side(_claim, options, name="claim")


def write_stream(
    df: DataFrame,
    table_uri: str,
    *,
    pipeline_id: str,
    checkpoint_location: str | None = None,
    trigger: Mapping[str, Any] | None = None,
    output_mode: str = "append",
    query_name: str | None = None,
    **options: Any,
) -> StreamingQuery:
    """Start a streaming query that writes ``df`` to the Delta table at ``table_uri``.

    Every micro-batch becomes one Delta commit carrying ``txn(pipeline_id, batch_id)``: a
    batch replayed after a crash is recognised and skipped, so each row lands exactly once.

    Args:
        df: A streaming DataFrame.
        table_uri: The table's location (see :class:`~deltaflow.config.sink.SinkOptions`).
        pipeline_id: Stable identity of this pipeline; changing it is a deliberate reset.
        checkpoint_location: Spark's checkpoint folder; defaults to
            ``<table>/_deltaflow/checkpoints/<pipeline_id>`` for local tables.
        trigger: Keyword arguments of ``DataStreamWriter.trigger``, e.g.
            ``{"processingTime": "10 seconds"}`` or ``{"availableNow": True}``.
        output_mode: ``append``, or ``complete`` to replace the table with every batch.
        query_name: Name of the streaming query (defaults to ``pipeline_id``).
        **options: Further sink options (``partition_columns``, ``compression``, ...).

    Returns:
        The running ``StreamingQuery``.

    Raises:
        ConfigError: for unknown options or values that are not allowed.
        SchemaMismatchError: when the DataFrame does not fit the existing table.
    """
    if not df.isStreaming:
        raise ConfigError("write_stream() needs a streaming DataFrame; use deltaflow.write()")
    opts = SinkOptions.build({"table_uri": table_uri, "pipeline_id": pipeline_id, **options})
    location = checkpoint_location or default_checkpoint_location(opts)
    opts = opts.model_copy(update={"checkpoint_location": location})
    register(df.sparkSession)
    if opts.write_mode == "merge":
        from deltaflow.sinks.merge import MergeWriter, target_rows

        opts = _prepare_table(target_rows(df, opts), opts, adopt_partitioning=True)
        writer = df.writeStream.foreachBatch(stoppable(MergeWriter(_claim(opts)), pipeline=pipeline_id))
    elif opts.uses_spark_writer:
        opts = _prepare_table(df, opts, adopt_partitioning=True)
        from deltaflow.sinks.batch_writer import SparkBatchWriter

        batch_writer = SparkBatchWriter(_claim(opts), overwrite=output_mode == "complete")
        writer = df.writeStream.foreachBatch(stoppable(batch_writer, pipeline=pipeline_id))
    else:
        opts = _prepare_table(df, opts, adopt_partitioning=True)
        writer = df.writeStream.format(FORMAT_NAME).options(**_claim(opts).to_spark_options())
    writer = (
        writer.option("checkpointLocation", location)
        .outputMode(output_mode)
        .queryName(query_name or pipeline_id)
    )
    if trigger:
        writer = writer.trigger(**trigger)
    logger.info(
        "starting pipeline %r into %s (checkpoint %s, files written by %s)",
        pipeline_id,
        normalize_uri(table_uri),
        location,
        "Spark" if opts.uses_spark_writer else "Python workers (Arrow)",
    )
    return writer.start()


def write(
    df: DataFrame,
    table_uri: str,
    *,
    pipeline_id: str | None = None,
    mode: str = "append",
    **options: Any,
) -> int:
    """Write a batch DataFrame to the Delta table at ``table_uri`` in one commit.

    Args:
        df: A batch DataFrame.
        table_uri: The table's location.
        pipeline_id: Optional writer identity recorded in the commit; with ``txn_version`` the
            write is idempotent (skipped when that version is already committed).
        mode: ``append`` or ``overwrite``.
        **options: Further sink options.

    Returns:
        The table's version after the write.
    """
    if df.isStreaming:
        raise ConfigError("write() needs a batch DataFrame; use deltaflow.write_stream()")
    values: dict[str, Any] = {"table_uri": table_uri, "write_mode": mode, **options}
    if pipeline_id is not None:
        values["pipeline_id"] = pipeline_id
    opts = SinkOptions.build(values)
    if opts.write_mode == "merge":
        raise ConfigError("write() appends or overwrites; merge changes with write_stream() or a pipeline")
    opts = _prepare_table(df, opts, adopt_partitioning=True)
    register(df.sparkSession)
    df.write.format(FORMAT_NAME).options(**opts.to_spark_options()).mode(opts.write_mode).save()
    from deltaflow.delta import log as delta_log

    table = delta_log.load(normalize_uri(table_uri), opts.storage_options)
    assert table is not None  # created by _prepare_table
    return table.version()

"""Run declarative pipelines (:mod:`deltaflow.config.pipeline`) as Spark streaming queries.

Per pipeline, one streaming query reads the source; each micro-batch goes to
:class:`PipelineWriter` (``foreachBatch``), which

1. Kafka: applies the ``transforms`` as ``deltaflow ingest`` does and splits off the messages
   that could not be decoded or transformed (dead letters in ingest's layout, the same as on
   the Arrow engine); files: reads the batch's files and, with a dead-letter table, splits
   off the JSON lines that are no record,
2. applies ``transforms`` (other sources) -> ``filter`` -> ``select`` (:func:`process`),
3. evaluates the ``expectations`` in one aggregation: any ``fail`` violation raises
   :class:`~deltaflow.errors.ExpectationFailedError` before anything is committed,
4. commits the dead letters (``drop`` violations, undecodable messages) to the dead-letter table,
5. commits each sink's rows (those its ``when`` accepts) to its table, with the sink's
   ``time_partition_pattern`` columns added and, with ``shuffle_by_partition``, repartitioned
   by its partition columns (:meth:`_Sink.rows`).

Every table's commit carries ``txn(<pipeline id>, <batch id>)``, so a batch replayed after a
crash between two commits skips the tables that hold it and lands in the others: each row
exactly once per table (docs/DESIGN.md, invariant 11).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from deltaflow.config.locations import normalize_uri
from deltaflow.config.pipeline import (
    DeltaSourceSpec,
    FilesSourceSpec,
    GeneratorSourceSpec,
    KafkaSourceSpec,
    ParquetFilesSourceSpec,
    PipelineSpec,
    PostgresCdcSourceSpec,
    SinkSpec,
)
from deltaflow.config.sink import SinkOptions
from deltaflow.config.time_partitions import TimePartitionColumn
from deltaflow.errors import ConfigError, ExpectationFailedError
from deltaflow.metrics import metrics
from deltaflow.pipeline.dead_letters import (
    INGEST_META,
    PIPELINE_SCHEMA,
    ingest_letters,
    kafka_row_letters,
    pipeline_letters,
)
from deltaflow.pipeline.interrupts import stoppable
from deltaflow.pipeline.kafka_rows import KafkaRows, for_pipeline
from deltaflow.pipeline.transforms import apply_transforms
from deltaflow.sources.files import BatchFiles, files_stream, read_files, source_schema
from deltaflow.sources.streams import load_stream

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from deltaflow.config.postgres import PgTable
    from deltaflow.sinks.mirror import MirrorWriter


__all__ = ["PipelineWriter", "choose_engine", "describe_source", "process", "start_pipeline"]

logger = logging.getLogger(__name__)


def state_dir() -> Path:
    """deltaflow's local state (``$DELTAFLOW_STATE_DIR``, else ``$XDG_STATE_HOME/deltaflow``)."""
    if os.environ.get("DELTAFLOW_STATE_DIR"):
        return Path(os.environ["DELTAFLOW_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "deltaflow"


def checkpoint_location(spec: PipelineSpec) -> str:
    """``checkpoint_location``, or ``<first sink>/_deltaflow/checkpoints/<id>`` for local tables
    (a ``postgres-cdc`` pipeline into a remote table: ``<state_dir()>/checkpoints/<id>``)."""
    if spec.checkpoint_location:
        return normalize_uri(spec.checkpoint_location)
    from deltaflow.pipeline.api import default_checkpoint_location

    first = SinkOptions.build({"table_uri": spec.sinks[0].table_uri, "pipeline_id": spec.pipeline_id})
    try:
        return default_checkpoint_location(first)
    except ConfigError:
        if isinstance(spec.source, PostgresCdcSourceSpec):
            # The table holds the progress (per slot): a checkpoint on this machine only saves
            # work, and losing it loses nothing.
            return str(state_dir() / "checkpoints" / spec.pipeline_id)
        raise ConfigError(
            f"pipeline {spec.pipeline_id!r}: its first sink {first.table_uri!r} is not on the local "
            "filesystem; "
            "set checkpoint_location (a local or HDFS path that survives restarts)",
            pipeline_id=spec.pipeline_id,
        ) from None


# -- sources -----------------------------------------------------------------------------------


def read_source(
    spark: SparkSession, spec: PipelineSpec, checkpoint: str, kafka: KafkaRows | None = None
) -> DataFrame:
    """The pipeline's source as a streaming DataFrame (Kafka: the source's rows, decoded as
    ``kafka`` says, transformed per batch by it)."""
    from deltaflow.pipeline.api import register

    register(spark)
    src = spec.source
    if isinstance(src, FilesSourceSpec):
        return files_stream(spark, src, checkpoint)
    if isinstance(src, DeltaSourceSpec):
        return _delta(spark, src)
    if isinstance(src, GeneratorSourceSpec):
        return _generator(spark, src)
    if isinstance(src, PostgresCdcSourceSpec):
        return _postgres(spark, spec, src)
    if isinstance(src, ParquetFilesSourceSpec):  # pragma: no cover - started by _watch
        raise ConfigError(
            "a parquet-files source has no rows to read: it registers files", pipeline_id=spec.pipeline_id
        )
    return _kafka(spark, src, kafka or for_pipeline(spec))


def _postgres(spark: SparkSession, spec: PipelineSpec, src: PostgresCdcSourceSpec) -> DataFrame:
    from deltaflow.sources.postgres_cdc import PostgresCdcDataSource

    options = src.source_options(spec.pipeline_id, _cdc_sinks_in_order(spec)).to_spark_options()
    return load_stream(spark, PostgresCdcDataSource, options)


def _cdc_sinks_in_order(spec: PipelineSpec) -> list[SinkSpec]:
    """A postgres-cdc pipeline's tables in commit order: mirrors, then the event table (last: a
    crash between two commits never leaves the event table ahead of a mirror)."""
    return sorted(spec.sinks, key=lambda s: s.write_mode != "merge")


def _delta(spark: SparkSession, src: DeltaSourceSpec) -> DataFrame:
    from deltaflow.sources.delta import DeltaTableDataSource

    options: dict[str, str] = {"table_uri": src.table_uri}
    for key in ("starting_version", "starting_timestamp", "max_versions_per_trigger"):
        value = getattr(src, key)
        if value is not None:
            options[key] = str(value)
    for key in ("ignore_deletes", "ignore_changes", "read_change_feed"):
        options[key] = "true" if getattr(src, key) else "false"
    if src.storage_options:
        options["storage_options"] = json.dumps(src.storage_options)
    return load_stream(spark, DeltaTableDataSource, options)


def _generator(spark: SparkSession, src: GeneratorSourceSpec) -> DataFrame:
    from pyspark.sql import functions as F  # noqa: N812

    from deltaflow.sources.generator import GeneratorDataSource

    options = {
        "rows_per_second": str(src.rows_per_second),
        "partitions": str(src.partitions),
        "seed": str(src.seed),
    }
    if src.total_rows is not None:
        options["total_rows"] = str(src.total_rows)
    if src.rows_per_batch is not None:
        options["rows_per_batch"] = str(src.rows_per_batch)
    df = load_stream(spark, GeneratorDataSource, options)
    for name, expr in src.fields.items():
        df = df.withColumn(name, F.expr(expr))
    return df


def _kafka(spark: SparkSession, src: KafkaSourceSpec, rows: KafkaRows) -> DataFrame:
    from deltaflow.sources.kafka import KafkaDataSource

    options = _kafka_options(src, value_schema=rows.value_schema, keep_value=rows.keep_value)
    return load_stream(spark, KafkaDataSource, options)


def _kafka_options(
    src: KafkaSourceSpec, *, value_schema: str | None = None, keep_value: bool = False
) -> dict[str, str]:
    options: dict[str, str] = {
        "bootstrap_servers": src.bootstrap_servers,
        "value_format": src.format,
        "max_messages_per_batch": str(src.max_messages_per_batch),
        "starting_offsets": src.starting_offsets
        if isinstance(src.starting_offsets, str)
        else json.dumps(src.starting_offsets),
        # A transform may still reject a decoded message: its dead letter needs the bytes.
        "keep_value": str(keep_value).lower(),
        "fail_on_data_loss": str(src.fail_on_data_loss).lower(),
    }
    if src.topic_pattern:
        options["topic_pattern"] = src.topic_pattern
    else:
        options["topic"] = ",".join(src.topics)
    schema = value_schema or src.schema_
    if schema:
        options["value_schema"] = schema
    if src.avro_schema:
        options["avro_schema"] = src.avro_schema
    if src.schema_registry_url:
        options["schema_registry_url"] = src.schema_registry_url
    if src.decompress_gzip:
        options["value_compression"] = "gzip"
    if src.kafka_settings:
        options["kafka_settings"] = json.dumps(
            {k: v.get_secret_value() for k, v in src.kafka_settings.items()}
        )
    return options


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


# -- processing --------------------------------------------------------------------------------


def process(df: DataFrame, spec: PipelineSpec, *, keep_kafka: bool = False) -> DataFrame:
    """``transforms`` -> ``filter`` -> ``select``, or ``query`` (a Kafka source's ``kafka``
    struct is dropped unless ``select`` or ``query`` keeps it, or ``keep_kafka``: map the
    fields you want). A Kafka source's rows come transformed (:class:`KafkaRows`)."""
    from pyspark.sql import functions as F  # noqa: N812

    if spec.query:
        # Each streaming query runs its batches in its own session: the view is private to it.
        df.createOrReplaceTempView(spec.source_name)
        return df.sparkSession.sql(spec.query)
    kafka = isinstance(spec.source, KafkaSourceSpec)
    if spec.transforms and not kafka:
        df = apply_transforms(df, spec.parsed_transforms())
    if spec.filter:
        df = df.filter(F.expr(spec.filter))
    if spec.select:
        df = df.selectExpr(*spec.select)
    elif kafka and "kafka" in df.columns and not keep_kafka:
        df = df.drop("kafka")
    return df


@dataclass(frozen=True)
class _Sink:
    name: str
    options: SinkOptions
    when: str | None
    #: ``time_partition_pattern``'s columns and the event-time column they format.
    time_columns: tuple[TimePartitionColumn, ...] = ()
    event_time: str | None = None
    shuffle: bool = False

    def rows(self, df: DataFrame) -> DataFrame:
        """``df`` as this sink writes it: the time partition columns added (formatted in UTC),
        repartitioned by the partition columns with ``shuffle_by_partition``."""
        from pyspark.sql import functions as F  # noqa: N812

        if self.time_columns and self.event_time:
            utc = _utc_wall_clock(df, self.event_time)
            df = df.select("*", *(_time_value(utc, c).alias(c.name) for c in self.time_columns))
        if self.shuffle and self.options.partition_columns:
            df = df.repartition(*(F.col(f"`{c}`") for c in self.options.partition_columns))
        return df


#: Each strftime field as (Spark function over a TIMESTAMP_NTZ, digits); ``date`` is %Y-%m-%d.
_TIME_FIELDS = {
    "year": ("year", 4),
    "month": ("month", 2),
    "day": ("dayofmonth", 2),
    "hour": ("hour", 2),
    "minute": ("minute", 2),
    "second": ("second", 2),
    "day_of_year": ("dayofyear", 3),
}


def _time_value(utc: Column, column: TimePartitionColumn) -> Column:
    """A time partition column's value: its fields read from the UTC wall clock ``utc`` (a
    TIMESTAMP_NTZ: no time zone is involved, unlike ``date_format``, which goes through the
    session zone and shifts hours in its DST gap), zero-padded, joined with the literal text.
    NULL for a NULL event time."""
    from pyspark.sql import functions as F  # noqa: N812

    def field(name: str) -> Column:
        function, digits = _TIME_FIELDS[name]
        return F.format_string(f"%0{digits}d", getattr(F, function)(utc))

    parts: list[Column] = []
    for kind, value in column.parts:
        if kind == "text":
            parts.append(F.lit(value))
        elif value == "date":
            parts += [field("year"), F.lit("-"), field("month"), F.lit("-"), field("day")]
        else:
            parts.append(field(value))
    return F.when(utc.isNull(), F.lit(None).cast("string")).otherwise(F.concat(*parts))


def _utc_wall_clock(df: DataFrame, column: str) -> Column:
    """``column`` as a TIMESTAMP_NTZ holding its UTC wall-clock time, whatever the session's
    time zone (a TIMESTAMP is an instant: its epoch microseconds added to the NTZ epoch; a
    TIMESTAMP_NTZ is taken as UTC; a DATE is its midnight)."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import TimestampType

    quoted = f"`{column.replace('`', '``')}`"
    if isinstance(df.schema[column].dataType, TimestampType):
        return F.expr(f"timestampadd(MICROSECOND, unix_micros({quoted}), TIMESTAMP_NTZ'1970-01-01 00:00:00')")
    return F.expr(f"CAST({quoted} AS TIMESTAMP_NTZ)")


def _event_time(spec: PipelineSpec, name: str, sink: SinkSpec, shape: DataFrame) -> str | None:
    """The column ``sink``'s ``time_partition_pattern`` formats: ``event_time_column``, else the
    rows' only TIMESTAMP (or TIMESTAMP_NTZ) column.

    Raises:
        ConfigError: the column is missing or not a time, there is no or more than one
            candidate, or a time partition column already exists in the rows.
    """
    from pyspark.sql.types import DateType, TimestampNTZType, TimestampType

    if not sink.time_partition_pattern:
        return None
    where = f"pipeline {spec.pipeline_id!r}, sink {name!r}"
    types = {f.name: f.dataType for f in shape.schema.fields}
    lowered = {n.lower() for n in types}
    made = [c.name for c in sink.time_partition_columns if c.name.lower() in lowered]
    if made:
        raise ConfigError(
            f"{where}: time_partition_pattern {sink.time_partition_pattern!r} makes the column(s) "
            f"{', '.join(made)}, which the rows already have; rename them, or name the segments "
            "Hive style (hr=%H)",
            pipeline_id=spec.pipeline_id,
        )
    times = [n for n, t in types.items() if isinstance(t, TimestampType | TimestampNTZType)]
    if sink.event_time_column:
        found = next((n for n in types if n.lower() == sink.event_time_column.lower()), None)
        if found is None or not isinstance(types[found], TimestampType | TimestampNTZType | DateType):
            kind = (
                "have no column" if found is None else f"have {found} as {types[found].simpleString()}, not"
            )
            raise ConfigError(
                f"{where}: event_time_column {sink.event_time_column!r}: the rows {kind} a TIMESTAMP or "
                f"DATE column (their time columns: {', '.join(times) or 'none'})",
                pipeline_id=spec.pipeline_id,
            )
        return found
    if len(times) != 1:
        raise ConfigError(
            f"{where}: time_partition_pattern formats the event time, and the rows have "
            f"{len(times)} TIMESTAMP columns ({', '.join(times) or 'none'}): set event_time_column "
            "(Arroyo's event_time_field) to the one to use",
            pipeline_id=spec.pipeline_id,
        )
    return times[0]


class PipelineWriter:
    """``foreachBatch`` function of one pipeline (the steps in the module docstring)."""

    def __init__(
        self,
        spec: PipelineSpec,
        sinks: Sequence[_Sink],
        dead_letter: SinkOptions | None,
        mirrors: Sequence[MirrorWriter] = (),
        files: BatchFiles | None = None,
        kafka: KafkaRows | None = None,
    ) -> None:
        from deltaflow.sinks.batch_writer import SparkBatchWriter
        from deltaflow.sinks.merge import MergeWriter

        self._spec = spec
        self._sinks = list(sinks)
        self._mirrors = list(mirrors)
        self._writers: dict[str, Callable[[DataFrame, int], None]] = {
            s.name: MergeWriter(s.options) if s.options.write_mode == "merge" else SparkBatchWriter(s.options)
            for s in sinks
        }
        self._dlq = SparkBatchWriter(dead_letter) if dead_letter else None
        #: The tables whose commits carry the pipeline's batch-id txn, and the query whose
        #: checkpoint they were found to match (:meth:`_check_checkpoint`).
        tables = [*(s.options for s in sinks), *([dead_letter] if dead_letter else [])]
        self._batch_tables = [o for o in tables if not o.kafka_offsets]
        self._checked_query: str | None = None
        #: A Kafka source: the batch is the source's rows, decoded and transformed here.
        self._kafka = kafka
        #: A files source: the batch is the files it takes, read here.
        self._files = files

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        held: list[DataFrame] = []

        def hold(frame: DataFrame) -> DataFrame:
            """``frame``, cached until the batch is done (it is read more than once)."""
            frame = frame.persist()
            held.append(frame)
            return frame

        try:
            self._run(batch, batch_id, hold)
        finally:
            for frame in held:
                frame.unpersist()

    def _run(self, batch: DataFrame, batch_id: int, hold: Callable[[DataFrame], DataFrame]) -> None:
        from pyspark.sql import functions as F  # noqa: N812

        spec = self._spec
        self._check_checkpoint(batch, batch_id)
        reused = len(self._sinks) + len(self._mirrors) > 1 or bool(spec.expectations)
        # Kafka: the transformed rows are cached (split into dead letters and rows; a
        # per-message transform runs once). Mirrors: the source's rows. Otherwise the rows after
        # the transforms are: a transform such as input_file_name() must be evaluated in the
        # scan of the files, not over a cache.
        if self._kafka is not None:
            batch = hold(self._kafka.frame(batch))
        elif self._mirrors and reused:
            batch = hold(batch)
        if self._mirrors:
            # Mirrors first (their commit order: see _cdc_sinks_in_order), from one collection,
            # side by side (each is its own table; delta-rs works outside the GIL).
            events = batch.toArrow()
            if len(self._mirrors) == 1:
                self._mirrors[0](events, batch_id)
            else:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(min(len(self._mirrors), 4), thread_name_prefix="mirror") as pool:
                    done = [pool.submit(mirror, events, batch_id) for mirror in self._mirrors]
                for future in done:
                    future.result()  # the first failure, once every mirror has finished
        letters: list[DataFrame] = []
        # Kafka, with a drop expectation and ingest's dead-letter layout: the rows keep their
        # message's coordinates until the expectations have run.
        keep_kafka = (
            self._kafka is not None
            and self._kafka.layout == "kafka"
            and any(e.action == "drop" for e in spec.expectations)
            and not (spec.select or spec.query)
        )
        if self._kafka is not None:
            # (Messages without a value, tombstones, are no rows: the source skips them.)
            self._split_kafka(batch, batch_id, letters)
            batch = self._kafka.good(batch)
        if self._files is not None:
            batch = self._files(batch)
            if self._files.dead_letters:
                batch = self._split_malformed(batch, batch_id, hold, letters)
        rows = process(batch, spec, keep_kafka=keep_kafka)
        if reused and not (self._kafka is not None or self._mirrors):
            rows = hold(rows)
        rows = self._check_expectations(rows, batch_id, letters)
        if keep_kafka:
            rows = rows.drop("kafka")
        if letters:
            self._dead_letter(letters, batch_id)
        for sink in self._sinks:
            routed = rows.filter(F.expr(sink.when)) if sink.when else rows
            self._writers[sink.name](sink.rows(routed), batch_id)

    def _split_kafka(self, frame: DataFrame, batch_id: int, letters: list[DataFrame]) -> None:
        """Count, meter and log the batch's failed messages (their dead letters to ``letters``)
        and its fields the table lacks, in one pass, as the Arrow engine reports them; a field
        the table has gained since the query started restarts it (the Arrow engine's too)."""
        from pyspark.sql import functions as F  # noqa: N812

        from deltaflow.pipeline.dead_letters import log_unknown_fields
        from deltaflow.pipeline.evolution import restart_if_table_gained

        assert self._kafka is not None
        spec, table = self._spec, self._sinks[0].options.table_uri
        error, unknown = F.col(f"{INGEST_META}.error"), F.col(f"{INGEST_META}.unknown_fields")
        good_unknown = F.when(error.isNull(), unknown)
        stats = frame.agg(
            F.count(error).alias("failed"),
            F.first(error, ignorenulls=True).alias("first_error"),
            F.count(good_unknown).alias("unknown"),
            F.array_distinct(F.flatten(F.collect_set(good_unknown))).alias("names"),
        ).first()
        assert stats is not None
        if stats["unknown"]:
            metrics.unknown_fields_seen(pipeline=spec.pipeline_id, table=table, count=stats["unknown"])
            if self._kafka.follow_table:
                restart_if_table_gained(self._sinks[0].options, stats["names"], batch_id)
            log_unknown_fields(batch_id, stats["unknown"], stats["names"])
        if stats["failed"]:
            metrics.records_failed(pipeline=spec.pipeline_id, table=table, count=stats["failed"])
            letters.append(self._kafka.letters(self._kafka.failed(frame), spec.pipeline_id, batch_id))
            logger.warning(
                "pipeline %r batch %s: %d message(s) could not be decoded or transformed%s; first error: %s",
                spec.pipeline_id,
                batch_id,
                stats["failed"],
                " (to the dead-letter table)" if self._dlq else " (skipped: no dead-letter table)",
                stats["first_error"],
            )

    def _check_checkpoint(self, batch: DataFrame, batch_id: int) -> None:
        """Before a query's first batch writes anything: every table holding the pipeline's
        batch-id txn must hold it from this query's checkpoint (or the batch id must be at or
        beyond it). Each writer checks its own table before it commits, but the dead-letter
        table commits first: a lost checkpoint's replacement would leave its mark there (and
        its dead letters), and the restored checkpoint would then be refused by that table.

        Raises:
            CheckpointMismatchError: a table holds batches of another checkpoint, or later ones.
        """
        from deltaflow.delta import log as delta_log
        from deltaflow.delta.progress import is_committed
        from deltaflow.sinks.spark_checkpoint import streaming_query_id

        if not self._batch_tables:
            return
        query_id = streaming_query_id(batch, self._batch_tables[0])
        if query_id is None or query_id == self._checked_query:
            return
        for options in self._batch_tables:
            uri = normalize_uri(options.table_uri)
            table = delta_log.load(uri, options.storage_options)
            is_committed(table, uri, options.pipeline_id, batch_id, streaming=True, checkpoint=query_id)
        self._checked_query = query_id

    def _split_malformed(
        self, rows: DataFrame, batch_id: int, hold: Callable[[DataFrame], DataFrame], letters: list[DataFrame]
    ) -> DataFrame:
        """A files source's lines that are no record, to the dead-letter table (the files are
        read twice: once for these, once for the rows, which must come from the file scan)."""
        from pyspark.sql import functions as F  # noqa: N812

        from deltaflow.sources.files import ERROR_COLUMN, RECORD_COLUMN

        spec = self._spec
        failed = hold(rows.filter(F.col(ERROR_COLUMN).isNotNull()))
        malformed = failed.count()
        if malformed:
            metrics.records_failed(
                pipeline=spec.pipeline_id, table=self._sinks[0].options.table_uri, count=malformed
            )
            letters.append(
                pipeline_letters(
                    failed,
                    spec.pipeline_id,
                    batch_id,
                    reason=F.col(ERROR_COLUMN),
                    record=F.col(RECORD_COLUMN),
                )
            )
            logger.warning(
                "pipeline %r batch %s: %d line(s) of its files are no JSON object; to the dead-letter table",
                spec.pipeline_id,
                batch_id,
                malformed,
            )
        return rows.filter(F.col(ERROR_COLUMN).isNull()).drop(ERROR_COLUMN, RECORD_COLUMN)

    def _check_expectations(self, rows: DataFrame, batch_id: int, letters: list[DataFrame]) -> DataFrame:
        """Count every expectation's violations in one pass; raise on ``fail``; split off ``drop``."""
        from pyspark.sql import functions as F  # noqa: N812

        spec = self._spec
        if not spec.expectations:
            return rows
        ok = {e.name: F.coalesce(F.expr(e.expr).cast("boolean"), F.lit(False)) for e in spec.expectations}
        counts = rows.agg(
            *(
                F.sum(F.when(~ok[e.name], 1).otherwise(0)).alias(f"v{i}")
                for i, e in enumerate(spec.expectations)
            )
        ).first()
        violations = {
            e.name: int((counts[f"v{i}"] if counts else 0) or 0) for i, e in enumerate(spec.expectations)
        }
        for e in spec.expectations:
            if violations[e.name]:
                metrics.expectation_violated(
                    pipeline=spec.pipeline_id, expectation=e.name, action=e.action, count=violations[e.name]
                )
        failing = [e for e in spec.expectations if e.action == "fail" and violations[e.name]]
        if failing:
            detail = ", ".join(f"{e.name!r} ({violations[e.name]} row(s) violate {e.expr})" for e in failing)
            raise ExpectationFailedError(
                f"pipeline {spec.pipeline_id!r}, batch {batch_id}: expectation {detail}; nothing of the "
                "batch was committed. Fix the data or the expectation, then start the pipeline again",
                pipeline_id=spec.pipeline_id,
                batch_id=batch_id,
                expectations=[e.name for e in failing],
            )
        for e in spec.expectations:
            if e.action == "warn" and violations[e.name]:
                logger.warning(
                    "pipeline %r batch %s: %d row(s) violate expectation %r (%s); kept",
                    spec.pipeline_id,
                    batch_id,
                    violations[e.name],
                    e.name,
                    e.expr,
                )
        drops = [e for e in spec.expectations if e.action == "drop"]
        if not any(violations[e.name] for e in drops):
            return rows
        keep = F.lit(True)
        for e in drops:
            keep = keep & ok[e.name]
        names = F.array_compact(F.array(*(F.when(~ok[e.name], F.lit(e.name)) for e in drops)))
        reason = F.concat(F.lit("expectation failed: "), F.array_join(names, ", "))
        if self._kafka is not None and self._kafka.layout == "kafka":
            letters.append(kafka_row_letters(rows.filter(~keep), reason))
        else:
            letters.append(
                pipeline_letters(
                    rows.filter(~keep),
                    spec.pipeline_id,
                    batch_id,
                    reason=reason,
                    record=F.to_json(F.struct(*(F.col(f"`{c}`") for c in rows.columns))),
                )
            )
        dropped = sum(violations[e.name] for e in drops)
        logger.warning(
            "pipeline %r batch %s: rows violating %s dropped%s (%d violation(s))",
            spec.pipeline_id,
            batch_id,
            ", ".join(repr(e.name) for e in drops if violations[e.name]),
            " to the dead-letter table" if self._dlq else "",
            dropped,
        )
        return rows.filter(keep)

    def _dead_letter(self, letters: list[DataFrame], batch_id: int) -> None:
        if self._dlq is None:
            return  # counted and logged above
        frame = letters[0]
        for more in letters[1:]:
            frame = frame.unionByName(more)
        self._dlq(frame, batch_id)


# -- starting and running ----------------------------------------------------------------------


def choose_engine(spec: PipelineSpec) -> Literal["spark", "arrow"]:
    """The engine ``spec`` runs on (its ``engine``; ``auto``: Arrow whenever it can).

    The two engines record a Kafka pipeline's progress differently (a txn per batch, a txn per
    partition), so a pipeline keeps the engine its tables were written with: switching would
    start it over from ``starting_offsets``, duplicating rows.

    Raises:
        ConfigError: the engine asked for is not the one the tables' progress was written by.
    """
    if spec.engine == "spark" or (spec.engine == "auto" and spec.arrow_blockers()):
        written_by_arrow = _partition_progress(spec)
        if written_by_arrow:
            raise ConfigError(
                f"pipeline {spec.pipeline_id!r}: {written_by_arrow} holds its progress per Kafka partition, "
                "written by the Arrow engine; the Spark engine records it per batch and would start over "
                "from starting_offsets. Set engine: arrow (it can run only plain ingest: "
                f"{'; '.join(spec.arrow_blockers()) or 'this pipeline qualifies'}), or give the pipeline "
                "a new id and table",
                pipeline_id=spec.pipeline_id,
            )
        return "spark"
    written_by_spark = _batch_progress(spec)
    if written_by_spark is None:
        return "arrow"
    if spec.engine == "auto":
        logger.info(
            "pipeline %r: %s holds its Spark-engine progress (a txn per batch): staying on the Spark engine",
            spec.pipeline_id,
            written_by_spark,
        )
        return "spark"
    raise ConfigError(
        f"pipeline {spec.pipeline_id!r}: {written_by_spark} holds its progress per batch, written by the "
        "Spark engine; the Arrow engine records it per Kafka partition and would start over from "
        "starting_offsets. Keep engine: spark (or auto), or give the pipeline a new id and table",
        pipeline_id=spec.pipeline_id,
    )


def _batch_progress(spec: PipelineSpec) -> str | None:
    """The table (a sink or the dead-letter table) holding ``txn(pipeline_id, batch)``, if any."""
    from deltaflow.delta import log as delta_log
    from deltaflow.delta.progress import transaction_version

    tables = [*spec.sinks, *([spec.dead_letter] if spec.dead_letter else [])]
    for sink in tables:
        uri = normalize_uri(sink.table_uri)
        if transaction_version(delta_log.load(uri, sink.storage_options), spec.pipeline_id) is not None:
            return uri
    return None


def _partition_progress(spec: PipelineSpec) -> str | None:
    """A table of the pipeline (any sink, or the dead-letter table) holding Arrow-engine progress:
    a txn per Kafka partition of its topics."""
    from deltaflow.delta import log as delta_log
    from deltaflow.delta.progress import kafka_progress, transaction_version
    from deltaflow.sources.kafka import KafkaSourceOptions, topic_partitions

    src = spec.source
    if not isinstance(src, KafkaSourceSpec):
        return None
    tables = [(sink.table_uri, sink.storage_options, spec.pipeline_id) for sink in spec.sinks]
    if spec.dead_letter is not None:
        dead = spec.dead_letter
        tables.append((dead.table_uri, dead.storage_options, f"{spec.pipeline_id}-dlq"))
    candidates = []
    for uri, storage, app_id in tables:
        table = delta_log.load(normalize_uri(uri), storage)
        # No table, or one holding the Spark engine's progress: nothing of the Arrow engine.
        if table is not None and transaction_version(table, spec.pipeline_id) is None:
            candidates.append((normalize_uri(uri), table, app_id))
    if not candidates:
        return None
    layout = topic_partitions(KafkaSourceOptions.from_spark_options(_kafka_options(src)))
    return next((uri for uri, table, app_id in candidates if kafka_progress(table, app_id, layout)), None)


def start_pipeline(
    spark: SparkSession,
    spec: PipelineSpec,
    *,
    available_now: bool = False,
    on_engine: Callable[[str], None] | None = None,
) -> StreamingQuery:
    """Start one pipeline's streaming query (tables are created or checked first).

    ``on_engine`` is told the engine it runs on (:func:`choose_engine`) before it starts.
    """
    from deltaflow.pipeline.api import _claim, _prepare_table

    if isinstance(spec.source, ParquetFilesSourceSpec):
        return _watch(spark, spec, spec.source, available_now=available_now, on_engine=on_engine)
    engine = choose_engine(spec)
    if engine == "arrow":
        from deltaflow.pipeline.topic_ingest import start

        logger.info("pipeline %r runs as plain Kafka ingest (the Arrow engine)", spec.pipeline_id)
        return start(spark, spec.ingest_config(available_now=available_now), on_engine=on_engine)
    location = checkpoint_location(spec)
    kafka = for_pipeline(spec) if isinstance(spec.source, KafkaSourceSpec) else None
    source = read_source(spark, spec, location, kafka)
    good = source
    if kafka is not None:
        good = kafka.good(kafka.frame(source))
    files = None
    if isinstance(spec.source, FilesSourceSpec):
        # The stream is the files each batch takes; the rows are read from them in the batch.
        schema = source_schema(spark, spec.source, location)
        dead_letters = spec.dead_letter is not None and spec.source.format == "json"
        files = BatchFiles(spec.source, schema, dead_letters=dead_letters)
        good = read_files(spark, spec.source, schema, [])
    if spec.query:
        # The columns the query makes, from an empty frame in a session of its own (a temp
        # view in the shared session would race with other pipelines starting).
        good = spark.newSession().createDataFrame([], good.schema)
    shape = process(good, spec)
    cdc = isinstance(spec.source, PostgresCdcSourceSpec)
    sinks = [
        _Sink(
            name,
            sink.sink_options(spec.pipeline_id, location, source_offsets=cdc),
            sink.when,
            sink.time_partition_columns,
            _event_time(spec, name, sink, shape),
            sink.shuffle_by_partition,
        )
        for name, sink in zip(spec.sink_names(), spec.sinks, strict=True)
        if not sink.stream
    ]
    mirrors = _mirrors(spec, location)
    _check_expressions(spec, shape)
    for i, sink in enumerate(sinks):
        if sink.options.write_mode == "merge":
            from deltaflow.sinks.merge import target_rows

            _prepare_table(target_rows(shape, sink.options), sink.options)
        else:
            # An existing table's partitioning when the sink names none (as delta-spark's
            # append, ingest and write/write_stream take it); another one is still refused.
            options = _prepare_table(sink.rows(shape), sink.options, adopt_partitioning=True)
            sinks[i] = dataclasses.replace(sink, options=options)
    dead_letter = None
    if spec.dead_letter is not None:
        values = spec.dead_letter.model_dump(exclude_defaults=True)
        values.update(pipeline_id=spec.pipeline_id, checkpoint_location=location)
        dead_letter = SinkOptions.build(values)
        if kafka is not None and kafka.layout == "kafka":
            _prepare_table(ingest_letters(kafka.frame(source)), dead_letter)
        else:
            _prepare_table(spark.createDataFrame([], PIPELINE_SCHEMA), dead_letter)
        dead_letter = _claim(dead_letter)
    # Every table this pipeline writes: an earlier process running it can no longer commit.
    sinks = [dataclasses.replace(s, options=_claim(s.options)) for s in sinks]
    mirrors = [m.with_options(_claim(m.options)) for m in mirrors]
    writer = PipelineWriter(spec, sinks, dead_letter, mirrors, files, kafka)
    if on_engine is not None:
        on_engine("spark")
    stream = (
        source.writeStream.foreachBatch(stoppable(writer, pipeline=spec.pipeline_id))
        .option("checkpointLocation", location)
        .queryName(spec.pipeline_id)
    )
    if available_now:
        stream = stream.trigger(availableNow=True)
    elif spec.trigger_interval:
        stream = stream.trigger(processingTime=f"{spec.trigger_interval} seconds")
    logger.info(
        "starting pipeline %r: %s -> %s (checkpoint %s)",
        spec.pipeline_id,
        describe_source(spec),
        ", ".join(f"{s.name}: {normalize_uri(s.options.table_uri)}" for s in sinks),
        location,
    )
    from deltaflow.pipeline.session import start_query

    return start_query(stream, spark, spec.pipeline_id)


def _watch(
    spark: SparkSession,
    spec: PipelineSpec,
    src: ParquetFilesSourceSpec,
    *,
    available_now: bool,
    on_engine: Callable[[str], None] | None,
) -> StreamingQuery:
    """A parquet-files pipeline: files registered in place (:mod:`deltaflow.pipeline.watch_files`)."""
    from deltaflow.ops.compaction import CompactionPolicy
    from deltaflow.pipeline.watch_files import start_watch

    (sink,) = spec.sinks
    options = sink.sink_options(spec.pipeline_id, checkpoint_location(spec))
    compaction = CompactionPolicy(
        min_files=options.auto_compact_min_files,
        target_bytes=options.target_file_size_bytes,
        compact=options.auto_compact,
        vacuum_interval_s=options.vacuum_interval_hours * 3600,
    )
    if on_engine is not None:
        on_engine("spark")
    return start_watch(
        spark,
        table_uri=sink.table_uri,
        path=src.path,
        pipeline_id=spec.pipeline_id,
        checkpoint_location=checkpoint_location(spec),
        copy=src.copy_,
        storage_options=sink.storage_options,
        available_now=available_now,
        trigger_interval=spec.trigger_interval,
        max_files_per_trigger=src.max_files_per_trigger,
        compaction=compaction if compaction.compact or compaction.vacuum_interval_s else None,
    )


def _mirrors(spec: PipelineSpec, location: str) -> list[MirrorWriter]:
    """The pipeline's mirror tables, checked against the PostgreSQL catalog and created."""
    src = spec.source
    wanted = [s for s in spec.sinks if s.stream]
    if not isinstance(src, PostgresCdcSourceSpec) or not wanted:
        return []
    from deltaflow.sinks.mirror import MirrorWriter
    from deltaflow.sources.postgres_catalog import describe_table, published_streams, table_exists

    options = src.source_options(spec.pipeline_id, _cdc_sinks_in_order(spec))
    published = published_streams(options)
    out = []
    for sink in wanted:
        stream = sink.stream or ""
        if stream not in published:
            where = f"pipeline {spec.pipeline_id!r}: the mirror of {stream} ({sink.table_uri})"
            if not table_exists(options, stream):
                raise ConfigError(
                    f"{where} reads {stream}, a table {options.where()} does not have (dropped? a "
                    "typo in stream?). Remove that sink from the pipeline (a mirror of a dropped "
                    "table stays as it was at the drop), or name an existing table in stream (one "
                    f"created again must be published too: ALTER PUBLICATION {src.publication} ADD "
                    f"TABLE {stream})",
                    pipeline_id=spec.pipeline_id,
                )
            raise ConfigError(
                f"{where} reads a table publication {src.publication!r} does not publish (it has "
                f"{', '.join(published) or 'none'}): ALTER PUBLICATION {src.publication} ADD TABLE {stream}",
                pipeline_id=spec.pipeline_id,
            )

        def describe(stream: str = stream) -> PgTable:
            return describe_table(options, stream)

        mirror = MirrorWriter(
            sink.sink_options(spec.pipeline_id, location, source_offsets=True), stream, options.key, describe
        )
        mirror.prepare()  # the key checked, the table created from the catalog
        out.append(mirror)
    return out


def _check_expressions(spec: PipelineSpec, shape: DataFrame) -> None:
    """Analyse every ``when`` and expectation against the rows' columns before anything runs (a
    typo would otherwise surface in the first batch, after other tables committed it)."""
    from pyspark.sql import functions as F  # noqa: N812

    checks = [
        (f"sinks.{n}.when", s.when) for n, s in zip(spec.sink_names(), spec.sinks, strict=True) if s.when
    ]
    checks += [(f"expectations.{e.name}", e.expr) for e in spec.expectations]
    for where, expr in checks:
        try:
            shape.select(F.expr(expr).alias("x")).schema  # noqa: B018 - analysis only, no job
        except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException/ParseException
            raise ConfigError(
                f"pipeline {spec.pipeline_id!r}, {where}: {expr!r} is not a valid predicate over the columns "
                f"{', '.join(shape.columns)}: {_first_line(exc)}",
                pipeline_id=spec.pipeline_id,
            ) from None


def describe_source(spec: PipelineSpec) -> str:
    src = spec.source
    if isinstance(src, FilesSourceSpec):
        return f"{src.format} files in {src.path}"
    if isinstance(src, DeltaSourceSpec):
        return f"delta table {src.table_uri}" + (" (change feed)" if src.read_change_feed else "")
    if isinstance(src, GeneratorSourceSpec):
        return f"generator at {src.rows_per_second:g} rows/s"
    if isinstance(src, ParquetFilesSourceSpec):
        how = (
            "copied below the table where outside it, then registered" if src.copy_ else "registered in place"
        )
        return f"parquet files landing in {src.path} ({how})"
    if isinstance(src, PostgresCdcSourceSpec):
        return f"postgres-cdc publication {src.publication} (slot {src.slot_name}) @ {src.where()}"
    return f"kafka {','.join(src.topics) or src.topic_pattern} @ {src.bootstrap_servers}"


def source_units(spec: PipelineSpec) -> tuple[str, str, str]:
    """What the pipeline's streaming query counts as input rows, what its sinks commit, and what
    its lag behind the source's newest position counts ("": it reports none).

    A files source's stream is the files each batch takes (their rows are read in the batch);
    a parquet-files source's is the files it registers; a CDC source's are changes, and its lag
    is the WAL between the slot's position and the server's newest (bytes, not changes).
    """
    src = spec.source
    if isinstance(src, (FilesSourceSpec, ParquetFilesSourceSpec)):
        return "file(s)", "row(s)", ""
    if isinstance(src, PostgresCdcSourceSpec):
        return "change(s)", "change(s)", "byte(s) of WAL"
    if isinstance(src, KafkaSourceSpec):
        return "message(s)", "row(s)", "message(s)"
    return "row(s)", "row(s)", ""

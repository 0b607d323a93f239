"""``deltaflow ingest`` on the Arrow engine: the tasks write the files, the driver commits them.

The query is ``deltaflow-kafka-ingest`` (:mod:`deltaflow.sources.kafka_ingest`) into
``foreachBatch``: Spark's offset log, triggers, scheduling and task retries as for any
streaming query, but the rows stay in Arrow inside the source's tasks (step 0 there) and the
micro-batch Spark hands the driver is one small row per task: the files it wrote. The driver
then commits them, dead letters first, with the sink's steps 1-5 (DESIGN.md, "The Arrow ingest
path"). Runs that need Spark SQL (``sql:`` transforms) or schema evolution take the Spark
engine (:func:`choose_engine`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from deltaflow.config.ingest import IngestConfig
from deltaflow.config.sink import StreamSinkOptions
from deltaflow.errors import ConfigError
from deltaflow.io import arrow_transforms
from deltaflow.metrics import metrics
from deltaflow.pipeline.dead_letters import log_failed, log_unknown_fields
from deltaflow.sinks.spark_checkpoint import restarts_offsets_went_back

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from deltaflow.sinks.datasource import DeltaCommitMessage
    from deltaflow.sources.kafka_ingest import IngestPlan, TaskResult

__all__ = ["ArrowIngestWriter", "arrow_blockers", "choose_engine", "arrow_stream"]

logger = logging.getLogger(__name__)


def arrow_blockers(config: IngestConfig) -> list[str]:
    """Why ``config`` needs the Spark engine (empty: the Arrow engine can run it)."""
    reasons = []
    sql = arrow_transforms.unsupported([*config.parsed_transforms(), *config.parsed_dlq_transforms()])
    if sql:
        reasons.append(f"Spark SQL transforms ({'; '.join(sql)})")
    return reasons


def choose_engine(config: IngestConfig) -> Literal["spark", "arrow"]:
    """The engine a run takes: the one asked for, or with ``auto`` the Arrow engine whenever it
    can run the configuration.

    Raises:
        ConfigError: ``--engine arrow`` for a configuration only Spark can run.
    """
    blockers = arrow_blockers(config)
    if config.engine == "spark":
        return "spark"
    if config.engine == "arrow" and blockers:
        raise ConfigError(
            f"--engine arrow cannot run this ingest: it uses {', and '.join(blockers)}; use "
            "--engine spark (or auto, which picks Spark for it)",
            pipeline_id=config.pipeline_id,
        )
    return "arrow" if not blockers else "spark"


def ingest_plan(
    *,
    source_schema: pa.Schema,
    main: StreamSinkOptions,
    main_schema: pa.Schema,
    dlq: StreamSinkOptions | None,
    dlq_schema: pa.Schema | None,
    config: IngestConfig,
) -> IngestPlan:
    """What every task does, from the tables' options and schemas (on the driver)."""
    from deltaflow.config.locations import normalize_uri
    from deltaflow.pipeline.evolution import SCHEMA_SAMPLE_PER_PARTITION
    from deltaflow.sources.kafka_ingest import IngestPlan, TableFiles

    def files(options: StreamSinkOptions, schema: pa.Schema) -> TableFiles:
        return TableFiles.of(
            normalize_uri(options.table_uri),
            schema,
            partition_columns=tuple(options.partition_columns),
            compression=options.compression,
            target_file_size=options.target_file_size_bytes,
            max_records_per_file=options.max_records_per_file,
            storage_options=dict(options.storage_options),
        )

    return IngestPlan(
        source_schema_ipc=source_schema.serialize().to_pybytes(),
        main=files(main, main_schema),
        dead_letters=files(dlq, dlq_schema) if dlq is not None and dlq_schema is not None else None,
        transforms=tuple(config.transforms),
        dlq_transforms=tuple(config.dlq_transforms),
        dlq_pipeline_id=dlq.pipeline_id if dlq is not None else None,
        dlq_format=config.dlq_format,
        sample_unknown=SCHEMA_SAMPLE_PER_PARTITION if config.schema_evolution else 0,
    )


def arrow_stream(
    spark: SparkSession,
    source_options: Mapping[str, str],
    plan: IngestPlan,
    writer: ArrowIngestWriter,
) -> DataStreamWriter:
    """The Arrow engine's streaming query (not started)."""
    from pyspark.sql import functions as F  # noqa: N812

    from deltaflow.metrics import MESSAGES_OBSERVATION
    from deltaflow.sources.kafka_ingest import KafkaIngestDataSource
    from deltaflow.sources.streams import load_stream

    results = load_stream(spark, KafkaIngestDataSource, {**source_options, "ingest_plan": plan.to_option()})
    # Spark counts the task rows; the messages they stand for are reported beside them.
    observed = results.observe(MESSAGES_OBSERVATION, F.coalesce(F.sum("rows"), F.lit(0)).alias("messages"))
    return observed.writeStream.foreachBatch(writer)


class ArrowIngestWriter:
    """``foreachBatch`` function of the Arrow engine: commit what the tasks wrote.

    The micro-batch holds one row per task (:class:`TaskResult`); it is read once. Then, as
    on the Spark engine: counts and warnings, the dead letters' commit, the main table's
    commit (each with its per-partition txns; a crash between them is a replay that skips the
    former), and with ``group_config`` the offsets to the consumer group.
    """

    def __init__(
        self,
        main: StreamSinkOptions,
        main_schema: pa.Schema,
        dlq: StreamSinkOptions | None,
        dlq_schema: pa.Schema | None,
        *,
        group_config: Mapping[str, str] | None = None,
        schema_evolution: bool = False,
        gzipped: bool = False,
        follow_table: bool = False,
    ) -> None:
        from deltaflow.sinks.datasource import _DeltaSink

        self._evolve = schema_evolution
        self._follow_table = follow_table
        self._gzipped = gzipped
        self._pipeline = main.pipeline_id
        self._main = _DeltaSink(main, main_schema, overwrite=False)
        self._dlq = _DeltaSink(dlq, dlq_schema, overwrite=False) if dlq and dlq_schema else None
        self._group_config = dict(group_config) if group_config else None
        self.failed_total = 0
        self.unknown_total = 0

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from deltaflow.sources.kafka_ingest import TaskResult

        started = time.monotonic()
        results = [TaskResult.from_row(row.asDict()) for row in batch.collect()]  # the one action
        written = time.monotonic() - started  # the tasks' read, decode, transform and write
        metrics.batch_written(pipeline=self._pipeline, table=self._main.table_uri, seconds=written)
        dlq_attempted = False
        try:
            failed = self._report(results, batch_id)
            if self._follow_table:
                from deltaflow.pipeline.evolution import restart_if_table_gained

                names = set().union(*(r.unknown_names for r in results))
                restart_if_table_gained(self._main.options, names, batch_id)
            if self._evolve:
                self._evolve_schema(batch.sparkSession, results, batch_id)  # raises if it added columns
            if self._dlq is not None and (failed or restarts_offsets_went_back(self._main.options, batch_id)):
                dlq = self._dlq.options.pipeline_id or ""
                metrics.batch_written(pipeline=dlq, table=self._dlq.table_uri, seconds=written)
                dlq_attempted = True
                self._dlq.commit_batch(_messages(results, dead=True), batch_id)
        except BaseException:
            # In no commit, so nothing references them (a dead-letter commit that was tried may
            # have landed: its files stay, the commit rule).
            deleted = self._main.delete_uncommitted([f for r in results for f in r.main])
            if self._dlq is not None and not dlq_attempted:
                deleted += self._dlq.delete_uncommitted([f for r in results for f in r.dead_letters])
            if deleted:
                logger.info("batch %s: %d uncommitted file(s) deleted", batch_id, deleted)
            raise
        self._main.commit_batch(_messages(results, dead=False), batch_id)
        if self._group_config is not None:
            # After the Delta commit, for lag monitoring only: progress is read from the table.
            from deltaflow.sinks.spark_checkpoint import read_batch_offsets
            from deltaflow.sources.kafka import commit_to_group

            commit_to_group(self._group_config, read_batch_offsets(self._main.options, batch_id))

    def _evolve_schema(self, spark: SparkSession, results: list[TaskResult], batch_id: int) -> None:
        """New top-level fields become columns, typed by Spark from the tasks' samples (as on
        the Spark engine), and the query restarts (``SchemaEvolvedError``)."""
        from deltaflow.pipeline.evolution import evolve_schema, new_top_level_fields, sample_texts

        names = sorted(set().union(*(r.unknown_names for r in results)))
        top = new_top_level_fields(self._main.options, names) if names else set()
        if not top:
            return
        texts = sample_texts([v for r in results for v in r.samples], self._gzipped)
        evolve_schema(spark, self._main.options, batch_id, top, spark.sparkContext.parallelize(texts))

    def _report(self, results: list[TaskResult], batch_id: int) -> int:
        """Count, meter and log the batch's unknown fields and failed messages; the failed count."""
        table = self._main.table_uri
        unknown = sum(r.unknown for r in results)
        if unknown:
            self.unknown_total += unknown
            metrics.unknown_fields_seen(pipeline=self._pipeline, table=table, count=unknown)
            log_unknown_fields(batch_id, unknown, set().union(*(r.unknown_names for r in results)))
        failed = sum(r.failed for r in results)
        if failed:
            self.failed_total += failed
            metrics.records_failed(pipeline=self._pipeline, table=table, count=failed)
            first = next((r.first_error for r in results if r.first_error), "")
            log_failed(batch_id, failed, first, dead_letter_table=self._dlq is not None)
        return failed


def _messages(results: list[TaskResult], *, dead: bool) -> list[DeltaCommitMessage]:
    from deltaflow.sinks.datasource import DeltaCommitMessage

    return [
        DeltaCommitMessage(r.dead_letters if dead else r.main, partition_id=i, writer=r.writer)
        for i, r in enumerate(results)
    ]

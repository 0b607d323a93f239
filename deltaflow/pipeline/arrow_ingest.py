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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

from deltaflow.config.ingest import IngestConfig
from deltaflow.config.sink import SinkOptions, StreamSinkOptions
from deltaflow.errors import ConfigError
from deltaflow.io import arrow_transforms, logs
from deltaflow.io.faults import crash_target, maybe_crash
from deltaflow.metrics import metrics
from deltaflow.pipeline.dead_letters import log_failed, log_unknown_fields
from deltaflow.pipeline.interrupts import stoppable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from deltaflow.io.parquet import WrittenFile
    from deltaflow.sinks.datasource import DeltaCommitMessage, _DeltaSink
    from deltaflow.sinks.kafka_mirror import KafkaMirrorSink

    #: A main table's sink: rows appended, or changes merged into a mirror.
    MainSink = _DeltaSink | KafkaMirrorSink
    from deltaflow.sources.kafka_ingest import IngestPlan, TableResult, TaskResult
    from deltaflow.sources.topic_routes import TableFiles

__all__ = [
    "ArrowIngestWriter",
    "IngestTables",
    "arrow_blockers",
    "arrow_stream",
    "choose_engine",
    "table_files",
]

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
    parallelism: int = 1,
) -> IngestPlan:
    """What every task does, from the tables' options and schemas (on the driver), for one topic."""
    from deltaflow.pipeline.evolution import SCHEMA_SAMPLE_PER_PARTITION
    from deltaflow.sources.kafka_ingest import IngestPlan, TopicRoute

    route = TopicRoute(
        table_files(main, main_schema),
        table_files(dlq, dlq_schema) if dlq is not None and dlq_schema is not None else None,
    )
    return IngestPlan(
        source_schema_ipc=source_schema.serialize().to_pybytes(),
        routes={config.topic: route},
        transforms=tuple(config.transforms),
        dlq_transforms=tuple(config.dlq_transforms),
        dlq_pipeline_id=dlq.pipeline_id if dlq is not None else None,
        dlq_format=config.dlq_format,
        sample_unknown=SCHEMA_SAMPLE_PER_PARTITION if config.schema_evolution else 0,
        task_parallelism=parallelism,
        min_task_messages=config.min_task_messages,
    )


def table_files(options: StreamSinkOptions, schema: pa.Schema) -> TableFiles:
    """How tasks write a table's files, from its sink options."""
    from deltaflow.config.locations import normalize_uri
    from deltaflow.sources.topic_routes import TableFiles

    return TableFiles.of(
        normalize_uri(options.table_uri),
        schema,
        partition_columns=tuple(options.partition_columns),
        compression=options.compression,
        target_file_size=options.target_file_size_bytes,
        max_records_per_file=options.max_records_per_file,
        storage_options=dict(options.storage_options),
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
    return observed.writeStream.foreachBatch(stoppable(writer, pipeline=writer.pipeline_id))


class IngestTables:
    """The tables one ingest query commits to, and which topic goes to which.

    Args:
        main: The main tables' sinks by URI, as prepared before the query started.
        dead_letters: The dead-letter tables' sinks by URI.
        table_of: The main table of a topic (``None``: no table takes it).
        dead_letters_of: The dead-letter table of a topic.
        make: Makes the tables of topics that started to match while the query runs (the
            planner lists them in a batch's end offsets); ``None``: the topics are fixed.
        open_sink: The sink of a main table this process has not written yet (a topic that
            started to match while the query runs, into a table that exists).
        open_dead_letters: The same for a dead-letter table.
        checkpoint: Options naming the query's checkpoint (its offset log is read once per
            batch); default: the first sink's.
    """

    def __init__(
        self,
        main: Mapping[str, MainSink],
        dead_letters: Mapping[str, _DeltaSink],
        *,
        table_of: Callable[[str], str | None],
        dead_letters_of: Callable[[str], str | None],
        make: Callable[[Sequence[str]], None] | None = None,
        open_sink: Callable[[str], MainSink] | None = None,
        open_dead_letters: Callable[[str], _DeltaSink] | None = None,
        checkpoint: SinkOptions | None = None,
    ) -> None:
        self.main = dict(main)
        self.dead_letters = dict(dead_letters)
        self.table_of = table_of
        self.dead_letters_of = dead_letters_of
        self._make = make
        self._open = open_sink
        self._open_dead_letters = open_dead_letters
        self._lock = threading.Lock()
        self.checkpoint = checkpoint or next(iter([*self.main.values(), *self.dead_letters.values()])).options

    def __getstate__(self) -> dict[str, Any]:
        # Over Spark Connect the foreachBatch function is pickled to the server's Python worker.
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @classmethod
    def one(cls, main: _DeltaSink, dlq: _DeltaSink | None) -> IngestTables:
        """One table (and its dead-letter table) for every topic read."""
        return cls(
            {main.table_uri: main},
            {dlq.table_uri: dlq} if dlq is not None else {},
            table_of=lambda _: main.table_uri,
            dead_letters_of=lambda _: dlq.table_uri if dlq is not None else None,
        )

    def make(self, topics: Sequence[str]) -> None:
        if self._make is not None and topics:
            self._make(topics)

    def sink(self, uri: str) -> MainSink:
        """The main table's sink at ``uri`` (opened on first use when new to this process)."""
        sink: MainSink = self._opened(self.main, self._open, uri)
        return sink

    def dead_letter_sink(self, uri: str) -> _DeltaSink:
        """The dead-letter table's sink at ``uri`` (opened on first use when new to this process)."""
        sink: _DeltaSink = self._opened(self.dead_letters, self._open_dead_letters, uri)
        return sink

    def _opened(self, sinks: dict[str, Any], open_sink: Callable[[str], Any] | None, uri: str) -> Any:
        with self._lock:
            if uri not in sinks:
                if open_sink is None:
                    raise KeyError(f"no sink for table {uri!r}")
                sinks[uri] = open_sink(uri)
            return sinks[uri]


class ArrowIngestWriter:
    """``foreachBatch`` function of the Arrow engine: commit what the tasks wrote, table by table.

    The micro-batch holds one row per task (:class:`TaskResult`); it is read once. Spark's
    offset log is read once too; then, as on the Spark engine: counts and warnings, the
    dead-letter tables' commits, the main tables' commits (each with the per-partition txns of
    the topics it takes; a crash between them is a replay that skips what landed), in parallel,
    and with ``group_config`` the offsets to the consumer group.
    """

    def __init__(
        self,
        tables: IngestTables,
        *,
        pipeline_id: str,
        group_config: Mapping[str, str] | None = None,
        schema_evolution: bool = False,
        gzipped: bool = False,
        follow_table: bool = False,
        stop_mirrors: bool = True,
    ) -> None:
        """``stop_mirrors``: a mirror some of whose changes could not be read stops the query
        (``--cdc_errors stop``); false: they are dead letters and the mirror goes on."""
        self._tables = tables
        self._stop_mirrors = stop_mirrors
        self._evolve = schema_evolution
        self._follow_table = follow_table
        self._gzipped = gzipped
        self._pipeline = pipeline_id
        self._group_config = dict(group_config) if group_config else None
        self.failed_total = 0
        self.unknown_total = 0

    @property
    def pipeline_id(self) -> str:
        return self._pipeline

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from deltaflow.delta.progress import pending_topics, split_offsets
        from deltaflow.sinks.spark_checkpoint import read_batch_end
        from deltaflow.sources.kafka_ingest import TaskResult

        started = time.monotonic()
        results = [TaskResult.from_row(row.asDict()) for row in batch.collect()]  # the one action
        written = time.monotonic() - started  # the tasks' read, decode, transform and write
        offsets = read_batch_end(self._tables.checkpoint, batch_id)
        end, lost = split_offsets(offsets)
        by_table = _by_table(results)
        dlq_attempted: set[str] = set()
        try:
            self._tables.make(pending_topics(offsets))
            sinks = {uri: self._tables.sink(uri) for uri in by_table}
            for uri, parts in by_table.items():
                metrics.batch_written(pipeline=self._pipeline, table=uri, seconds=written)
                with logs.context(table=uri):
                    self._report(uri, [r for _, r in parts], batch_id)
            if self._follow_table or self._evolve:
                self._follow(batch, by_table, sinks, batch_id)
            # Step 1 of each table: the dead letters first, so that no main row is committed
            # while its failed neighbours are not.
            jobs = self._dead_letter_jobs(results, by_table, end, lost, batch_id, written)
            dlq_attempted = set(jobs)
            _run_all(jobs)
        except BaseException:
            # In no commit, so nothing references them (a dead-letter commit that was tried may
            # have landed: its files stay, the commit rule).
            deleted = sum(
                self._tables.sink(uri).delete_uncommitted([f for _, r in parts for f in r.files])
                for uri, parts in by_table.items()
                if uri in self._tables.main
            )
            for uri, files in _dead_letter_files(results).items():
                if uri not in dlq_attempted and uri in self._tables.dead_letters:
                    deleted += self._tables.dead_letters[uri].delete_uncommitted(files)
            if deleted:
                logger.info("batch %s: %d uncommitted file(s) deleted", batch_id, deleted)
            raise
        # Step 2: every main table that read messages (or restarted a partition), in parallel.
        sources = _by_uri(end, lost, self._tables.table_of)
        touched = set(by_table) | {u for u, (_, restarted) in sources.items() if restarted}
        jobs = {}
        for uri in sorted(touched):
            sink = self._tables.sink(uri)
            parts = by_table.get(uri, [])
            messages = _messages([(i, r.files, w) for (i, w), r in parts])
            if (
                self._stop_mirrors
                and getattr(sink, "applies_changes", False)
                and any(r.failed for _, r in parts)
            ):
                jobs[uri] = _stop_mirror(sink, [r for _, r in parts], messages, batch_id)
                continue
            jobs[uri] = _commit_job(sink, messages, batch_id, sources.get(uri, ({}, {})))
        wanted = crash_target("between_tables", batch_id)  # tests: one table first, then a crash
        if wanted is not None:
            for uri in [u for u in jobs if u.rstrip("/").endswith(wanted)]:
                jobs.pop(uri)()
                maybe_crash("between_tables", batch_id, uri)
        _run_all(jobs)
        if self._group_config is not None:
            # After the Delta commits, for lag monitoring only: progress is read from the tables.
            from deltaflow.sources.kafka import commit_to_group

            commit_to_group(self._group_config, end)

    def _dead_letter_jobs(
        self,
        results: list[TaskResult],
        by_table: Mapping[str, list[tuple[tuple[int, str], TableResult]]],
        end: Mapping[str, Mapping[str, int]],
        lost: Mapping[str, Mapping[str, Any]],
        batch_id: int,
        written: float,
    ) -> dict[str, Callable[[], None]]:
        """The dead-letter tables to commit: those of tables with failed messages, and those
        whose topics restarted a partition because its offsets went back (their progress from
        the old topic must move back too)."""
        from deltaflow.delta.progress import WENT_BACK

        wanted = {r.dead_letter_table for parts in by_table.values() for _, r in parts if r.failed}
        wanted |= {
            self._tables.dead_letters_of(t)
            for t, parts in lost.items()
            if any(r.get("reason") == WENT_BACK for r in parts.values())
        }
        files = _dead_letter_files_by_task(results)
        wanted |= set(files)
        jobs = {}
        sources = _by_uri(end, lost, self._tables.dead_letters_of)
        for uri in sorted(u for u in wanted if u is not None):
            sink = self._tables.dead_letter_sink(uri)
            metrics.batch_written(pipeline=sink.options.pipeline_id or "", table=uri, seconds=written)
            messages = _messages(files.get(uri, []))
            jobs[uri] = _commit_job(sink, messages, batch_id, sources.get(uri, ({}, {})))
        return jobs

    def _follow(
        self,
        batch: DataFrame,
        by_table: Mapping[str, list[tuple[tuple[int, str], TableResult]]],
        sinks: Mapping[str, MainSink],
        batch_id: int,
    ) -> None:
        """Columns another writer added to a table restart the query (it decodes them then);
        with schema evolution, new top-level fields become columns, typed by Spark from the
        tasks' samples (as on the Spark engine), and the query restarts (``SchemaEvolvedError``)."""
        from deltaflow.pipeline.evolution import (
            evolve_schema,
            new_top_level_fields,
            restart_if_table_gained,
            sample_texts,
        )

        for uri, parts in by_table.items():
            names = sorted(set().union(*(r.unknown_names for _, r in parts)))
            if not names:
                continue
            options = sinks[uri].options
            if self._follow_table:
                restart_if_table_gained(options, set(names), batch_id)
            if not self._evolve:
                continue
            top = new_top_level_fields(options, names)
            if top:
                texts = sample_texts([v for _, r in parts for v in r.samples], self._gzipped)
                spark = batch.sparkSession
                evolve_schema(spark, options, batch_id, top, texts)

    def _report(self, table: str, results: list[TableResult], batch_id: int) -> None:
        """Count, meter and log one table's unknown fields and failed messages."""
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
            dead = any(r.dead_letter_table for r in results)
            log_failed(batch_id, failed, first, dead_letter_table=dead)


#: Commits of one batch that run at once (one per table; each mostly waits on the store).
COMMIT_THREADS = 8


def _run_all(jobs: Mapping[str, Callable[[], None]]) -> None:
    """Run every job (at once when there are several); when some fail, raise the first failure
    (in the jobs' order) once all have ended: a table's commit is never cut off by another's
    failure, and what landed is kept (a replay skips it)."""
    if len(jobs) <= 1:
        for job in jobs.values():
            job()
        return
    errors: dict[str, BaseException] = {}
    with ThreadPoolExecutor(max_workers=min(COMMIT_THREADS, len(jobs)), thread_name_prefix="commit") as pool:
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        for key, future in futures.items():
            exc = future.exception()
            if exc is not None:
                errors[key] = exc
    if errors:
        first_key = next(iter(errors))
        if len(errors) > 1:
            logger.error("%d table(s) failed to commit: %s", len(errors), ", ".join(sorted(errors)))
        raise errors[first_key]


def _commit_job(
    sink: MainSink,
    messages: list[DeltaCommitMessage],
    batch_id: int,
    source: tuple[dict[str, dict[str, int]], dict[str, dict[str, Any]]],
) -> Callable[[], None]:
    return lambda: sink.commit_batch(messages, batch_id, source=source)


def _stop_mirror(
    sink: MainSink, results: Sequence[TableResult], messages: list[DeltaCommitMessage], batch_id: int
) -> Callable[[], None]:
    """A mirror some of whose changes could not be read: nothing of the batch is applied to it
    (a mirror that skipped a change would be wrong from then on), and the query stops."""
    from deltaflow.errors import MergeError

    def job() -> None:
        sink.delete_uncommitted([f for m in messages for f in m.files])
        failed = sum(r.failed for r in results)
        first = next((r.first_error for r in results if r.first_error), "")
        dead = next((r.dead_letter_table for r in results if r.dead_letter_table), None)
        where = f"they are in the dead-letter table {dead}" if dead else "no dead-letter table is set"
        raise MergeError(
            f"batch {batch_id}: {failed} change(s) for the mirror {sink.table_uri} cannot be applied "
            f"(the first: {first}); {where}. Nothing of this batch was applied to this mirror, and "
            "the pipeline stops: a mirror that skipped a change would differ from its source from "
            "then on. The change stays in its topic, so a restart meets it again. To go on past it, "
            "restart with --cdc_errors dead_letter (it stays in the dead-letter table; the rows it "
            "changed may differ from the database until their next change), or take the mirror "
            "again from a topic the change is not in",
            table_uri=sink.table_uri,
            batch_id=batch_id,
        )

    return job


def _by_uri(
    end: Mapping[str, Mapping[str, int]],
    lost: Mapping[str, Mapping[str, Any]],
    table_of: Callable[[str], str | None],
) -> dict[str, tuple[dict[str, dict[str, int]], dict[str, dict[str, Any]]]]:
    """The end offsets and restarts of each table's topics (one pass over the topics: asking
    every table about every topic cost topics x tables lookups a batch)."""
    out: dict[str, tuple[dict[str, dict[str, int]], dict[str, dict[str, Any]]]] = {}
    for part, offsets in ((0, end), (1, lost)):
        for topic, parts in offsets.items():
            uri = table_of(topic)
            if uri is not None:
                out.setdefault(uri, ({}, {}))[part][topic] = dict(parts)
    return out


def _by_table(results: list[TaskResult]) -> dict[str, list[tuple[tuple[int, str], TableResult]]]:
    """Each main table's results: ``((task index, writer), result)``."""
    out: dict[str, list[tuple[tuple[int, str], TableResult]]] = {}
    for i, r in enumerate(results):
        for uri, table in r.tables.items():
            out.setdefault(uri, []).append(((i, r.writer), table))
    return out


def _dead_letter_files(results: list[TaskResult]) -> dict[str, list[WrittenFile]]:
    """Each dead-letter table's files, of every task."""
    return {
        uri: [f for _, files, _ in parts for f in files]
        for uri, parts in _dead_letter_files_by_task(results).items()
    }


def _dead_letter_files_by_task(
    results: list[TaskResult],
) -> dict[str, list[tuple[int, list[WrittenFile], str]]]:
    out: dict[str, list[tuple[int, list[WrittenFile], str]]] = {}
    for i, r in enumerate(results):
        for uri, files in r.dead_letters.items():
            out.setdefault(uri, []).append((i, files, r.writer))
    return out


def _messages(parts: Sequence[tuple[int, list[WrittenFile], str]]) -> list[DeltaCommitMessage]:
    from deltaflow.sinks.datasource import DeltaCommitMessage

    return [DeltaCommitMessage(files, partition_id=i, writer=writer) for i, files, writer in parts]

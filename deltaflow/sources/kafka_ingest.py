"""The Arrow ingest path: Kafka messages become Delta data files inside Spark's source tasks.

``deltaflow-kafka-ingest`` is the Kafka source (same planning, pacing, admission control and
resume from the table's progress) whose tasks do the whole of plain ingest where the messages
are read, on Arrow: decode, kafka-delta-ingest transforms (:mod:`deltaflow.io.arrow_transforms`),
split failed messages into dead letters, write the Parquet files of the main table and of the
dead-letter table (with statistics). A task hands Spark one small row: the files it wrote and
what it saw. The rows never pass through the JVM; the driver commits the files (DESIGN.md,
"The Arrow ingest path").

Step 0 of the commit sequence, per task of micro-batch N:

Step 0.1. Read the task's offset range and decode it to Arrow (as the Kafka source does).
Step 0.2. Apply the transforms; a message whose decoding or a transform failed is a dead letter.
Step 0.3. Write the good rows into the main table's folder and the dead letters (those beyond
          the dead-letter table's progress) into its folder: ``part-b<N>-k<task>-a<attempt>-*``.
Step 0.4. Return the files' descriptions and the counts (failed, unknown fields).

A task attempt that fails leaves files no commit names (orphans for ``vacuum --full``);
Spark runs it again and only the successful attempt's files are returned.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import logging
import math
import pickle
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from deltaflow.config.transforms import parse_transform
from deltaflow.delta.progress import PENDING_KEY, pending_topics, split_offsets, stale_progress
from deltaflow.errors import storage_error
from deltaflow.io import arrow_transforms
from deltaflow.io.faults import maybe_crash
from deltaflow.io.parquet import PartitionedFileWriter, WrittenFile, writer_process
from deltaflow.io.storage import filesystem
from deltaflow.sources.kafka import (
    KafkaDataSource,
    KafkaPartitionRange,
    KafkaSourceOptions,
    KafkaStreamReader,
    Offsets,
    read_ranges,
)
from deltaflow.sources.topic_routes import TableFiles, TopicRoute, TopicRouter, progress_layout

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit
    from pyspark.sql.types import StructType

__all__ = [
    "FORMAT_NAME",
    "RESULT_SCHEMA",
    "IngestPlan",
    "IngestTask",
    "TableFiles",
    "TableResult",
    "TaskResult",
    "TopicRoute",
    "check_plan",
    "pack",
    "table_schema",
    "write_task",
]

logger = logging.getLogger(__name__)

FORMAT_NAME = "deltaflow-kafka-ingest"
#: One row per task: its :class:`TaskResult` (pickled) and the messages it read.
RESULT_SCHEMA = "result BINARY, rows BIGINT"
_RESULT = pa.schema([("result", pa.binary()), ("rows", pa.int64())])
#: Bytes of message values a task samples for schema evolution at most.
SAMPLE_BYTES = 1024 * 1024
#: A task reads at least this many messages when it can (``IngestPlan.min_task_messages``): many
#: small topic-partitions share a task, since each task costs a Python worker round trip and a
#: file per table it holds; fewer would make small files and slow batches.
MIN_TASK_MESSAGES = 20_000
#: How long the planner waits before it asks the driver again for a topic's table.
PENDING_RETRY_S = 60.0
#: The message's coordinates the transforms and dead letters read (``kafka.<field>``).
_KAFKA_FIELDS = ("partition", "offset", "topic", "timestamp", "timestamp_type", "key", "headers")


def _writer(files: TableFiles, prefix: str) -> PartitionedFileWriter:
    fs, root = filesystem(files.table_uri, files.storage_options)
    return PartitionedFileWriter(
        fs=fs,
        root=root,
        schema=files.schema,
        partition_columns=files.partition_columns,
        compression=files.compression,
        target_file_size=files.target_file_size,
        max_records_per_file=files.max_records_per_file,
        file_prefix=prefix,
        indexed_columns=-1,
    )


@dataclass(frozen=True)
class IngestPlan:
    """What every task of the query does (built once on the driver, shipped to the planner).

    Attributes:
        routes: Each topic's tables, resolved on the driver at start.
        router: Resolves the routes of topics that appear while the query runs (a pattern).
        task_parallelism: The cores the tasks share (Spark's default parallelism): a batch is
            cut into at least this many tasks of :data:`MIN_TASK_MESSAGES` messages or more.
    """

    source_schema_ipc: bytes
    routes: dict[str, TopicRoute]
    router: TopicRouter | None = None
    transforms: tuple[str, ...] = ()
    dlq_transforms: tuple[str, ...] = ()
    #: The pipeline id of the dead-letter tables' txns (their progress per partition).
    dlq_pipeline_id: str | None = None
    #: The dead-letter rows' shape: ``deltaflow`` or ``kafka-delta-ingest`` (``--dlq_format``).
    dlq_format: str = "deltaflow"
    #: Schema evolution: return up to this many raw values of good messages with unknown fields.
    sample_unknown: int = 0
    task_parallelism: int = 1
    min_task_messages: int = MIN_TASK_MESSAGES
    #: The pipeline whose txns hold each topic's progress (default: the source's ``pipeline_id``).
    pipeline_id: str | None = None
    #: Main tables the driver made at start, claimed by their creation: no progress yet, so
    #: the query's start offsets need not read them (hundreds of loads for a new estate).
    made: frozenset[str] = frozenset()
    #: ``debezium``: the topics are change streams kept as mirror tables (tasks stage folded
    #: changes, :mod:`deltaflow.sources.change_topics`); ``none``: rows are appended.
    cdc: str = "none"
    #: ``mirror`` (the changes merged) or ``append`` (each change event a row).
    cdc_mode: str = "mirror"
    #: A mirror's key columns (default: the message key's).
    key_columns: tuple[str, ...] = ()
    #: Change events in the Avro converter's format: the schema registry (and its basic auth).
    registry_url: str | None = None
    registry_auth: str | None = field(default=None, repr=False)

    def to_option(self) -> str:
        return base64.b64encode(pickle.dumps(self)).decode()

    @classmethod
    def from_option(cls, text: str) -> IngestPlan:
        plan = pickle.loads(base64.b64decode(text))
        assert isinstance(plan, cls)
        return plan

    @property
    def source_schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.source_schema_ipc))


@dataclass(frozen=True)
class IngestRange:
    """A Kafka offset range, and how far its dead letters are committed already."""

    range: KafkaPartitionRange
    #: Dead letters at or below this offset are in the dead-letter table already.
    dead_lettered_through: int = -1

    @property
    def size(self) -> int:
        return self.range.end - self.range.start


@dataclass(frozen=True)
class IngestTask(InputPartition):
    """One task: its ranges (of one or many topic-partitions), their topics' routes, the plan's
    transforms, and its index in the batch (in its files' names)."""

    ranges: tuple[IngestRange, ...]
    routes: dict[str, TopicRoute]
    plan: IngestPlan
    index: int = 0


@dataclass
class TableResult:
    """What a task read and wrote for one main table."""

    files: list[WrittenFile] = field(default_factory=list)
    #: Messages read for the table (its topics' ranges).
    rows: int = 0
    failed: int = 0
    first_error: str | None = None
    unknown: int = 0
    unknown_names: set[str] = field(default_factory=set)
    #: Raw values of good messages with unknown fields (``IngestPlan.sample_unknown``).
    samples: list[bytes] = field(default_factory=list)
    #: The table its dead letters go to.
    dead_letter_table: str | None = None


@dataclass
class TaskResult:
    """What a task saw and wrote, per main table and per dead-letter table (the driver sums them)."""

    tables: dict[str, TableResult] = field(default_factory=dict)
    dead_letters: dict[str, list[WrittenFile]] = field(default_factory=dict)
    #: The executor process that wrote the files (:func:`~deltaflow.io.parquet.writer_process`).
    writer: str = ""

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables.values())

    def to_batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([{"result": pickle.dumps(self), "rows": self.rows}], schema=_RESULT)

    @classmethod
    def from_row(cls, row: Any) -> TaskResult:
        result = pickle.loads(row["result"])
        assert isinstance(result, cls)
        return result


class KafkaIngestDataSource(KafkaDataSource):
    """Spark data source ``deltaflow-kafka-ingest``: the Kafka source whose tasks write files.

    Its options are the Kafka source's plus ``ingest_plan`` (:meth:`IngestPlan.to_option`).
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return RESULT_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaIngestReader:  # noqa: N802
        options = dict(self.options)
        plan = IngestPlan.from_option(options.pop("ingest_plan"))
        return KafkaIngestReader(KafkaSourceOptions.from_spark_options(options), plan)


class KafkaIngestReader(KafkaStreamReader):
    """Plans like the Kafka source, with each topic's progress read from its own table; packs
    the ranges into tasks by their size; each task writes files (:func:`write_task`).

    A topic without a table (one that started to match while the query runs) is left out of the
    batch and listed under :data:`PENDING_KEY`: the driver makes its table, and the next batch
    reads it.
    """

    def __init__(self, options: KafkaSourceOptions, plan: IngestPlan) -> None:
        super().__init__(options, plan.source_schema)
        self._plan = plan
        self._routes = dict(plan.routes)
        self._tables: dict[str, Any] = {}  # DeltaTables by URI, brought up to date when read
        #: Pending topic -> when the driver was last asked, and the topic's offsets then.
        self._asked: dict[str, tuple[float, int]] = {}
        self._seen: set[str] = set()  # the topics of the last batch planned (a deleted one is logged)

    # -- routes and progress -------------------------------------------------------------------

    def _route(self, topic: str) -> TopicRoute | None:
        route = self._routes.get(topic)
        if route is None and self._plan.router is not None:
            route = self._plan.router.resolve(topic)
            if route is not None:
                self._routes[topic] = route
                logger.info("topic %r now goes to %s", topic, route.main.table_uri)
        return route

    def _load_table(self, uri: str, storage_options: Mapping[str, str]) -> Any:
        """The table at ``uri`` at its latest version (``None`` while there is none); kept and
        brought up to date, which reads only the commits since the last call."""
        from deltaflow.delta import log as delta_log

        table = self._tables.get(uri)
        if table is not None:
            try:
                table.update_incremental()
                return table
            except Exception:  # noqa: BLE001 - replaced or vacuumed history, a store fault: load again
                pass
        table = self._tables[uri] = delta_log.load(uri, storage_options)
        return table

    def _committed(self, layout: Mapping[str, Sequence[int | str]]) -> Offsets:
        """Next offset to read per partition, from each topic's table."""
        from deltaflow.delta.log import side_by_side
        from deltaflow.delta.progress import committed_offsets

        app = self._plan.pipeline_id or self._options.pipeline_id
        if app is None:
            return {}
        done: Offsets = {}
        by_table = progress_layout(self._routes, layout)
        if self._initial is None:  # the query's start: tables made for it hold no progress
            by_table = {uri: topics for uri, topics in by_table.items() if uri not in self._plan.made}

        def load(uri: str) -> Any:
            return self._load_table(uri, self._routes[next(iter(by_table[uri]))].main.storage_options)

        # Side by side: a batch of many topics reads every table that gets messages.
        tables = dict(zip(by_table, side_by_side(load, list(by_table), name="progress"), strict=True))
        alone = self._options.kafka_delta_ingest_txns and len(self._routes) == 1
        for uri, topics in by_table.items():
            done.update(committed_offsets(tables[uri], app, topics, kafka_delta_ingest=alone))
        return {t: {p: v + 1 for p, v in parts.items()} for t, parts in done.items() if parts}

    def _sink_table(self) -> Any:
        (route,) = {r.main.table_uri: r for r in self._routes.values()}.values()
        return self._load_table(route.main.table_uri, route.main.storage_options)

    # -- planning ------------------------------------------------------------------------------

    def _topic_partitions(self, read: Collection[str] = ()) -> dict[str, list[int]]:
        layout = super()._topic_partitions(read)
        # Topics no table takes (a group of the template matched nothing) are not read.
        router = self._plan.router
        return {t: p for t, p in layout.items() if t in self._routes or router is None or router.table_uri(t)}

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        end = super().latestOffset(start, limit)
        topics = {t for t in end if not t.startswith("$")}
        gone = self._seen - topics
        if gone:
            logger.warning(
                "topic(s) %s no longer exist on the broker (deleted?): not read; their tables are kept",
                sorted(gone),
            )
        self._seen = topics
        pending = []
        now = time.monotonic()
        for topic in [t for t in end if not t.startswith("$") and t not in self._routes]:
            # A topic without a table: look for it (its table may exist already) and ask the
            # driver, again once it has new messages or a minute passed; meanwhile it is not read.
            size = sum(end[topic].values())
            asked, seen = self._asked.get(topic, (-PENDING_RETRY_S, -1))
            due = size > seen or now - asked >= PENDING_RETRY_S
            if due and self._route(topic) is not None:
                continue
            del end[topic]  # read once its table exists
            if due:
                self._asked[topic] = (now, size)
                pending.append(topic)
        if pending:
            logger.info("topic(s) %s match but have no table yet: the driver makes them", sorted(pending))
            end[PENDING_KEY] = sorted(pending)
        return end

    def commit(self, end: Offsets) -> None:
        for topic in pending_topics(end):  # the driver made their tables in that batch
            if self._route(topic) is not None:
                self._asked.pop(topic, None)

    def partitions(self, start: Offsets, end: Offsets) -> list[IngestTask]:  # type: ignore[override]
        ranges = super().partitions(start, end)
        _, lost = split_offsets(end)
        # (Asked only where the main table was: a batch this source planned from its own last
        # end cannot be behind its dead-letter tables either.)
        done = self._dead_lettered(self._asked_table)
        items = []
        for r in ranges:
            route = self._route(r.topic)
            assert route is not None, f"no table for topic {r.topic!r}"
            if route.decoding is not None:
                r = dataclasses.replace(r, decoding=route.decoding)
            held = done.get(r.topic, {}).get(str(r.partition))
            # A partition restarted because its offsets went back: the dead-letter table's
            # progress from before names offsets of the old topic, not these.
            if held is None or stale_progress(lost.get(r.topic, {}).get(str(r.partition)), held):
                held = -1
            items.append(IngestRange(r, held))
        bare = dataclasses.replace(self._plan, routes={}, router=None)
        tasks = []
        for i, group in enumerate(pack(items, self._plan.task_parallelism, self._plan.min_task_messages)):
            routes = {g.range.topic: self._routes[g.range.topic] for g in group}
            tasks.append(IngestTask(tuple(group), routes, bare, i))
        return tasks

    def _dead_lettered(self, layout: Mapping[str, Sequence[int | str]]) -> dict[str, dict[str, int]]:
        """The dead-letter tables' progress: a batch planned from a lost checkpoint can start
        before it (the source resumes from the main table), and those dead letters must not
        land twice."""
        from deltaflow.delta.progress import kafka_progress

        app = self._plan.dlq_pipeline_id
        if app is None:
            return {}
        by_table: dict[str, dict[str, Sequence[int | str]]] = {}
        files: dict[str, TableFiles] = {}
        for topic, parts in layout.items():
            route = self._routes.get(topic)
            if parts and route is not None and route.dead_letters is not None:
                by_table.setdefault(route.dead_letters.table_uri, {})[topic] = parts
                files[route.dead_letters.table_uri] = route.dead_letters
        out: dict[str, dict[str, int]] = {}
        for uri, topics in by_table.items():
            table = self._load_table(uri, files[uri].storage_options)
            out.update(kafka_progress(table, app, topics))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, IngestTask)
        yield write_task(partition)


def pack(
    ranges: Sequence[IngestRange], parallelism: int, least: int = MIN_TASK_MESSAGES
) -> list[list[IngestRange]]:
    """The ranges as tasks sized by messages, not by partitions: ``parallelism`` tasks or more
    when each can have ``least`` messages or more, a larger range split by offsets, smaller ones
    sharing a task (each to the least loaded, the largest first)."""
    total = sum(r.size for r in ranges)
    if not ranges:
        return []
    size = max(least, math.ceil(total / max(1, parallelism)))
    pieces: list[IngestRange] = []
    for r in ranges:
        if r.size <= size:
            pieces.append(r)
            continue
        count = math.ceil(r.size / size)
        step = math.ceil(r.size / count)
        for begin in range(r.range.start, r.range.end, step):
            cut = dataclasses.replace(r.range, start=begin, end=min(begin + step, r.range.end))
            pieces.append(IngestRange(cut, r.dead_lettered_through))
    # As many tasks as the messages need, each piece to the least loaded one (largest first),
    # a new task only when even that one has no room.
    count = max(1, math.ceil(total / size))
    tasks: list[list[IngestRange]] = [[] for _ in range(count)]
    loads = [0] * count
    for piece in sorted(pieces, key=lambda p: (-p.size, p.range.topic, p.range.partition, p.range.start)):
        i = min(range(len(loads)), key=loads.__getitem__)
        if loads[i] and loads[i] + piece.size > size:
            tasks.append([])
            loads.append(0)
            i = len(loads) - 1
        tasks[i].append(piece)
        loads[i] += piece.size
    return tasks


def table_schema(source: pa.Schema, transforms: Sequence[str]) -> pa.Schema:
    """The columns a table gets from messages read as ``source`` (the source's rows: Kafka's
    columns and the decoded value) after ``transforms``: the table a new topic's table is
    made with."""
    rows, _, _ = _decoded(source.empty_table())
    out = arrow_transforms.check(rows.schema, [parse_transform(t) for t in transforms])
    return pa.schema([f for f in out if f.name != arrow_transforms.KAFKA_COLUMN])


def check_plan(plan: IngestPlan) -> None:
    """Run the plan's transforms on no rows of each route's messages: a field they lack or a
    type the Arrow engine cannot take raises :class:`~deltaflow.errors.ConfigError` on the
    driver."""
    for route in plan.routes.values():
        source = route.decoding.arrow_schema if route.decoding is not None else plan.source_schema
        empty = source.empty_table()
        rows, _, _ = _decoded(empty)
        arrow_transforms.check(rows.schema, [parse_transform(t) for t in plan.transforms], route.main.schema)
        if route.dead_letters is not None:
            no_errors = pa.chunked_array([pa.array([], pa.string())])
            letters = _dead_letters(
                empty, no_errors, rows.column(arrow_transforms.KAFKA_COLUMN), plan.dlq_format
            )
            arrow_transforms.check(
                letters.schema, [parse_transform(t) for t in plan.dlq_transforms], route.dead_letters.schema
            )


def write_task(task: IngestTask) -> pa.RecordBatch:
    """Steps 0.1-0.4 for one task: read, decode, transform, split, write; describe the files."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    raw_batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
    batch_id = int(raw_batch) if raw_batch else None
    attempt = ctx.attemptNumber() if ctx else 0
    prefix = f"part-b{batch_id if batch_id is not None else 0:06d}-k{task.index:05d}-a{attempt}"
    plan = task.plan
    if plan.cdc == "debezium":
        return _write_change_task(task, prefix, batch_id)
    transforms = [parse_transform(t) for t in plan.transforms]
    dlq_transforms = [parse_transform(t) for t in plan.dlq_transforms]
    produced = {t.target[0].lower() for t in transforms}
    writers: dict[str, PartitionedFileWriter] = {}  # by table URI, main and dead-letter tables
    # A main table's writer is closed as soon as every range of its topics in this task is read
    # (its last offset seen): a task of many tables holds the open files of those still being
    # read, not of all. A range whose last offsets hold no record is seen done only at the end.
    unread: dict[str, set[int]] = {}
    for i, item in enumerate(task.ranges):
        unread.setdefault(task.routes[item.range.topic].main.table_uri, set()).add(i)
    closed: list[PartitionedFileWriter] = []  # closed early; their files deleted too if the task fails
    result = TaskResult(writer=writer_process())

    def writer(files: TableFiles) -> PartitionedFileWriter:
        if files.table_uri not in writers:
            # (A table seen done is not written again; were it, its file names carry a uuid.)
            writers[files.table_uri] = _writer(files, prefix)
        return writers[files.table_uri]

    def written(uri: str, out: PartitionedFileWriter) -> None:
        table = result.tables.setdefault(uri, TableResult())
        table.files = [*table.files, *out.close()]

    current = ""
    try:
        # Step 0.1. Read and decode (the Kafka source's own reader), range after range.
        for index, batch in read_ranges([i.range for i in task.ranges]):
            item = task.ranges[index]
            route = task.routes[item.range.topic]
            current = route.main.table_uri
            outcome = _outcome(result, route)
            main_schema = route.main.schema
            table = pa.Table.from_batches([batch])
            outcome.rows += table.num_rows
            rows, decode_error, unknown = _decoded(table)
            kafka = rows.column(arrow_transforms.KAFKA_COLUMN)
            # Step 0.2. Transforms; failed messages are dead letters.
            rows, failed = arrow_transforms.apply(rows, transforms, target_schema=main_schema)
            error = decode_error if failed is None else pc.coalesce(decode_error, failed)
            ok = pc.is_null(error)
            _count_unknown(outcome, unknown, ok, produced)
            if unknown is not None and len(outcome.samples) < plan.sample_unknown:
                _sample_unknown(outcome, table.column("value"), unknown, ok, produced, plan.sample_unknown)
            # Step 0.3. Write.
            good = rows.filter(ok)
            if good.num_rows:
                out = writer(route.main)
                for part in _conform(good, main_schema).to_batches():
                    out.write(part)
            last = pc.max(table.column("offset")).as_py() if table.num_rows else None
            if last is not None and last + 1 >= item.range.end:
                left = unread[current]
                left.discard(index)
                if not left and current in writers:
                    out = writers.pop(current)
                    closed.append(out)
                    written(current, out)
            bad = pc.invert(ok)
            count = int(pc.sum(bad).as_py() or 0)
            if count:
                outcome.failed += count
                if outcome.first_error is None:
                    outcome.first_error = pc.drop_null(error)[0].as_py()
                if route.dead_letters is not None:
                    letters = _new_dead_letters(
                        table,
                        error,
                        bad,
                        kafka,
                        item,
                        plan.dlq_format,
                        dlq_transforms,
                        route.dead_letters.schema,
                    )
                    if letters.num_rows:
                        out = writer(route.dead_letters)
                        for part in _conform(letters, route.dead_letters.schema).to_batches():
                            out.write(part)
        dead = {r.dead_letters.table_uri for r in task.routes.values() if r.dead_letters is not None}
        for uri, out in writers.items():
            current = uri
            if uri in dead:
                result.dead_letters[uri] = out.close()
            else:
                written(uri, out)
    except BaseException as exc:
        for out in [*writers.values(), *closed]:
            out.discard()
        if isinstance(exc, OSError):  # the store failed: a classified error the daemon can act on
            raise storage_error(exc, current, "writing data files of") from exc
        raise
    maybe_crash("write", batch_id)
    # Step 0.4. Describe.
    return result.to_batch()


def _write_change_task(task: IngestTask, prefix: str, batch_id: int | None) -> pa.RecordBatch:
    """Steps 0.1-0.4 of a task of Debezium topics (:mod:`deltaflow.sources.change_topics`):
    read, fold per table and key, write each table's fold as one staging file and the dead
    letters as data files of the dead-letter tables."""
    from deltaflow.sources.change_topics import ChangeReader, events, stage

    plan = task.plan
    appended: dict[str, PartitionedFileWriter] = {}
    result = TaskResult(writer=writer_process())
    avro = None
    if plan.registry_url:
        from deltaflow.sources.debezium import AvroEnvelopes
        from deltaflow.sources.decode import SchemaRegistry

        avro = AvroEnvelopes(SchemaRegistry(plan.registry_url, basic_auth=plan.registry_auth))
    reader = ChangeReader(plan.key_columns, avro)
    dlq_transforms = [parse_transform(t) for t in plan.dlq_transforms]
    letters: dict[str, PartitionedFileWriter] = {}
    current = ""
    try:
        for index, batch in read_ranges([i.range for i in task.ranges]):
            item = task.ranges[index]
            route = task.routes[item.range.topic]
            current = route.main.table_uri
            outcome = _outcome(result, route)
            table = pa.Table.from_batches([batch])
            outcome.rows += table.num_rows
            if plan.cdc_mode == "append":
                event_rows, errors = events(
                    item.range.topic,
                    table.column("key").to_pylist(),
                    table.column("value").to_pylist(),
                    table.column("timestamp").to_pylist(),
                    avro,
                )
                if event_rows.num_rows:
                    if current not in appended:
                        appended[current] = _writer(route.main, prefix)
                    for part in _conform(event_rows, route.main.schema).to_batches():
                        appended[current].write(part)
            else:
                errors = reader.fold(
                    route.main,
                    table.column("key").to_pylist(),
                    table.column("value").to_pylist(),
                    table.column("offset").to_pylist(),
                )
            if not any(errors):
                continue
            error = pa.chunked_array([pa.array(errors, pa.string())])
            bad = pc.is_valid(error)
            outcome.failed += int(pc.sum(bad).as_py() or 0)
            if outcome.first_error is None:
                outcome.first_error = next(e for e in errors if e is not None)
            if route.dead_letters is None:
                continue
            kafka = _decoded(table)[0].column(arrow_transforms.KAFKA_COLUMN)
            dead = _new_dead_letters(
                table, error, bad, kafka, item, plan.dlq_format, dlq_transforms, route.dead_letters.schema
            )
            if dead.num_rows:
                uri = route.dead_letters.table_uri
                if uri not in letters:
                    letters[uri] = _writer(route.dead_letters, prefix)
                for part in _conform(dead, route.dead_letters.schema).to_batches():
                    letters[uri].write(part)
        for uri, fold in reader.folds.items():
            current = uri
            if fold:
                result.tables[uri].files = [stage(reader.tables[uri], fold, prefix)]
        for uri, out in appended.items():
            current = uri
            result.tables[uri].files = out.close()
        for uri, out in letters.items():
            current = uri
            result.dead_letters[uri] = out.close()
    except BaseException as exc:
        for out in [*letters.values(), *appended.values()]:
            out.discard()
        if isinstance(exc, OSError):
            raise storage_error(exc, current, "staging changes of") from exc
        raise
    maybe_crash("write", batch_id)
    return result.to_batch()


def _outcome(result: TaskResult, route: TopicRoute) -> TableResult:
    """What the task read and wrote for ``route``'s main table (made on its first batch)."""
    dead = route.dead_letters.table_uri if route.dead_letters is not None else None
    return result.tables.setdefault(route.main.table_uri, TableResult(dead_letter_table=dead))


def _new_dead_letters(
    table: pa.Table,
    error: pa.ChunkedArray,
    bad: pa.ChunkedArray,
    kafka: pa.ChunkedArray,
    item: IngestRange,
    dlq_format: str,
    transforms: Sequence[Any],
    schema: pa.Schema,
) -> pa.Table:
    """The dead-letter rows of the messages ``bad`` flags that the dead-letter table does not
    hold yet (beyond ``item.dead_lettered_through``), after the ``--dlq_transform`` ``transforms``."""
    new = pc.and_(bad, pc.greater(table.column("offset"), item.dead_lettered_through))
    letters = _dead_letters(table.filter(new), error.filter(new), kafka.filter(new), dlq_format)
    letters, _ = arrow_transforms.apply(letters, transforms, target_schema=schema)
    return _finish_dead_letters(letters)


def _decoded(table: pa.Table) -> tuple[pa.Table, pa.ChunkedArray, pa.ChunkedArray | None]:
    """The value's fields (or ``value`` for raw messages) plus the ``kafka`` struct; the
    decode errors; the unknown fields per message."""
    kafka = pa.StructArray.from_arrays(
        [
            table.column("partition").combine_chunks(),
            table.column("offset").combine_chunks(),
            table.column("topic").combine_chunks(),
            table.column("timestamp").combine_chunks(),
            # Kafka's ids (kafka-delta-ingest's kafka.timestamp_type), not librdkafka's 0/1/2.
            pc.subtract(table.column("timestamp_type").combine_chunks(), pa.scalar(1, pa.int32())),
            _key_text(table.column("key")),
            table.column("headers").combine_chunks(),
        ],
        names=list(_KAFKA_FIELDS),
    )
    if "data" not in table.schema.names:  # raw values
        values = pa.table({"value": table.column("value")})
        errors = pa.chunked_array([pa.nulls(table.num_rows, pa.string())])
        unknown = None
    else:
        data = table.column("data").combine_chunks()
        values = pa.Table.from_arrays(
            [data.field(i) for i in range(data.type.num_fields)],
            names=[data.type.field(i).name for i in range(data.type.num_fields)],
        )
        errors = table.column("error")
        unknown = table.column("unknown_fields")
    return values.append_column(arrow_transforms.KAFKA_COLUMN, kafka), errors, unknown


def _key_text(key: pa.ChunkedArray) -> pa.Array:
    """The keys as UTF-8 text, invalid sequences replaced by U+FFFD (the Spark engine's
    ``make_valid_utf8`` gives the same): keys are bytes, and a key that is no UTF-8 must neither
    fail the batch nor land as an invalid string."""
    key = key.combine_chunks()
    try:
        return pc.cast(key, pa.string())
    except pa.ArrowInvalid:  # some key is no UTF-8: decode those in Python
        return pa.array(
            [None if k is None else k.decode("utf-8", errors="replace") for k in key.to_pylist()],
            pa.string(),
        )


def _count_unknown(
    result: TableResult, unknown: pa.ChunkedArray | None, ok: pa.ChunkedArray, produced: set[str]
) -> None:
    """Fields of good messages the table lacks (a field a transform produces is not unknown)."""
    if unknown is None or not unknown.null_count < len(unknown):
        return
    for names in unknown.filter(ok).to_pylist():
        kept = [n for n in names or () if n.split(".")[0].lower() not in produced]
        if kept:
            result.unknown += 1
            result.unknown_names.update(kept)


def _sample_unknown(
    result: TableResult,
    values: pa.ChunkedArray,
    unknown: pa.ChunkedArray,
    ok: pa.ChunkedArray,
    produced: set[str],
    limit: int,
) -> None:
    """Keep raw values of good messages with a new top-level field (the ones schema evolution
    can add: not nested, not made by a transform), up to ``limit`` values and
    :data:`SAMPLE_BYTES` per task (they travel to the driver)."""
    has_unknown = pc.fill_null(pc.greater(pc.list_value_length(unknown), 0), False)
    mask = pc.and_(ok, has_unknown)
    size = sum(len(v) for v in result.samples)
    for names, value in zip(unknown.filter(mask).to_pylist(), values.filter(mask).to_pylist(), strict=True):
        if len(result.samples) >= limit or size >= SAMPLE_BYTES:
            return
        if value and any("." not in n and n.lower() not in produced for n in names or ()):
            result.samples.append(value)
            size += len(value)


def _dead_letters(
    failed: pa.Table, errors: pa.ChunkedArray, kafka: pa.ChunkedArray, dlq_format: str = "deltaflow"
) -> pa.Table:
    """The dead-letter rows of ``dlq_format`` (``pipeline.dead_letters.KAFKA_COLUMNS`` or
    ``KDI_COLUMNS``, the same rows the Spark engine makes) plus the ``kafka`` struct (as
    :func:`_decoded` built it) for ``--dlq_transform`` sources."""
    now = pa.scalar(dt.datetime.now(dt.UTC), pa.timestamp("us", tz="UTC"))
    n = failed.num_rows
    if dlq_format == "kafka-delta-ingest":
        texts = [_json_text(v) for v in failed.column("value").to_pylist()]
        b64 = [
            None if v is None or t is not None else base64.b64encode(v).decode()
            for v, t in zip(failed.column("value").to_pylist(), texts, strict=True)
        ]
        stamp = now.as_py()
        return pa.table(
            {
                "base64_bytes": pa.array(b64, pa.string()),
                "json_string": pa.array(texts, pa.string()),
                "error": errors,
                # Epoch microseconds while --dlq_transforms run (kafka-delta-ingest's value).
                "timestamp": pa.array([int(stamp.timestamp() * 1_000_000)] * n, pa.int64()),
                "date": pa.array([stamp.strftime("%Y-%m-%d")] * n, pa.string()),
                arrow_transforms.KAFKA_COLUMN: kafka,
            }
        )
    return pa.table(
        {
            "topic": failed.column("topic"),
            "partition": failed.column("partition"),
            "offset": failed.column("offset"),
            "kafka_timestamp": failed.column("timestamp"),
            "key_base64": _base64(failed.column("key")),
            "value_base64": _base64(failed.column("value")),
            "error": errors,
            "dead_lettered_at": pa.array([now.as_py()] * n, pa.timestamp("us", tz="UTC")),
            arrow_transforms.KAFKA_COLUMN: kafka,
        }
    )


def _json_text(value: bytes | None) -> str | None:
    """``value`` as text when it is JSON (kafka-delta-ingest's ``json_string``), else ``None``."""
    if value is None:
        return None
    try:
        text = value.decode()
        json.loads(text)
    except ValueError:  # UnicodeDecodeError included
        return None
    return text


def _finish_dead_letters(letters: pa.Table) -> pa.Table:
    """kafka-delta-ingest's ``timestamp`` (epoch microseconds for the transforms) as a TIMESTAMP."""
    if "timestamp" in letters.schema.names and pa.types.is_int64(letters.schema.field("timestamp").type):
        index = letters.schema.get_field_index("timestamp")
        stamps = pc.cast(letters.column("timestamp"), pa.timestamp("us", tz="UTC"))
        letters = letters.set_column(index, "timestamp", stamps)
    return letters


def _base64(column: pa.ChunkedArray) -> pa.Array:
    return pa.array(
        [None if v is None else base64.b64encode(v).decode() for v in column.to_pylist()], pa.string()
    )


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns of ``schema`` in its order and types (missing ones null)."""
    columns = []
    for f in schema:
        if f.name in table.schema.names:
            column = table.column(f.name)
            columns.append(column if column.type == f.type else pc.cast(column, f.type))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)

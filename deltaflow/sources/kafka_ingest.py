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
import datetime as dt
import json
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from deltaflow.config.transforms import parse_transform
from deltaflow.delta.progress import split_offsets, stale_progress
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
    read_range,
)

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = [
    "FORMAT_NAME",
    "RESULT_SCHEMA",
    "IngestPlan",
    "TableFiles",
    "TaskResult",
    "check_plan",
    "write_range",
]

FORMAT_NAME = "deltaflow-kafka-ingest"
#: One row per task: its files (pickled :class:`WrittenFile` lists) and what it saw.
RESULT_SCHEMA = (
    "main BINARY, dead_letters BINARY, rows BIGINT, failed BIGINT, first_error STRING, "
    "unknown BIGINT, unknown_names ARRAY<STRING>, writer STRING, samples ARRAY<BINARY>"
)
_RESULT = pa.schema(
    [
        ("main", pa.binary()),
        ("dead_letters", pa.binary()),
        ("rows", pa.int64()),
        ("failed", pa.int64()),
        ("first_error", pa.string()),
        ("unknown", pa.int64()),
        ("unknown_names", pa.list_(pa.string())),
        ("writer", pa.string()),
        ("samples", pa.list_(pa.binary())),
    ]
)
#: Bytes of message values a task samples for schema evolution at most.
SAMPLE_BYTES = 1024 * 1024
#: The message's coordinates the transforms and dead letters read (``kafka.<field>``).
_KAFKA_FIELDS = ("partition", "offset", "topic", "timestamp", "timestamp_type", "key", "headers")


@dataclass(frozen=True)
class TableFiles:
    """Where and how a task writes one table's data files (built on the driver)."""

    table_uri: str
    schema_ipc: bytes
    partition_columns: tuple[str, ...] = ()
    compression: str = "snappy"
    target_file_size: int = 128 * 1024 * 1024
    max_records_per_file: int = 0
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, table_uri: str, schema: pa.Schema, **settings: Any) -> TableFiles:
        return cls(table_uri, schema.serialize().to_pybytes(), **settings)

    @property
    def schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.schema_ipc))

    def writer(self, prefix: str) -> PartitionedFileWriter:
        fs, root = filesystem(self.table_uri, self.storage_options)
        return PartitionedFileWriter(
            fs=fs,
            root=root,
            schema=self.schema,
            partition_columns=self.partition_columns,
            compression=self.compression,
            target_file_size=self.target_file_size,
            max_records_per_file=self.max_records_per_file,
            file_prefix=prefix,
            indexed_columns=-1,
        )


@dataclass(frozen=True)
class IngestPlan:
    """What every task of the query does (built once on the driver, shipped with each task)."""

    source_schema_ipc: bytes
    main: TableFiles
    dead_letters: TableFiles | None = None
    transforms: tuple[str, ...] = ()
    dlq_transforms: tuple[str, ...] = ()
    #: The pipeline id of the dead-letter table's txns (its progress per partition).
    dlq_pipeline_id: str | None = None
    #: The dead-letter rows' shape: ``deltaflow`` or ``kafka-delta-ingest`` (``--dlq_format``).
    dlq_format: str = "deltaflow"
    #: Schema evolution: return up to this many raw values of good messages with unknown fields.
    sample_unknown: int = 0

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
class IngestRange(InputPartition):
    """One task: a Kafka offset range, the plan, and how far the dead letters are committed."""

    range: KafkaPartitionRange
    plan: IngestPlan
    #: Dead letters at or below this offset are in the dead-letter table already.
    dead_lettered_through: int = -1


@dataclass
class TaskResult:
    """What a task saw and wrote (the driver sums them per batch)."""

    main: list[WrittenFile] = field(default_factory=list)
    dead_letters: list[WrittenFile] = field(default_factory=list)
    rows: int = 0
    failed: int = 0
    first_error: str | None = None
    unknown: int = 0
    unknown_names: set[str] = field(default_factory=set)
    #: The executor process that wrote the files (:func:`~deltaflow.io.parquet.writer_process`).
    writer: str = ""
    #: Raw values of good messages with unknown fields (``IngestPlan.sample_unknown``).
    samples: list[bytes] = field(default_factory=list)

    def to_batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist(
            [
                {
                    "main": pickle.dumps(self.main),
                    "dead_letters": pickle.dumps(self.dead_letters),
                    "rows": self.rows,
                    "failed": self.failed,
                    "first_error": self.first_error,
                    "unknown": self.unknown,
                    "unknown_names": sorted(self.unknown_names),
                    "writer": self.writer,
                    "samples": self.samples,
                }
            ],
            schema=_RESULT,
        )

    @classmethod
    def from_row(cls, row: Any) -> TaskResult:
        return cls(
            main=pickle.loads(row["main"]),
            dead_letters=pickle.loads(row["dead_letters"]),
            rows=int(row["rows"]),
            failed=int(row["failed"]),
            first_error=row["first_error"],
            unknown=int(row["unknown"]),
            unknown_names=set(row["unknown_names"] or ()),
            writer=row["writer"] or "",
            samples=list(row["samples"] or ()),
        )


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
    """Plans like the Kafka source; each task writes files (:func:`write_range`)."""

    def __init__(self, options: KafkaSourceOptions, plan: IngestPlan) -> None:
        super().__init__(options, plan.source_schema)
        self._plan = plan

    def partitions(self, start: Offsets, end: Offsets) -> list[IngestRange]:  # type: ignore[override]
        ranges = super().partitions(start, end)
        positions, lost = split_offsets(end)
        done = self._dead_lettered({t: [r.partition for r in ranges if r.topic == t] for t in positions})
        out = []
        for r in ranges:
            held = done.get(r.topic, {}).get(str(r.partition))
            # A partition restarted because its offsets went back: the dead-letter table's
            # progress from before names offsets of the old topic, not these.
            if held is None or stale_progress(lost.get(r.topic, {}).get(str(r.partition)), held):
                held = -1
            out.append(IngestRange(r, self._plan, held))
        return out

    def _dead_lettered(self, layout: Mapping[str, list[int]]) -> dict[str, dict[str, int]]:
        """The dead-letter table's progress: a batch planned from a lost checkpoint can start
        before it (the source resumes from the main table), and those dead letters must not
        land twice."""
        files, app = self._plan.dead_letters, self._plan.dlq_pipeline_id
        if files is None or app is None:
            return {}
        from deltaflow.delta import log as delta_log
        from deltaflow.delta.progress import kafka_progress

        table = delta_log.load(files.table_uri, files.storage_options)
        return kafka_progress(table, app, layout)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, IngestRange)
        yield write_range(partition)


def check_plan(plan: IngestPlan) -> None:
    """Run the plan's transforms on no rows of the messages' schema: a field they lack or a type
    the Arrow engine cannot take raises :class:`~deltaflow.errors.ConfigError` on the driver."""
    empty = plan.source_schema.empty_table()
    rows, _, _ = _decoded(empty)
    arrow_transforms.check(rows.schema, [parse_transform(t) for t in plan.transforms], plan.main.schema)
    if plan.dead_letters is not None:
        no_errors = pa.chunked_array([pa.array([], pa.string())])
        letters = _dead_letters(empty, no_errors, rows.column(arrow_transforms.KAFKA_COLUMN), plan.dlq_format)
        arrow_transforms.check(
            letters.schema, [parse_transform(t) for t in plan.dlq_transforms], plan.dead_letters.schema
        )


def write_range(task: IngestRange) -> pa.RecordBatch:
    """Steps 0.1-0.4 for one task: read, decode, transform, split, write; describe the files."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    raw_batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
    batch_id = int(raw_batch) if raw_batch else None
    attempt = ctx.attemptNumber() if ctx else 0
    prefix = f"part-b{batch_id if batch_id is not None else 0:06d}-k{task.range.partition:05d}-a{attempt}"
    plan = task.plan
    transforms = [parse_transform(t) for t in plan.transforms]
    dlq_transforms = [parse_transform(t) for t in plan.dlq_transforms]
    produced = {t.target[0].lower() for t in transforms}
    main_schema = plan.main.schema
    main = plan.main.writer(prefix)
    dead = plan.dead_letters.writer(prefix) if plan.dead_letters is not None else None
    result = TaskResult(writer=writer_process())
    try:
        # Step 0.1. Read and decode (the Kafka source's own reader).
        for batch in read_range(task.range):
            table = pa.Table.from_batches([batch])
            result.rows += table.num_rows
            rows, decode_error, unknown = _decoded(table)
            kafka = rows.column(arrow_transforms.KAFKA_COLUMN)
            # Step 0.2. Transforms; failed messages are dead letters.
            rows, failed = arrow_transforms.apply(rows, transforms, target_schema=main_schema)
            error = decode_error if failed is None else pc.coalesce(decode_error, failed)
            ok = pc.is_null(error)
            _count_unknown(result, unknown, ok, produced)
            if unknown is not None and len(result.samples) < plan.sample_unknown:
                _sample_unknown(result, table.column("value"), unknown, ok, produced, plan.sample_unknown)
            # Step 0.3. Write.
            good = rows.filter(ok)
            if good.num_rows:
                for part in _conform(good, main_schema).to_batches():
                    main.write(part)
            bad = pc.invert(ok)
            count = int(pc.sum(bad).as_py() or 0)
            if count:
                result.failed += count
                if result.first_error is None:
                    result.first_error = pc.drop_null(error)[0].as_py()
                if dead is not None and plan.dead_letters is not None:
                    new = pc.and_(bad, pc.greater(table.column("offset"), task.dead_lettered_through))
                    letters = _dead_letters(
                        table.filter(new), error.filter(new), kafka.filter(new), plan.dlq_format
                    )
                    letters, _ = arrow_transforms.apply(
                        letters, dlq_transforms, target_schema=plan.dead_letters.schema
                    )
                    letters = _finish_dead_letters(letters)
                    if letters.num_rows:
                        for part in _conform(letters, plan.dead_letters.schema).to_batches():
                            dead.write(part)
        result.main = main.close()
        result.dead_letters = dead.close() if dead is not None else []
    except BaseException as exc:
        main.discard()
        if dead is not None:
            dead.discard()
        if isinstance(exc, OSError):  # the store failed: a classified error the daemon can act on
            raise storage_error(exc, plan.main.table_uri, "writing data files of") from exc
        raise
    maybe_crash("write", batch_id)
    # Step 0.4. Describe.
    return result.to_batch()


def _decoded(table: pa.Table) -> tuple[pa.Table, pa.ChunkedArray, pa.ChunkedArray | None]:
    """The value's fields (or ``value`` for raw messages) plus the ``kafka`` struct; the
    decode errors; the unknown fields per message."""
    key = table.column("key")
    kafka = pa.StructArray.from_arrays(
        [
            table.column("partition").combine_chunks(),
            table.column("offset").combine_chunks(),
            table.column("topic").combine_chunks(),
            table.column("timestamp").combine_chunks(),
            # Kafka's ids (kafka-delta-ingest's kafka.timestamp_type), not librdkafka's 0/1/2.
            pc.subtract(table.column("timestamp_type").combine_chunks(), pa.scalar(1, pa.int32())),
            pc.cast(key, options=pc.CastOptions(pa.string(), allow_invalid_utf8=True)).combine_chunks(),
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


def _count_unknown(
    result: TaskResult, unknown: pa.ChunkedArray | None, ok: pa.ChunkedArray, produced: set[str]
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
    result: TaskResult,
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

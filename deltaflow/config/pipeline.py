"""Declarative pipelines: the YAML file ``deltaflow run`` and ``deltaflow validate`` read.

One file declares one or more pipelines::

    pipelines:
      - id: orders-silver
        source: {type: files, path: /landing/orders, format: json}
        transforms: {date: "sql: to_date(ts)"}
        filter: "status <> 'test'"
        expectations:
          - {name: positive_amount, expr: "amount > 0", action: drop}
        dead_letter: {table_uri: /lake/orders_rejected}
        sinks:
          - {name: eu, table_uri: /lake/orders_eu, when: "region = 'eu'"}
          - {name: rest, table_uri: /lake/orders_rest, when: "region <> 'eu'"}

Loading substitutes ``${VAR}`` and ``${VAR:-default}`` in every string, then validates the
whole file with pydantic; every error names its YAML path, the value received and what is
allowed (:class:`PipelineConfigError`). Nothing here imports Spark: ``validate`` starts no JVM.

A micro-batch flows: source -> ``transforms`` (kafka-delta-ingest mappings) -> ``filter`` ->
``select`` -> ``expectations`` -> each sink's ``when`` predicate (see ``deltaflow.pipeline.runner``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from deltaflow.config.identity import PipelineId
from deltaflow.config.ingest import IngestConfig
from deltaflow.config.locations import absolute_local, normalize_uri
from deltaflow.config.models import problem
from deltaflow.config.postgres import PIPELINE_OWNED as POSTGRES_OWNED
from deltaflow.config.postgres import PostgresCdcOptions
from deltaflow.config.rivven import is_rivven_layout, translate
from deltaflow.config.sink import SinkOptions
from deltaflow.config.time_partitions import TimePartitionColumn, parse_time_pattern
from deltaflow.config.transforms import Transform, parse_transform
from deltaflow.config.units import parse_seconds, parse_size
from deltaflow.errors import ConfigError, PipelineConfigError

__all__ = [
    "DeltaSourceSpec",
    "Expectation",
    "FilesSourceSpec",
    "GeneratorSourceSpec",
    "KafkaSourceSpec",
    "ParquetFilesSourceSpec",
    "PipelineFile",
    "PipelineSpec",
    "SinkSpec",
    "load_pipelines",
]

#: Spark's functions of the file a row was read from (empty outside the file scan).
_INPUT_FILE = re.compile(r"\binput_file_(?:name|block_start|block_length)\s*\(", re.IGNORECASE)
#: ``${NAME}`` or ``${NAME:-default}``; ``$${`` is a literal ``${``.
_ENV = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


#: A file is taken once it was last modified this long ago (StreamSets' directory origin waits
#: 5 s; twice that leaves a writer that pauses between flushes time to finish).
DEFAULT_MIN_FILE_AGE_S = 10.0
#: Options of Spark's file stream source: deltaflow lists files itself, so they would do nothing.
_STREAM_ONLY_OPTIONS = frozenset(
    {
        "latestfirst",
        "maxfileage",
        "cleansource",
        "sourcearchivedir",
        "filenameonly",
        "maxfilespertrigger",
        "maxbytespertrigger",
    }
)


class FilesSourceSpec(_Model):
    """A landing directory of files, read with Spark's file stream source.

    Attributes:
        path: The directory (new files are picked up; a file is read once, so it must be
            complete when it is taken: write it elsewhere and rename it into the directory, or
            let ``min_file_age`` pass between its last write and its reading).
        format: ``json`` (one object per line), ``csv``, ``parquet``, ``avro`` (object container
            files, decoded with fastavro in the tasks: no spark-avro jar) or ``text``.
        schema: Spark DDL of the columns (``id BIGINT, ts TIMESTAMP``); when left out it is
            inferred once from the files present at the first start and stored with the
            checkpoint, so later files never change it.
        max_files_per_trigger / max_bytes_per_trigger: Admission control per micro-batch.
        rescued_data_column: JSON/CSV/Avro: a column holding what did not fit the schema (JSON
            and Avro: an object of the fields the schema lacks; a JSON record with a value of the
            wrong type or that cannot be parsed, a CSV line: the whole record). ``null`` drops
            that information.
        source_file_column: A column with the path of the file each row came from.
        min_file_age: A file is taken only once it was last modified at least this long ago
            (``"10 seconds"``, the default; ``0`` takes files at once): a file still being
            written is left until its writer is done.
        options: Further options of Spark's reader (``header``, ``sep``, ``dateFormat``, ...;
            ``pathGlobFilter`` and ``recursiveFileLookup`` also choose the files).
    """

    type: Literal["files"]
    path: str
    format: Literal["json", "csv", "parquet", "avro", "text"] = "json"
    schema_: str | None = Field(default=None, alias="schema")
    max_files_per_trigger: int | None = Field(default=None, ge=1)
    max_bytes_per_trigger: Annotated[int | None, Field(ge=1)] = None
    rescued_data_column: str | None = "_rescued_data"
    source_file_column: str | None = None
    min_file_age: float = Field(default=DEFAULT_MIN_FILE_AGE_S, ge=0)
    options: dict[str, str] = Field(default_factory=dict)

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return absolute_local(value)  # a Spark Connect server opens it too: locations.absolute_local

    @field_validator("max_bytes_per_trigger", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:

        return parse_size(value) if isinstance(value, str) else value

    @field_validator("min_file_age", mode="before")
    @classmethod
    def _age(cls, value: Any) -> Any:
        return parse_seconds(value)

    @model_validator(mode="after")
    def _check(self) -> FilesSourceSpec:
        if self.max_files_per_trigger and self.max_bytes_per_trigger:
            raise ValueError("set max_files_per_trigger or max_bytes_per_trigger, not both (Spark takes one)")
        if self.format == "json" and self.options.get("multiLine", "").lower() == "true":
            raise ValueError("json files are read one object per line; multiLine is not supported")
        if any(c in self.path for c in "*?[{"):
            raise ValueError("path is the folder the files land in (no glob); pathGlobFilter chooses names")
        listing = sorted(k for k in self.options if k.lower() in _STREAM_ONLY_OPTIONS)
        if listing:
            raise ValueError(
                f"options {', '.join(listing)} are of Spark's file stream source, which deltaflow does not "
                "use (its listing takes each file once, min_file_age old; set max_files_per_trigger or "
                "max_bytes_per_trigger here)"
            )
        return self

    @field_validator("options", mode="before")
    @classmethod
    def _strings(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        return value


class ParquetFilesSourceSpec(_Model):
    """Parquet files landing in a folder, registered in the (one) sink table where they are, as
    ``deltaflow add-files`` registers them, exactly once (:mod:`deltaflow.pipeline.watch_files`):
    no data is read or rewritten.

    Attributes:
        path: The folder or object-store prefix (listed with pyarrow); the
            sink table's own root when files land inside it. Files must appear complete
            (written elsewhere and renamed into place).
        copy: Copy files that land outside the table's root below it, then register the copies
            (``add-files --copy``); without it such files stop the pipeline.
        max_files_per_trigger: Files per micro-batch (one commit each) at most.
    """

    type: Literal["parquet-files"]
    path: str
    copy_: bool = Field(default=False, alias="copy")
    max_files_per_trigger: int | None = Field(default=None, ge=1)

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return absolute_local(value)  # a Spark Connect server opens it too: locations.absolute_local


class DeltaSourceSpec(_Model):
    """Another Delta table read as a stream of its new commits (offsets are table versions).

    Attributes:
        table_uri: The table to read.
        starting_version: The first version to read; default: the table's latest version
            when the pipeline first starts (its current content is read as the first batch).
        starting_timestamp: The first version committed at or after this ISO-8601 time.
        ignore_deletes: Skip commits that only remove data (a partition deleted); without it
            such a commit stops the pipeline.
        ignore_changes: Also accept commits that rewrite files (UPDATE, MERGE, DELETE of
            rows): their new files are read again, so unchanged rows come downstream twice.
        read_change_feed: Read the table's Change Data Feed (inserts, update pre/post images,
            deletes with ``_change_type``, ``_commit_version``, ``_commit_timestamp``); needs
            ``delta.enableChangeDataFeed`` on the source table.
        max_versions_per_trigger: At most this many table versions per micro-batch.
        storage_options: Storage options for reading the table.
    """

    type: Literal["delta"]
    table_uri: str
    starting_version: int | None = Field(default=None, ge=0)
    starting_timestamp: str | None = None
    ignore_deletes: bool = False
    ignore_changes: bool = False
    read_change_feed: bool = False
    max_versions_per_trigger: int | None = Field(default=None, ge=1)
    storage_options: dict[str, str] = Field(default_factory=dict)

    @field_validator("table_uri")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return absolute_local(value)  # a Spark Connect server opens it too: locations.absolute_local

    @model_validator(mode="after")
    def _one_start(self) -> DeltaSourceSpec:
        if self.starting_version is not None and self.starting_timestamp is not None:
            raise ValueError("set starting_version or starting_timestamp, not both")
        return self


class KafkaSourceSpec(_Model):
    """A Kafka topic through the ``deltaflow-kafka`` source, values decoded in its tasks.

    The decoded value's fields become columns, beside a ``kafka`` struct (``topic``,
    ``partition``, ``offset``, ``timestamp``, ``key``, ``headers``). Messages that cannot be
    decoded go to the pipeline's dead-letter table (or are counted and skipped without one).
    """

    type: Literal["kafka"]
    bootstrap_servers: str
    topic: str | list[str] | None = None
    topic_pattern: str | None = None
    starting_offsets: Literal["earliest", "latest"] | dict[str, dict[str, int]] = "earliest"
    max_messages_per_batch: int = Field(default=0, ge=0)
    format: Literal["json", "avro"] = "json"
    schema_: str | None = Field(default=None, alias="schema")
    avro_schema: str | None = None
    schema_registry_url: str | None = None
    decompress_gzip: bool = False
    kafka_settings: dict[str, SecretStr] = Field(default_factory=dict)
    #: Spark's ``failOnDataLoss``: stored offsets the broker no longer holds stop the pipeline.
    fail_on_data_loss: bool = True

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _check(self) -> KafkaSourceSpec:
        if (self.topic is None) == (self.topic_pattern is None):
            raise ValueError("set exactly one of topic and topic_pattern")
        if (
            self.format == "json"
            and not self.schema_
            and not self.topic_pattern
            and "," not in (self.topic or "")
        ):
            # (Several topics may go to a table each, whose columns come from each topic's
            # messages: PipelineSpec checks those.)
            raise ValueError("format json needs schema (Spark DDL of the value's fields)")
        if self.format == "avro" and not (self.avro_schema or self.schema_registry_url):
            raise ValueError("format avro needs avro_schema or schema_registry_url")
        return self

    @property
    def topics(self) -> list[str]:
        if self.topic is None:
            return []
        return [self.topic] if isinstance(self.topic, str) else list(self.topic)


class GeneratorSourceSpec(_Model):
    """Synthetic events for demos and benchmarks, deterministic per row id.

    Attributes:
        rows_per_second: Rows made available per second of wall-clock time.
        total_rows: Stop producing after this many rows (``null``: forever).
        rows_per_batch: Admission control: at most this many rows per micro-batch.
        partitions: Spark input partitions per micro-batch.
        fields: Extra columns as Spark SQL expressions over ``id`` (and the other generated
            columns), e.g. ``{amount_cents: "cast(amount * 100 as bigint)"}``.
        seed: Changes the generated values (same seed, same rows).
    """

    type: Literal["generator"]
    rows_per_second: float = Field(default=1000.0, gt=0)
    total_rows: int | None = Field(default=None, ge=0)
    rows_per_batch: int | None = Field(default=None, ge=1)
    partitions: int = Field(default=2, ge=1, le=10_000)
    fields: dict[str, str] = Field(default_factory=dict)
    seed: int = Field(default=0, ge=0)


class PostgresCdcSourceSpec(PostgresCdcOptions):
    """A PostgreSQL publication's changes (``postgres-cdc``): one event row per change, progress
    per replication slot in the sink's Delta log (:mod:`deltaflow.sources.postgres_cdc`).

    The pipeline sets ``delta_table_uri``, ``pipeline_id`` and ``delta_storage_options`` from its
    sink.
    """

    type: Literal["postgres-cdc"]

    @model_validator(mode="after")
    def _not_pipeline_owned(self) -> PostgresCdcSourceSpec:
        for key in POSTGRES_OWNED:
            if getattr(self, key):
                raise ValueError(f"{key} is set by the pipeline (from its sink), not in the source")
        return self

    def source_options(self, pipeline_id: str, sinks: Sequence[SinkOptions]) -> PostgresCdcOptions:
        """The source's options, reading its progress from every table of ``sinks``."""
        values = self.model_dump(exclude={"type"}, exclude_defaults=True)
        values.update(
            delta_table_uri=sinks[0].table_uri,
            pipeline_id=pipeline_id,
            delta_storage_options=dict(sinks[0].storage_options),
            more_delta_tables={s.table_uri: dict(s.storage_options) for s in sinks[1:]},
        )
        return PostgresCdcOptions(**values)


SourceSpec = Annotated[
    FilesSourceSpec
    | DeltaSourceSpec
    | KafkaSourceSpec
    | GeneratorSourceSpec
    | PostgresCdcSourceSpec
    | ParquetFilesSourceSpec,
    Field(discriminator="type"),
]

#: Sink options a pipeline sets itself.
_PIPELINE_OWNED = ("pipeline_id", "checkpoint_location", "txn_version", "kafka_offsets")


#: Keys of a pipeline's sink that are not options of the table writer.
_ROUTING_KEYS = frozenset(
    {
        "name",
        "connector",
        "when",
        "stream",
        "time_partition_pattern",
        "event_time_column",
        "shuffle_by_partition",
    }
)


class SinkSpec(SinkOptions):
    """A Delta table a pipeline writes: the sink options (Rivven's names) plus routing.

    Attributes:
        name: The sink's name in logs and metrics (default: ``sink<N>``).
        connector: ``delta`` (``delta-lake`` is accepted as in Rivven's files).
        when: A Spark SQL predicate: only rows for which it is true go to this sink.
        stream: ``postgres-cdc`` pipelines, with ``write_mode: merge``: the PostgreSQL table
            (``schema.table``) this sink's table mirrors (``key_columns`` default to its primary
            key; see :mod:`deltaflow.sinks.mirror`).
        time_partition_pattern: Arroyo's time-based partitioning: a strftime pattern
            (``%Y/%m/%d/%H``) whose segments become partition columns before
            ``partition_columns`` (:mod:`deltaflow.config.time_partitions`), formatted from the
            event time in UTC.
        event_time_column: The event-time column ``time_partition_pattern`` formats (a
            TIMESTAMP, TIMESTAMP_NTZ or DATE column of the rows); default: the rows' only
            TIMESTAMP column (several, or none: the pipeline refuses to start, naming them).
        shuffle_by_partition: Repartition each batch by the partition columns before writing:
            every partition value is written by one task, so one file per partition and batch
            (without it, each task writes a file for each partition it holds rows of).
    """

    name: str | None = None
    connector: Literal["delta", "delta-lake"] = "delta"
    when: str | None = None
    stream: str | None = Field(default=None, pattern=r"^[^.]+\.[^.]+$")
    time_partition_pattern: str | None = None
    event_time_column: str | None = None
    shuffle_by_partition: bool = False

    @field_validator("time_partition_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None:
            parse_time_pattern(value)  # ValueError names the problem
        return value

    @model_validator(mode="after")
    def _time_partitions(self) -> SinkSpec:
        names = [c.name.lower() for c in self.time_partition_columns]
        clash = sorted(set(names) & {c.lower() for c in self.partition_columns})
        if clash:
            raise ValueError(
                f"time_partition_pattern makes the column(s) {', '.join(clash)}, also in partition_columns"
            )
        if self.event_time_column and not self.time_partition_pattern:
            raise ValueError("event_time_column is the column time_partition_pattern formats: set both")
        if self.time_partition_pattern and self.write_mode == "merge":
            raise ValueError("time_partition_pattern applies to append and overwrite sinks, not merge")
        if self.shuffle_by_partition and not (self.partition_columns or self.time_partition_pattern):
            raise ValueError("shuffle_by_partition needs partition_columns or time_partition_pattern")
        return self

    @property
    def time_partition_columns(self) -> tuple[TimePartitionColumn, ...]:
        """The columns ``time_partition_pattern`` makes (none without one)."""
        return parse_time_pattern(self.time_partition_pattern) if self.time_partition_pattern else ()

    @model_validator(mode="before")
    @classmethod
    def _mirror(cls, values: Any) -> Any:
        if isinstance(values, Mapping) and values.get("stream") and values.get("write_mode") == "merge":
            values = {**values}
            values.setdefault("cdc_format", "postgres")
        return values

    @model_validator(mode="after")
    def _not_pipeline_owned(self) -> SinkSpec:
        for key in _PIPELINE_OWNED:
            if getattr(self, key) not in (None, False):
                raise ValueError(f"{key} is set by the pipeline, not per sink")
        return self

    def sink_options(
        self, pipeline_id: str, checkpoint_location: str, *, source_offsets: bool = False
    ) -> SinkOptions:
        """The :class:`SinkOptions` this sink writes with (``source_offsets``: the source's end
        offsets are the progress, as ``kafka_offsets`` records them)."""
        values = self.model_dump(exclude=set(_ROUTING_KEYS), exclude_defaults=True)
        values.update(pipeline_id=pipeline_id, checkpoint_location=checkpoint_location)
        if self.time_partition_pattern:
            time_columns = tuple(c.name for c in self.time_partition_columns)
            values["partition_columns"] = time_columns + tuple(self.partition_columns)
        if source_offsets:
            values["kafka_offsets"] = True
        return SinkOptions.build(values)


class DeadLetterSpec(SinkOptions):
    """The table receiving the rows a ``drop`` expectation rejected, and undecodable messages."""

    @model_validator(mode="after")
    def _not_pipeline_owned(self) -> DeadLetterSpec:
        for key in _PIPELINE_OWNED:
            if getattr(self, key) not in (None, False):
                raise ValueError(f"{key} is set by the pipeline, not for the dead-letter table")
        if self.write_mode != "append":
            raise ValueError("the dead-letter table is appended to; write_mode must be append")
        return self


class Expectation(_Model):
    """A named data-quality rule (as Delta Live Tables has them).

    Attributes:
        name: Shown in logs, metrics and the dead-letter rows.
        expr: A Spark SQL predicate a good row satisfies (NULL counts as a violation).
        action: ``warn`` counts violations and keeps the rows; ``drop`` sends them to the
            dead-letter table (or drops them without one); ``fail`` stops the pipeline before
            anything of the batch is committed.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    expr: str = Field(min_length=1)
    action: Literal["warn", "drop", "fail"] = "warn"


class SparkSpec(_Model):
    """The Spark application all pipelines of the file run in."""

    master: str | None = None
    conf: dict[str, str] = Field(default_factory=dict)


class PipelineSpec(_Model):
    """One pipeline: a source, its processing, one or more Delta sinks.

    Attributes:
        pipeline_id: The pipeline's stable identity (:mod:`deltaflow.config.identity`: the
            Delta ``txn`` app id in every sink table, the query name, the default checkpoint
            folder, the metric label). Changing it starts over. ``id`` is accepted for it.
        transforms: kafka-delta-ingest mappings ``target: source`` (a field path,
            ``substr(...)``, ``epoch_*_to_iso8601(...)``, ``kafka.<field>`` or ``sql: <expr>``).
        filter: A Spark SQL predicate; rows for which it is not true are left out.
        select: Spark SQL select expressions (``["*", "upper(name) AS name"]``).
        query: Instead of ``transforms``/``filter``/``select``: one Spark SQL query over the
            source, which it names ``source_name`` (``SELECT id, upper(name) AS name FROM source
            WHERE ...``); it runs on each micro-batch, so aggregations are per batch.
        source_name: The source's name in ``query`` (default ``source``).
        trigger_interval: Seconds between micro-batches (``"5 seconds"``; default: as soon as
            the previous batch is done).
        checkpoint_location: Spark's checkpoint; default
            ``<first sink>/_deltaflow/checkpoints/<pipeline_id>``.
        enabled: ``false`` keeps a pipeline in the file without running it.
        engine: ``spark`` (the default) runs every micro-batch through Spark SQL (the steps of
            :mod:`deltaflow.pipeline.runner`). ``arrow`` runs a plain Kafka pipeline (one topic,
            kafka-delta-ingest transforms, one append sink, no filter/select/query/expectations)
            as ``deltaflow ingest`` runs it: rows stay in Arrow inside Spark's tasks, progress is
            one txn per Kafka partition and dead letters have ingest's layout
            (:mod:`deltaflow.pipeline.dead_letters`). ``auto`` takes ``arrow`` whenever it can,
            and ``spark`` for a pipeline whose tables already hold its Spark-engine progress.
    """

    pipeline_id: PipelineId = Field(validation_alias=AliasChoices("pipeline_id", "id"))
    source: SourceSpec
    transforms: dict[str, str] = Field(default_factory=dict)
    filter: str | None = None
    select: list[str] = Field(default_factory=list)
    expectations: list[Expectation] = Field(default_factory=list)
    query: str | None = None
    source_name: str = Field(default="source", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    sinks: list[SinkSpec] = Field(min_length=1)
    dead_letter: DeadLetterSpec | None = None
    trigger_interval: float | None = None
    checkpoint_location: str | None = None
    enabled: bool = True
    engine: Literal["spark", "arrow", "auto"] = "spark"

    @field_validator("checkpoint_location")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        return absolute_local(value) if value else value  # see locations.absolute_local

    @field_validator("trigger_interval", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> Any:
        return None if value is None else parse_seconds(value)

    @field_validator("transforms")
    @classmethod
    def _transforms(cls, value: dict[str, str]) -> dict[str, str]:
        for target, source in value.items():
            try:
                parse_transform(f"{target}: {source}").check()
            except ConfigError as exc:
                raise ValueError(f"{target}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _check(self) -> PipelineSpec:
        problems: list[str] = []
        names: dict[str, int] = {}
        tables: dict[str, str] = {}
        for i, sink in enumerate(self.sinks):
            name = sink.name or f"sink{i}"
            if name in names:
                problems.append(f"sinks[{i}] and sinks[{names[name]}] are both named {name!r}")
            names[name] = i
            uri = normalize_uri(sink.table_uri)
            if uri in tables:
                problems.append(f"sinks {tables[uri]!r} and {name!r} write the same table {uri}")
            tables[uri] = name
        for i, sink in enumerate(self.sinks):
            ordered = (
                self.source.type in ("kafka", "postgres-cdc")
                or sink.cdc_format == "debezium"
                or sink.sequence_by
            )
            if sink.write_mode == "merge" and not ordered:
                problems.append(
                    f"sinks[{i}]: a merge from a {self.source.type} source needs sequence_by (the rows of "
                    "one batch have no order of their own: which change of a key is the latest?)"
                )
        if (
            any(
                s.write_mode == "merge" and s.cdc_format == "debezium" and not s.key_columns
                for s in self.sinks
            )
            and not self.debezium_mirrors()
        ):
            problems.append(
                "a merge with cdc_format debezium on the Spark engine needs key_columns; a table_uri "
                "template ({topic}, {1} ...) or engine: arrow keeps each topic's mirror with the key "
                "of its messages"
            )
        src = self.source
        if (
            isinstance(src, KafkaSourceSpec)
            and src.format == "json"
            and not src.schema_
            and not (self.table_per_topic() or self.debezium_mirrors())
        ):
            problems.append(
                "source: format json needs schema (Spark DDL of the value's fields); a table_uri "
                "template ({topic}, {1} ...) takes each topic's columns from its messages"
            )
        if self.debezium_mirrors() and self.sinks[0].sequence_by:
            problems.append(
                "sinks[0]: sequence_by does not apply to Debezium mirrors: each change's sequence comes "
                "from its event (the database's position, else the Kafka offset)"
            )
        problems += self._postgres_problems()
        problems += self._parquet_files_problems()
        problems += self._template_problems()
        problems += self._input_file_problems()
        if self.dead_letter is not None and normalize_uri(self.dead_letter.table_uri) in tables:
            problems.append("dead_letter.table_uri must be another table than the sinks'")
        if self.query and (self.transforms or self.filter or self.select):
            problems.append("query replaces transforms, filter and select: use one or the other")
        expectation_names = [e.name for e in self.expectations]
        dupes = sorted({n for n in expectation_names if expectation_names.count(n) > 1})
        if dupes:
            problems.append(f"expectation name(s) used twice: {', '.join(dupes)}")
        if self.engine == "arrow" and self.arrow_blockers():
            problems.append(
                f"engine arrow cannot run this pipeline: it uses {'; '.join(self.arrow_blockers())} "
                "(use engine: spark, or auto, which picks Spark for it)"
            )
        elif self.engine != "spark" and not self.arrow_blockers():
            try:
                self.ingest_config()
            except ConfigError as exc:
                problems.append(f"engine {self.engine}: {exc}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _postgres_problems(self) -> list[str]:
        """A postgres-cdc pipeline writes mirror tables (merge sinks with ``stream``) and at
        most one event table (an append sink taking every event): each records the progress
        per slot, and an event table is written last so that a crash between two tables'
        commits never leaves it ahead of a mirror."""
        out = []
        cdc = self.source.type == "postgres-cdc"
        for i, sink in enumerate(self.sinks):
            at = f"sinks[{i}]"
            if sink.stream and not cdc:
                out.append(f"{at}: stream names a PostgreSQL table: it needs a postgres-cdc source")
            elif sink.stream and sink.write_mode != "merge":
                out.append(f"{at}: stream makes a mirror table: set write_mode: merge")
            elif cdc and sink.write_mode == "merge" and not sink.stream:
                out.append(f"{at}: a merge from postgres-cdc mirrors one table: set stream: schema.table")
            elif cdc and sink.write_mode == "overwrite":
                out.append(f"{at}: a postgres-cdc pipeline appends events or merges mirrors; no overwrite")
            other_order = sink.sequence_by or sink.cdc_format not in ("none", "postgres")
            if cdc and sink.write_mode == "merge" and other_order:
                out.append(f"{at}: a mirror is ordered by LSN: leave out sequence_by and cdc_format")
            if cdc and sink.when:
                out.append(f"{at}: when is not supported with postgres-cdc (a mirror takes its stream)")
        if cdc and sum(s.write_mode == "append" for s in self.sinks) > 1:
            out.append("a postgres-cdc pipeline appends its events to one table at most (besides mirrors)")
        mirrors = any(s.stream for s in self.sinks)
        used = [k for k in ("transforms", "filter", "select", "query", "expectations") if getattr(self, k)]
        if cdc and mirrors and used:
            out.append(
                f"mirror tables take the events as the source reads them: {', '.join(used)} cannot apply"
            )
        return out

    def _input_file_problems(self) -> list[str]:
        """``input_file_name()`` in an expectation or a sink's ``when``: those see the batch's
        rows after they were cached for the sinks, where Spark knows no file and gives ''."""
        checks = [(f"expectations[{i}]", e.expr) for i, e in enumerate(self.expectations)]
        checks += [(f"sinks[{i}].when", s.when) for i, s in enumerate(self.sinks) if s.when]
        out = []
        for where, expr in checks:
            found = _INPUT_FILE.search(expr)
            if found:
                out.append(
                    f"{where}: {found.group(0)}) gives '' there (it sees the rows after the transforms, "
                    "cached for the sinks): take the file name in transforms "
                    '(file: "sql: input_file_name()") or with the files source\'s source_file_column'
                )
        return out

    def _parquet_files_problems(self) -> list[str]:
        """A parquet-files pipeline registers files as they are in one table: no rows pass
        through it to transform, filter or route."""
        if self.source.type != "parquet-files":
            return []
        out = []
        used = [
            k
            for k in ("transforms", "filter", "select", "query", "expectations", "dead_letter")
            if getattr(self, k)
        ]
        if used:
            out.append(
                f"a parquet-files source registers files without reading them: {', '.join(used)} cannot apply"
            )
        if len(self.sinks) != 1 or self.sinks[0].when:
            out.append("a parquet-files source registers its files in exactly one sink table (no when)")
        elif self.sinks[0].write_mode != "append":
            out.append("a parquet-files source adds files: the sink's write_mode must be append")
        return out

    def parsed_transforms(self) -> list[Transform]:
        """``transforms``, parsed (in order)."""
        return [parse_transform(f"{k}: {v}") for k, v in self.transforms.items()]

    def sink_names(self) -> list[str]:
        return [s.name or f"sink{i}" for i, s in enumerate(self.sinks)]

    def table_per_topic(self) -> bool:
        """Whether the sink's ``table_uri`` is a template giving each topic its own table
        (``{topic}``, ``{1}`` ...): ingest of many topics, on the Arrow engine."""
        from deltaflow.config.table_template import has_placeholders

        return isinstance(self.source, KafkaSourceSpec) and has_placeholders(self.sinks[0].table_uri)

    def _template_problems(self) -> list[str]:
        from deltaflow.config.table_template import TableTemplate, has_placeholders

        src = self.source
        templated = [i for i, sink in enumerate(self.sinks) if has_placeholders(sink.table_uri)]
        if not templated:
            return []
        if not isinstance(src, KafkaSourceSpec):
            return [
                f"sinks[{templated[0]}]: a table_uri template ({{topic}}, {{1}} ...) takes a Kafka source"
            ]
        problems = []
        several = bool(src.topic_pattern) or len(src.topics) > 1
        for i in templated:
            try:
                TableTemplate.of(self.sinks[i].table_uri, pattern=src.topic_pattern, several=several)
            except ConfigError as exc:
                problems.append(f"sinks[{i}].table_uri: {exc}")
        blockers = self.arrow_blockers()
        if blockers:
            problems.append(
                "a table per topic (table_uri " + repr(self.sinks[templated[0]].table_uri) + ") runs on "
                "the Arrow engine, which cannot run: " + "; ".join(blockers)
            )
        if self.engine == "spark":
            problems.append("a table per topic runs on the Arrow engine: set engine: arrow or auto")
        return problems

    def debezium_mirrors(self) -> bool:
        """Whether this pipeline keeps Debezium topics as mirror tables on the Arrow engine
        (``deltaflow ingest --cdc debezium``): a Kafka source into one merge sink with
        ``cdc_format: debezium`` whose ``table_uri`` is a template, or with ``engine: arrow``."""
        sink = self.sinks[0]
        return (
            isinstance(self.source, KafkaSourceSpec)
            and len(self.sinks) == 1
            and sink.write_mode == "merge"
            and sink.cdc_format == "debezium"
            and (self.table_per_topic() or self.engine == "arrow")
        )

    def arrow_blockers(self) -> list[str]:
        """Why the Arrow engine cannot run this pipeline (empty: it can)."""
        src = self.source
        if not isinstance(src, KafkaSourceSpec):
            return [f"a {src.type} source (the Arrow engine reads Kafka)"]
        reasons = []
        if (src.topic_pattern or len(src.topics) != 1) and not self.table_per_topic():
            reasons.append(
                "several topics or a topic_pattern into one table (the Arrow engine writes a table per topic)"
            )
        if isinstance(src.starting_offsets, dict) and set(src.starting_offsets) - set(src.topics):
            reasons.append("starting_offsets for another topic")
        mappings = [f"{k}: {v}" for k, v in self.transforms.items()]
        sql = [m for m in mappings if parse_transform(m).sql is not None]
        if sql:
            reasons.append(f"Spark SQL transforms ({', '.join(sql)})")
        used = [key for key in ("filter", "select", "query", "expectations") if getattr(self, key)]
        if used:
            reasons.append(f"{', '.join(used)} (Spark SQL)")
        if len(self.sinks) > 1 or self.sinks[0].when:
            reasons.append("routing to several sinks or a sink's when (Spark SQL)")
        if self.sinks[0].write_mode != "append" and not self.debezium_mirrors():
            reasons.append(f"write_mode {self.sinks[0].write_mode} (the Arrow engine appends)")
        if self.sinks[0].time_partition_pattern or self.sinks[0].shuffle_by_partition:
            reasons.append("time_partition_pattern or shuffle_by_partition (Spark SQL)")
        if self.dead_letter is not None and self.dead_letter.partition_columns:
            reasons.append(
                "dead_letter partition_columns (the Arrow engine's dead letters have ingest's columns)"
            )
        return reasons

    def ingest_config(self, *, available_now: bool = False) -> IngestConfig:
        """This pipeline as ``deltaflow ingest`` runs it (the Arrow engine; see ``engine``).

        Raises:
            ConfigError: :meth:`arrow_blockers` names something only Spark can run.
        """
        blockers = self.arrow_blockers()
        if blockers:
            raise ConfigError(
                f"pipeline {self.pipeline_id!r}: the Arrow engine cannot run it: {'; '.join(blockers)}",
                pipeline_id=self.pipeline_id,
            )
        src = self.source
        assert isinstance(src, KafkaSourceSpec)
        sink = self.sinks[0]
        topics = src.topics
        # Ingest owns the progress and the writer; append is the only mode here (op_column is
        # for merges). The schema mode is the sink's, default included.
        owned = {
            "table_uri",
            "write_path",
            "write_mode",
            "op_column",
            "writer_epoch",
            "key_columns",
            "cdc_format",
        }
        table = sink.model_dump(exclude={*_ROUTING_KEYS, *owned}, exclude_defaults=True)
        table["schema_mode"] = sink.schema_mode
        values: dict[str, Any] = {
            "topic": ",".join(topics),
            "topic_pattern": src.topic_pattern,
            "table_uri": sink.table_uri,
            "brokers": src.bootstrap_servers,
            "pipeline_id": self.pipeline_id,
            "allowed_latency": self.trigger_interval,
            "max_messages_per_batch": src.max_messages_per_batch,
            "transforms": tuple(f"{k}: {v}" for k, v in self.transforms.items()),
            "value_format": src.format,
            "value_schema": src.schema_,
            "avro": src.schema_registry_url,
            "avro_schema": src.avro_schema,
            "decompress_gzip": src.decompress_gzip,
            "fail_on_data_loss": src.fail_on_data_loss,
            "ends_at_latest_offsets": available_now,
            "checkpoint_location": normalize_uri(self.checkpoint_location)
            if self.checkpoint_location
            else None,
            "kafka_settings": src.kafka_settings,
            # auto: ingest's own fallback to its Spark engine (same progress and layout) when
            # the Arrow engine refuses a transform on the messages' schema.
            "engine": self.engine if self.engine != "spark" else "arrow",
            "table_options": table,
        }
        if self.debezium_mirrors():
            values["cdc"] = "debezium"
            values["key_columns"] = sink.key_columns
        if isinstance(src.starting_offsets, dict):
            values["seek_offsets"] = src.starting_offsets.get(topics[0], {})
        else:
            values["auto_offset_reset"] = src.starting_offsets
        if self.dead_letter is not None:
            values["dlq_table_location"] = self.dead_letter.table_uri
            dlq = self.dead_letter.model_dump(exclude=owned, exclude_defaults=True)
            dlq["schema_mode"] = self.dead_letter.schema_mode
            values["dlq_table_options"] = dlq
        return IngestConfig.build(**values)


class PipelineFile(_Model):
    """A whole pipeline file."""

    pipelines: list[PipelineSpec] = Field(min_length=1)
    spark: SparkSpec = Field(default_factory=SparkSpec)
    #: For a Rivven connector file: what each of its keys became (:mod:`deltaflow.config.rivven`).
    _notes: list[str] = PrivateAttr(default_factory=list)

    @property
    def notes(self) -> list[str]:
        return list(self._notes)

    @model_validator(mode="after")
    def _unique(self) -> PipelineFile:
        ids = [p.pipeline_id for p in self.pipelines]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"pipeline id(s) used twice: {', '.join(dupes)}")
        slots: dict[tuple[str, str, str, str], str] = {}
        for p in self.pipelines:
            if isinstance(p.source, PostgresCdcSourceSpec):
                other = slots.setdefault(p.source.slot_identity(), p.pipeline_id)
                if other != p.pipeline_id:
                    raise ValueError(
                        f"pipelines {other!r} and {p.pipeline_id!r} read the same replication slot "
                        f"{p.source.slot_name!r}: a slot serves one reader (each would advance it past "
                        "what the other holds); give each its own slot"
                    )
        return self

    def selected(self, ids: list[str] | tuple[str, ...] = ()) -> list[PipelineSpec]:
        """The enabled pipelines, or those named in ``ids`` (an unknown id is an error)."""
        known = {p.pipeline_id: p for p in self.pipelines}
        missing = [i for i in ids if i not in known]
        if missing:
            raise ConfigError(
                f"no pipeline {', '.join(map(repr, missing))} in the file; it has {', '.join(known)}",
                pipelines=list(known),
            )
        return [known[i] for i in ids] if ids else [p for p in self.pipelines if p.enabled]


def load_pipelines(path: str | Path, env: Mapping[str, str] | None = None) -> PipelineFile:
    """Read, substitute and validate a pipeline file.

    Raises:
        PipelineConfigError: the file cannot be read or parsed, a ``${VAR}`` is not set, or the
            content is not valid; the message lists every problem with its YAML path.
    """
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PipelineConfigError(str(path), [f"cannot read the file: {exc.strerror or exc}"]) from None
    try:
        raw = yaml.load(text, Loader=_unique_key_loader())  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PipelineConfigError(str(path), [f"not valid YAML: {exc}"]) from None
    if not isinstance(raw, dict):
        raise PipelineConfigError(str(path), ["the file must be a mapping with a 'pipelines' list"])
    problems: list[str] = []
    data = _substitute(raw, env if env is not None else os.environ, "", problems)
    if problems:
        raise PipelineConfigError(str(path), problems)
    notes: list[str] = []
    if is_rivven_layout(data):
        translation = translate(data)
        if translation.problems:
            raise PipelineConfigError(str(path), translation.problems)
        data, notes = translation.data, translation.notes
    try:
        file = PipelineFile.model_validate(data)
    except ValidationError as exc:
        found = _problems(exc, data)
        if notes:
            found = [
                *found,
                "(a Rivven file: the paths above are of deltaflow's layout; see the notes of validate)",
            ]
        raise PipelineConfigError(str(path), found) from None
    file._notes = notes
    return file


def _unique_key_loader() -> Any:
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML would keep the
    last one silently: a second sink of the same name would replace the first)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping",
                        node.start_mark,
                        f"found the key {key!r} twice",
                        key_node.start_mark,
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _substitute(value: Any, env: Mapping[str, str], where: str, problems: list[str]) -> Any:
    if isinstance(value, dict):
        return {
            k: _substitute(v, env, f"{where}.{k}" if where else str(k), problems) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_substitute(v, env, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        problems.append(f"{where}: environment variable {name} is not set (use ${{{name}:-default}})")
        return ""

    return _ENV.sub(one, value)


def _problems(exc: ValidationError, data: Any) -> list[str]:
    out = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p in _SOURCE_TAGS)]
        where = _yaml_path(loc)
        kind = err["type"]
        if kind == "missing":
            out.append(f"{where}: required key is missing")
        elif kind == "extra_forbidden":
            out.append(f"{where}: unknown key{_hint(loc)}")
        elif kind == "union_tag_invalid":
            expected = err.get("ctx", {}).get("expected_tags", "")
            tag = err.get("ctx", {}).get("tag")
            out.append(f"{where}: unknown source type; use one of {expected} (received {tag!r})")
        else:
            out.append(problem(err, where))
    return out


_SOURCE_TAGS = frozenset({"files", "delta", "kafka", "generator"})
_MODELS_BY_KEY: dict[str, type[BaseModel]] = {
    "sinks": SinkSpec,
    "dead_letter": DeadLetterSpec,
    "expectations": Expectation,
    "spark": SparkSpec,
}


def _hint(loc: list[Any]) -> str:
    """`` (did you mean 'x'?)`` for a misspelt key, from the model the key sits in."""
    import difflib

    name = loc[-1] if loc else None
    if not isinstance(name, str):
        return ""
    model: type[BaseModel] | None = None
    for part in reversed(loc[:-1]):
        if isinstance(part, str):
            model = _MODELS_BY_KEY.get(part) or (PipelineSpec if part == "pipelines" else None)
            if part == "source":
                fields = set().union(
                    *(
                        m.model_fields
                        for m in (
                            FilesSourceSpec,
                            DeltaSourceSpec,
                            KafkaSourceSpec,
                            GeneratorSourceSpec,
                            ParquetFilesSourceSpec,
                        )
                    )
                )
                close = difflib.get_close_matches(name, sorted(fields | {"schema"}), n=1)
                return f" (did you mean {close[0]!r}?)" if close else ""
            break
    if model is None:
        model = PipelineFile if len(loc) == 1 else None
    if model is None:
        return ""
    close = difflib.get_close_matches(name, sorted(model.model_fields), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _yaml_path(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(file)"

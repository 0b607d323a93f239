"""Typed, frozen configuration of the Delta sink.

Spark hands data-source options over as lower-cased strings; :meth:`SinkOptions.from_spark_options`
turns them into a validated model and :meth:`SinkOptions.to_spark_options` back, so the driver,
the executors and the commit worker all see the same values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, Self
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from deltaflow.config.identity import PipelineId
from deltaflow.config.locations import SUPPORTED_SCHEMES, absolute_local
from deltaflow.config.models import problem
from deltaflow.errors import ConfigError, UnknownOptionError

__all__ = [
    "CdcFormat",
    "Compression",
    "SchemaMode",
    "SinkOptions",
    "StreamSinkOptions",
    "WriteMode",
    "WritePath",
    "for_stream",
]

Compression = Literal["snappy", "zstd", "gzip", "lz4", "none"]
WriteMode = Literal["append", "overwrite", "merge"]
CdcFormat = Literal["none", "op", "debezium", "postgres"]
SchemaMode = Literal["strict", "merge", "subset"]
WritePath = Literal["auto", "spark", "arrow"]

# Options Spark itself adds to a writeStream/write call; they are accepted and not ours.
_SPARK_OWNED_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})
_SPARK_OPTION_ALIASES = {"path": "table_uri", "checkpointlocation": "checkpoint_location"}


class SinkOptions(BaseModel):
    """Options of the deltaflow Delta sink (names follow Rivven's and Volley's Delta sinks).

    Attributes:
        table_uri: Where the table lives: a local path, ``file://``, ``s3://``, ``s3a://``,
            ``gs://``, ``az://``, ``abfs://`` or ``abfss://``.
        pipeline_id: Stable identity of the writer: the Delta ``txn`` app id, the default
            checkpoint folder and the metric label. Required for streams.
        auto_create_table: Create the table from the data's schema on first write.
        partition_columns: Hive-style partition columns, in directory order.
        target_file_size_mb: A task starts a new file once the current one reaches this size.
        max_records_per_file: A task starts a new file after this many rows (0 = no limit).
        compression: Parquet compression codec.
        write_mode: ``append`` adds the batch; ``overwrite`` replaces the table's content;
            ``merge`` (pipelines) upserts and deletes rows by ``key_columns`` with delta-rs MERGE
            (see ``deltaflow.sinks.merge``).
        key_columns: ``merge``: the columns identifying a row.
        cdc_format: ``merge``: how a row says what happened: ``none`` (every row is an upsert),
            ``op`` (an ``op_column`` with c/r/u/d or insert/update/delete), ``debezium`` (a
            Debezium envelope: ``before``, ``after``, ``op``, ``ts_ms``, ``source``),
            ``postgres`` (``postgres-cdc`` events of one table: a mirror, set by pipelines for
            a sink with ``stream``; ``key_columns`` default to the table's primary key).
        op_column: ``cdc_format: op``: the column holding the operation.
        sequence_by: ``merge``: a Spark SQL expression ordering the changes of one key (an LSN,
            a version, a timestamp; Debezium default ``source.lsn``, else ``ts_ms``). Within a
            batch only the latest change per key is applied; its value is kept in the column
            ``_change_sequence`` so that an older change never overwrites a newer one.
        max_commit_retries: Attempts after the first failed commit, with exponential backoff.
        table_properties: Delta table properties applied when the table is created.
        storage_options: Passed to delta-rs and to pyarrow's filesystem.
        schema_mode: ``strict`` rejects any schema difference; ``merge`` adds new columns;
            ``subset`` (what ``format("delta")`` writes with) lets the data leave out nullable
            columns of the table, as delta-spark does, and refuses new ones.
        txn_version: For batch writes: the ``txn`` version recorded with ``pipeline_id``; a
            write whose version is already committed is skipped (idempotent backfills).
        kafka_offsets: The stream reads one ``deltaflow-kafka`` source: record its progress in
            the Delta log as one ``txn`` per partition (``<pipeline_id>-<topic>-<partition>``,
            version = last offset written) in each batch's commit, instead of the batch-id
            txn. With the source's ``delta_table_uri`` set, the pipeline then resumes from the
            table, even without its Spark checkpoint.
        checkpoint_location: The query's Spark checkpoint (set by Spark or ``write_stream``);
            ``kafka_offsets`` reads each batch's source offsets from its offset log.
        write_path: Who writes the Parquet files of a stream started with ``write_stream``:
            ``spark`` (Spark's own writer; tables on a filesystem all Spark processes share),
            ``arrow`` (Python workers with pyarrow; any storage), ``auto`` (``spark`` for
            local tables, else ``arrow``). ``df.writeStream.format("deltaflow")`` and batch
            writes always use ``arrow``.
        auto_compact: Streams only: once a partition the stream writes holds
            ``auto_compact_min_files`` files smaller than half of ``target_file_size_mb``,
            compact it in the background (``dataChange=false``; never blocks or fails the
            stream; see ``deltaflow.ops.compaction``).
        auto_compact_min_files: Small files in one partition that trigger a compaction.
        vacuum_interval_hours: Streams only: vacuum the table this often in the background
            (0 = never), keeping the table's ``delta.deletedFileRetentionDuration``.
        writer_epoch: Set by deltaflow when it starts a stream (``deltaflow.delta.commit.claim_writer``):
            the pipeline's writer epoch in this table. Every commit carries it, and a process
            holding an older epoch stops instead of committing (a zombie writer).
        user_metadata: Recorded as ``userMetadata`` in every commit's ``commitInfo`` (Delta's
            ``userMetadata`` option): shown by ``DESCRIBE HISTORY`` and ``deltaflow history``.
        replace_where: ``overwrite`` only: replace just the partitions this predicate over
            partition columns selects (``date >= '2026-11-01' AND country = 'DE'``), in the same
            commit as the new files, which must all fall inside it (Delta's ``replaceWhere``).
        overwrite_schema: ``overwrite`` only: the data's schema (and ``partition_columns``)
            replace the table's (Delta's ``overwriteSchema``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    table_uri: str
    pipeline_id: PipelineId | None = None
    auto_create_table: bool = True
    partition_columns: tuple[str, ...] = ()
    target_file_size_mb: int = Field(default=128, ge=1, le=65536)
    max_records_per_file: int = Field(default=0, ge=0)
    compression: Compression = "snappy"
    write_mode: WriteMode = "append"
    key_columns: tuple[str, ...] = ()
    cdc_format: CdcFormat = "none"
    op_column: str = "op"
    sequence_by: str | None = None
    max_commit_retries: int = Field(default=3, ge=0, le=100)
    table_properties: Mapping[str, str] = Field(default_factory=dict)
    storage_options: Mapping[str, str] = Field(default_factory=dict)
    schema_mode: SchemaMode = "strict"
    txn_version: int | None = Field(default=None, ge=0)
    write_path: WritePath = "auto"
    kafka_offsets: bool = False
    checkpoint_location: str | None = None
    auto_compact: bool = True
    auto_compact_min_files: int = Field(default=50, ge=2)
    vacuum_interval_hours: float = Field(default=0.0, ge=0.0)
    writer_epoch: int | None = Field(default=None, ge=1)
    user_metadata: str | None = None
    replace_where: str | None = None
    overwrite_schema: bool = False

    @field_validator("table_uri")
    @classmethod
    def _check_uri(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("table_uri must not be empty")
        scheme = urlparse(value).scheme.lower()
        if scheme and len(scheme) > 1 and scheme not in SUPPORTED_SCHEMES:
            raise ValueError(
                f"unsupported URI scheme {scheme!r} in {value!r}; "
                f"use a local path or one of: {', '.join(s + '://' for s in SUPPORTED_SCHEMES)}"
            )
        return absolute_local(value)

    @field_validator("checkpoint_location")
    @classmethod
    def _absolute_checkpoint(cls, value: str | None) -> str | None:
        return absolute_local(value) if value else value

    @field_validator("partition_columns", "key_columns", mode="before")
    @classmethod
    def _split_columns(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return tuple(json.loads(text))
            return tuple(c.strip() for c in text.split(",") if c.strip())
        return value

    @field_validator("partition_columns")
    @classmethod
    def _unique_columns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        lowered = [c.lower() for c in value]
        dupes = sorted({c for c in lowered if lowered.count(c) > 1})
        if dupes:
            raise ValueError(f"partition column(s) listed twice: {', '.join(dupes)}")
        return value

    @model_validator(mode="after")
    def _check_merge(self) -> SinkOptions:
        # (debezium: each topic's key from its messages on the Arrow engine; PipelineSpec
        # asks for key_columns where the Spark engine runs it.)
        if (
            self.write_mode == "merge"
            and not self.key_columns
            and self.cdc_format not in ("postgres", "debezium")
        ):
            raise ValueError(
                "write_mode merge needs key_columns (the columns identifying a row; a mirror of a "
                "PostgreSQL table in a postgres-cdc pipeline: stream: schema.table)"
            )
        if self.write_mode != "merge" and (self.key_columns or self.cdc_format != "none" or self.sequence_by):
            raise ValueError("key_columns, cdc_format and sequence_by apply to write_mode merge only")
        return self

    @field_validator("table_properties", "storage_options", mode="before")
    @classmethod
    def _parse_mapping(cls, value: Any) -> Any:
        if isinstance(value, str):
            parsed = json.loads(value) if value.strip() else {}
            if not isinstance(parsed, dict):
                raise ValueError("must be a JSON object of string keys and values")
            value = parsed
        if isinstance(value, Mapping):
            return {str(k): str(v) for k, v in value.items()}
        return value

    @property
    def is_local(self) -> bool:
        """Whether the table lives on the local filesystem."""
        scheme = urlparse(self.table_uri).scheme.lower()
        return scheme in ("", "file") or len(scheme) == 1  # len 1: a Windows drive letter

    @property
    def uses_spark_writer(self) -> bool:
        """Whether ``write_stream`` writes files with Spark's own Parquet writer."""
        return self.write_path == "spark" or (self.write_path == "auto" and self.is_local)

    @property
    def target_file_size_bytes(self) -> int:
        """``target_file_size_mb`` in bytes."""
        return self.target_file_size_mb * 1024 * 1024

    @classmethod
    def known_options(cls) -> frozenset[str]:
        """All option names the sink accepts."""
        return frozenset(cls.model_fields)

    @classmethod
    def build(cls, values: Mapping[str, Any]) -> Self:
        """Validate ``values``, turning pydantic's errors into a :class:`ConfigError`.

        The message names each key, the value received and what is allowed.
        """
        unknown = set(values) - cls.known_options()
        if unknown:
            raise UnknownOptionError(unknown, cls.known_options())
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(_describe(exc), errors=exc.errors(include_url=False)) from None
        except json.JSONDecodeError as exc:  # pragma: no cover - wrapped by pydantic above
            raise ConfigError(f"invalid JSON in sink options: {exc}") from None

    @classmethod
    def from_spark_options(cls, options: Mapping[str, str]) -> Self:
        """Build from the (lower-cased, string-valued) options Spark passes to a data source."""
        values: dict[str, Any] = {}
        for key, value in options.items():
            name = key.lower()
            if name in _SPARK_OWNED_OPTIONS:
                if name in _SPARK_OPTION_ALIASES and value:
                    values.setdefault(_SPARK_OPTION_ALIASES[name], value)
                continue
            values[name] = value
        return cls.build(values)

    def to_spark_options(self) -> dict[str, str]:
        """Serialise to string options for ``DataFrameWriter.options``; round-trips exactly."""
        out: dict[str, str] = {}
        for name, value in self.model_dump(exclude_defaults=True).items():
            if isinstance(value, bool):
                out[name] = "true" if value else "false"
            elif isinstance(value, tuple | list):
                out[name] = json.dumps(list(value))
            elif isinstance(value, Mapping):
                out[name] = json.dumps(dict(value))
            elif value is not None:
                out[name] = str(value)
        out["table_uri"] = self.table_uri
        return out


class StreamSinkOptions(SinkOptions):
    """Sink options of a streaming write: ``pipeline_id`` is required (checked here, once)."""

    pipeline_id: PipelineId


def for_stream(options: SinkOptions) -> StreamSinkOptions:
    """``options`` as the options of a streaming write.

    Raises:
        ConfigError: ``pipeline_id`` is not set (the message says why it is needed).
    """
    if isinstance(options, StreamSinkOptions):
        return options
    if not options.pipeline_id:
        raise ConfigError(PIPELINE_ID_MISSING, table_uri=options.table_uri)
    return StreamSinkOptions.build(options.model_dump())


#: Why a stream needs its pipeline_id, for the error when it is missing.
PIPELINE_ID_MISSING = (
    "pipeline_id is required for a streaming write: it is the Delta txn app id that makes replays "
    "idempotent, the default checkpoint folder and the metric label; set a stable name "
    "(.option('pipeline_id', ...), pipeline_id= in Python, 'pipeline_id' in YAML, --app-id for ingest)"
)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        key = ".".join(str(p) for p in err["loc"]) or "options"
        parts.append(
            PIPELINE_ID_MISSING if err["type"] == "missing" and key == "pipeline_id" else problem(err, key)
        )
    return "invalid sink options: " + "; ".join(parts)

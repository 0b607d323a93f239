"""Kafka as a Spark streaming source, on confluent-kafka through the Python Data Source API.

No JVM jar: the driver side plans micro-batches from broker metadata and watermarks, and each
executor task reads one Kafka partition's offset range with its own consumer, yielding Arrow
record batches. Offsets are ``{"<topic>": {"<partition>": <next offset>}}``.

Use it after :func:`deltaflow.register` as ``spark.readStream.format("deltaflow-kafka")`` with
the options of :class:`KafkaSourceOptions`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import re
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from deltaflow.config.identity import PipelineId
from deltaflow.config.models import problems
from deltaflow.config.secrets import MASK, masked
from deltaflow.delta.progress import DATA_LOSS_KEY, DataLoss, split_offsets, stale_progress
from deltaflow.errors import (
    ConfigError,
    DeltaflowError,
    KafkaAccessError,
    KafkaUnavailableError,
    TransientError,
)
from deltaflow.io import logs
from deltaflow.sources.decode import JsonDecoder, SchemaRegistry, avro_to_spark_ddl, decompress
from deltaflow.sources.kafka_data_loss import check_partition, log_restarts

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = [
    "FORMAT_NAME",
    "KAFKA_SCHEMA",
    "KafkaDataSource",
    "KafkaSourceOptions",
    "Offsets",
    "kafka_errors",
    "topic_partitions",
]

logger = logging.getLogger(__name__)
#: librdkafka's own records (a broker refusing connections, TLS or SASL failures), passed to
#: every client this module makes; confluent-kafka forwards them when a client is polled.
#: librdkafka logs each reconnect attempt (~20 a second for a broker that refuses them): the
#: same failure reads as one record a minute, which counts the ones held back.
CLIENT_LOGGER = logging.getLogger(f"{__name__}.librdkafka")
#: Seconds between two records of the same librdkafka failure.
CLIENT_LOG_REPEAT_S = 60.0


def _client_log_key(message: str) -> str:
    # "FAIL [rdkafka#consumer-3] [thrd:b:9092/bootstrap]: ... refused (after 0ms in state CONNECT)":
    # the same failure of every client of the process (named "<client.id>#<kind>-<n>"),
    # whatever the attempt's timing and librdkafka's own count of repeats.
    return re.sub(r"\[[^\]#]*#\w+-\d+\]|after \d+ms|, \d+ identical error\(s\) suppressed", "", message)


CLIENT_LOGGER.addFilter(logs.RepeatFilter(CLIENT_LOG_REPEAT_S, key=_client_log_key))


def with_client_logger(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with :data:`CLIENT_LOGGER` as confluent-kafka's ``logger``, unless it sets
    librdkafka's ``debug`` contexts: those are asked for whole, as librdkafka prints them (to
    standard error, each with the time it happened)."""
    return dict(conf) if "debug" in conf else {"logger": CLIENT_LOGGER, **conf}


#: ``spark.readStream.format(...)`` name (Spark reserves ``kafka`` for its own connector).
FORMAT_NAME = "deltaflow-kafka"

#: The rows this source produces, as Spark's own Kafka source names them.
KAFKA_SCHEMA = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset LONG, timestamp TIMESTAMP, "
    "timestamp_type INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)

#: When the source decodes values (``value_format`` json or avro) three columns follow: ``data``
#: (the decoded record), ``error`` (why decoding failed, else null) and ``unknown_fields`` (the
#: fields the message had that the schema lacks). ``value`` then keeps failed messages' bytes only.
DECODED_COLUMNS = ("data", "error", "unknown_fields")

#: Messages asked from librdkafka per consume() call, and rows per Arrow batch handed to Spark.
CONSUME_CHUNK = 10_000
#: A task that sees no progress for this long fails (the broker is gone): Spark retries it.
READ_STALL_TIMEOUT_S = 60.0
#: Metadata and watermark requests from the driver.
METADATA_TIMEOUT_S = 15.0
#: With nothing to start yet, ``latestOffset()`` waits this long at most before it answers "no
#: new data" (Spark asks again 10 ms later on its default trigger): bounds the broker requests
#: of an idle or paced query to a few per second, and the delay of data arriving when due.
IDLE_POLL_S = 0.25
#: After the table could not be read for the size estimate (``min_batch_bytes``), the seconds
#: before it is read again (meanwhile the previous estimate, or the interval alone, paces).
ESTIMATE_RETRY_S = 5.0
#: Consumer settings for bulk reads (DELTA_NOTES: 145k msgs/s with defaults, 350k+ with these).
_FAST_CONSUMER = {
    "queued.min.messages": 200_000,
    "fetch.wait.max.ms": 50,
    "fetch.queue.backoff.ms": 0,
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": False,
}
#: Settings whose values are never logged or shown.

Offsets = dict[str, dict[str, int]]
#: The Kafka metadata columns a pipeline may leave unfilled (see ``metadata``).
METADATA_COLUMNS: tuple[Literal["key", "timestamp", "headers"], ...] = ("key", "timestamp", "headers")


class KafkaSourceOptions(BaseModel):
    """Options of the Kafka source.

    Attributes:
        bootstrap_servers: ``host:port[,host:port]`` of the brokers.
        topic: One topic, or several separated by commas.
        topic_pattern: A regular expression over topic names (instead of ``topic``).
        starting_offsets: ``earliest``, ``latest``, or JSON ``{"topic": {"0": 42}}`` (the next
            offset to read; partitions left out start at the earliest offset).
        max_messages_per_batch: Admission control: at most this many messages per micro-batch,
            shared among partitions by their backlog (0 = no limit).
        batch_interval: Pacing (seconds, 0 = none), for queries on Spark's default trigger: a
            micro-batch starts once this long has passed since the previous one started, or at
            once when ``max_messages_per_batch`` messages are waiting or the previous batch left
            messages behind (kafka-delta-ingest's ``allowed_latency``: a full buffer is written
            without waiting, so a backlog drains at full speed). While it holds data back, the
            source reports no new data (``processAllAvailable()`` may return before it is due).
        min_batch_bytes: Pacing by size (0 = none; kafka-delta-ingest's ``min_bytes_per_file``):
            a batch held back by ``batch_interval`` starts at once when the messages waiting
            would make files of this many bytes of Parquet on average (each Kafka partition
            with messages waiting writes one): messages waiting x the median Parquet bytes per
            row of the 50 newest files in ``delta_table_uri`` (read again after every batch,
            and 5 s after a failed read) >= this x those partitions. Until the table holds a
            file that counts its rows, only the interval paces.
        kafka_settings: librdkafka settings passed through (``security.protocol``,
            ``sasl.mechanism``, ...). Values of secret settings are masked when printed.
        sasl_password: SASL password, kept out of logs (``sasl.password`` for librdkafka).
        delta_table_uri: The Delta table the pipeline writes with ``kafka_offsets``: the source
            then starts after the offsets committed there (``<pipeline_id>-<topic>-<partition>``
            txns) and never reads an offset the table already holds, so a lost or replaced
            Spark checkpoint neither duplicates nor loses rows.
        pipeline_id: The pipeline whose txns to read (the sink's ``pipeline_id``; the option
            ``delta_app_id`` is accepted for it).
        delta_storage_options: Storage options for reading that table (JSON object).
        kafka_delta_ingest_txns: Also take kafka-delta-ingest's progress txns
            (``<pipeline_id>-<partition>``, no topic) as the table's, for one topic
            (``deltaflow ingest`` does: a table kafka-delta-ingest wrote resumes where it stopped).
        value_format: ``binary`` (rows carry the value bytes), ``json`` or ``avro``: the source
            decodes values into a ``data`` struct, with ``error`` and ``unknown_fields`` columns;
            a message that fails to decode is a row with its error, never a failed batch. A
            message without a value (a tombstone) is no row when the source decodes (as
            kafka-delta-ingest skips it: there is nothing to land nor to dead-letter).
        value_schema: The decoded value's columns as Spark DDL (``id BIGINT, ts TIMESTAMP``);
            required for ``json`` and for Avro ``container``.
        avro_schema: Avro record schema (JSON text) of bare Avro values, or the reader schema
            with a registry (default: the subject's latest version), of container files, or
            giving the columns of single-object encoded values.
        avro_encoding: ``datum`` (bare, or Confluent-framed with a registry), ``container``
            (each value an Avro object container file: its first record) or ``single_object``
            (Avro single-object encoding, read with ``avro_writer_schemas`` by fingerprint).
        avro_writer_schemas: The writer schemas (JSON texts) of ``single_object`` values.
        schema_registry_url: A Confluent schema registry: values are in the Confluent wire
            format (magic byte, schema id, then Avro or, with ``json``, JSON text); Avro writer
            schemas are fetched by id, JSON schema ids must be known to it.
        schema_registry_subject: Subject whose latest schema is the reader schema (default
            ``<topic>-value``).
        schema_registry_auth: ``user:password`` for the registry's basic auth (masked).
        value_compression: ``gzip`` to decompress each value before decoding.
        keep_value: With decoding, keep every message's bytes in ``value`` (default: only the
            failed ones'), for pipelines that may reject a decoded row later.
        fail_on_data_loss: Spark's ``failOnDataLoss`` (that option name is accepted too): a
            partition whose next offset the broker no longer holds (beyond its latest offset:
            the topic was re-created; below its earliest: retention removed the messages) stops
            the query with :class:`~deltaflow.errors.KafkaDataLossError` before anything is
            written. With false it restarts at the broker's earliest offset, with a warning, a
            metric and a record in the batch's commit (:mod:`deltaflow.sources.kafka_data_loss`).
        metadata: Which of the columns ``key``, ``timestamp`` (with ``timestamp_type``) and
            ``headers`` to fill for every message (comma-separated; default all). The others
            are null, except on messages that failed to decode (dead letters keep them):
            building them costs as much as decoding JSON, for pipelines that drop them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str
    topic: tuple[str, ...] = ()
    topic_pattern: str | None = None
    starting_offsets: Literal["earliest", "latest"] | dict[str, dict[str, int]] = "earliest"
    max_messages_per_batch: int = Field(default=0, ge=0)
    batch_interval: float = Field(default=0.0, ge=0)
    min_batch_bytes: int = Field(default=0, ge=0)
    kafka_settings: dict[str, SecretStr] = Field(default_factory=dict)
    sasl_password: SecretStr | None = None
    delta_table_uri: str | None = None
    pipeline_id: PipelineId | None = None
    delta_storage_options: dict[str, str] = Field(default_factory=dict)
    kafka_delta_ingest_txns: bool = False
    value_format: Literal["binary", "json", "avro"] = "binary"
    value_schema: str | None = None
    avro_schema: str | None = None
    avro_encoding: Literal["datum", "container", "single_object"] = "datum"
    avro_writer_schemas: tuple[str, ...] = ()
    schema_registry_url: str | None = None
    schema_registry_subject: str | None = None
    schema_registry_auth: SecretStr | None = None
    value_compression: Literal["none", "gzip"] = "none"
    keep_value: bool = False
    fail_on_data_loss: bool = True
    metadata: tuple[Literal["key", "timestamp", "headers"], ...] = METADATA_COLUMNS

    @field_validator("avro_writer_schemas", mode="before")
    @classmethod
    def _schema_list(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    @field_validator("topic", "metadata", mode="before")
    @classmethod
    def _split_topics(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(t.strip() for t in value.split(",") if t.strip())
        return value

    @field_validator("starting_offsets", mode="before")
    @classmethod
    def _parse_offsets(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().startswith("{"):
            return json.loads(value)
        return value

    @field_validator("kafka_settings", "delta_storage_options", mode="before")
    @classmethod
    def _parse_settings(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("topic_pattern")
    @classmethod
    def _check_pattern(cls, value: str | None) -> str | None:
        if value is not None:
            re.compile(value)
        return value

    def client_config(self) -> dict[str, Any]:
        """librdkafka configuration with the secrets revealed (never log this)."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update({k: v.get_secret_value() for k, v in self.kafka_settings.items()})
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        return with_client_logger(conf)

    def describe(self) -> dict[str, Any]:
        """The options for logs and config dumps, secrets masked."""
        out = self.model_dump(
            exclude={"kafka_settings", "sasl_password", "delta_storage_options", "schema_registry_auth"}
        )
        if self.schema_registry_auth is not None:
            out["schema_registry_auth"] = MASK
        out["kafka_settings"] = masked({k: v.get_secret_value() for k, v in self.kafka_settings.items()})
        if self.sasl_password is not None:
            out["sasl_password"] = MASK
        return out

    @classmethod
    def from_spark_options(cls, options: Mapping[str, str]) -> KafkaSourceOptions:
        """Validate Spark's (lower-cased) option strings; ``kafka.<setting>`` keys pass through."""
        values: dict[str, Any] = {}
        settings: dict[str, str] = {}
        for key, value in options.items():
            name = key.lower()
            if name.startswith("kafka."):
                settings[name[len("kafka.") :]] = value
            elif name != "path":
                values[name] = value
        if settings:
            merged = dict(json.loads(values.get("kafka_settings") or "{}"))
            merged.update(settings)
            values["kafka_settings"] = merged
        if "delta_app_id" in values:  # the option's earlier name
            values.setdefault("pipeline_id", values.pop("delta_app_id"))
        if "failondataloss" in values:  # Spark's Kafka source's name (options arrive lower-cased)
            values.setdefault("fail_on_data_loss", values.pop("failondataloss"))
        unknown = set(values) - set(cls.model_fields)
        if unknown:
            from deltaflow.errors import UnknownOptionError

            raise UnknownOptionError(unknown, cls.model_fields)
        try:
            opts = cls(**values)
        except ValidationError as exc:
            raise ConfigError("invalid Kafka source options: " + "; ".join(problems(exc))) from None
        if bool(opts.topic) == bool(opts.topic_pattern):
            raise ConfigError("set exactly one of 'topic' and 'topic_pattern' for the Kafka source")
        if bool(opts.delta_table_uri) != bool(opts.pipeline_id):
            raise ConfigError(
                "set both 'delta_table_uri' and 'pipeline_id' (or neither) for the Kafka source"
            )
        if opts.min_batch_bytes and not opts.delta_table_uri:
            raise ConfigError(
                "min_batch_bytes needs delta_table_uri and pipeline_id: the bytes a message "
                "takes are estimated from the table's files"
            )
        if opts.value_compression != "none" and opts.value_format == "binary":
            raise ConfigError("value_compression applies when the source decodes (value_format json or avro)")
        if opts.value_format == "json" and not opts.value_schema:
            raise ConfigError("value_format 'json' needs value_schema (Spark DDL of the value's fields)")
        container = opts.avro_encoding == "container"
        if opts.value_format == "avro" and not (opts.avro_schema or opts.schema_registry_url or container):
            raise ConfigError("value_format 'avro' needs avro_schema or schema_registry_url")
        if container and not opts.value_schema:
            raise ConfigError("avro_encoding 'container' needs value_schema (the columns)")
        if opts.avro_encoding == "single_object" and not (opts.avro_writer_schemas and opts.avro_schema):
            raise ConfigError("avro_encoding 'single_object' needs avro_writer_schemas and avro_schema")
        if opts.value_format == "avro" and opts.value_schema and not container:
            raise ConfigError("value_schema is for JSON; Avro columns come from the Avro schema")
        latest_of = opts.value_format == "avro" and opts.schema_registry_url and not opts.avro_schema
        if latest_of and len(opts.topic) != 1 and not opts.schema_registry_subject:
            raise ConfigError("with several topics, name the registry subject: schema_registry_subject")
        return opts

    def registry(self) -> SchemaRegistry | None:
        if not self.schema_registry_url:
            return None
        auth = self.schema_registry_auth.get_secret_value() if self.schema_registry_auth else None
        return SchemaRegistry(self.schema_registry_url, basic_auth=auth)

    def reader_avro_schema(self) -> str:
        """The Avro reader schema: given, or the subject's latest version in the registry."""
        if self.avro_schema:
            return self.avro_schema
        registry = self.registry()
        assert registry is not None
        subject = self.schema_registry_subject or f"{self.topic[0]}-value"
        return registry.latest(subject)[1]

    def value_ddl(self) -> str:
        """The decoded value's fields as Spark DDL (json: given; avro: from the Avro schema).

        Built as text: Spark parses DDL in the JVM, and ``schema()`` runs in a Python worker
        without a session. A Spark JSON schema (``StructType.json()``) is accepted too.
        """
        if self.value_format == "avro" and self.avro_encoding != "container":
            return avro_to_spark_ddl(self.reader_avro_schema())
        assert self.value_schema is not None
        text = self.value_schema.strip()
        if not text.startswith("{"):
            return text
        from pyspark.sql.types import StructType

        try:
            parsed = StructType.fromJson(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"value_schema is not a Spark JSON schema: {exc}") from None
        return ", ".join(f"{_quote(f.name)} {_ddl(f.dataType)}" for f in parsed.fields)

    def source_schema(self) -> str:
        """The rows' schema (DDL): Kafka's columns, plus the decoded ones when decoding."""
        if self.value_format == "binary":
            return KAFKA_SCHEMA
        data, error, unknown = DECODED_COLUMNS
        return f"{KAFKA_SCHEMA}, {data} STRUCT<{self.value_ddl()}>, {error} STRING, {unknown} ARRAY<STRING>"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _ddl(dtype: Any) -> str:
    """Spark DDL of a data type, without a Spark session."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(dtype, StructType):
        return "STRUCT<" + ", ".join(f"{_quote(f.name)}: {_ddl(f.dataType)}" for f in dtype.fields) + ">"
    if isinstance(dtype, ArrayType):
        return f"ARRAY<{_ddl(dtype.elementType)}>"
    if isinstance(dtype, MapType):
        return f"MAP<{_ddl(dtype.keyType)}, {_ddl(dtype.valueType)}>"
    return str(dtype.simpleString())


@dataclass(frozen=True)
class Decoding:
    """How a task decodes values (built on the driver, shipped with each range)."""

    value_format: str
    arrow_schema: pa.Schema
    compression: str = "none"
    keep_value: bool = False
    metadata: frozenset[str] = frozenset(METADATA_COLUMNS)
    avro_schema: str | None = None
    avro_encoding: str = "datum"
    avro_writer_schemas: tuple[str, ...] = ()
    registry_url: str | None = None
    registry_auth: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class KafkaPartitionRange(InputPartition):
    """One Kafka partition's offsets ``[start, end)`` to read in one Spark task."""

    topic: str
    partition: int
    start: int
    end: int
    config: dict[str, Any] = field(default_factory=dict)
    decoding: Decoding | None = None
    fail_on_data_loss: bool = True

    def __repr__(self) -> str:  # the config holds credentials
        return f"KafkaPartitionRange({self.topic}[{self.partition}] {self.start}..{self.end})"


class KafkaDataSource(DataSource):
    """Spark data source ``deltaflow-kafka`` (streaming reads)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return KafkaSourceOptions.from_spark_options(self.options).source_schema()

    def streamReader(self, schema: StructType) -> KafkaStreamReader:  # noqa: N802
        return KafkaStreamReader(KafkaSourceOptions.from_spark_options(self.options), schema)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; :meth:`read` runs on executors."""

    def __init__(self, options: KafkaSourceOptions, schema: StructType | pa.Schema) -> None:
        logs.configure_worker()  # planned in a Python worker Spark starts
        import pyarrow as pa

        from deltaflow.delta.schema import spark_to_arrow

        self._options = options
        self._decoding = Decoding(
            value_format=options.value_format,
            arrow_schema=schema if isinstance(schema, pa.Schema) else spark_to_arrow(schema),
            compression=options.value_compression,
            keep_value=options.keep_value,
            metadata=frozenset(options.metadata),
            avro_schema=(
                options.reader_avro_schema()
                if options.value_format == "avro" and options.avro_encoding != "container"
                else options.avro_schema
            ),
            avro_encoding=options.avro_encoding,
            avro_writer_schemas=options.avro_writer_schemas,
            registry_url=options.schema_registry_url,
            registry_auth=(
                options.schema_registry_auth.get_secret_value() if options.schema_registry_auth else None
            ),
        )
        self._admin: Any = None
        self._target: Offsets | None = None  # availableNow: never read beyond these offsets
        self._latest: Offsets | None = None  # the newest offsets seen by the last latestOffset()
        # Pacing (batch_interval): when the next batch is due, and whether the last one was
        # capped by admission control (messages left behind: the next starts at once).
        self._due = 0.0
        self._left_behind = False
        # Pacing by size (min_batch_bytes): Parquet bytes per row, read from the table once
        # per batch. ``_estimate_due``: when to read it (monotonic; 0 after each batch, infinity
        # once read, 5 s on after a failed read, which keeps the last estimate).
        self._row_bytes: float | None = None
        self._estimate_due = 0.0
        self._table: Any = None  # the sink's DeltaTable (progress, size estimate), kept up to date
        self._initial: Offsets | None = None
        # The end offsets of the last batch this source planned, and the partitions whose
        # progress the last plan read from the table (see partitions()).
        self._last_end: Offsets = {}
        self._asked_table: dict[str, list[str]] = {}

    # -- driver: planning --------------------------------------------------------------------

    def _client(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            with kafka_errors(f"connecting to Kafka at {self._options.bootstrap_servers}"):
                self._admin = AdminClient(self._options.client_config())
        return self._admin

    def _topic_partitions(self, read: Collection[str] = ()) -> dict[str, list[int]]:
        return topic_partitions(self._options, self._client(), read=read)

    def _watermarks(self, layout: Mapping[str, Sequence[int]], which: str) -> Offsets:
        return watermarks(self._options, layout, which, self._client())

    def _committed(self, layout: Mapping[str, Sequence[int | str]]) -> Offsets:
        """Next offset to read per partition according to the Delta table (if configured)."""
        if not self._options.delta_table_uri or not self._options.pipeline_id or not layout:
            return {}
        from deltaflow.delta.progress import committed_offsets

        done = committed_offsets(
            self._sink_table(),
            self._options.pipeline_id,
            layout,
            kafka_delta_ingest=self._options.kafka_delta_ingest_txns,
        )
        return {t: {p: v + 1 for p, v in parts.items()} for t, parts in done.items() if parts}

    def initialOffset(self) -> Offsets:  # noqa: N802
        # Spark asks twice while planning the first batch (each answer costs broker requests
        # and a Delta log read): the offsets of this query's start are fixed once known.
        if self._initial is None:
            self._initial = self._initial_offset()
            # (The first batch's plan still reads the tables: an ingest's dead-letter tables can
            # be ahead of its main tables after a lost checkpoint, and only that read sees it.)
        return {t: dict(parts) for t, parts in self._initial.items()}

    def _initial_offset(self) -> Offsets:
        layout = self._topic_partitions()
        start = self._options.starting_offsets
        committed = self._committed(layout)
        if start == "latest":
            offsets = self._watermarks(layout, "latest")
        else:
            offsets = self._watermarks(layout, "earliest")
            if isinstance(start, dict):
                for topic, parts in start.items():
                    for part, value in parts.items():
                        if topic in offsets and str(part) in offsets[topic]:
                            offsets[topic][str(part)] = max(int(value), offsets[topic][str(part)])
        for topic, parts in committed.items():  # the table's progress wins over any start rule
            for part, value in parts.items():
                if topic in offsets and part in offsets[topic]:
                    offsets[topic][part] = value
        logger.info("Kafka source starts at %s (from the Delta log: %s)", offsets, committed or "nothing")
        return offsets

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = self._watermarks(self._topic_partitions(), "latest")

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self._options.max_messages_per_batch:
            return ReadMaxRows(self._options.max_messages_per_batch)
        return ReadAllAvailable()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        start, _ = split_offsets(start)  # the previous batch's restarts are its own
        layout = self._topic_partitions(read=start)
        latest = self._target or self._watermarks(layout, "latest")
        self._latest = latest
        earliest: Offsets | None = None
        end: Offsets = {}
        begins: Offsets = {}  # start, plus the earliest offset of partitions new since then
        for topic, parts in layout.items():
            end[topic], begins[topic] = {}, {}
            for p in parts:
                key = str(p)
                begin = start.get(topic, {}).get(key)
                if begin is None:  # a partition (or topic) that appeared since the last batch
                    earliest = earliest or self._watermarks(layout, "earliest")
                    begin = earliest[topic][key]
                begins[topic][key] = begin
                end[topic][key] = max(begin, latest.get(topic, {}).get(key, begin))
        # Offsets the broker no longer holds: stop, or restart those partitions at the earliest.
        # The earliest offsets are asked for only when a batch would start (or offsets went back).
        moved = any(begins[t][k] > latest.get(t, {}).get(k, begins[t][k]) for t in begins for k in begins[t])
        lost: dict[str, dict[str, DataLoss]] = {}
        if moved or end != _known(start, end):
            earliest = earliest or self._watermarks(layout, "earliest")
            lost = self._data_loss(begins, earliest, latest)
            for topic, records in lost.items():
                for key, record in records.items():
                    begins[topic][key] = record["restart"]
                    end[topic][key] = max(record["restart"], record["latest"])
        available = end
        if isinstance(limit, ReadMaxRows):
            end = _admit(begins, end, limit.max_rows)
        if self._target is not None:
            return self._planned(end, lost)  # availableNow: Spark stops once the target is read
        now = time.monotonic()
        if end == _known(start, end):
            time.sleep(IDLE_POLL_S)  # nothing new: answer after a while, not 100 times a second
            return end
        interval = self._options.batch_interval
        full = isinstance(limit, ReadMaxRows) and _count(begins, end) >= limit.max_rows
        if (
            interval
            and now < self._due
            and not (full or lost or self._left_behind or self._sized(begins, end))
        ):
            time.sleep(min(IDLE_POLL_S, self._due - now))
            return _known(start, end)  # held back: "no new data" until due
        self._due = now + interval
        self._left_behind = end != available
        self._estimate_due = 0.0
        return self._planned(end, lost)

    def _data_loss(
        self, begins: Offsets, earliest: Offsets, latest: Offsets
    ) -> dict[str, dict[str, DataLoss]]:
        """The partitions whose next offset the broker no longer holds, to restart at the earliest
        (raises :class:`~deltaflow.errors.KafkaDataLossError` with ``fail_on_data_loss``)."""
        lost: dict[str, dict[str, DataLoss]] = {}
        for topic, parts in begins.items():
            for key, begin in parts.items():
                low, high = earliest.get(topic, {}).get(key), latest.get(topic, {}).get(key)
                if low is None or high is None:
                    continue
                record = check_partition(topic, key, begin, low, high, fail=self._options.fail_on_data_loss)
                if record is not None:
                    lost.setdefault(topic, {})[key] = record
        return lost

    @staticmethod
    def _planned(end: Offsets, lost: Mapping[str, Mapping[str, DataLoss]]) -> dict[str, Any]:
        """The end offsets of a batch about to be planned, with its restarts recorded beside them
        (Spark writes them to its offset log, where ``partitions()`` and the sinks read them)."""
        if not lost:
            return end
        log_restarts(lost)
        return {**end, DATA_LOSS_KEY: {t: dict(records) for t, records in lost.items()}}

    def _sized(self, begins: Offsets, end: Offsets) -> bool:
        """Whether the messages from ``begins`` to ``end`` would make files of
        ``min_batch_bytes`` of Parquet on average (estimated; each Kafka partition with
        messages waiting writes its own file)."""
        wanted = self._options.min_batch_bytes
        if not wanted:
            return False
        now = time.monotonic()
        if now >= self._estimate_due:
            try:
                self._row_bytes = self._read_row_bytes()
                self._estimate_due = math.inf  # until the next batch
            except Exception as exc:  # noqa: BLE001 - the estimate only paces; the sink meets real faults
                self._estimate_due = now + ESTIMATE_RETRY_S
                logger.warning(
                    "no size estimate from %s (%s); trying again in %.0f s, until then %s",
                    self._options.delta_table_uri,
                    exc,
                    ESTIMATE_RETRY_S,
                    "the previous estimate paces" if self._row_bytes is not None else "the interval paces",
                )
        if self._row_bytes is None:
            return False
        files = sum(o > begins[t][k] for t, parts in end.items() for k, o in parts.items())
        waiting = _count(begins, end)
        estimate = waiting * self._row_bytes
        if not files or estimate < wanted * files:
            return False
        logger.info(
            "a batch starts before its interval: %d messages waiting in %d partitions, ~%d bytes "
            "of Parquet (%.1f per row in the table's newest files) >= min_batch_bytes %d per file",
            waiting,
            files,
            estimate,
            self._row_bytes,
            wanted,
        )
        return True

    def _read_row_bytes(self) -> float | None:
        """Parquet bytes per row in the table's newest files."""
        from deltaflow.delta import log as delta_log

        return delta_log.bytes_per_row(self._sink_table())

    def _sink_table(self) -> Any:
        """The sink's table at its latest version, ``None`` while there is none. Loaded once and
        then brought up to date, which reads only the commits since the last call (a table
        with a long history is not read again in every batch)."""
        from deltaflow.config.locations import normalize_uri
        from deltaflow.delta import log as delta_log

        if self._table is not None:
            try:
                self._table.update_incremental()
                return self._table
            except Exception:  # noqa: BLE001 - replaced or vacuumed history, a store fault: load again
                self._table = None
        assert self._options.delta_table_uri is not None
        self._table = delta_log.load(
            normalize_uri(self._options.delta_table_uri), self._options.delta_storage_options
        )
        return self._table

    def reportLatestOffset(self) -> Offsets | None:  # noqa: N802
        # Spark puts it in the progress report as ``latestOffset``: lag = latest - end.
        return self._latest

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaPartitionRange]:
        config = self._options.client_config()
        start, _ = split_offsets(start)
        end, lost = split_offsets(end)
        # Never read what the table already holds: a batch replayed after its commit landed, or
        # planned from a checkpoint older than the table, reads only the rest. A partition the
        # batch restarts (its offsets went back) ignores the stale progress it restarted from.
        # Only partitions with something to read ask the table (a query of many topics reads
        # the progress of the tables that get messages, not of every table), and only when this
        # source did not plan the batch before: a partition starting where the last batch this
        # source planned ended cannot be behind its table. That batch committed (else the query
        # failed, and this source with it), and a writer that took the pipeline over since is
        # fenced out by this one's next commit. So steady batches read no table here.
        unsure = {
            t: [
                k
                for k, stop in parts.items()
                if k in lost.get(t, {})
                or k not in start.get(t, {})
                or (stop > start[t][k] and self._last_end.get(t, {}).get(k) != start[t][k])
            ]
            for t, parts in end.items()
        }
        self._asked_table = {t: keys for t, keys in unsure.items() if keys}
        committed = self._committed(self._asked_table)
        # A partition absent from ``start`` appeared after the last batch: read it from its
        # earliest offset, as latestOffset() planned it.
        new = {t: [int(k) for k in parts if k not in start.get(t, {})] for t, parts in end.items()}
        earliest = (
            self._watermarks({t: p for t, p in new.items() if p}, "earliest") if any(new.values()) else {}
        )
        ranges = []
        for topic, parts in end.items():
            for key, stop in parts.items():
                record = lost.get(topic, {}).get(key)
                begin = record["restart"] if record is not None else start.get(topic, {}).get(key)
                if begin is None:
                    begin = earliest.get(topic, {}).get(key, stop)
                held = committed.get(topic, {}).get(key)
                if held is not None and not stale_progress(record, held - 1):
                    begin = max(begin, held)
                if stop > begin:
                    ranges.append(
                        KafkaPartitionRange(
                            topic,
                            int(key),
                            begin,
                            stop,
                            config,
                            self._decoding,
                            self._options.fail_on_data_loss,
                        )
                    )
        self._last_end = {t: dict(parts) for t, parts in end.items()}
        return ranges

    def commit(self, end: Offsets) -> None:
        pass  # progress lives in Spark's checkpoint (and, for ingest, in the Delta log)

    def stop(self) -> None:
        self._admin = None

    # -- executors: reading ------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaPartitionRange)
        yield from read_range(partition)


def watermarks(
    options: KafkaSourceOptions, layout: Mapping[str, Sequence[int]], which: str, client: Any = None
) -> Offsets:
    """The ``earliest`` or ``latest`` offset of each partition of ``layout`` (``client``: an
    ``AdminClient``, made here when not given)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

    spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()  # type: ignore[no-untyped-call]
    request = {TopicPartition(t, p): spec for t, parts in layout.items() for p in parts}
    out: Offsets = {t: {} for t in layout}
    if not request:
        return out
    with kafka_errors(f"reading the {which} offsets from {options.bootstrap_servers}"):
        if client is None:
            client = AdminClient(options.client_config())
        with _logs_served(client):
            futures = client.list_offsets(request, request_timeout=METADATA_TIMEOUT_S)
            for tp, future in futures.items():
                out[tp.topic][str(tp.partition)] = int(future.result().offset)
    return out


def topic_partitions(
    options: KafkaSourceOptions, client: Any = None, *, read: Collection[str] = ()
) -> dict[str, list[int]]:
    """The partitions of each topic ``options`` reads (``client``: an ``AdminClient``, made here
    when not given). ``read``: the topics the query has read already (its batches' offsets).

    Raises:
        ConfigError: a topic does not exist (a name that is wrong, or a topic not made yet).
        KafkaUnavailableError: a topic of ``read`` does not exist now: deleted, or being made
            again (transient: the query restarts and finds it, or keeps failing until it is).
    """
    if client is None:
        from confluent_kafka.admin import AdminClient

        with kafka_errors(f"connecting to Kafka at {options.bootstrap_servers}"):
            client = AdminClient(options.client_config())
    with kafka_errors(f"reading the topics of {options.bootstrap_servers}"), _logs_served(client):
        meta = client.list_topics(timeout=METADATA_TIMEOUT_S)
    if options.topic_pattern:
        pattern = re.compile(options.topic_pattern)
        names = [t for t in meta.topics if pattern.fullmatch(t) and not t.startswith("__")]
    else:
        names = list(options.topic)
    found: dict[str, list[int]] = {}
    for name in names:
        topic = meta.topics.get(name)
        if topic is None or topic.error is not None or not topic.partitions:
            why = getattr(topic, "error", None) or "no partitions"
            if name in read:
                raise KafkaUnavailableError(
                    f"Kafka topic {name!r}, which this query has read, is not on "
                    f"{options.bootstrap_servers} now ({why}): deleted, or being made again; the "
                    "query restarts and reads it once it is back (a topic made again starts its "
                    "offsets again: fail_on_data_loss decides what then)",
                    topic=name,
                )
            raise ConfigError(
                f"Kafka topic {name!r} does not exist on {options.bootstrap_servers} ({why})",
                topic=name,
            )
        found[name] = sorted(topic.partitions)
    return found


def _count(start: Offsets, end: Offsets) -> int:
    """Messages from ``start`` to ``end`` (offsets, so compacted or aborted ones count too)."""
    return sum(max(0, o - start.get(t, {}).get(k, o)) for t, parts in end.items() for k, o in parts.items())


def _known(start: Offsets, end: Offsets) -> Offsets:
    """``start``, laid out as ``end`` (partitions new since ``start`` left out)."""
    return {
        t: {k: start[t][k] for k in parts if k in start.get(t, {})} for t, parts in end.items() if t in start
    }


def _admit(start: Offsets, end: Offsets, budget: int) -> Offsets:
    """Cap the batch at ``budget`` messages, shared among partitions by their backlog."""
    lags = {(t, k): end[t][k] - start.get(t, {}).get(k, end[t][k]) for t in end for k in end[t]}
    total = sum(v for v in lags.values() if v > 0)
    if total <= budget:
        return end
    capped: Offsets = {t: dict(parts) for t, parts in end.items()}
    order = [(tk, lag) for tk, lag in sorted(lags.items(), key=lambda kv: -kv[1]) if lag > 0]
    shares = {}
    given = 0
    for tk, lag in order:
        share = min(lag, max(1, budget * lag // total), budget - given)
        shares[tk] = share
        given += share
    for tk, lag in order:  # what rounding down left over, to the largest backlogs first
        extra = min(lag - shares[tk], budget - given)
        shares[tk] += extra
        given += extra
    for (t, k), share in shares.items():
        capped[t][k] = end[t][k] - lags[t, k] + share
    return capped


def commit_to_group(config: Mapping[str, Any], end: Offsets) -> None:
    """Commit ``end`` (next offsets to read) to the consumer group of ``config``."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    if "group.id" not in config:
        raise ConfigError("committing offsets to a consumer group needs its group.id")
    offsets = [TopicPartition(t, int(p), o) for t, parts in end.items() for p, o in parts.items() if o > 0]
    if not offsets:
        return
    consumer = Consumer(with_client_logger({**config, "enable.auto.commit": False}))
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    except KafkaException as exc:  # monitoring only: never fail the pipeline for it
        logger.warning("could not commit offsets to group %r: %s", config["group.id"], exc)
    finally:
        consumer.close()


#: librdkafka error names that retrying cannot fix: credentials, permissions, settings.
_REFUSED = frozenset(
    {
        "_AUTHENTICATION",
        "SASL_AUTHENTICATION_FAILED",
        "UNSUPPORTED_SASL_MECHANISM",
        "ILLEGAL_SASL_STATE",
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "CLUSTER_AUTHORIZATION_FAILED",
        "_INVALID_ARG",
        "_INVALID_TYPE",
        "_UNSUPPORTED_FEATURE",
        "_SSL",
        "_FATAL",
    }
)


def kafka_failure(exc: BaseException, doing: str, **context: Any) -> DeltaflowError:
    """The deltaflow error for a confluent-kafka exception raised while ``doing`` something:
    :class:`KafkaAccessError` when Kafka refused the client or its settings (or librdkafka
    calls the error fatal), else :class:`KafkaUnavailableError`."""
    err: Any = exc.args[0] if exc.args else None
    name = str(err.name()) if hasattr(err, "name") else type(exc).__name__
    text = str(err.str()) if hasattr(err, "str") else str(exc)
    fatal = bool(err.fatal()) if hasattr(err, "fatal") else False
    if fatal or name in _REFUSED:
        return KafkaAccessError(
            f"{doing}: Kafka refused the client ({name}: {text}); check the Kafka settings "
            "(bootstrap servers, security protocol, credentials, ACLs)",
            kafka_error=name,
            **context,
        )
    return KafkaUnavailableError(
        f"{doing}: {name}: {text}; the Kafka cluster may be down or unreachable, retrying later may work",
        kafka_error=name,
        **context,
    )


@contextmanager
def _logs_served(client: Any) -> Iterator[None]:
    """Hand the records librdkafka made meanwhile to :data:`CLIENT_LOGGER`: confluent-kafka
    forwards an admin client's records only when it is polled (a consumer's, as it consumes)."""
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            client.poll(0)


@contextmanager
def kafka_errors(doing: str, **context: Any) -> Iterator[None]:
    """Turn confluent-kafka's exceptions raised inside the block into deltaflow errors (see
    :func:`kafka_failure`), so that what happens next is decided by their type."""
    from confluent_kafka import KafkaException

    try:
        yield
    except KafkaException as exc:
        raise kafka_failure(exc, doing, **context) from exc


def read_range(task: KafkaPartitionRange) -> Iterator[pa.RecordBatch]:
    """Read ``[task.start, task.end)`` of one partition as Arrow batches of the source schema."""
    for _, batch in read_ranges([task]):
        yield batch


def read_ranges(tasks: Sequence[KafkaPartitionRange]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Read the ranges with one consumer: ``(index of the range, batch)`` pairs, each range's
    batches in offset order. Ranges of different partitions are read together (one fetch
    covers them all: a task holding many small topic-partitions does not wait for a fetch per
    range); two ranges of one partition are read one after the other."""
    from confluent_kafka import Consumer

    if not tasks:
        return
    # A range below the broker's log start (retention ran between planning and reading) is an
    # error, never librdkafka's default reset to the latest offset, which skips the range whole.
    conf = with_client_logger({**_FAST_CONSUMER, **tasks[0].config, "auto.offset.reset": "error"})
    conf.setdefault("group.id", "deltaflow-reader")
    with kafka_errors(f"connecting to Kafka to read {tasks[0].topic}[{tasks[0].partition}]"):
        consumer = Consumer(conf)
    # Messages and Arrow buffers are freed by reference counting; the cyclic collector finds
    # nothing here but scans the worker's objects every few hundred allocations (~10 % of the
    # read's Python time, measured on 200k messages). Paused while the ranges are read.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if len(tasks) == 1:
            task = tasks[0]
            with kafka_errors(
                f"reading {task.topic}[{task.partition}] offsets {task.start}-{task.end}",
                topic=task.topic,
                partition=task.partition,
            ):
                for batch in _read_range(task, consumer):
                    yield 0, batch
            return
        rounds: list[list[tuple[int, KafkaPartitionRange]]] = []
        for index, task in enumerate(tasks):  # a partition at most once per round
            free = next(
                (
                    r
                    for r in rounds
                    if all(t.topic != task.topic or t.partition != task.partition for _, t in r)
                ),
                None,
            )
            if free is None:
                free = []
                rounds.append(free)
            free.append((index, task))
        for together in rounds:
            with kafka_errors(
                f"reading {len(together)} ranges of {len({t.topic for _, t in together})} topic(s)"
            ):
                yield from _read_together(together, consumer)
    finally:
        if collecting:
            gc.enable()
        consumer.close()


@dataclass
class _Reading:
    """One range being read by :func:`_read_together`."""

    index: int
    task: KafkaPartitionRange
    next_offset: int
    decoder: Any
    rows: list[Any] = field(default_factory=list)


def _read_together(
    ranges: Sequence[tuple[int, KafkaPartitionRange]], consumer: Any
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Read ranges of distinct partitions at once; each range's rows in chunks of
    :data:`CONSUME_CHUNK` as Arrow batches, in offset order."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    state = {
        (t.topic, t.partition): _Reading(i, t, t.start, _decoder(t.decoding) if t.decoding else None)
        for i, t in ranges
        if t.end > t.start
    }
    if not state:
        return
    assignment = [TopicPartition(t, p, r.task.start) for (t, p), r in state.items()]
    consumer.assign(assignment)
    consumer.resume(assignment)  # paused in an earlier round (a second range of the partition)
    active = set(state)
    last_progress = time.monotonic()

    def flush(reading: _Reading) -> tuple[int, pa.RecordBatch]:
        task = reading.task
        assert task.decoding is not None
        rows, reading.rows = reading.rows, []
        return reading.index, _to_arrow(
            rows, task, task.decoding.arrow_schema, reading.decoder, task.decoding
        )

    while active:
        # At most the messages the ranges still hold: consume() returns once it has that many,
        # else only after its timeout (a task of many small ranges waited a second per call).
        left = sum(state[k].task.end - state[k].next_offset for k in active)
        messages = consumer.consume(num_messages=max(1, min(CONSUME_CHUNK, left)), timeout=1.0)
        ready: list[tuple[int, pa.RecordBatch]] = []
        done: list[tuple[str, int]] = []
        for m in messages:
            key = (m.topic(), m.partition())
            reading = state.get(key)
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.code() == KafkaError._AUTO_OFFSET_RESET and reading is not None:
                    # read on from the earliest offset (fail_on_data_loss false), or stop
                    _aged_out_while_reading(consumer, reading.task, reading.next_offset, err)
                    continue
                raise KafkaException(err)
            if reading is None or key not in active:
                continue
            offset = m.offset()
            if offset is None or offset >= reading.task.end:
                done.append(key)
                continue
            reading.rows.append(m)
            reading.next_offset = offset + 1
            last_progress = time.monotonic()
            if reading.next_offset >= reading.task.end:
                done.append(key)
            elif len(reading.rows) >= CONSUME_CHUNK:
                ready.append(flush(reading))
        if not messages:
            # The rest of a range may hold no records (transaction markers, compaction).
            positions = consumer.position([TopicPartition(t, p) for t, p in active])
            done += [
                (tp.topic, tp.partition)
                for tp in positions
                if tp.offset >= state[tp.topic, tp.partition].task.end
            ]
        for key in dict.fromkeys(done):
            if key in active:
                active.discard(key)
                consumer.pause([TopicPartition(*key)])
                if state[key].rows:
                    ready.append(flush(state[key]))
        yield from ready
        if active and time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
            reading = state[next(iter(active))]
            raise TransientError(
                f"no progress reading {len(active)} partition(s), e.g. {reading.task.topic}"
                f"[{reading.task.partition}] at offset {reading.next_offset} (range ends at "
                f"{reading.task.end}), for {READ_STALL_TIMEOUT_S:.0f} s; is the broker up?",
                topic=reading.task.topic,
                partition=reading.task.partition,
                offset=reading.next_offset,
            )


def _read_range(task: KafkaPartitionRange, consumer: Any) -> Iterator[pa.RecordBatch]:
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    decoding = task.decoding
    assert decoding is not None
    arrow_schema = decoding.arrow_schema
    decoder = _decoder(decoding)
    consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
    next_offset = task.start
    last_progress = time.monotonic()
    while next_offset < task.end:
        messages = consumer.consume(num_messages=min(CONSUME_CHUNK, task.end - next_offset), timeout=1.0)
        rows: list[Any] = messages
        if any(m.error() is not None for m in messages) or (
            messages and (messages[-1].offset() or 0) >= task.end
        ):
            rows = []
            for m in messages:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        _aged_out_while_reading(consumer, task, next_offset, err)
                        break  # read on from the earliest offset (fail_on_data_loss false)
                    raise KafkaException(err)
                offset = m.offset()
                if offset is None or offset >= task.end:
                    break
                rows.append(m)
        if rows:
            next_offset = rows[-1].offset() + 1
            last_progress = time.monotonic()
            yield _to_arrow(rows, task, arrow_schema, decoder, decoding)
            continue
        (position,) = consumer.position([TopicPartition(task.topic, task.partition)])
        if position.offset >= task.end:
            break  # the rest of the range holds no records (transaction markers, compaction)
        if time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
            raise TransientError(
                f"no progress reading {task.topic}[{task.partition}] at offset {next_offset} "
                f"(range ends at {task.end}) for {READ_STALL_TIMEOUT_S:.0f} s; is the broker up?",
                topic=task.topic,
                partition=task.partition,
                offset=next_offset,
            )


def _aged_out_while_reading(consumer: Any, task: KafkaPartitionRange, offset: int, err: Any) -> None:
    """The range's next offset is gone from the broker (retention ran after the batch was
    planned): stop the task (``fail_on_data_loss``), or seek the consumer to the earliest offset.

    Raises:
        KafkaDataLossError: with ``fail_on_data_loss``, naming the offsets.
    """
    from confluent_kafka import TopicPartition

    low, high = consumer.get_watermark_offsets(
        TopicPartition(task.topic, task.partition), timeout=METADATA_TIMEOUT_S
    )
    record = check_partition(task.topic, task.partition, offset, low, high, fail=task.fail_on_data_loss)
    if record is None:  # the broker holds it after all: librdkafka's reset was for something else
        raise TransientError(
            f"reading {task.topic}[{task.partition}] at offset {offset}: {err.str()}",
            topic=task.topic,
            partition=task.partition,
            offset=offset,
        )
    log_restarts({task.topic: {str(task.partition): record}}, planned=False)
    consumer.seek(TopicPartition(task.topic, task.partition, max(low, offset)))


def _decoder(decoding: Decoding) -> Any:
    if decoding.value_format == "binary":
        return None
    data_type = decoding.arrow_schema.field("data").type
    registry = (
        SchemaRegistry(decoding.registry_url, basic_auth=decoding.registry_auth)
        if decoding.registry_url
        else None
    )
    if decoding.value_format == "json":
        return JsonDecoder(pa_schema(data_type), registry)
    from deltaflow.sources.decode import AvroDecoder, ContainerAvroDecoder, SingleObjectAvroDecoder

    if decoding.avro_encoding == "container":
        return ContainerAvroDecoder(decoding.avro_schema, data_type)
    if decoding.avro_encoding == "single_object":
        return SingleObjectAvroDecoder(decoding.avro_writer_schemas, data_type)
    assert decoding.avro_schema is not None
    return AvroDecoder(decoding.avro_schema, data_type, registry)


def pa_schema(struct_type: Any) -> pa.Schema:
    import pyarrow as pa

    return pa.schema(list(struct_type))


def _to_arrow(
    rows: Sequence[Any], task: KafkaPartitionRange, schema: pa.Schema, decoder: Any, decoding: Decoding
) -> pa.RecordBatch:
    import pyarrow as pa

    values: list[bytes | None] = [m.value() for m in rows]
    if decoder is not None and None in values:
        # Tombstones (no value: what Debezium and compacted topics send after a delete) hold
        # nothing to decode: no row and no dead letter, as kafka-delta-ingest skips them.
        kept = [m for m, v in zip(rows, values, strict=True) if v is not None]
        logger.debug(
            "%s[%s]: %d message(s) without a value (tombstones) skipped",
            task.topic,
            task.partition,
            len(rows) - len(kept),
        )
        rows, values = kept, [v for v in values if v is not None]
    n = len(rows)
    value_column: pa.Array | None = None
    decoded: list[Any] = []
    errors: list[str | None] | None = None
    failures = 0
    if decoder is not None:
        payloads, errors = decompress(values, decoding.compression)
        result = decoder.decode(payloads)
        errors = [e or d for e, d in zip(errors, result.errors, strict=True)]
        failures = n - errors.count(None)
        data = result.data  # null where decoding failed (a failed gzip leaves nothing to decode)
        if not decoding.keep_value:  # only the failed messages' bytes (dead letters)
            if failures:
                values = [v if e is not None else None for v, e in zip(values, errors, strict=True)]
            else:
                value_column = pa.nulls(n, pa.binary())
        decoded = [
            data.cast(schema.field("data").type),
            pa.array(errors, pa.string()) if failures else pa.nulls(n, pa.string()),
            pa.array(result.unknown_fields, schema.field("unknown_fields").type),
        ]
    # The metadata columns a pipeline does not use: only the failed messages' (dead letters).
    failed: Sequence[Any] | None = None
    if decoding.metadata != frozenset(METADATA_COLUMNS):
        failed = []
        if failures and errors is not None:
            failed = [m if e is not None else None for m, e in zip(rows, errors, strict=True)]

    def column(name: str, build: Any, dtype: pa.DataType) -> pa.Array:
        if failed is None or name in decoding.metadata:
            return pa.array([build(m) for m in rows], dtype)
        if not failed:
            return pa.nulls(n, dtype)
        return pa.array([None if m is None else build(m) for m in failed], dtype)

    first, last = (rows[0].offset(), rows[-1].offset()) if rows else (0, -1)
    if last - first == n - 1:  # no gaps (compaction, transaction markers): no per-message call
        import numpy as np

        offsets = pa.array(np.arange(first, last + 1, dtype=np.int64))
    else:
        offsets = pa.array([m.offset() for m in rows], pa.int64())
    stamp_type = schema.field("timestamp").type
    return pa.RecordBatch.from_arrays(
        [
            column("key", lambda m: m.key(), pa.binary()),
            value_column if value_column is not None else pa.array(values, pa.binary()),
            pa.repeat(pa.scalar(task.topic, pa.string()), n),
            pa.repeat(pa.scalar(task.partition, pa.int32()), n),
            offsets,
            column("timestamp", _timestamp_us, pa.int64()).cast(stamp_type),
            column("timestamp", lambda m: m.timestamp()[0], pa.int32()),
            column("headers", _headers, schema.field("headers").type),
            *decoded,
        ],
        schema=schema,
    )


def _timestamp_us(message: Any) -> int | None:
    kind, millis = message.timestamp()
    return millis * 1000 if kind else None


def _headers(message: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": v} for k, v in message.headers() or ()]

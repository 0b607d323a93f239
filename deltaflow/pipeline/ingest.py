"""Kafka topic -> Delta table, exactly once, with kafka-delta-ingest's knobs (``deltaflow ingest``).

The pipeline: the ``deltaflow-kafka`` source (resuming from the table's per-partition txns,
decoding JSON or Avro values to Arrow in its tasks) -> transforms -> :class:`IngestWriter`,
which per micro-batch commits the messages that failed (decoding or a transform) to the
dead-letter table, then the good rows with each partition's last offset to the main table.

Two Delta tables cannot share one transaction, so each carries its own progress: the
dead-letter table commits txns ``<app_id>-dlq-<topic>-<partition>`` and only ever takes
messages beyond them; the main table commits ``<app_id>-<topic>-<partition>``. A crash
between the two commits replays the batch: the dead-letter rows are recognised as
committed, the main rows land. See docs/DESIGN.md (invariant 9).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltaflow.config.ingest import IngestConfig
from deltaflow.config.locations import normalize_uri
from deltaflow.config.sink import SinkOptions, StreamSinkOptions
from deltaflow.config.transforms import Transform
from deltaflow.errors import ConfigError, DeltaflowError
from deltaflow.metrics import metrics
from deltaflow.pipeline.dead_letters import INGEST_META as META
from deltaflow.pipeline.dead_letters import ingest_letters, log_failed, log_unknown_fields
from deltaflow.pipeline.evolution import (
    SCHEMA_SAMPLE_PER_PARTITION,
    evolve_schema,
    infer_json,
    new_top_level_fields,
    restart_if_table_gained,
    sample_text,
)
from deltaflow.pipeline.interrupts import stoppable
from deltaflow.pipeline.kafka_rows import decoded_fields, decoded_frame
from deltaflow.sinks.spark_checkpoint import restarts_offsets_went_back

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter
    from pyspark.sql.types import StructType

__all__ = ["IngestWriter", "build_ingest_frame", "ingest"]

logger = logging.getLogger(__name__)

#: The column carrying each row's decoding/transform outcome until the rows are split.
#: Columns of the dead-letter table (before ``--dlq_transform``s).


def _starting_offsets(config: IngestConfig) -> str:
    if config.seek_offsets:
        # kafka-delta-ingest *seeks*: the first message ingested is the one after the offset.
        return json.dumps({config.topic: {str(p): int(o) + 1 for p, o in config.seek_offsets.items()}})
    return config.auto_offset_reset


def _stored_offsets(config: IngestConfig, table: Any) -> dict[str, int]:
    """The table's progress for the partitions of ``--seek_offsets`` (kafka-delta-ingest's
    txns included)."""
    from deltaflow.delta.progress import resumed_progress

    return resumed_progress(table, config.pipeline_id, config.topic, list(config.seek_offsets or {}))


def _check_seek_offsets(config: IngestConfig) -> None:
    """``--seek_offsets`` against the table's progress, before anything is written.

    Progress behind a seek offset is refused: seeking would skip messages after what the
    pipeline already wrote (kafka-delta-ingest's ``InconsistentStoredOffsets``); a new
    ``--app_id`` is the deliberate way to skip ahead. Progress at or beyond it wins.

    Raises:
        ConfigError: the table's progress is behind the seek offsets.
    """
    if not config.seek_offsets:
        return

    uri = normalize_uri(config.table_uri)
    app = config.pipeline_id
    table = _main_table(config)
    held = _stored_offsets(config, table)
    seek = {str(p): int(o) for p, o in config.seek_offsets.items()}
    behind = {p: (held[p], o) for p, o in seek.items() if p in held and held[p] < o}
    if behind:
        detail = ", ".join(f"partition {p}: stored={s}/seek={o}" for p, (s, o) in sorted(behind.items()))
        raise ConfigError(
            f"table {uri!r} holds offsets of --app_id {app!r} behind the seek offsets ({detail}); "
            "seeking would skip messages after what it holds. Drop --seek_offsets to resume from "
            "the table, or use a new --app_id to start at the seek offsets",
            table_uri=uri,
            pipeline_id=app,
        )


def _record_seek_offsets(config: IngestConfig, main: StreamSinkOptions) -> None:
    """``--seek_offsets`` recorded as kafka-delta-ingest does, before the first batch: the
    partitions the table holds no progress for get one commit of txns
    ``<app_id>-<topic>-<partition>`` = the seek offset, no files, so the first message read is
    the next one and a restart without the flag keeps the position."""
    if not config.seek_offsets:
        return
    seek = {str(p): int(o) for p, o in config.seek_offsets.items()}
    if record_progress(main, {config.topic: seek}, kafka_delta_ingest=True, what="seek offsets"):
        logger.info(
            "seek offsets %s recorded in %s: the first message read is the next one", seek, main.table_uri
        )
    else:
        logger.info("seek offsets %s: the table holds them or later ones", seek)


def record_progress(
    main: StreamSinkOptions,
    last: Mapping[str, Mapping[str, int]],
    *,
    kafka_delta_ingest: bool = False,
    what: str = "starting offsets",
) -> bool:
    """Commit txns ``<pipeline_id>-<topic>-<partition>`` = the offsets in ``last`` (no files)
    for the partitions the table holds no progress for: reading starts after them (seek
    offsets, or a new topic's ends with ``--auto_offset_reset latest``). Whether it committed.

    ``kafka_delta_ingest``: kafka-delta-ingest's txns (``<pipeline_id>-<partition>``) count as
    progress too (one topic).
    """
    import pyarrow as pa

    from deltaflow.delta import commit
    from deltaflow.delta import log as delta_log
    from deltaflow.delta.progress import kafka_progress, kafka_txn_id, resumed_progress

    uri = normalize_uri(main.table_uri)
    app = main.pipeline_id or ""

    def missing(t: Any) -> dict[str, int]:
        out = {}
        for topic, parts in last.items():
            if kafka_delta_ingest:
                held = resumed_progress(t, app, topic, list(parts))
            else:
                held = kafka_progress(t, app, {topic: list(parts)}).get(topic, {})
            out.update({kafka_txn_id(app, topic, p): int(o) for p, o in parts.items() if str(p) not in held})
        return out

    table = delta_log.load(uri, main.storage_options)
    if table is None or not missing(table):
        return False

    fence = (
        commit.Fence(commit.fence_app_id(app), main.writer_epoch) if main.writer_epoch is not None else None
    )
    commit.commit_files(
        uri,
        [],
        what=f"{what} of {app!r}",
        schema=pa.schema(table.schema().to_arrow()),
        partition_by=main.partition_columns,
        mode="append",
        metadata={"deltaflow.operation": what, "deltaflow.pipeline_id": app},
        storage_options=main.storage_options,
        policy=commit.RetryPolicy(max_retries=main.max_commit_retries),
        create_if_missing=False,
        properties={},
        txns=missing,
        already_done=lambda t: not missing(t),
        fence=fence,
    )
    return True


def _with_table_partitioning(config: IngestConfig) -> IngestConfig:
    """The partitioning of an existing table, as kafka-delta-ingest takes it: from the table.

    Without ``--partition_by`` the table's partition columns are used; an explicit one that
    differs is refused (a table's partitioning is fixed when it is created).

    Raises:
        ConfigError: ``--partition_by`` differs from the existing table's partitioning.
    """
    uri = normalize_uri(config.table_uri)
    table = _main_table(config)
    if table is None:
        return config
    have = list(table.metadata().partition_columns)
    given = list(config.table_options.get("partition_columns") or config.partition_by)
    if given and given != have:
        raise ConfigError(
            f"table {uri!r} is partitioned by {have}, but --partition_by {given} was given; "
            "an existing table keeps its partitioning: drop --partition_by to use the table's",
            table_uri=uri,
        )
    if given or not have:
        return config
    logger.info("table %s is partitioned by %s: writing with its partitioning", uri, have)
    table_options = dict(config.table_options)
    if "partition_columns" in table_options:
        table_options["partition_columns"] = have
    return config.model_copy(update={"partition_by": tuple(have), "table_options": table_options})


def _value_schema(spark: SparkSession, config: IngestConfig) -> StructType:
    """The JSON value's schema: given, the existing table's, or inferred from a sample."""
    from pyspark.sql.types import StructType

    table = _main_table(config)
    if config.value_schema:
        parsed = StructType.fromDDL(config.value_schema)
        if not isinstance(parsed, StructType):
            raise ConfigError(f"--schema must list columns, got {config.value_schema!r}")
        return decoded_fields(parsed, table, config.parsed_transforms())
    if table is not None:
        return decoded_fields(StructType([]), table, config.parsed_transforms())
    samples = _sample_values(config)
    if not samples:
        raise ConfigError(
            f"cannot infer the JSON schema: topic {config.topic!r} has no messages and table "
            f"{config.table_uri!r} does not exist; pass a schema (--schema 'id LONG, ...')",
            topic=config.topic,
        )
    inferred = infer_json(spark, samples)
    # Spark keeps unparsable samples in a column of its own: those messages are dead letters.
    inferred = StructType([f for f in inferred.fields if f.name != "_corrupt_record"])
    logger.info("inferred the JSON schema from %d message(s): %s", len(samples), inferred.simpleString())
    return inferred


#: Messages sampled for schemas at most in all (several topics share it) ...
SAMPLE_BUDGET = 20_000
#: ... but at least this many per partition.
SAMPLE_FLOOR = 20


def _sample_values(config: IngestConfig) -> list[str]:
    return sample_topics(config, [config.topic]).get(config.topic, [])


def sample_topics(config: IngestConfig, topics: Sequence[str]) -> dict[str, list[str]]:
    """Up to :data:`SCHEMA_SAMPLE_PER_PARTITION` values (as text) of each partition of each of
    ``topics``, from its earliest offset, read with one consumer."""
    from confluent_kafka import Consumer

    from deltaflow.sources.kafka import kafka_errors, with_client_logger

    conf = {
        "bootstrap.servers": config.brokers,
        "group.id": "deltaflow-schema-sample",
        **config.kafka_conf,
    }
    doing = f"sampling {topics[0]!r} for its schema" if len(topics) == 1 else f"sampling {len(topics)} topics"
    with kafka_errors(doing, topic=topics[0] if topics else None):
        return _sample(config, Consumer(with_client_logger({**conf, "enable.auto.commit": False})), topics)


def _watermarks(
    config: IngestConfig, layout: Mapping[str, Sequence[int]]
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """The earliest and latest offsets of every partition of ``layout``, in two requests (one
    request per partition took 0.6 s for 200 topics x 2 partitions against 0.05 s, measured)."""
    from confluent_kafka.admin import AdminClient

    from deltaflow.sources.kafka import KafkaSourceOptions, watermarks

    settings = {"kafka_settings": json.dumps(dict(config.kafka_conf))} if config.kafka_conf else {}
    options = KafkaSourceOptions.from_spark_options(
        {"bootstrap_servers": config.brokers, "topic": ",".join(layout), **settings}
    )
    client = AdminClient(options.client_config())
    return watermarks(options, layout, "earliest", client), watermarks(options, layout, "latest", client)


def _sample(config: IngestConfig, consumer: Any, topics: Sequence[str]) -> dict[str, list[str]]:
    from confluent_kafka import TopicPartition

    out: dict[str, list[str]] = {t: [] for t in topics}
    try:
        meta = consumer.list_topics(timeout=15)
        layout = {t: sorted(meta.topics[t].partitions) for t in topics if t in meta.topics}
        partitions = sum(len(parts) for parts in layout.values())
        # Many topics share one budget (each partition at least a few messages): inference over
        # 200 topics' full samples cost ~15 s and ~700 MB of JVM heap that stays (measured).
        per_partition = max(
            SAMPLE_FLOOR, min(SCHEMA_SAMPLE_PER_PARTITION, SAMPLE_BUDGET // max(1, partitions))
        )
        low, high = _watermarks(config, layout)
        wanted: dict[tuple[str, int], int] = {}  # (topic, partition) -> messages still to read
        start = []
        for topic, parts in layout.items():
            for p in parts:
                first, end = low[topic][str(p)], high[topic][str(p)]
                count = min(end, first + per_partition) - first
                if count > 0:
                    wanted[topic, p] = count
                    start.append(TopicPartition(topic, p, first))
        if not start:
            return out
        consumer.assign(start)
        while wanted:
            batch = consumer.consume(num_messages=sum(wanted.values()), timeout=5)
            if not batch:
                break
            for m in batch:
                if m.error() is not None:
                    continue
                key = (m.topic(), m.partition())
                if wanted.get(key, 0) <= 0:
                    continue
                wanted[key] -= 1
                if wanted[key] == 0:
                    del wanted[key]
                text = sample_text(_unframed(m.value(), config), config.decompress_gzip)
                if text:
                    out[m.topic()].append(text)
        return out
    finally:
        consumer.close()


def _unframed(value: bytes | None, config: IngestConfig) -> bytes | None:
    """A sampled value without its Confluent frame (``--json-registry``)."""
    return value[5:] if value and config.json_registry else value


def kafka_reader_options(config: IngestConfig) -> dict[str, str]:
    """The Kafka source's options every ingest reads with (one topic or many): the brokers and
    client settings, where to start, pacing, and which metadata the tasks build."""
    from deltaflow.sources.kafka import METADATA_COLUMNS

    options: dict[str, str] = {
        "bootstrap_servers": config.brokers,
        "starting_offsets": _starting_offsets(config),
        "max_messages_per_batch": str(config.max_messages_per_batch),
        "batch_interval": str(config.allowed_latency or 0),
        "fail_on_data_loss": str(config.fail_on_data_loss).lower(),
    }
    settings = dict(config.kafka_conf)
    if config.consumer_group:
        settings["group.id"] = config.consumer_group
    if settings:
        options["kafka_settings"] = json.dumps(settings)
    if config.decompress_gzip:
        options["value_compression"] = "gzip"
    if config.registry_auth is not None:
        options["schema_registry_auth"] = config.registry_auth
    transforms = config.parsed_transforms()
    failing = config.dlq_table_location and any(t.can_fail for t in transforms)
    if failing or config.schema_evolution:
        # A transform may still reject a message; evolution samples the new fields' values.
        options["keep_value"] = "true"
    # Kafka metadata no transform reads is built for failed messages only (the dead letters').
    used = set().union(*(t.kafka_fields() for t in [*transforms, *config.parsed_dlq_transforms()]))
    if failing or config.cdc != "none":
        used |= {"key", "timestamp"}  # a transform's dead letters carry them; a change is keyed
    options["metadata"] = ",".join(c for c in METADATA_COLUMNS if c in used)
    return options


def source_options(spark: SparkSession, config: IngestConfig) -> dict[str, str]:
    """The ``deltaflow-kafka`` source's options for ingest of one topic (both engines read with
    them): :func:`kafka_reader_options`, the table whose progress it resumes from, and how
    values decode."""
    options = kafka_reader_options(config)
    options.update(
        {
            "topic": config.topic,
            "min_batch_bytes": str(config.min_bytes_per_file or 0),
            "delta_table_uri": normalize_uri(config.table_uri),
            "pipeline_id": config.pipeline_id,
            "kafka_delta_ingest_txns": "true",  # a table kafka-delta-ingest wrote resumes
        }
    )
    storage = config.table_options.get("storage_options")
    if storage:  # the source reads the table's progress with them
        options["delta_storage_options"] = json.dumps(dict(storage))
    if config.value_format == "json":
        options["value_format"] = "json"
        options["value_schema"] = _value_schema(spark, config).json()
        if config.json_registry:
            options["schema_registry_url"] = config.json_registry
    elif config.value_format == "avro" and config.avro == "":
        # Each message an Avro container file: the columns are the table's or --schema's.
        options["value_format"] = "avro"
        options["avro_encoding"] = "container"
        if config.value_schema is None and _main_table(config) is None:
            raise ConfigError(
                "--avro '' (a container file per message) takes its columns from the table or "
                "--schema: pass --schema 'id LONG, ...'",
                topic=config.topic,
            )
        options["value_schema"] = _value_schema(spark, config).json()
    elif config.value_format == "avro" and config.soe_avro:
        options["value_format"] = "avro"
        options["avro_encoding"] = "single_object"
        schemas = _avsc_files(config.soe_avro)
        options["avro_writer_schemas"] = json.dumps(schemas)
        options["avro_schema"] = config.avro_schema or schemas[-1]
    elif config.value_format == "avro":
        options["value_format"] = "avro"
        if config.avro and config.avro.startswith(("http://", "https://")):
            from deltaflow.sources.decode import SchemaRegistry

            options["schema_registry_url"] = config.avro
            # The reader schema, fixed once for the query (the source and its tasks share it).
            if config.avro_schema:
                options["avro_schema"] = config.avro_schema
            else:
                registry = SchemaRegistry(config.avro, basic_auth=config.registry_auth)
                _id, options["avro_schema"] = registry.latest(f"{config.topic}-value")
        elif config.avro_schema:
            options["avro_schema"] = config.avro_schema
        else:
            assert config.avro is not None
            try:
                options["avro_schema"] = Path(config.avro).read_text()
            except OSError as exc:
                raise ConfigError(f"cannot read the Avro schema file {config.avro!r}: {exc}") from None
    return options


def _main_table(config: IngestConfig) -> Any:
    """The main table as it is now (a ``DeltaTable``; ``None`` while it does not exist)."""
    from deltaflow.delta import log as delta_log

    return delta_log.load(
        normalize_uri(config.table_uri), dict(config.table_options.get("storage_options") or {})
    )


def caught_up(config: IngestConfig) -> list[str] | None:
    """For a job (``ends_at_latest_offsets``): the tables it writes, when each already holds
    every message of its topics up to their latest offsets. Such a job has nothing to do: it
    need not start Spark, nor claim the tables (a cron job of an idle topic adds no commit).

    ``None`` when there may be something to read: a partition the table has no progress of
    (unless it is empty), one whose offsets moved on or went back, a table not made yet, seek
    offsets given; and when it cannot be told (a broker or store that does not answer: the
    job's own start then says why, with its retries).
    """
    from deltaflow.delta.log import load, side_by_side
    from deltaflow.delta.progress import committed_offsets
    from deltaflow.sources.kafka import watermarks

    if not config.ends_at_latest_offsets or config.seek_offsets:
        return None
    app = config.pipeline_id
    storage = dict(config.table_options.get("storage_options") or {})
    try:
        options, layout, by_table = _topic_tables(config)
        if not by_table:
            return None
        latest = watermarks(options, {t: layout[t] for ts in by_table.values() for t in ts}, "latest")
        tables = side_by_side(lambda uri: load(uri, storage), list(by_table), name="caught-up")
    except DeltaflowError as exc:  # a broker or store that does not answer: said once here
        logger.info("could not tell whether the job has anything to read (%s): starting it", exc)
        return None
    except Exception:
        logger.debug("could not tell whether the job has anything to read", exc_info=True)
        return None
    for table, topics in zip(tables, by_table.values(), strict=True):
        if table is None:
            return None
        for topic in topics:
            parts = layout[topic]
            # (One topic: a table kafka-delta-ingest wrote resumes too, as the source reads it.)
            held = committed_offsets(
                table, app, {topic: parts}, kafka_delta_ingest=not config.several_topics
            ).get(topic, {})
            for part in parts:
                end, done = latest[topic][str(part)], held.get(str(part))
                if (done is None and end != 0) or (done is not None and done + 1 != end):
                    return None
    return sorted(by_table)


def topic_tables(config: IngestConfig) -> list[str]:
    """The tables of the topics ``config`` reads now, its dead-letter tables included (a
    template rendered for each topic that matches; the one table of a single topic)."""
    _, layout, by_table = _topic_tables(config)
    dlq = config.dlq_template()
    letters = {dlq.render(topic) for topic in layout} if dlq is not None else set()
    return sorted({*by_table, *(uri for uri in letters if uri is not None)})


def _topic_tables(config: IngestConfig) -> tuple[Any, dict[str, list[int]], dict[str, list[str]]]:
    """The Kafka options, the topics' partitions and each table's topics."""
    from deltaflow.sources.kafka import KafkaSourceOptions, topic_partitions

    reader = kafka_reader_options(config)
    if config.topic_pattern:
        reader["topic_pattern"] = config.topic_pattern
    else:
        reader["topic"] = ",".join(config.topics)
    options = KafkaSourceOptions.from_spark_options(reader)
    layout = topic_partitions(options)
    template = config.table_template()
    by_table: dict[str, list[str]] = {}
    for topic in layout:
        uri = template.render(topic) if config.several_topics else normalize_uri(config.table_uri)
        if uri is not None:  # a topic no table takes is not read
            by_table.setdefault(uri, []).append(topic)
    return options, layout, by_table


def _avsc_files(location: str) -> list[str]:
    """The Avro schemas of ``location``: one ``.avsc`` file, or a folder's, in name order."""
    path = Path(location)
    try:
        files = sorted(path.glob("*.avsc")) if path.is_dir() else [path]
        texts = [f.read_text() for f in files]
    except OSError as exc:
        raise ConfigError(f"cannot read the Avro schema(s) at {location!r}: {exc}") from None
    if not texts:
        raise ConfigError(f"no .avsc file in {location!r}")
    return texts


def kafka_source(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """The ``deltaflow-kafka`` source with ``options`` (:func:`source_options`) as a stream."""
    from deltaflow.pipeline.api import register
    from deltaflow.sources.kafka import KafkaDataSource
    from deltaflow.sources.streams import load_stream

    register(spark)
    return load_stream(spark, KafkaDataSource, options)


def empty_source(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """An empty (batch) frame with the rows the ``deltaflow-kafka`` source would give."""
    from deltaflow.sources.kafka import KafkaSourceOptions

    return spark.createDataFrame([], KafkaSourceOptions.from_spark_options(options).source_schema())


def build_ingest_frame(spark: SparkSession, config: IngestConfig, raw: DataFrame | None = None) -> DataFrame:
    """The streaming DataFrame ``ingest`` writes on the Spark engine (:func:`decoded_frame`).
    ``raw``: the source (:func:`kafka_source`), if already loaded."""
    if raw is None:
        raw = kafka_source(spark, source_options(spark, config))
    return decoded_frame(
        raw,
        config.parsed_transforms(),
        raw_values=config.value_format == "raw",
        table_schema=_table_schema(config),
    )


def _table_schema(config: IngestConfig) -> pa.Schema | None:
    """The main table's Arrow schema, if it exists (per-message transform results take its types)."""
    import pyarrow as pa

    table = _main_table(config)
    return None if table is None else pa.schema(table.schema().to_arrow())


def main_rows(frame: DataFrame) -> DataFrame:
    """The rows for the main table: decoded and transformed without an error."""
    from pyspark.sql import functions as F  # noqa: N812

    return frame.filter(F.col(f"{META}.error").isNull()).drop(META, "kafka")


def counted(frame: DataFrame) -> DataFrame:
    """``frame`` (the Kafka source's rows) observing its rows as the batch's messages
    (:data:`~deltaflow.metrics.MESSAGES_OBSERVATION`).

    A ``foreachBatch`` function that reads its batch twice (the dead letters' pass) makes Spark
    count the source's rows twice in ``numInputRows``; the observation counts them once, and
    progress reports and summaries scale by it (:func:`~deltaflow.metrics.progress_messages`).
    """
    from pyspark.sql import functions as F  # noqa: N812

    from deltaflow.metrics import MESSAGES_OBSERVATION

    return frame.observe(MESSAGES_OBSERVATION, F.count(F.lit(1)).alias("messages"))


class IngestWriter:
    """``foreachBatch`` function of ``ingest``: dead letters first, then the main table.

    Both commits are idempotent on their own txns, so the order only decides what a crash
    between them leaves: dead letters committed, main rows not yet, and a replay that skips
    the former and lands the latter (never a main row whose failed neighbours are lost).
    With ``group_config`` the batch's end offsets are then committed to that consumer group.
    """

    def __init__(
        self,
        main: SinkOptions,
        dlq: SinkOptions | None,
        dlq_transforms: Sequence[Transform],
        *,
        group_config: Mapping[str, str] | None = None,
        schema_evolution: bool = False,
        gzipped: bool = False,
        dlq_format: str = "deltaflow",
        follow_table: bool = False,
    ) -> None:
        from deltaflow.sinks.batch_writer import SparkBatchWriter

        self._main = SparkBatchWriter(main)
        self._main_options = main
        self._group_config = dict(group_config) if group_config else None
        self._evolve = schema_evolution
        self._gzipped = gzipped
        self._dlq = SparkBatchWriter(dlq) if dlq else None
        self._dlq_options = dlq
        self._dlq_transforms = list(dlq_transforms)
        self._dlq_format = dlq_format
        self._follow_table = follow_table
        self.failed_total = 0
        self.unknown_total = 0

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        # One pass over the batch: the main files are written while the statistics are
        # observed; the batch is read again only when it holds failed messages (dead letters)
        # or new fields to evolve the schema with. Nothing is committed before both are known.
        seen = Observation(f"deltaflow-ingest-{self._main_options.pipeline_id}-{batch_id}")
        observed = batch.observe(
            seen,
            F.count(F.col(f"{META}.error")).alias("failed"),
            F.first(F.col(f"{META}.error"), ignorenulls=True).alias("first_error"),
            F.count(F.col(f"{META}.unknown_fields")).alias("unknown"),
            F.array_distinct(F.flatten(F.collect_set(F.col(f"{META}.unknown_fields")))).alias("names"),
        )
        pending = self._main.write_files(main_rows(observed), batch_id)
        if pending is None:
            return  # a replay of a committed batch: nothing was read
        try:
            stats = seen.get
            pipeline, table = (
                self._main_options.pipeline_id or "",
                normalize_uri(self._main_options.table_uri),
            )
            if stats["unknown"]:
                self.unknown_total += stats["unknown"]
                metrics.unknown_fields_seen(pipeline=pipeline, table=table, count=stats["unknown"])
                if self._follow_table:
                    restart_if_table_gained(self._main_options, stats["names"], batch_id)
                if self._evolve:
                    self._evolve_schema(batch, batch_id, sorted(stats["names"]))
                log_unknown_fields(batch_id, stats["unknown"], stats["names"])
            if stats["failed"]:
                self.failed_total += stats["failed"]
                metrics.records_failed(pipeline=pipeline, table=table, count=stats["failed"])
                self._dead_letter(batch, batch_id, stats["failed"], stats["first_error"])
            elif self._dlq is not None and restarts_offsets_went_back(self._main_options, batch_id):
                self._dead_letter(batch, batch_id, 0, "")  # its progress moves back too
        except BaseException:
            self._main.discard(pending)
            raise
        self._main.commit(pending)
        if self._group_config is not None:
            # After the Delta commit, for lag monitoring only: progress is read from the table.
            from deltaflow.sinks.spark_checkpoint import read_batch_offsets
            from deltaflow.sources.kafka import commit_to_group

            commit_to_group(self._group_config, read_batch_offsets(self._main_options, batch_id))

    def _evolve_schema(self, batch: DataFrame, batch_id: int, names: list[str]) -> None:
        """Add the new top-level fields as columns, typed from the messages, then restart
        (:func:`~deltaflow.pipeline.evolution.evolve_schema`)."""
        from pyspark.sql import functions as F  # noqa: N812

        top = new_top_level_fields(self._main_options, names)
        if not top:
            return
        gzipped = self._gzipped
        sample = (
            batch.filter(F.size(F.col(f"{META}.unknown_fields")) > 0)
            .select(F.col(f"{META}.value").alias("v"))
            .limit(SCHEMA_SAMPLE_PER_PARTITION)
        )
        texts = sample.rdd.map(lambda r: sample_text(r.v, gzipped) or "")
        evolve_schema(batch.sparkSession, self._main_options, batch_id, top, texts)

    def _dead_letter(self, batch: DataFrame, batch_id: int, failed: int, first_error: str) -> None:
        if self._dlq is None or self._dlq_options is None:
            log_failed(batch_id, failed, first_error, dead_letter_table=False)
            return
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        from deltaflow.errors import TransientError

        # This pass reads the batch again: it must see the same failed messages as the first.
        again = Observation(f"deltaflow-dlq-{self._dlq_options.pipeline_id}-{batch_id}")
        source = batch.observe(again, F.count(F.col(f"{META}.error")).alias("failed"))
        seen = _already_dead_lettered(self._dlq_options, batch_id)
        rows = ingest_letters(
            source if seen is None else source.filter(~seen), self._dlq_transforms, self._dlq_format
        )
        if failed:
            log_failed(batch_id, failed, first_error, dead_letter_table=True)
        pending = self._dlq.write_files(rows, batch_id)
        if pending is None:
            return
        if again.get["failed"] != failed:
            self._dlq.discard(pending)
            raise TransientError(
                f"batch {batch_id} held {failed} failed message(s) when read for the main table and "
                f"{again.get['failed']} when read again for the dead-letter table (did compaction or "
                "retention change the topic?); nothing of the batch was committed, retrying it",
                batch_id=batch_id,
            )
        self._dlq.commit(pending)


def _already_dead_lettered(options: SinkOptions, batch_id: int) -> Column | None:
    """Rows of this batch the dead-letter table holds already (its per-partition txns).

    A batch planned from a lost checkpoint can start before the dead-letter table's progress
    (the source only knows the main table's); those rows must not land twice.
    """
    from pyspark.sql import functions as F  # noqa: N812

    from deltaflow.delta import log as delta_log
    from deltaflow.delta.progress import kafka_progress, stale_progress
    from deltaflow.sinks.spark_checkpoint import read_batch_source

    table = delta_log.load(normalize_uri(options.table_uri), options.storage_options)
    end, lost = read_batch_source(options, batch_id)
    done = kafka_progress(table, options.pipeline_id or "", {t: list(parts) for t, parts in end.items()})
    # A partition restarted because its offsets went back: progress from before is the old topic's.
    last = {
        f"{topic}:{p}": v
        for topic, parts in done.items()
        for p, v in parts.items()
        if not stale_progress(lost.get(topic, {}).get(p), v)
    }
    if not last:
        return None
    # One map lookup per row (not an OR per partition), on the message's own coordinates.
    lookup = F.create_map(*(F.lit(x) for kv in sorted(last.items()) for x in kv))
    key = F.concat_ws(":", F.col("kafka.topic"), F.col("kafka.partition").cast("string"))
    return F.col("kafka.offset") <= F.coalesce(lookup[key], F.lit(-1))


def ingest(
    spark: SparkSession, config: IngestConfig, *, on_engine: Callable[[str], None] | None = None
) -> StreamingQuery:
    """Start ingesting ``config.topic`` into ``config.table_uri``; returns the running query.

    ``on_engine`` is told the engine the query runs on (``arrow`` or ``spark``) before it starts.
    """
    from deltaflow.pipeline.api import _claim, _prepare_table, default_checkpoint_location
    from deltaflow.pipeline.arrow_ingest import choose_engine

    if config.several_topics:
        raise ConfigError(
            "ingest() reads one topic; several (a pattern or a list) start with "
            "deltaflow.pipeline.topic_ingest.start",
            pipeline_id=config.pipeline_id,
        )
    config = _with_table_partitioning(config.for_one_topic())
    _check_seek_offsets(config)
    engine = choose_engine(config)
    options = source_options(spark, config)
    # The Arrow engine reads with a source of its own and needs the Kafka rows' schema only
    # here: an empty frame of that schema spares Spark a Python planner process.
    raw = counted(kafka_source(spark, options)) if engine == "spark" else empty_source(spark, options)
    frame = build_ingest_frame(spark, config, raw)
    location = config.checkpoint_location or default_checkpoint_location(config.sink_options(None))
    main = config.sink_options(location)
    _prepare_table(main_rows(frame), main)
    dlq = config.dlq_options(location)
    dlq_transforms = config.parsed_dlq_transforms()
    if dlq is not None:
        _prepare_table(ingest_letters(frame, dlq_transforms, config.dlq_format), dlq)
        dlq = _claim(dlq)
    # Claimed before the query plans its first batch from the table's progress: from here on a
    # process that started earlier on this pipeline can no longer commit (zombie writers).
    main = _claim(main)
    _record_seek_offsets(config, main)
    group = None
    if config.commit_to_group:
        group = {"bootstrap.servers": config.brokers, **config.kafka_conf}
        group["group.id"] = config.consumer_group or ""
    stream = None
    if engine == "arrow":
        try:
            stream = _arrow_engine(spark, config, options, raw, frame, main, dlq, group)
        except ConfigError as exc:
            if config.engine == "arrow":
                raise
            logger.info("the Arrow engine cannot run this ingest (%s): taking the Spark engine", exc)
            engine = "spark"
            frame = build_ingest_frame(spark, config, counted(kafka_source(spark, options)))
    if stream is None:
        writer = IngestWriter(
            main,
            dlq,
            dlq_transforms,
            group_config=group,
            schema_evolution=config.schema_evolution,
            gzipped=config.decompress_gzip,
            dlq_format=config.dlq_format,
            follow_table=config.value_format == "json",
        )
        stream = frame.writeStream.foreachBatch(stoppable(writer, pipeline=config.pipeline_id))
    stream = stream.option("checkpointLocation", location).queryName(config.pipeline_id)
    if config.ends_at_latest_offsets:
        stream = stream.trigger(availableNow=True)
    # Otherwise Spark's default trigger, paced by the source (``batch_interval``): a batch every
    # allowed_latency seconds, or at once while a backlog drains (a processingTime trigger would
    # idle until the next interval after every capped batch).
    if on_engine is not None:
        on_engine(engine)
    logger.info(
        "ingesting %s from %s into %s%s (checkpoint %s; %s engine)",
        config.topic,
        config.brokers,
        normalize_uri(config.table_uri),
        f", dead letters into {normalize_uri(config.dlq_table_location)}"
        if config.dlq_table_location
        else "",
        location,
        engine,
    )
    from deltaflow.pipeline.session import start_query

    return start_query(stream, spark, config.pipeline_id)


def _arrow_engine(
    spark: SparkSession,
    config: IngestConfig,
    options: Mapping[str, str],
    raw: DataFrame,
    frame: DataFrame,
    main: StreamSinkOptions,
    dlq: StreamSinkOptions | None,
    group: Mapping[str, str] | None,
) -> DataStreamWriter:
    """The Arrow engine's query: tables, schemas and transforms as the Spark engine has them."""
    from deltaflow.delta.schema import spark_to_arrow
    from deltaflow.pipeline.arrow_ingest import ArrowIngestWriter, IngestTables, arrow_stream, ingest_plan
    from deltaflow.pipeline.session import default_parallelism
    from deltaflow.sinks.datasource import _DeltaSink
    from deltaflow.sources.kafka_ingest import check_plan

    main_schema = spark_to_arrow(main_rows(frame).schema)
    letters = ingest_letters(frame, config.parsed_dlq_transforms(), config.dlq_format)
    dlq_schema = spark_to_arrow(letters.schema) if dlq else None
    plan = ingest_plan(
        source_schema=spark_to_arrow(raw.schema),
        main=main,
        main_schema=main_schema,
        dlq=dlq,
        dlq_schema=dlq_schema,
        config=config,
        parallelism=default_parallelism(spark),
    )
    check_plan(plan)  # what the Arrow engine cannot run fails here, before the query starts
    main_sink = _DeltaSink(main, main_schema, overwrite=False)
    dlq_sink = _DeltaSink(dlq, dlq_schema, overwrite=False) if dlq and dlq_schema else None
    writer = ArrowIngestWriter(
        IngestTables.one(main_sink, dlq_sink),
        pipeline_id=config.pipeline_id,
        group_config=group,
        schema_evolution=config.schema_evolution,
        gzipped=config.decompress_gzip,
        follow_table=config.value_format == "json",
    )
    return arrow_stream(spark, options, plan, writer)

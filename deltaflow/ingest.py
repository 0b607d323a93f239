"""Kafka topic -> Delta table, exactly once, with kafka-delta-ingest's knobs (``deltaflow ingest``).

The pipeline: the ``deltaflow-kafka`` source (resuming from the table's per-partition txns) ->
JSON decoding of the value -> transforms -> the Delta sink with ``kafka_offsets``: every
micro-batch is one commit holding the rows and each partition's last offset.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from deltaflow._storage import normalize_uri
from deltaflow.exceptions import ConfigError
from deltaflow.transforms import Transform, apply_transforms, parse_transform

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

__all__ = ["IngestConfig", "build_ingest_frame", "ingest"]

logger = logging.getLogger(__name__)

#: Messages sampled per partition to infer the JSON schema of a table that does not exist yet.
SCHEMA_SAMPLE_PER_PARTITION = 1000


@dataclass(frozen=True)
class IngestConfig:
    """What ``deltaflow ingest`` runs (the CLI flags, validated)."""

    topic: str
    table_uri: str
    brokers: str
    app_id: str
    allowed_latency: float | None = None
    max_messages_per_batch: int = 0
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    seek_offsets: Mapping[str, int] | None = None
    transforms: Sequence[str] = ()
    value_format: Literal["json", "raw"] = "json"
    schema: str | None = None
    ends_at_latest_offsets: bool = False
    checkpoint_location: str | None = None
    partition_by: Sequence[str] = ()
    kafka_settings: Mapping[str, str] = field(default_factory=dict)
    consumer_group: str | None = None
    write_path: Literal["auto", "spark", "arrow"] = "auto"

    def parsed_transforms(self) -> list[Transform]:
        return [parse_transform(t) for t in self.transforms]


def _starting_offsets(config: IngestConfig) -> str:
    if config.seek_offsets:
        return json.dumps({config.topic: {str(p): int(o) for p, o in config.seek_offsets.items()}})
    return config.auto_offset_reset


def _value_schema(spark: SparkSession, config: IngestConfig) -> StructType:
    """The JSON value's schema: given, the existing table's, or inferred from a sample."""
    from pyspark.sql.types import StructType

    from deltaflow import delta_log

    if config.schema:
        parsed = StructType.fromDDL(config.schema)
        if not isinstance(parsed, StructType):
            raise ConfigError(f"--schema must list columns, got {config.schema!r}")
        return parsed
    table = delta_log.load(normalize_uri(config.table_uri), {})
    if table is not None:
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema

        # Columns a transform makes whole are not in the message; nested targets only add
        # fields to a struct the message carries (they stay in the decoded schema as nulls).
        produced = {t.target[0] for t in config.parsed_transforms() if len(t.target) == 1}
        table_schema = from_arrow_schema(pa.schema(table.schema().to_arrow()))
        return StructType([f for f in table_schema.fields if f.name not in produced])
    samples = _sample_values(config)
    if not samples:
        raise ConfigError(
            f"cannot infer the JSON schema: topic {config.topic!r} has no messages and table "
            f"{config.table_uri!r} does not exist; pass a schema (--schema 'id LONG, ...')",
            topic=config.topic,
        )
    inferred = spark.read.json(spark.sparkContext.parallelize(samples)).schema
    logger.info("inferred the JSON schema from %d message(s): %s", len(samples), inferred.simpleString())
    return inferred


def _sample_values(config: IngestConfig) -> list[str]:
    from confluent_kafka import Consumer, TopicPartition

    conf = {
        "bootstrap.servers": config.brokers,
        "group.id": "deltaflow-schema-sample",
        **config.kafka_settings,
    }
    consumer = Consumer({**conf, "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(config.topic, timeout=15)
        parts = sorted(meta.topics[config.topic].partitions)
        values: list[str] = []
        for p in parts:
            low, high = consumer.get_watermark_offsets(TopicPartition(config.topic, p), timeout=15)
            stop = min(high, low + SCHEMA_SAMPLE_PER_PARTITION)
            if stop <= low:
                continue
            consumer.assign([TopicPartition(config.topic, p, low)])
            got = 0
            while got < stop - low:
                batch = consumer.consume(num_messages=stop - low - got, timeout=5)
                if not batch:
                    break
                got += len(batch)
                values += [
                    v.decode("utf-8", "replace") for m in batch if m.error() is None and (v := m.value())
                ]
        return values
    finally:
        consumer.close()


def build_ingest_frame(spark: SparkSession, config: IngestConfig) -> DataFrame:
    """The streaming DataFrame ``ingest`` writes: decoded, transformed rows."""
    from pyspark.sql import functions as F  # noqa: N812

    from deltaflow.api import register

    register(spark)
    reader = (
        spark.readStream.format("deltaflow-kafka")
        .option("bootstrap_servers", config.brokers)
        .option("topic", config.topic)
        .option("starting_offsets", _starting_offsets(config))
        .option("max_messages_per_batch", config.max_messages_per_batch)
        .option("delta_table_uri", normalize_uri(config.table_uri))
        .option("delta_app_id", config.app_id)
    )
    settings = dict(config.kafka_settings)
    if config.consumer_group:
        settings["group.id"] = config.consumer_group
    if settings:
        reader = reader.option("kafka_settings", json.dumps(settings))
    raw = reader.load()
    kafka = F.struct(
        "partition", "offset", "topic", "timestamp", F.col("key").cast("string").alias("key"), "headers"
    ).alias("kafka")
    if config.value_format == "raw":
        decoded = raw.select(F.col("value"), kafka)
    else:
        schema = _value_schema(spark, config)
        decoded = raw.select(F.from_json(F.col("value").cast("string"), schema).alias("_v"), kafka).select(
            "_v.*", "kafka"
        )
    return apply_transforms(decoded, config.parsed_transforms()).drop("kafka")


def ingest(spark: SparkSession, config: IngestConfig) -> StreamingQuery:
    """Start ingesting ``config.topic`` into ``config.table_uri``; returns the running query."""
    from deltaflow.api import write_stream

    frame = build_ingest_frame(spark, config)
    if config.ends_at_latest_offsets:
        trigger: dict[str, Any] = {"availableNow": True}
    elif config.allowed_latency:
        trigger = {"processingTime": f"{config.allowed_latency} seconds"}
    else:
        trigger = {}
    return write_stream(
        frame,
        config.table_uri,
        pipeline_id=config.app_id,
        checkpoint_location=config.checkpoint_location,
        trigger=trigger or None,
        kafka_offsets=True,
        partition_columns=list(config.partition_by),
        schema_mode="merge",
        write_path=config.write_path,
    )

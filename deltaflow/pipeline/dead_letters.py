"""Dead letters: the rows a pipeline could not land, in a Delta table of their own.

The layouts, all defined here:

* ``deltaflow ingest`` (kafka-delta-ingest's dead-letter table): one row per Kafka message that
  failed decoding or a transform, with its coordinates and raw bytes (:data:`KAFKA_COLUMNS`);
  ``--dlq_transform`` adds columns. Its txns are ``<pipeline_id>-dlq-<topic>-<partition>``.
* ``deltaflow ingest --dlq_format kafka-delta-ingest``: kafka-delta-ingest's own row
  (:data:`KDI_COLUMNS`): ``base64_bytes`` (the value in base64, when it is not JSON text: it
  could not be decoded), ``json_string`` (the value, when it is JSON text that a transform or a
  column type refused), ``error``, ``timestamp`` (when the dead letter was made: epoch
  microseconds while ``--dlq_transform``s run, as kafka-delta-ingest's transforms see it, then a
  TIMESTAMP) and ``date`` (its UTC date, ``yyyy-MM-dd``: kafka-delta-ingest's documented
  partition column, which it leaves to a transform; a ``--dlq_transform`` of ``date`` wins).
* Pipelines (``deltaflow run``/``sql``) of a Kafka source, on either engine: ingest's layout
  (:data:`KAFKA_COLUMNS`), so that a pipeline's dead letters do not depend on the engine it
  runs on. On the Spark engine a row a ``drop`` expectation rejects lands there too
  (:func:`kafka_row_letters`). Its txn is the pipeline's batch id on the Spark engine, the
  ingest's per-partition txns on the Arrow engine (each engine keeps its own progress).
* Pipelines of other sources: one row per record, with the reason (an expectation with
  ``action: drop``, a JSON line that is no object) and the record as JSON
  (:data:`PIPELINE_SCHEMA`). Its txn is the pipeline's batch id, like its sinks'. A Kafka
  pipeline's dead-letter table made by an earlier deltaflow in this layout keeps it
  (:func:`layout_of`).

All are written before the main table's commit of the same batch, so a crash between the two
never leaves a main row whose failed neighbours are lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from deltaflow.config.transforms import Transform
from deltaflow.pipeline.transforms import apply_transforms

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "INGEST_META",
    "KAFKA_COLUMNS",
    "KDI_COLUMNS",
    "PIPELINE_SCHEMA",
    "Layout",
    "base64_text",
    "ingest_letters",
    "kafka_row_letters",
    "layout_of",
    "log_failed",
    "log_unknown_fields",
    "pipeline_letters",
]

logger = logging.getLogger(__name__)

#: The struct an ingest frame carries per message: its decode error, key, value, unknown fields.
INGEST_META = "_deltaflow"
#: Columns of ``deltaflow ingest``'s dead-letter table (before ``--dlq_transform`` columns).
KAFKA_COLUMNS = (
    "topic",
    "partition",
    "offset",
    "kafka_timestamp",
    "key_base64",
    "value_base64",
    "error",
    "dead_lettered_at",
)
#: Columns of kafka-delta-ingest's dead-letter table (``--dlq_format kafka-delta-ingest``).
KDI_COLUMNS = ("base64_bytes", "json_string", "error", "timestamp", "date")
#: Columns of a pipeline's dead-letter table (sources other than Kafka).
PIPELINE_SCHEMA = (
    "pipeline_id STRING, batch_id BIGINT, reason STRING, record STRING, dead_lettered_at TIMESTAMP"
)
#: ``kafka``: :data:`KAFKA_COLUMNS` (and ``--dlq_transform`` columns); ``pipeline``: :data:`PIPELINE_SCHEMA`.
Layout = Literal["kafka", "pipeline"]
_PIPELINE_COLUMNS = ("pipeline_id", "batch_id", "reason", "record", "dead_lettered_at")


def layout_of(table: Any) -> Layout | None:
    """The layout of an existing dead-letter table (a ``DeltaTable``): ``pipeline`` when it has
    exactly the columns of :data:`PIPELINE_SCHEMA` (a Kafka pipeline's table made before its
    dead letters took ingest's layout), else ``kafka``; ``None`` without a table."""
    if table is None:
        return None
    names = tuple(f.name for f in table.schema().fields)
    return "pipeline" if names == _PIPELINE_COLUMNS else "kafka"


def base64_text(column: Column) -> Column:
    """``column``'s bytes in base64 on one line, as the Arrow engine and kafka-delta-ingest write
    them. Spark's ``base64`` breaks its output into MIME lines of 76 characters (CRLF between
    them: ``spark.sql.chunkBase64String.enabled``, on by default); the breaks are removed."""
    from pyspark.sql import functions as F  # noqa: N812

    return F.regexp_replace(F.base64(column), "[\r\n]", "")


def ingest_letters(
    frame: DataFrame, transforms: Sequence[Transform] = (), dlq_format: str = "deltaflow"
) -> DataFrame:
    """The dead-letter rows of an ingest frame: its failed messages, in ``dlq_format``'s shape."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import LongType

    failed = frame.filter(F.col(f"{INGEST_META}.error").isNotNull())
    if dlq_format == "kafka-delta-ingest":
        value = F.col(f"{INGEST_META}.value")
        text = value.cast("string")
        is_json = F.try_parse_json(text).isNotNull()
        now = F.current_timestamp()
        kdi = failed.select(
            F.when(~is_json, base64_text(value)).alias("base64_bytes"),
            F.when(is_json, text).alias("json_string"),
            F.col(f"{INGEST_META}.error").alias("error"),
            F.unix_micros(now).alias("timestamp"),
            F.date_format(now, "yyyy-MM-dd").alias("date"),  # the session's time zone is UTC
            F.col("kafka"),
        )
        kdi = apply_transforms(kdi, transforms).drop("kafka")
        if isinstance(kdi.schema["timestamp"].dataType, LongType):
            kdi = kdi.withColumn("timestamp", F.timestamp_micros("timestamp"))
        return kdi
    out = failed.select(
        F.col("kafka.topic").alias("topic"),
        F.col("kafka.partition").alias("partition"),
        F.col("kafka.offset").alias("offset"),
        F.col("kafka.timestamp").alias("kafka_timestamp"),
        base64_text(F.col(f"{INGEST_META}.key")).alias("key_base64"),
        base64_text(F.col(f"{INGEST_META}.value")).alias("value_base64"),
        F.col(f"{INGEST_META}.error").alias("error"),
        F.current_timestamp().alias("dead_lettered_at"),
        F.col("kafka"),
    )
    return apply_transforms(out, transforms).drop("kafka")


def kafka_row_letters(rows: DataFrame, reason: Column) -> DataFrame:
    """Rows of a Kafka pipeline rejected after decoding (a ``drop`` expectation on the Spark
    engine) in :data:`KAFKA_COLUMNS`: the message's coordinates and key from the rows'
    ``kafka`` struct (null when ``select``/``query`` left it out), the row itself (without
    ``kafka``) as JSON text in ``value_base64`` (it is no longer the message's bytes), the
    ``reason`` in ``error``."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import StructType

    kafka = rows.schema["kafka"].dataType if "kafka" in rows.columns else None
    has = set(kafka.fieldNames()) if isinstance(kafka, StructType) else set()

    def meta(name: str, kind: str) -> Column:
        return F.col(f"kafka.{name}") if name in has else F.lit(None).cast(kind)

    record = F.to_json(F.struct(*(F.col(f"`{c}`") for c in rows.columns if c != "kafka")))
    return rows.select(
        meta("topic", "string").alias("topic"),
        meta("partition", "int").alias("partition"),
        meta("offset", "bigint").alias("offset"),
        meta("timestamp", "timestamp").alias("kafka_timestamp"),
        base64_text(meta("key", "string").cast("binary")).alias("key_base64"),
        base64_text(record.cast("binary")).alias("value_base64"),
        reason.alias("error"),
        F.current_timestamp().alias("dead_lettered_at"),
    )


def pipeline_letters(
    rows: DataFrame, pipeline_id: str, batch_id: int, reason: Column, record: Column
) -> DataFrame:
    """A pipeline's dead-letter rows: ``reason`` and ``record`` (JSON) per row of ``rows``."""
    from pyspark.sql import functions as F  # noqa: N812

    return rows.select(
        F.lit(pipeline_id).alias("pipeline_id"),
        F.lit(batch_id).cast("bigint").alias("batch_id"),
        reason.alias("reason"),
        record.alias("record"),
        F.current_timestamp().alias("dead_lettered_at"),
    )


def log_unknown_fields(batch_id: int, count: int, names: Iterable[str]) -> None:
    """What ``deltaflow ingest`` says of a batch's messages with fields the table lacks (both
    engines): they are not stored."""
    logger.warning(
        "batch %s: %d message(s) carry fields the table lacks, not stored: %s (enable "
        "them by adding the columns to the table or to --schema)",
        batch_id,
        count,
        ", ".join(sorted(names)[:20]),
    )


def log_failed(batch_id: int, failed: int, first_error: str | None, *, dead_letter_table: bool) -> None:
    """What ``deltaflow ingest`` says of a batch's failed messages (both engines): dead letters,
    or skipped when there is no dead-letter table."""
    if not dead_letter_table:
        logger.warning(
            "batch %s: %d message(s) could not be decoded or transformed and are skipped (no "
            "dead-letter table; set --dlq_table_location to keep them). First error: %s",
            batch_id,
            failed,
            first_error,
        )
    else:
        logger.info(
            "batch %s: %d message(s) to the dead-letter table; first error: %s", batch_id, failed, first_error
        )

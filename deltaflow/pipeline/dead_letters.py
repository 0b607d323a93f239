"""Dead letters: the rows a pipeline could not land, in a Delta table of their own.

Two layouts, both defined here:

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
* Pipelines (``deltaflow run``/``sql``): one row per record of any source, with the reason (an
  expectation with ``action: drop``, an undecodable Kafka message) and the record as JSON
  (:data:`PIPELINE_SCHEMA`). Its txn is the pipeline's batch id, like its sinks'.

Both are written before the main table's commit of the same batch, so a crash between the two
never leaves a main row whose failed neighbours are lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from deltaflow.config.transforms import Transform
from deltaflow.pipeline.transforms import apply_transforms

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "INGEST_META",
    "KAFKA_COLUMNS",
    "KDI_COLUMNS",
    "PIPELINE_SCHEMA",
    "base64_text",
    "ingest_letters",
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
#: Columns of a pipeline's dead-letter table.
PIPELINE_SCHEMA = (
    "pipeline_id STRING, batch_id BIGINT, reason STRING, record STRING, dead_lettered_at TIMESTAMP"
)


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

"""A Kafka message as a row on the Spark engine: ``deltaflow ingest`` and YAML pipelines alike,
and as the Arrow engine makes it (:mod:`deltaflow.sources.kafka_ingest`), so that a pipeline's
tables do not depend on the engine it runs on.

* :func:`decoded_fields`: the fields a JSON value is decoded into (the schema given, the
  table's other columns, without what the transforms produce);
* :func:`kafka_struct`: the ``kafka`` struct the transforms and dead letters read;
* :func:`decoded_frame`: the source's rows decoded and transformed, each carrying its first
  failure (a dead letter);
* :class:`KafkaRows` (:func:`for_pipeline`): the same for a YAML pipeline, with the
  dead-letter layout of its table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaflow.config.locations import normalize_uri
from deltaflow.config.pipeline import KafkaSourceSpec, PipelineSpec
from deltaflow.config.transforms import Transform
from deltaflow.errors import ConfigError
from deltaflow.pipeline.dead_letters import (
    INGEST_META,
    Layout,
    base64_text,
    ingest_letters,
    layout_of,
    pipeline_letters,
)
from deltaflow.pipeline.transforms import apply_transforms

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = ["KafkaRows", "decoded_fields", "decoded_frame", "for_pipeline", "kafka_struct"]

logger = logging.getLogger(__name__)

#: The struct each row carries: its first failure, unknown fields, raw key and value.
META = INGEST_META


def kafka_struct() -> Column:
    """The ``kafka`` struct of a ``deltaflow-kafka`` source's rows, as the transforms and dead
    letters read it on the Spark engine (the Arrow engine builds the same in
    :mod:`deltaflow.sources.kafka_ingest`): the message's coordinates, its timestamp and
    kafka-delta-ingest's ``timestamp_type``, its key as UTF-8 text (invalid sequences replaced
    by U+FFFD, as Python's ``errors="replace"`` does), its headers."""
    from pyspark.sql import functions as F  # noqa: N812

    return F.struct(
        "partition",
        "offset",
        "topic",
        "timestamp",
        # Kafka's ids (kafka-delta-ingest's kafka.timestamp_type), not librdkafka's 0/1/2.
        (F.col("timestamp_type") - 1).alias("timestamp_type"),
        F.make_valid_utf8(F.col("key").cast("string")).alias("key"),
        "headers",
    ).alias("kafka")


def decoded_frame(
    raw: DataFrame,
    transforms: Sequence[Transform],
    *,
    raw_values: bool = False,
    table_schema: pa.Schema | None = None,
) -> DataFrame:
    """The rows of a ``deltaflow-kafka`` source on the Spark engine (``ingest`` and YAML
    pipelines alike), transformed: the value's fields (or ``value`` for ``raw_values``), the
    ``kafka`` struct (:func:`kafka_struct`) and the ``_deltaflow`` struct (error,
    unknown_fields, raw key and value). A message whose decoding or a transform failed carries
    the first error: it is a dead letter.

    Args:
        raw: The source's rows.
        transforms: Applied in order (:func:`~deltaflow.pipeline.transforms.apply_transforms`).
        raw_values: The source does not decode (``--raw``).
        table_schema: The main table's schema, if it exists: per-message results take its types.
    """
    from pyspark.sql import functions as F  # noqa: N812

    kafka = kafka_struct()
    if raw_values:
        meta = F.struct(
            F.lit(None).cast("string").alias("error"),
            F.lit(None).cast("array<string>").alias("unknown_fields"),
            F.col("key"),
            F.col("value"),
        )
        decoded = raw.select(F.col("value"), kafka, meta.alias(META))
    else:
        meta = F.struct("error", "unknown_fields", "key", "value")
        decoded = raw.select("data.*", kafka, meta.alias(META))
        produced = sorted({t.target[0].lower() for t in transforms})
        if produced:
            # A field a transform produces is not "unknown" when the message carries it too.
            kept = F.filter(
                F.col(f"{META}.unknown_fields"),
                lambda name: ~F.lower(F.split(name, r"\.").getItem(0)).isin(produced),
            )
            decoded = decoded.withColumn(
                META, F.col(META).withField("unknown_fields", F.when(F.size(kept) > 0, kept))
            )
    error = f"{META}_transform_error"
    out = apply_transforms(
        decoded.withColumn(error, F.lit(None).cast("string")),
        transforms,
        table_schema=table_schema,
        errors=error,
    )
    out = out.withColumn(
        META, F.col(META).withField("error", F.coalesce(F.col(f"{META}.error"), F.col(error)))
    )
    return out.drop(error)


def decoded_fields(given: StructType, table: Any, transforms: Sequence[Transform]) -> StructType:
    """The fields a JSON value is decoded into (both engines, ``ingest`` and YAML pipelines):
    ``given``'s, then the other columns of the existing ``table`` (added by schema evolution,
    or by hand: they decode too), without what the transforms produce.

    A column a transform makes whole is not in the message; nor is a nested target (removed
    by :func:`_without_nested_targets`: decoded, it would be a null struct a transform cannot
    add to).
    """
    from pyspark.sql.types import StructType

    table_fields: list[Any] = []
    if table is not None:
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema

        produced = {t.target[0] for t in transforms if len(t.target) == 1}
        table_schema = from_arrow_schema(pa.schema(table.schema().to_arrow()))
        table_fields = [f for f in table_schema.fields if f.name not in produced]
    names = set(given.fieldNames())
    merged = StructType([*given.fields, *(f for f in table_fields if f.name not in names)])
    return _without_nested_targets(merged, transforms)


def _without_nested_targets(schema: StructType, transforms: Sequence[Transform]) -> StructType:
    """``schema`` without the nested fields transforms produce (``meta.kafka.offset``), and
    without structs left empty by that (``meta.kafka``).

    Messages do not carry them (kafka-delta-ingest's walkthrough: a table with ``meta.kafka``
    filled by ``kafka.*`` transforms). Decoded from the table's schema they would be null
    structs, and a field set inside a null struct stays null; left out, the transform adds the
    struct to its parent (the table's column order is restored when the rows are written).
    """
    from pyspark.sql.types import StructField, StructType

    targets = [t.target for t in transforms if len(t.target) > 1]
    if not targets:
        return schema

    def prune(struct: StructType, paths: list[tuple[str, ...]]) -> StructType:
        fields: list[StructField] = []
        for f in struct.fields:
            below = [p[1:] for p in paths if p[0].lower() == f.name.lower()]
            if any(len(p) == 0 for p in below):
                continue  # the transform's target itself
            if below and isinstance(f.dataType, StructType):
                inner = prune(f.dataType, below)
                if not inner.fields:
                    continue
                f = StructField(f.name, inner, f.nullable, f.metadata)
            fields.append(f)
        return StructType(fields)

    return prune(schema, targets)


def _value_schema(spec: PipelineSpec, src: KafkaSourceSpec, table: Any) -> str | None:
    """The JSON value's fields as ``deltaflow ingest`` decodes them on either engine
    (:func:`decoded_fields`): the source's ``schema``, plus the other columns of the one sink's
    ``table``, without what the transforms produce."""
    from pyspark.sql.types import StructType

    if src.format != "json" or not src.schema_:
        return src.schema_
    given = StructType.fromDDL(src.schema_)
    if not isinstance(given, StructType):
        raise ConfigError(
            f"pipeline {spec.pipeline_id!r}: source.schema must list columns, got {src.schema_!r}",
            pipeline_id=spec.pipeline_id,
        )
    return decoded_fields(given, table, spec.parsed_transforms()).json()


def _one_sink(spec: PipelineSpec) -> bool:
    """Whether the pipeline writes one table, appending (what the Arrow engine can run)."""
    return len(spec.sinks) == 1 and spec.sinks[0].write_mode == "append"


def _only_table(spec: PipelineSpec) -> Any:
    """The table of a pipeline's one append sink, when it exists (else ``None``)."""
    from deltaflow.delta import log as delta_log

    if not _one_sink(spec):
        return None
    sink = spec.sinks[0]
    return delta_log.load(normalize_uri(sink.table_uri), sink.storage_options)


@dataclass(frozen=True)
class KafkaRows:
    """A Kafka pipeline's rows on the Spark engine, made as the Arrow engine makes them (as
    ``deltaflow ingest`` does on either engine): the value's fields, the ``kafka`` struct, the
    ``transforms`` applied, and the messages whose decoding or a transform failed told apart.

    Attributes:
        value_schema: The fields the source decodes a JSON value into (Spark JSON; Avro:
            ``None``, from the Avro schema).
        keep_value: The source keeps every message's bytes (a transform may reject a decoded
            message, and its dead letter holds them).
        transforms: The pipeline's transforms.
        table_schema: The one sink's table, if it exists: per-message results take its types.
        layout: The dead-letter table's layout (:func:`~deltaflow.pipeline.dead_letters.layout_of`).
        follow_table: JSON into one append sink: the value is decoded with the table's columns
            too, and a column another writer adds while the query runs restarts it (as ingest).
    """

    value_schema: str | None
    keep_value: bool
    transforms: tuple[Transform, ...]
    table_schema: pa.Schema | None = None
    layout: Layout = "kafka"
    follow_table: bool = False

    def frame(self, raw: DataFrame) -> DataFrame:
        """The source's rows decoded and transformed, with ``kafka`` and the ``_deltaflow``
        struct (:func:`decoded_frame`)."""
        return decoded_frame(raw, self.transforms, table_schema=self.table_schema)

    @staticmethod
    def failed(frame: DataFrame) -> DataFrame:
        """The rows whose decoding or a transform failed (the dead letters)."""
        from pyspark.sql import functions as F  # noqa: N812

        return frame.filter(F.col(f"{META}.error").isNotNull())

    @staticmethod
    def good(frame: DataFrame) -> DataFrame:
        """The rows that decoded and transformed, with ``kafka`` (for ``filter``/``select``)."""
        from pyspark.sql import functions as F  # noqa: N812

        return frame.filter(F.col(f"{META}.error").isNull()).drop(META)

    def letters(self, failed: DataFrame, pipeline_id: str, batch_id: int) -> DataFrame:
        """The dead-letter rows of the messages that failed, in the table's layout."""
        if self.layout == "kafka":
            return ingest_letters(failed)
        from pyspark.sql import functions as F  # noqa: N812

        record = F.to_json(
            F.struct(
                F.col("kafka.topic").alias("topic"),
                F.col("kafka.partition").alias("partition"),
                F.col("kafka.offset").alias("offset"),
                base64_text(F.col(f"{META}.key")).alias("key_base64"),
                base64_text(F.col(f"{META}.value")).alias("value_base64"),
            )
        )
        reason = F.col(f"{META}.error")
        return pipeline_letters(failed, pipeline_id, batch_id, reason=reason, record=record)


def for_pipeline(spec: PipelineSpec) -> KafkaRows:
    """How the Spark engine makes a Kafka pipeline's rows and dead letters: as the Arrow engine
    does, into the dead-letter table's layout (an existing table made in the pipeline layout
    before Kafka pipelines took ingest's keeps it: its rows stay readable as they were)."""
    import pyarrow as pa

    from deltaflow.delta import log as delta_log

    src = spec.source
    assert isinstance(src, KafkaSourceSpec)
    table = _only_table(spec)
    transforms = spec.parsed_transforms()
    layout: Layout = "kafka"
    if spec.dead_letter is not None:
        uri = normalize_uri(spec.dead_letter.table_uri)
        found = layout_of(delta_log.load(uri, spec.dead_letter.storage_options))
        if found == "pipeline":
            logger.warning(
                "pipeline %r: the dead-letter table %s has the columns pipeline_id, batch_id, reason, "
                "record (made by an earlier deltaflow): its layout is kept. A new table gets the layout "
                "of the Arrow engine and deltaflow ingest (topic, partition, offset, kafka_timestamp, "
                "key_base64, value_base64, error, dead_lettered_at): point dead_letter.table_uri at a "
                "new table to take it",
                spec.pipeline_id,
                uri,
            )
            layout = "pipeline"
    return KafkaRows(
        value_schema=_value_schema(spec, src, table),
        keep_value=spec.dead_letter is not None and any(t.can_fail for t in transforms),
        transforms=tuple(transforms),
        table_schema=pa.schema(table.schema().to_arrow()) if table is not None else None,
        layout=layout,
        follow_table=src.format == "json" and _one_sink(spec),
    )

"""A Kafka message as a row on the Spark engine, as the Arrow engine makes it
(:mod:`deltaflow.sources.kafka_ingest`), so that a table does not depend on the engine that
wrote it.

* :func:`decoded_fields`: the fields a JSON value is decoded into (the schema given, the
  table's other columns, without what the transforms produce);
* :func:`kafka_struct`: the ``kafka`` struct the transforms and dead letters read;
* :func:`decoded_frame`: the source's rows decoded and transformed, each carrying its first
  failure (a dead letter).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deltaflow.config.transforms import Transform
from deltaflow.pipeline.dead_letters import INGEST_META
from deltaflow.pipeline.transforms import apply_transforms

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = ["decoded_fields", "decoded_frame", "kafka_struct"]

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
    """The rows of a ``deltaflow-kafka`` source on the Spark engine (``ingest``), transformed:
    the value's fields (or ``value`` for ``raw_values``), the ``kafka`` struct
    (:func:`kafka_struct`) and the ``_deltaflow`` struct (error, unknown_fields, raw key and
    value). A message whose decoding or a transform failed carries the first error: it is a
    dead letter.

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
    """The fields a JSON value is decoded into (both engines of ``ingest``):
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

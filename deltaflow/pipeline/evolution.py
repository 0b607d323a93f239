"""Schema evolution of ``deltaflow ingest``: new top-level message fields become table columns.

Both engines use it the same way: a micro-batch with unknown fields names them; the ones the
table lacks at the top level are typed by Spark's JSON inference over sampled message texts,
added to the table in a commit of their own, and the query restarts
(:class:`~deltaflow.errors.SchemaEvolvedError`) to decode the batch again with them. Nothing of
that batch is committed. The samples come from the batch's rows on the Spark engine and from
the source tasks' results on the Arrow engine.

Columns another writer adds while ingest runs are followed too (kafka-delta-ingest picks up a
table's new schema): a batch whose messages carry a top-level field the table now has as a
column is not committed, and the query restarts to decode it (:func:`restart_if_table_gained`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from deltaflow.config.locations import normalize_uri
from deltaflow.config.sink import SinkOptions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "SCHEMA_SAMPLE_PER_PARTITION",
    "evolve_schema",
    "infer_json",
    "new_top_level_fields",
    "restart_if_table_gained",
    "sample_text",
    "sample_texts",
]

#: Messages sampled per partition (or task) to infer the types of a JSON schema.
SCHEMA_SAMPLE_PER_PARTITION = 1000


def sample_text(value: bytes | None, gzipped: bool) -> str | None:
    """A message value as text for schema inference (gunzipped; None: nothing to sample)."""
    if not value:
        return None
    if gzipped:
        from deltaflow.sources.decode import decompress

        (value,), _errors = decompress([value], "gzip")
        if value is None:
            return None  # a dead letter, not a sample
    return value.decode("utf-8", "replace")


def sample_texts(values: Sequence[bytes | None], gzipped: bool) -> list[str]:
    """:func:`sample_text` of each value, the empty ones left out."""
    return [t for v in values if (t := sample_text(v, gzipped))]


def new_top_level_fields(options: SinkOptions, names: Sequence[str]) -> set[str]:
    """The unknown field names evolution adds: top-level ones the table lacks. Nested new fields
    are reported only (Delta cannot add them to a struct in place); a name the table has in
    another case would clash (Delta names are case-insensitive)."""
    from deltaflow.delta import log as delta_log

    table = delta_log.load(normalize_uri(options.table_uri), options.storage_options)
    if table is None:
        return set()
    have = {name.lower() for name in table.schema().to_arrow().names}
    return {n for n in names if "." not in n and n.lower() not in have}


def restart_if_table_gained(options: SinkOptions, names: Iterable[str], batch_id: int) -> None:
    """Restart when the table has columns for fields this batch's messages carry but the query
    does not decode: another writer added them since the query started.

    Only exact-case top-level names count (a name the decoder treats as unknown in another case
    would restart forever).

    Raises:
        SchemaEvolvedError: such columns exist; nothing of this batch is committed, and the
            restarted query decodes the batch again with them.
    """
    from deltaflow.delta import log as delta_log
    from deltaflow.errors import SchemaEvolvedError

    top = {n for n in names if "." not in n}
    if not top:
        return
    uri = normalize_uri(options.table_uri)
    table = delta_log.load(uri, options.storage_options)
    if table is None:
        return
    gained = sorted(top & set(table.schema().to_arrow().names))
    if gained:
        raise SchemaEvolvedError(
            f"batch {batch_id}: {uri} has column(s) {', '.join(gained)} that the query does not "
            "decode (added since it started); restarting the query to decode them (nothing of "
            "the batch was committed)",
            batch_id=batch_id,
            table_uri=uri,
        )


def infer_json(spark: SparkSession, texts: Sequence[str]) -> StructType:
    """Spark's JSON inference over ``texts`` (one JSON document each), as ``spark.read.json``
    types them, run in the JVM alone: the texts enter as one Arrow column, so no Python worker
    process is started for them (an RDD of Python strings starts a worker daemon and workers
    that then idle for the life of the process: 3 processes and ~70 MiB)."""
    import pyarrow as pa
    from pyspark.sql.types import StructType

    if not texts:
        return StructType([])
    frame = spark.createDataFrame(pa.table({"value": pa.array(list(texts), pa.string())}))
    return spark.read.json(frame).schema  # a DataFrame of strings: parsed in the JVM (also on Connect)


def evolve_schema(
    spark: SparkSession, options: SinkOptions, batch_id: int, top: set[str], texts: Any
) -> None:
    """Add the ``top`` fields as columns, typed by Spark's JSON inference over ``texts`` (message
    texts: a list, or an RDD of them), then ask for a restart.

    Raises:
        SchemaEvolvedError: columns were added; nothing of this batch is committed, and the
            restarted query decodes the batch again with the new columns.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    from deltaflow.delta import commit
    from deltaflow.errors import SchemaEvolvedError

    inferred = infer_json(spark, texts) if isinstance(texts, list) else spark.read.json(texts).schema
    new = [f for f in inferred.fields if f.name in top]
    if not new:
        return
    uri = normalize_uri(options.table_uri)
    commit.add_columns(
        uri,
        options.storage_options,
        [pa.field(f.name, to_arrow_type(f.dataType), True) for f in new],
        policy=commit.RetryPolicy(max_retries=options.max_commit_retries),
    )
    added = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in new)
    raise SchemaEvolvedError(
        f"batch {batch_id}: added column(s) {added} "
        f"to {uri} for new message fields; restarting the query to decode them (nothing of the "
        "batch was committed)",
        batch_id=batch_id,
        table_uri=uri,
    )

"""CDC into Delta: upserts and deletes by key, applied with delta-rs MERGE (``write_mode: merge``).

Per micro-batch :class:`MergeWriter`:

1. Replay check: ``txn(pipeline_id)`` already holds this batch -> nothing to do.
2. Normalise the rows (:func:`changes`): each becomes the row image, an operation (upsert or
   delete) and a sequence (``sequence_by``). Debezium envelopes: ``after`` for c/r/u, ``before``
   for d; truncates and messages without an image are skipped and counted.
3. Keep the latest change per key (highest sequence; at equal sequences the later row).
4. Collect them to the driver as Arrow and MERGE them in ONE commit carrying the txn:
   delete where the key matches and the change is a delete, update where it matches, insert
   where it does not (deletes of unknown keys do nothing). With a sequence, a matched row is
   touched only by a strictly newer change: a replayed or late older change never overwrites
   a newer one. A commit conflict (another writer) retries the whole step from 1.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltaflow._version import __version__
from deltaflow.config.locations import normalize_uri
from deltaflow.config.sink import SinkOptions, for_stream
from deltaflow.errors import ConfigError, DeltaflowError, MergeError
from deltaflow.io import logs
from deltaflow.io.changes import OP_COLUMN, SEQUENCE_COLUMN
from deltaflow.io.faults import maybe_crash
from deltaflow.metrics import metrics

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["OP", "SEQUENCE_COLUMN", "MergeWriter", "changes", "target_rows"]

logger = logging.getLogger(__name__)

#: The column of the target table keeping the sequence of the change applied last, and the
#: normalised operation of a change (``upsert`` or ``delete``, never stored): the names every
#: mirror's merge shares (:mod:`deltaflow.io.changes`).
OP = OP_COLUMN
_ORDER = "_deltaflow_arrival"
#: What ``cdc_format: op`` accepts (case-insensitive), by meaning.
DELETE_OPS = ("d", "delete", "deleted")
UPSERT_OPS = (
    "c",
    "r",
    "u",
    "i",
    "insert",
    "update",
    "upsert",
    "create",
    "read",
    "snapshot",
    "update_postimage",
)
#: Operations that are not a row's new state (a Change Data Feed's pre-image, a truncate):
#: skipped without a warning.
SKIPPED_OPS = ("update_preimage", "t", "truncate")


def _sequence(df: DataFrame, options: SinkOptions) -> Column | None:
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import StructType

    if options.sequence_by:
        return F.expr(options.sequence_by)
    if options.cdc_format == "debezium":
        source = df.schema["source"].dataType if "source" in df.columns else None
        if isinstance(source, StructType) and "lsn" in source.fieldNames():
            return F.col("source.lsn")
        if "ts_ms" in df.columns:
            return F.col("ts_ms")
    return None


def changes(df: DataFrame, options: SinkOptions) -> DataFrame:
    """The rows of ``df`` as changes: the image's columns, ``_deltaflow_op`` and (with a
    sequence) ``_change_sequence``. Debezium's ``{"payload": {...}}`` wrapping is unwrapped."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import StructType

    if options.cdc_format == "debezium" and "payload" in df.columns and "after" not in df.columns:
        df = df.select("payload.*")
    sequence = _sequence(df, options)
    if options.cdc_format == "debezium":
        missing = [c for c in ("before", "after", "op") if c not in df.columns]
        if missing:
            raise ConfigError(
                f"cdc_format debezium needs the envelope's columns before, after and op; the rows lack "
                f"{', '.join(missing)} (give the source a schema like 'before STRUCT<...>, after "
                "STRUCT<...>, op STRING, ts_ms BIGINT, source STRUCT<lsn: BIGINT>')",
                table_uri=options.table_uri,
            )
        if not isinstance(df.schema["after"].dataType, StructType):
            raise ConfigError("cdc_format debezium: 'after' must be a struct of the row's columns")
        op = F.lower(F.col("op"))
        op_skipped = op.isin(*SKIPPED_OPS)
        image = F.when(op == "d", F.col("before")).otherwise(F.col("after"))
        kind = F.when(op == "d", F.lit("delete")).when(op.isin("c", "r", "u"), F.lit("upsert"))
        columns = [F.col("_image")[f.name].alias(f.name) for f in df.schema["after"].dataType.fields]
        base = df.filter(op.isNull() | ~op_skipped).select(
            image.alias("_image"),
            kind.alias(OP),
            *([sequence.alias(SEQUENCE_COLUMN)] if sequence is not None else []),
        )
        base = base.filter(F.col("_image").isNotNull())
        out = base.select(*columns, OP, *([SEQUENCE_COLUMN] if sequence is not None else []))
    elif options.cdc_format == "op":
        if options.op_column not in df.columns:
            raise ConfigError(
                f"cdc_format op: the rows have no column {options.op_column!r} (set op_column)",
                table_uri=options.table_uri,
            )
        op = F.lower(F.trim(F.col(options.op_column)))
        kind = F.when(op.isin(*DELETE_OPS), F.lit("delete")).when(op.isin(*UPSERT_OPS), F.lit("upsert"))
        data = [F.col(f"`{c}`") for c in df.columns if c != options.op_column]
        extra = [sequence.alias(SEQUENCE_COLUMN)] if sequence is not None else []
        out = df.filter(~op.isin(*SKIPPED_OPS) | op.isNull()).select(*data, kind.alias(OP), *extra)
    else:
        extra = [sequence.alias(SEQUENCE_COLUMN)] if sequence is not None else []
        out = df.select(*[F.col(f"`{c}`") for c in df.columns], F.lit("upsert").alias(OP), *extra)
    missing_keys = [k for k in options.key_columns if k not in out.columns]
    if missing_keys:
        raise ConfigError(
            f"key column(s) {', '.join(missing_keys)} are not among the row's columns "
            f"({', '.join(c for c in out.columns if c != OP)})",
            table_uri=options.table_uri,
        )
    return out


def target_rows(df: DataFrame, options: SinkOptions) -> DataFrame:
    """The shape of the target table's rows (for creating it): the changes without the op."""
    return changes(df, options).drop(OP)


def latest_per_key(df: DataFrame, options: SinkOptions) -> DataFrame:
    """One change per key: the highest sequence, at equal sequences the row that came later."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F  # noqa: N812

    ordered = df.withColumn(_ORDER, F.monotonically_increasing_id())
    order = [F.col(_ORDER).desc()]
    if SEQUENCE_COLUMN in df.columns:
        order.insert(0, F.col(SEQUENCE_COLUMN).desc_nulls_last())
    window = Window.partitionBy(*(F.col(f"`{k}`") for k in options.key_columns)).orderBy(*order)
    return ordered.withColumn("_rank", F.row_number().over(window)).filter("_rank = 1").drop("_rank", _ORDER)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class MergeWriter:
    """``foreachBatch`` function (or one sink of a pipeline) applying each batch's changes."""

    def __init__(self, options: SinkOptions) -> None:
        options = for_stream(options)
        if options.write_mode != "merge":
            raise ConfigError("MergeWriter needs write_mode merge", table_uri=options.table_uri)
        self._options = options
        self._uri = normalize_uri(options.table_uri)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with logs.context(table=self._uri):  # the pipeline and batch: the batch function's
            self._apply(batch, batch_id)

    def _apply(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F  # noqa: N812

        from deltaflow.delta import commit
        from deltaflow.delta import log as delta_log
        from deltaflow.delta.progress import is_committed
        from deltaflow.delta.schema import spark_to_arrow
        from deltaflow.sinks.datasource import sink_fence
        from deltaflow.sinks.spark_checkpoint import streaming_query_id

        opts = self._options
        app = opts.pipeline_id or ""
        query_id = streaming_query_id(batch, opts)  # the checkpoint the batch runs on
        table = delta_log.load(self._uri, opts.storage_options)
        # A writer another process took the pipeline from stops here, also before it skips.
        commit.check_fence(table, self._uri, sink_fence(opts))
        if is_committed(table, self._uri, app, batch_id, streaming=True, checkpoint=query_id):
            metrics.batch_skipped(pipeline=app, table=self._uri)
            logger.info("batch %s of %r is already merged into %s: replay skipped", batch_id, app, self._uri)
            return
        cached = batch.is_cached  # a pipeline with several outputs cached it already
        batch = batch if cached else batch.persist()  # read twice: the checks, then the changes
        try:
            normalised = changes(batch, opts)
            self._check_rows(normalised, batch_id)
            rows = latest_per_key(normalised.filter(F.col(OP).isNotNull()), opts)
            started = time.monotonic()
            data = rows.toArrow()
        finally:
            if not cached:
                batch.unpersist()
        if data.num_rows == 0:
            return
        schema = spark_to_arrow(rows.schema)
        data = data.cast(schema) if data.schema != schema else data
        maybe_crash("before_commit", batch_id, self._uri)
        self._merge(data, batch_id, started, query_id)
        maybe_crash("after_commit", batch_id, self._uri)

    def _check_rows(self, rows: DataFrame, batch_id: int) -> None:
        """Refuse changes without a sequence (they could not be ordered: nothing is merged);
        count the rows whose operation is not a row change."""
        from pyspark.sql import functions as F  # noqa: N812

        sequenced = SEQUENCE_COLUMN in rows.columns
        stats = rows.agg(
            F.sum(F.when(F.col(OP).isNull(), 1).otherwise(0)).alias("unknown"),
            (F.sum(F.when(F.col(SEQUENCE_COLUMN).isNull(), 1).otherwise(0)) if sequenced else F.lit(0)).alias(
                "unsequenced"
            ),
        ).first()
        unknown, unsequenced = (
            (int(stats["unknown"] or 0), int(stats["unsequenced"] or 0)) if stats else (0, 0)
        )
        if unsequenced:
            raise MergeError(
                f"batch {batch_id}: {unsequenced} change(s) have no sequence (sequence_by "
                f"{self._options.sequence_by or 'default'} is NULL for them; for Debezium deletes an "
                "expression over 'after' is NULL: use source.lsn or ts_ms); nothing was merged",
                table_uri=self._uri,
                batch_id=batch_id,
            )
        if unknown:
            logger.warning(
                "batch %s: %d row(s) for %s carry an operation that is not an insert, update or delete "
                "(skipped)",
                batch_id,
                unknown,
                self._uri,
            )

    def _merge(self, data: pa.Table, batch_id: int, started: float, query_id: str | None) -> None:
        """ONE delta-rs MERGE carrying ``txn(pipeline_id, batch_id)`` and the mark of the
        checkpoint ``query_id`` it runs on, under the commit rule."""
        from deltalake.exceptions import DeltaError

        from deltaflow.delta import commit
        from deltaflow.delta.progress import batch_txns, is_committed
        from deltaflow.sinks.datasource import sink_fence

        opts = self._options
        app = opts.pipeline_id or ""
        sequenced = SEQUENCE_COLUMN in data.column_names
        on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in opts.key_columns)
        seq = _quote(SEQUENCE_COLUMN)
        # Ties go to the later change (the txn already keeps a replay out).
        newer = f" AND (t.{seq} IS NULL OR s.{seq} >= t.{seq})" if sequenced else ""

        def attempt(table: Any, props: Any) -> dict[str, Any]:
            if table is None:
                raise ConfigError(f"the merge target {self._uri!r} does not exist", table_uri=self._uri)
            merged: dict[str, Any] = (
                table.merge(data, predicate=on, source_alias="s", target_alias="t", commit_properties=props)
                .when_matched_delete(predicate=f"s.{OP} = 'delete'{newer}")
                .when_matched_update_all(predicate=f"s.{OP} = 'upsert'{newer}", except_cols=[OP])
                .when_not_matched_insert_all(predicate=f"s.{OP} = 'upsert'", except_cols=[OP])
                .execute()
            )
            return merged

        try:
            outcome = commit.commit(
                self._uri,
                opts.storage_options,
                attempt,
                what=f"merge of batch {batch_id} of {app!r}",
                metadata={
                    "deltaflow.version": __version__,
                    "deltaflow.pipeline_id": app,
                    "deltaflow.epoch": batch_id,
                    "deltaflow.rows": data.num_rows,
                },
                txns=lambda _table: batch_txns(app, batch_id, query_id),
                already_done=lambda table: is_committed(
                    table, self._uri, app, batch_id, streaming=True, checkpoint=query_id
                ),
                fence=sink_fence(opts),
                policy=commit.RetryPolicy(max_retries=opts.max_commit_retries),
            )
        except DeltaflowError:
            metrics.commit_failed(pipeline=app, table=self._uri)
            raise
        except DeltaError as exc:  # a type mismatch, an unknown column: retrying cannot help
            metrics.commit_failed(pipeline=app, table=self._uri)
            raise MergeError(
                f"merge of batch {batch_id} into {self._uri!r} failed: {exc}; nothing was committed",
                table_uri=self._uri,
                batch_id=batch_id,
            ) from exc
        if not outcome.committed:
            metrics.batch_skipped(pipeline=app, table=self._uri)
            logger.info("batch %s of %r is already merged into %s: replay skipped", batch_id, app, self._uri)
            return
        result: dict[str, Any] = dict(outcome.value or outcome.info.get("operationMetrics") or {})
        attempts = outcome.attempts
        metrics.batch_committed(
            pipeline=app,
            table=self._uri,
            rows=data.num_rows,
            files=int(result.get("num_target_files_added", 0)),
            bytes_=0,
            seconds=time.monotonic() - started,
            retries=attempts - 1,
        )
        logger.info(
            "merged batch %s of %r into %s: %d change(s): %d inserted, %d updated, %d deleted",
            batch_id,
            app,
            self._uri,
            data.num_rows,
            int(result.get("num_target_rows_inserted", 0)),
            int(result.get("num_target_rows_updated", 0)),
            int(result.get("num_target_rows_deleted", 0)),
        )

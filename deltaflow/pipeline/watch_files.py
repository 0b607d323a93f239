"""Watching a folder: Parquet files registered in a Delta table as they land, exactly once.

Spark owns the query: the ``deltaflow-landed-files`` source
(:mod:`deltaflow.sources.landed_files`) lists the folder or prefix with pyarrow, its offsets
record which files each micro-batch took (Spark's checkpoint keeps them), and Spark schedules
the batches; no file content is read.
Each micro-batch calls :func:`deltaflow.ops.add_files` with its paths: ONE commit per batch,
carrying ``txn(pipeline_id, batch_id)``. Exactly once: a batch replayed after its commit landed
(killed before Spark recorded it) finds every one of its paths in the table and commits nothing;
a lost commit response is found in the log by the commit's token.

Files must appear complete (object stores do; on local disk write elsewhere and rename into
the folder): a file is taken once, and a file whose footer cannot be read stops the query. The
folder is local or on an object store (pyarrow lists it; no Hadoop connector is needed); the
table may be anywhere, with ``copy`` for a folder outside its root. Files the table holds or its
registration records name are never offered again, so a lost checkpoint re-registers nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from deltaflow.config.locations import normalize_uri
from deltaflow.metrics import metrics
from deltaflow.pipeline.interrupts import stoppable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from deltaflow.ops.compaction import CompactionPolicy

__all__ = ["FileRegistrar", "start_watch"]

logger = logging.getLogger(__name__)


class FileRegistrar:
    """The ``foreachBatch`` function: a micro-batch's files into one ``add_files`` commit."""

    def __init__(
        self,
        table_uri: str,
        pipeline_id: str,
        *,
        copy: bool,
        storage_options: Mapping[str, str],
        compaction: CompactionPolicy | None = None,
    ) -> None:
        self.table_uri = table_uri
        self.pipeline_id = pipeline_id
        self.copy = copy
        self.storage_options = dict(storage_options)
        self.compaction = compaction

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from deltaflow import ops

        # The source's rows: URIs of data files (it lists as `add-files FOLDER` searches).
        paths = sorted({row[0] for row in batch.select("path").collect()})
        if not paths:
            return
        started = time.monotonic()
        result = ops.add_files(
            self.table_uri,
            paths,
            copy=self.copy,
            storage_options=self.storage_options,
            txn=(self.pipeline_id, batch_id),
        )
        logger.info(
            "pipeline %r batch %d: %d file(s) (%d rows) registered in %s as version %s, %d already there",
            self.pipeline_id,
            batch_id,
            result.files_added,
            result.rows_added,
            self.table_uri,
            result.version,
            result.files_skipped,
        )
        if result.version is not None and result.files_added:
            # As the sinks report their commits: rows are what the pipeline's summary counts.
            metrics.batch_committed(
                pipeline=self.pipeline_id,
                table=self.table_uri,
                rows=result.rows_added,
                files=result.files_added,
                bytes_=result.bytes_added,
                seconds=time.monotonic() - started,
                retries=0,
            )
        elif not result.files_added:
            metrics.batch_skipped(pipeline=self.pipeline_id, table=self.table_uri)
        if self.compaction is not None and result.files_added:
            from deltaflow.ops.compaction import compactor_for

            # As a sink does after its commit: the partitions that got files, to the table's
            # background compactor (and its vacuum schedule). Both keep registered files.
            compactor = compactor_for(
                self.table_uri, self.storage_options, self.compaction, pipeline=self.pipeline_id
            )
            compactor.after_commit(f.partition_values for f in result.files)


def start_watch(
    spark: SparkSession,
    *,
    table_uri: str,
    path: str,
    pipeline_id: str,
    checkpoint_location: str,
    copy: bool = False,
    storage_options: Mapping[str, str] | None = None,
    available_now: bool = False,
    trigger_interval: float | None = None,
    max_files_per_trigger: int | None = None,
    compaction: CompactionPolicy | None = None,
) -> StreamingQuery:
    """Start the query that registers every ``*.parquet`` file landing below ``path``.

    ``compaction``: auto-compaction (and scheduled vacuum) after each commit, as the sinks have
    it; the registered originals a compaction replaces stay on disk (vacuum keeps them).

    ``path`` is a local folder or an object-store prefix (listed with pyarrow by
    :mod:`deltaflow.sources.landed_files`).
    """
    import json

    from deltaflow.sources.landed_files import LandedFilesDataSource
    from deltaflow.sources.streams import load_stream

    folder = normalize_uri(path)
    options = {
        "path": folder,
        "table_uri": normalize_uri(table_uri),
        "storage_options": json.dumps(dict(storage_options or {})),
    }
    if max_files_per_trigger:
        options["max_files_per_trigger"] = str(max_files_per_trigger)
    files = load_stream(spark, LandedFilesDataSource, options)
    writer = FileRegistrar(
        normalize_uri(table_uri),
        pipeline_id,
        copy=copy,
        storage_options=storage_options or {},
        compaction=compaction,
    )
    stream = (
        files.writeStream.foreachBatch(stoppable(writer, pipeline=pipeline_id))
        .option("checkpointLocation", checkpoint_location)
        .queryName(pipeline_id)
    )
    if available_now:
        stream = stream.trigger(availableNow=True)
    elif trigger_interval:
        stream = stream.trigger(processingTime=f"{trigger_interval} seconds")
    logger.info(
        "pipeline %r: registering Parquet files landing in %s in %s (checkpoint %s)",
        pipeline_id,
        folder,
        writer.table_uri,
        checkpoint_location,
    )
    from deltaflow.pipeline.session import start_query

    return start_query(stream, spark, pipeline_id)

"""The ``foreachBatch`` writer: one micro-batch DataFrame -> files -> one Delta commit.

Used by ``write_stream(write_path="spark")`` and by pipelines that write a batch to several
tables (``deltaflow ingest`` with a dead-letter table). Files are written one of two ways:

* ``spark`` (tables on a filesystem every Spark process shares: local disk, NFS): Spark's
  native Parquet writer, faster than handing rows to Python workers as Arrow (BENCHMARKS.md).
* ``arrow`` (any storage, object stores included): ``mapInArrow`` tasks write the files with
  pyarrow, exactly as the ``deltaflow`` data source's executors do, and return what they wrote.

Either way the driver commits them with the sink's commit sequence
(:meth:`deltaflow.sinks.datasource._DeltaSink.commit_batch`, steps 1-5 of DESIGN.md's commit
sequence). Before them, for micro-batch N:

Step 0. Replay check BEFORE writing: if ``txn(pipeline_id)`` ≥ N nothing is written at all.
        Then the files are written.
        ``spark``: Spark writes the batch under
        ``<table>/_deltaflow/staging/<pipeline_id>/e<epoch>/<writer>/b<N>`` (cleared first: a
        crashed attempt may have left files there; Delta readers ignore it, and vacuum never
        deletes the files of a writer whose claim is live), counting the rows its tasks write;
        each file is renamed into its Hive partition folder of the table as
        ``part-b<N>-<spark's name>`` and described (size, partition values, footer statistics).
        The files must hold every row the tasks wrote: files that vanished before they were
        moved (deleted by another process) fail the batch, never commit it without their rows.
        ``arrow``: each task writes ``part-b<N>-p<task>-a<attempt>-*.parquet`` into the table.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from deltaflow.config.locations import normalize_uri
from deltaflow.config.sink import SinkOptions, for_stream
from deltaflow.delta.layout import staging_dir
from deltaflow.delta.progress import is_committed
from deltaflow.delta.schema import file_schema
from deltaflow.errors import WrittenFilesLostError
from deltaflow.io.faults import maybe_crash
from deltaflow.io.footers import hive_partitions
from deltaflow.io.parquet import WrittenFile, stats_json
from deltaflow.metrics import metrics
from deltaflow.sinks.datasource import DeltaCommitMessage, _DeltaSink, sink_fence
from deltaflow.sinks.spark_checkpoint import streaming_query_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["PendingCommit", "SparkBatchWriter"]

logger = logging.getLogger(__name__)

#: What an ``arrow`` write task returns to the driver: its pickled commit message.
_MESSAGE_SCHEMA = pa.schema([("m", pa.binary())])

#: Where Spark writes a batch before its files move into the table (under the table root).


@dataclass(frozen=True)
class PendingCommit:
    """Files of one micro-batch written to a table and not committed yet."""

    sink: _DeltaSink
    messages: list[DeltaCommitMessage]
    batch_id: int


class SparkBatchWriter:
    """``foreachBatch`` function: Spark writes Parquet, the driver commits to Delta."""

    def __init__(self, options: SinkOptions, *, overwrite: bool = False) -> None:
        options = for_stream(options)
        self._options = options
        self._overwrite = overwrite
        self._root = Path(normalize_uri(options.table_uri))  # used by the spark way only
        # One staging folder per writer object (process): a zombie copy of the pipeline clears
        # and fills its own folder, never this one's.
        # Under its writer epoch: vacuum --full keeps the files of a writer whose claim is live.
        self._staging_root = Path(
            staging_dir(str(self._root), options.pipeline_id, _writer_token(), options.writer_epoch)
        )
        # Bytes per row seen in the last batch: turns target_file_size_mb into Spark's
        # maxRecordsPerFile (Spark itself cannot roll files by size).
        self._bytes_per_row: float | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        pending = self.write_files(batch, batch_id)
        if pending is not None:
            self.commit(pending)

    def write_files(self, batch: DataFrame, batch_id: int) -> PendingCommit | None:
        """Step 0: write the batch's files, commit nothing; ``None`` for a replay.

        The caller then commits it (:meth:`commit`) or drops it (:meth:`discard`); files left by
        a crash in between are orphans no reader sees (vacuum full removes them).
        """
        from deltaflow.delta import commit
        from deltaflow.delta import log as delta_log

        opts = self._options
        sink = _DeltaSink(opts, batch.schema, self._overwrite)
        query_id = streaming_query_id(batch, opts)  # the checkpoint the batch runs on

        # Step 0. Replay check before writing anything (with kafka_offsets the source has already
        # left out every offset the table holds: a replayed batch is empty, and step 2 of the
        # commit checks the fence). A writer another process took the pipeline from stops here,
        # before the replay check: its batch may be one the other has committed, or older.
        if not opts.kafka_offsets:
            table = delta_log.load(sink.table_uri, opts.storage_options)
            commit.check_fence(table, sink.table_uri, sink_fence(opts))
            if is_committed(
                table, sink.table_uri, opts.pipeline_id, batch_id, streaming=True, checkpoint=query_id
            ):
                logger.info(
                    "batch %s of %r is already committed: replay skipped",
                    batch_id,
                    opts.pipeline_id,
                    extra={"table": sink.table_uri},
                )
                return None

        # Step 0 (cont.). Write the files.
        started = time.monotonic()
        if opts.uses_spark_writer:
            staging = self._staging_root / f"b{batch_id:06d}"
            shutil.rmtree(staging, ignore_errors=True)
            written = self._spark_write(batch, staging)
            files = self._move_into_table(staging, sink, batch_id)
            shutil.rmtree(staging, ignore_errors=True)
            self._check_rows(sink, files, written, batch_id)
            messages = [DeltaCommitMessage(files, 0, 0, query_id)]
            maybe_crash("write", batch_id)
        else:
            messages = [replace(m, query_id=query_id) for m in _arrow_write(batch, sink, batch_id)]
        metrics.batch_written(
            pipeline=opts.pipeline_id or "", table=sink.table_uri, seconds=time.monotonic() - started
        )
        logger.debug(
            "batch %s: wrote %d file(s) in %.2f s",
            batch_id,
            sum(len(m.files) for m in messages),
            time.monotonic() - started,
        )
        return PendingCommit(sink, messages, batch_id)

    def commit(self, pending: PendingCommit) -> None:
        """Steps 1-5 of the sink: the same checks and the same single commit."""
        pending.sink.commit_batch(pending.messages, pending.batch_id)

    def discard(self, pending: PendingCommit) -> None:
        """Delete the files of a batch that will not be committed."""
        files = [f for m in pending.messages for f in m.files]
        deleted = pending.sink.delete_uncommitted(files)
        logger.info(
            "batch %s: %d uncommitted file(s) deleted",
            pending.batch_id,
            deleted,
            extra={"table": pending.sink.table_uri},
        )

    def _spark_write(self, batch: DataFrame, staging: Path) -> int:
        """Spark writes the batch into ``staging``; returns the rows its tasks wrote (counted in
        the same job)."""
        import uuid

        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        opts = self._options
        spark = batch.sparkSession
        written = Observation(f"deltaflow-written-{uuid.uuid4().hex}")
        batch = batch.observe(written, F.count(F.lit(1)).alias("rows"))
        # INT96 timestamps carry no statistics; UTC keeps partition values stable.
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        writer = batch.write.mode("overwrite").option(
            "compression", "uncompressed" if opts.compression == "none" else opts.compression
        )
        limit = opts.max_records_per_file
        if self._bytes_per_row:
            by_size = max(1, int(opts.target_file_size_bytes / self._bytes_per_row))
            limit = min(limit, by_size) if limit else by_size
        if limit:
            writer = writer.option("maxRecordsPerFile", limit)
        if opts.partition_columns:
            writer = writer.partitionBy(*opts.partition_columns)
        writer.parquet(str(staging))
        return int(written.get["rows"])

    def _check_rows(self, sink: _DeltaSink, files: list[WrittenFile], written: int, batch_id: int) -> None:
        """The files moved into the table must hold every row Spark's tasks wrote: files deleted
        under the writer (a vacuum --full with a retention shorter than a batch takes) would
        otherwise commit the batch without their rows, and Spark would record it as done.

        Raises:
            WrittenFilesLostError: rows are missing; the moved files (in no log entry) are
                deleted, nothing is committed, and the batch is written again.
        """
        found = sum(f.num_records for f in files)
        if found == written:
            return
        sink.delete_uncommitted(files)
        raise WrittenFilesLostError(
            f"batch {batch_id} of {self._options.pipeline_id!r}: Spark's tasks wrote {written} row(s) "
            f"into {str(self._staging_root)!r}, but the files found there hold {found}: files were "
            "deleted before their commit (by another process: a vacuum --full with a retention "
            "shorter than a batch takes?). Nothing of the batch was committed; it is written again",
            pipeline_id=self._options.pipeline_id,
            batch_id=batch_id,
            table_uri=sink.table_uri,
            written=written,
            found=found,
        )

    def _move_into_table(self, staging: Path, sink: _DeltaSink, batch_id: int) -> list[WrittenFile]:
        opts = self._options
        schema = file_schema(sink.schema, opts.partition_columns)
        files: list[WrittenFile] = []
        for path in sorted(staging.rglob("*.parquet")):
            rel_dir = path.parent.relative_to(staging)
            values = dict(hive_partitions(path.relative_to(staging).as_posix()))
            metadata = pq.read_metadata(path)
            size = path.stat().st_size
            name = f"part-b{batch_id:06d}-{path.name.removeprefix('part-')}"
            target_dir = self._root / rel_dir
            target_dir.mkdir(parents=True, exist_ok=True)
            os.replace(path, target_dir / name)
            files.append(
                WrittenFile(
                    path=str(rel_dir / name) if rel_dir.parts else name,
                    size=size,
                    partition_values=values,
                    num_records=metadata.num_rows,
                    stats=stats_json(metadata, schema, -1),
                    modification_time=int(time.time() * 1000),
                )
            )
        rows = sum(f.num_records for f in files)
        if rows:
            self._bytes_per_row = sum(f.size for f in files) / rows
        return files


def _writer_token() -> str:
    """``<host>-<pid>-<random>``: names this writer's staging folder."""
    import socket
    import uuid

    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _arrow_write(batch: DataFrame, sink: _DeltaSink, batch_id: int) -> list[DeltaCommitMessage]:
    """Write ``batch`` with pyarrow in its tasks; return every task's commit message."""

    def write(iterator: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        message = sink.write_task(iterator, batch_id)
        yield pa.RecordBatch.from_pydict({"m": [pickle.dumps(message)]}, schema=_MESSAGE_SCHEMA)

    rows = batch.mapInArrow(write, "m BINARY").collect()
    return [pickle.loads(r.m) for r in rows]

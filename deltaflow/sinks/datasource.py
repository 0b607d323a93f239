"""The deltaflow Delta sink: a Spark Python data source named ``deltaflow``.

Executors write Parquet files in parallel (:meth:`_DeltaSink.write_task`); the driver commits
every file of a micro-batch in ONE Delta transaction that also records ``txn(pipeline_id,
batch_id)`` (:meth:`_DeltaSink.commit_batch`). See ``docs/DESIGN.md`` for the invariants.

Spark builds a fresh writer for the executors and again for the driver-side commit, in
separate Python workers, so the writer carries nothing but the validated options and the
schema, and :meth:`DeltaflowDataSource.streamWriter` does no I/O.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from deltaflow._version import __version__
from deltaflow.config.locations import normalize_uri
from deltaflow.config.sink import SinkOptions, for_stream
from deltaflow.delta import progress
from deltaflow.delta.progress import is_committed
from deltaflow.errors import (
    CheckpointMismatchError,
    ConfigError,
    DeltaflowError,
    WriterFencedError,
    WriteValidationError,
    WrittenFilesLostError,
    storage_error,
)
from deltaflow.io import logs
from deltaflow.io.faults import maybe_crash
from deltaflow.io.parquet import PartitionedFileWriter, WrittenFile, delete_files, writer_process
from deltaflow.io.storage import filesystem
from deltaflow.metrics import metrics
from deltaflow.sinks.spark_checkpoint import read_batch_source

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from deltaflow.ops.compaction import AutoCompactor


__all__ = [
    "DeltaBatchWriter",
    "DeltaCommitMessage",
    "DeltaflowDataSource",
    "FORMAT_NAME",
    "QueryTxnStreamWriter",
]

logger = logging.getLogger(__name__)

#: The name to use with ``df.writeStream.format(...)`` after :func:`deltaflow.register`.
FORMAT_NAME = "deltaflow"

#: Executors compute statistics for every column; the driver trims them to the table's
#: ``delta.dataSkippingNumIndexedCols`` (only the driver reads the log).
_ALL_COLUMNS = -1


@dataclass
class DeltaCommitMessage(WriterCommitMessage):
    """What one task wrote. Never ``None``: an empty task returns an empty file list."""

    files: list[WrittenFile] = field(default_factory=list)
    partition_id: int = -1
    attempt: int = 0
    query_id: str | None = None
    #: ``<host>:<pid of the executor's Python daemon>``: which executor process wrote the files.
    writer: str = ""


class DeltaflowDataSource(DataSource):
    """Spark data source ``deltaflow``: batch and streaming writes to a Delta table."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def writer(self, schema: StructType, overwrite: bool) -> DeltaBatchWriter:
        options = _table_partitioning(self.options, _arrow_options(self.options), schema.fieldNames())
        sink = _DeltaSink(options, schema, overwrite)
        return DeltaBatchWriter(sink)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DeltaStreamWriter:  # noqa: N802
        options = _table_partitioning(
            self.options, for_stream(_arrow_options(self.options)), schema.fieldNames()
        )
        return DeltaStreamWriter(_DeltaSink(options, schema, overwrite))


class DeltaStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer: one Delta commit per micro-batch, ``txn`` version = batch id."""

    def __init__(self, sink: _DeltaSink) -> None:
        self._sink = sink

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        return self._sink.write_task(iterator)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self._sink.commit_batch(messages, batchId)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self._sink.abort_batch(messages, batchId)


class QueryTxnStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer whose ``txn`` app id is the query's id, as delta-spark's own sink records
    it (``format("delta")`` served by deltaflow): the id lives in the query's checkpoint, so a
    restart from the checkpoint recognises its batches, and a new checkpoint is a new writer."""

    def __init__(self, options: SinkOptions, schema: StructType, overwrite: bool) -> None:
        self._sink = _DeltaSink(options, schema, overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        return self._sink.write_task(iterator)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        query_id = _query_id(messages)
        if query_id is None:  # no task ran: nothing was written, there is nothing to commit
            logger.info(
                "batch %s into %s had no write task: nothing to commit", batchId, self._sink.table_uri
            )
            return
        options = for_stream(self._sink.options.model_copy(update={"pipeline_id": query_id}))
        _DeltaSink(options, self._sink.schema, self._sink.overwrite).commit_batch(messages, batchId)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self._sink.abort_batch(messages, batchId)


class DeltaBatchWriter(DataSourceArrowWriter):
    """Batch writer: one Delta commit per ``save()``; ``txn`` only when ``txn_version`` is set."""

    def __init__(self, sink: _DeltaSink) -> None:
        self._sink = sink

    @classmethod
    def for_options(cls, options: SinkOptions, schema: StructType, overwrite: bool) -> DeltaBatchWriter:
        return cls(_DeltaSink(options, schema, overwrite))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        return self._sink.write_task(iterator)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        self._sink.commit_batch(messages, None)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        self._sink.abort_batch(messages, None)


class _DeltaSink:
    """State shared by the batch and streaming writers (options and schema, nothing else)."""

    def __init__(self, options: SinkOptions, schema: StructType | pa.Schema, overwrite: bool) -> None:
        from deltaflow.delta.schema import spark_to_arrow

        self.options = options
        self.table_uri = normalize_uri(options.table_uri)
        self.schema = schema if isinstance(schema, pa.Schema) else spark_to_arrow(schema)
        self.overwrite = overwrite or options.write_mode == "overwrite"
        if self.options.partition_columns:
            from deltaflow.delta.schema import check_partition_columns

            check_partition_columns(self.schema, options.partition_columns, self.table_uri)
        # A token shared by the files of one batch write (streams use the batch id instead).
        self._job_token = uuid.uuid4().hex[:8]
        # The table as this sink's last commit loaded it, with the (version, token) of the log
        # entry it was loaded at (the sink's commit before) and of the entry that commit made:
        # the next batch brings it up to date instead of loading it (:meth:`_load`).
        self._kept: tuple[Any, tuple[int, str], tuple[int, str]] | None = None
        self._last: tuple[int, str] | None = None  # the (version, token) of the last commit
        self._compactor_fed = False  # whether a commit handed its table to the compactor

    def __getstate__(self) -> dict[str, Any]:
        # A kept table is this process's (a delta-rs object): writers sent elsewhere load theirs.
        return {**self.__dict__, "_kept": None}

    # -- executors ---------------------------------------------------------------------------

    def write_task(
        self, iterator: Iterator[pa.RecordBatch], batch_id: int | None = None
    ) -> DeltaCommitMessage:
        """Write one task's data into Parquet files under the table root (no log access).

        ``batch_id`` defaults to the micro-batch Spark runs the task for (streaming writes).
        """
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if batch_id is None:
            batch_id = _local_int(ctx, "streaming.sql.batchId")
        partition_id = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        batch_tag = f"b{batch_id:06d}" if batch_id is not None else f"w{self._job_token}"
        fs, root = filesystem(self.table_uri, self.options.storage_options)
        writer = PartitionedFileWriter(
            fs=fs,
            root=root,
            schema=self.schema,
            partition_columns=self.options.partition_columns,
            compression=self.options.compression,
            target_file_size=self.options.target_file_size_bytes,
            max_records_per_file=self.options.max_records_per_file,
            file_prefix=f"part-{batch_tag}-p{partition_id:05d}-a{attempt}",
            indexed_columns=_ALL_COLUMNS,
        )
        try:
            files = writer.write_batches(iterator)
        except OSError as exc:  # the store failed: a classified error the daemon can act on
            raise storage_error(exc, self.table_uri, "writing data files of") from exc
        maybe_crash("write", batch_id)
        return DeltaCommitMessage(files, partition_id, attempt, query_id, writer_process())

    # -- driver ------------------------------------------------------------------------------

    def commit_batch(
        self,
        messages: Sequence[WriterCommitMessage | None],
        batch_id: int | None,
        *,
        source: tuple[Mapping[str, Mapping[str, int]], Mapping[str, Mapping[str, Any]]] | None = None,
    ) -> None:
        """Commit one batch. The numbered steps match ``docs/DESIGN.md``.

        ``source``: with ``kafka_offsets``, the batch's end offsets and restarts for this table
        (its topics'), when the caller read Spark's offset log already (one read for many tables).

        Step 1. Collect the files every task reported.
        Step 2. Load the table afresh; if it already holds this batch (``txn(pipeline_id)`` at
                this batch's version from this batch's checkpoint, or every Kafka partition's
                progress at its end offsets), the batch is a replay: delete its new files and
                stop. A txn version beyond this batch, or batches of another checkpoint (the
                checkpoint txn: :func:`deltaflow.delta.progress.checkpoint_mark`), mean a
                foreign checkpoint: fail, never skip. Nothing is changed before this check, not
                even the schema.
        Step 3. Check the inputs the commit itself would not: schema against the table (strict
                or merge: new columns are added now, in a commit of their own), partitioning,
                and that every file exists with its size.
        Step 4. Commit all files and the txns (the batch's and its checkpoint's) in ONE
                transaction under the commit rule (:func:`deltaflow.delta.commit.commit`; its
                first attempt starts from step 2's load unless step 3 committed): an
                error is resolved by reading the log, a commit that landed is never repeated,
                files are deleted only when another commit holds the batch.
        Step 5. Report. Spark records the batch as done only after this returns.
        """
        with self._logged(batch_id):
            from deltaflow.delta import commit
            from deltaflow.delta import log as delta_log
            from deltaflow.delta.schema import file_schema

            opts = self.options
            app_id, version = self._txn(batch_id)
            streaming = batch_id is not None
            # The checkpoint the batch runs on (its query id, as the tasks saw it): a batch the table
            # holds from another checkpoint is a lost checkpoint, not a replay.
            checkpoint = _query_id(messages) if streaming else None
            end: Mapping[str, Mapping[str, int]] | None = None
            lost: Mapping[str, Mapping[str, Any]] = {}
            if opts.kafka_offsets and batch_id is not None:
                end, lost = source if source is not None else read_batch_source(opts, batch_id)

            # Step 2, the done check and the txns of an attempt ask the same load: its txn versions
            # are read from the log once (progress.transaction_version keeps them per load).
            def kafka_txns(table: Any) -> dict[str, int]:
                return self._kafka_txns(table, end, lost) if end is not None else {}

            def already_done(table: Any) -> bool:
                if end is not None:
                    # Kafka progress: the batch is in the log when no partition it read advances it.
                    return not kafka_txns(table)
                return is_committed(
                    table, self.table_uri, app_id, version, streaming=streaming, checkpoint=checkpoint
                )

            # Step 1. Collect the files every task reported.
            files = _collect(messages)
            maybe_crash("before_commit", batch_id, self.table_uri)

            # Step 2. Replay check, before anything is changed; a writer another process took the
            # pipeline from stops here too, also when it would skip the batch or commit nothing.
            table = self._load()
            try:
                commit.check_fence(table, self.table_uri, sink_fence(opts))
                # (Kafka progress: a batch without rows that advances nothing is not a replay, just empty.)
                replay = already_done(table) and (end is None or bool(files))
            except (CheckpointMismatchError, WriterFencedError):
                self.delete_uncommitted(files)  # in no log entry, and no attempt was made
                raise
            if replay:
                self._skip(files, batch_id, "it is in the log already (a replay)")
                return

            # Step 3. Check the inputs.
            try:
                changed = self._check(table, files)
            except DeltaflowError:
                self.delete_uncommitted(files)
                raise
            if not files and not self.overwrite and table is not None and not kafka_txns(table):
                logger.debug("batch %s of %r wrote no rows: nothing to commit", batch_id, app_id)
                return
            indexed = delta_log.indexed_columns(table, opts.table_properties)
            if indexed >= 0:
                names = file_schema(self.schema, opts.partition_columns).names
                files = [_trim_stats(f, frozenset(names[:indexed])) for f in files]

            # Step 4. One transaction: files + txns + commit metadata, under the commit rule.
            rows = sum(f.num_records for f in files)
            started = time.monotonic()
            txn = {}
            if app_id is not None and version is not None:
                txn = progress.batch_txns(app_id, version, checkpoint)
            what = f"batch {batch_id if streaming else version} of {opts.pipeline_id or 'a batch write'!r}"
            try:
                result = commit.commit_files(
                    self.table_uri,
                    files,
                    what=what,
                    schema=self.schema,
                    partition_by=opts.partition_columns,
                    mode="overwrite" if self.overwrite else "append",
                    metadata={
                        **self._commit_metadata(messages, batch_id, rows),
                        **progress.data_loss_metadata(lost),
                    },
                    storage_options=opts.storage_options,
                    policy=commit.RetryPolicy(max_retries=opts.max_commit_retries),
                    create_if_missing=opts.auto_create_table,
                    properties=opts.table_properties,
                    txns=lambda table: {**kafka_txns(table), **txn},
                    partition_filters=self._replace_filters(table) if self.overwrite else None,
                    replace_schema=self.overwrite and opts.overwrite_schema,
                    already_done=already_done if (txn or end is not None) else None,
                    fence=sink_fence(opts),
                    # The load of step 2 serves the first attempt, unless step 3 committed since.
                    loaded=commit.NOT_LOADED if changed else table,
                )
            except CheckpointMismatchError:
                # Found inside the commit, possibly after an attempt whose outcome the log could no
                # longer show (a writer paused past the log retention): the files stay.
                raise
            except DeltaflowError:
                # The log does not hold the batch, but an attempt may still be in flight: the files
                # stay (orphans for vacuum --full if it never lands).
                metrics.commit_failed(pipeline=opts.pipeline_id or "", table=self.table_uri)
                raise
            if not result.committed:
                # Another commit holds this batch (an earlier process, a zombie): ours is in no log
                # entry, so its files are referenced by none, unless an attempt is still in flight.
                self._skip(
                    files,
                    batch_id,
                    f"another commit holds it (version {result.version})",
                    delete=result.may_delete_files,
                )
                return
            compacting = (
                bool(opts.auto_compact or opts.vacuum_interval_hours) and streaming and not self.overwrite
            )
            # The sink's first commit hands its table to the compactor, whose first count (every
            # partition is new to it) reads it in its thread; a table kept for the next batch is
            # never shared. From the next batch on the sink keeps its table, and the compactor
            # loads the table when a count is due (every few dozen commits).
            shared = compacting and not changed and table is not None and self._compactor_fed is False
            self._compactor_fed = self._compactor_fed or shared
            made = (result.version, result.token) if result.version is not None else None
            # Kept only when the table was loaded at this sink's own commit before, which the
            # next load can then find in the log (see _load).
            loaded_at = table.version() if table is not None else None
            base = self._last if self._last is not None and self._last[0] == loaded_at else None
            if base is not None and made is not None and streaming and not shared:
                self._kept = (table, base, made)
            self._last = made
            maybe_crash("after_commit", batch_id, self.table_uri)

            # Step 5. Report.
            metrics.batch_committed(
                pipeline=opts.pipeline_id or "",
                table=self.table_uri,
                rows=rows,
                files=len(files),
                bytes_=sum(f.size for f in files),
                seconds=time.monotonic() - started,
                retries=result.retries,
            )
            logger.info(
                "committed batch %s of %r to %s: version %s, %d file(s), %d row(s), %d retr%s%s",
                batch_id,
                opts.pipeline_id,
                self.table_uri,
                result.version,
                len(files),
                rows,
                result.retries,
                "y" if result.retries == 1 else "ies",
                " (an attempt that reported an error had landed)" if result.recovered else "",
            )
            if compacting:
                try:
                    compactor = self._compactor()
                    limit = compactor.policy.small_file_bytes
                    compactor.after_commit(
                        [f.partition_values for f in files],
                        # Its first count reads the table step 2 loaded (a load less per table).
                        loaded=table if shared else None,
                        version=result.version,
                        small=[f.partition_values for f in files if f.size < limit],
                    )
                except Exception:  # the batch is committed: maintenance must not fail it
                    logger.exception("auto-maintenance of %s not scheduled", self.table_uri)

    def _load(self) -> Any:
        """Step 2's load: the table as of its latest version (``None``: no table).

        The table this sink's last commit started from is brought up to date (it then reads only
        the commits since: measured 1.3 against 4.9 ms a table ten commits after a checkpoint,
        and a load replays every commit since the last checkpoint) when the log still holds,
        with their tokens, both the sink's commit that table was loaded at and the one it made
        from it: the log the table read is the log there now. Anything else is a full load.
        delta-rs "updates" a kept table onto whatever log is at the path, without an error: a
        table deleted and made again there (even while a batch commits, which then lands in the
        new log) would leave a view of both logs' files and schemas for every batch after.
        Left open: the table made again between these two reads and the update (a moment)."""
        from deltaflow.delta import commit
        from deltaflow.delta import log as delta_log

        kept, self._kept = self._kept, None
        if kept is not None:
            table, base, made = kept
            storage = self.options.storage_options
            try:
                entries = commit.read_entries(self.table_uri, storage, base[0], made[0])
                tokens = {e.version: e.info.get(commit.COMMIT_TOKEN_KEY) for e in entries}
                if tokens.get(base[0]) == base[1] and tokens.get(made[0]) == made[1]:
                    table.update_incremental()
                    since = entries[1:]
                    if (
                        table.version() == made[0]
                        and len(since) == made[0] - base[0]
                        and not any(e.redefines for e in since)
                    ):
                        # The txns it read at base, moved on by those of every commit since
                        # (all read above): no lookup replays the log segment again. Not past a
                        # change of the table's properties (txn expiry may have changed).
                        txns = {a: v for e in since for a, v in e.txns.items()}
                        progress.carry_txns(table, base[0], txns)
                    if table.version() >= made[0]:
                        return table
            except Exception:  # any doubt about the kept table: a full load
                logger.debug("kept table of %s not brought up to date", self.table_uri, exc_info=True)
        return delta_log.load(self.table_uri, self.options.storage_options)

    def _skip(
        self, files: Sequence[WrittenFile], batch_id: int | None, why: str, *, delete: bool = True
    ) -> None:
        metrics.batch_skipped(pipeline=self.options.pipeline_id or "", table=self.table_uri)
        if not delete:
            logger.warning(
                "batch %s of %r skipped on %s: %s; its %d new file(s) are kept, since an attempt "
                "to commit them may still be in flight (orphans for vacuum --full)",
                batch_id,
                self.options.pipeline_id,
                self.table_uri,
                why,
                len(files),
            )
            return
        removed = self.delete_uncommitted(files)
        logger.info(
            "batch %s of %r skipped on %s: %s; deleted its %d new file(s)",
            batch_id,
            self.options.pipeline_id,
            self.table_uri,
            why,
            removed,
        )

    def _compactor(self) -> AutoCompactor:
        from deltaflow.ops.compaction import CompactionPolicy, compactor_for

        opts = self.options
        policy = CompactionPolicy(
            min_files=opts.auto_compact_min_files,
            target_bytes=opts.target_file_size_bytes,
            compact=opts.auto_compact,
            vacuum_interval_s=opts.vacuum_interval_hours * 3600,
        )
        return compactor_for(self.table_uri, opts.storage_options, policy, pipeline=opts.pipeline_id or "")

    def abort_batch(self, messages: Sequence[WriterCommitMessage | None], batch_id: int | None) -> None:
        """Spark gave up on a batch: delete its files only if no commit can reference them.

        Spark calls ``abort`` after a task failed (some messages missing: the batch never
        reached :meth:`commit_batch`, so no commit holds its files) and after ``commit`` raised
        (every message present: :meth:`commit_batch` already kept or deleted the files by the
        commit rule; an attempt may still be in flight, so nothing is deleted here).
        """
        with self._logged(batch_id):
            if all(isinstance(m, DeltaCommitMessage) for m in messages):
                logger.warning(
                    "aborted batch %s of %r on %s after its commit step: files left as the commit step "
                    "decided (unreferenced ones are orphans for vacuum --full)",
                    batch_id,
                    self.options.pipeline_id,
                    self.table_uri,
                )
                return
            files = [f for m in messages if isinstance(m, DeltaCommitMessage) for f in m.files]
            removed = self.delete_uncommitted(files)
            logger.warning(
                "aborted batch %s of %r on %s (a task failed, nothing was committed): deleted %d file(s)",
                batch_id,
                self.options.pipeline_id,
                self.table_uri,
                removed,
            )

    # -- helpers -----------------------------------------------------------------------------

    def _logged(self, batch_id: int | None) -> contextlib.AbstractContextManager[None]:
        """Records logged inside carry the pipeline, the batch and the table (JSON logs)."""
        return logs.context(pipeline=self.options.pipeline_id, batch=batch_id, table=self.table_uri)

    def _txn(self, batch_id: int | None) -> tuple[str | None, int | None]:
        if batch_id is not None:
            # With kafka_offsets the partitions' txns carry the progress; a batch-id txn would
            # tie the table to one checkpoint, which is what they free it from.
            return (None, None) if self.options.kafka_offsets else (self.options.pipeline_id, batch_id)
        if self.options.pipeline_id and self.options.txn_version is not None:
            return self.options.pipeline_id, self.options.txn_version
        return None, None

    def _kafka_txns(
        self, table: Any, end: Mapping[str, Mapping[str, int]], lost: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, int]:
        """Txns ``<pipeline_id>-<topic>-<partition>`` = last offset of the batch ending at ``end``,
        for the partitions it advances beyond what the log holds (versions never move back, but
        for a partition the batch restarted because its offsets went back: ``lost``)."""
        return progress.advancing_txns(table, self.options.pipeline_id or "", end, lost)

    def _check(self, table: Any, files: Sequence[WrittenFile]) -> bool:
        """Step 3; whether it changed the table (columns added in a commit of their own)."""
        from deltaflow.delta import commit
        from deltaflow.delta.schema import check_against_table

        opts = self.options
        changed = False
        if table is not None and opts.replace_where:
            self._check_replace_where(table, files)
        if table is not None and self.overwrite and opts.overwrite_schema:
            parts = list(table.metadata().partition_columns)
            if parts != list(opts.partition_columns):
                raise ConfigError(
                    f"overwrite_schema cannot change the partitioning of {self.table_uri!r} "
                    f"({parts} -> {list(opts.partition_columns)}): delta-rs would commit a log "
                    "no reader can load. Write the new layout to a new table, or keep the "
                    "partition columns",
                    table_uri=self.table_uri,
                )
        if table is not None and not (self.overwrite and opts.overwrite_schema):
            # An overwrite replaces the content, not the schema (unless overwrite_schema):
            # the same rules as append.
            diff = check_against_table(
                table,
                self.schema,
                partition_columns=opts.partition_columns,
                schema_mode=opts.schema_mode,
                table_uri=self.table_uri,
            )
            if diff.new_in_data:
                new = {n for n, _, _ in diff.new_in_data}
                commit.add_columns(
                    self.table_uri,
                    opts.storage_options,
                    [f for f in self.schema if f.name in new],
                    policy=commit.RetryPolicy(max_retries=opts.max_commit_retries),
                )
                changed = True
        elif not opts.auto_create_table:
            from deltaflow.errors import TableNotFoundError

            raise TableNotFoundError(
                f"no Delta table at {self.table_uri!r} and auto_create_table is off",
                table_uri=self.table_uri,
            )
        fs, root = filesystem(self.table_uri, opts.storage_options)
        try:
            infos = fs.get_file_info([f"{root}/{f.path}" for f in files])
        except OSError as exc:
            raise storage_error(exc, self.table_uri, "checking the data files of") from exc
        for f, info in zip(files, infos, strict=True):
            if info.size is None:
                # Deleted under the writer (vacuum --full with a retention shorter than a batch):
                # writing the batch again heals it, so the daemon restarts rather than stops.
                raise WrittenFilesLostError(
                    f"data file {f.path!r} of table {self.table_uri!r} is missing: it was deleted "
                    "before its commit (vacuum --full with a retention shorter than a batch takes?); "
                    "nothing was committed, and the batch is written again",
                    table_uri=self.table_uri,
                    path=f.path,
                )
            if info.size != f.size:
                raise WriteValidationError(
                    f"data file {f.path!r} of table {self.table_uri!r} is "
                    f"{'missing' if info.size is None else f'{info.size} bytes'}, its task "
                    f"reported {f.size} bytes; nothing was committed",
                    table_uri=self.table_uri,
                    path=f.path,
                )
            if set(f.partition_values) != set(opts.partition_columns):
                raise WriteValidationError(
                    f"data file {f.path!r} carries partition values for "
                    f"{sorted(f.partition_values)}, expected {list(opts.partition_columns)}",
                    table_uri=self.table_uri,
                    path=f.path,
                )
        return changed

    def _replace_filters(self, table: Any) -> list[tuple[str, str, Any]] | None:
        """``replace_where`` as delta-rs partition filters over the table's partition columns."""
        if not self.options.replace_where or table is None:
            return None
        from deltaflow.ops.optimize import parse_partition_predicate

        return parse_partition_predicate(self.options.replace_where, list(table.metadata().partition_columns))

    def _check_replace_where(self, table: Any, files: Sequence[WrittenFile]) -> None:
        """Every new file must fall inside ``replace_where`` (else rows would land outside the
        partitions the commit replaces: Delta refuses that too)."""
        if not self.overwrite:
            raise ConfigError(
                "replace_where (Delta's replaceWhere) replaces partitions: it needs mode overwrite",
                table_uri=self.table_uri,
            )
        filters = self._replace_filters(table) or []
        for f in files:
            outside = [t for t in filters if not _partition_matches(f.partition_values.get(t[0]), t[1], t[2])]
            if outside:
                raise WriteValidationError(
                    f"data file {f.path!r} holds rows of partition {dict(f.partition_values)}, outside "
                    f"replace_where {self.options.replace_where!r}; nothing was committed",
                    table_uri=self.table_uri,
                    path=f.path,
                )

    def delete_uncommitted(self, files: Sequence[WrittenFile]) -> int:
        """Delete files no commit references; a storage failure leaves them as orphans."""
        return delete_unreferenced(
            self.table_uri,
            self.options.storage_options,
            files,
            "unreferenced file(s)",
            "they are orphans for vacuum --full",
        )

    def _commit_metadata(
        self, messages: Sequence[WriterCommitMessage | None], batch_id: int | None, rows: int
    ) -> dict[str, Any]:
        query_id = _query_id(messages)
        meta: dict[str, Any] = {
            "deltaflow.version": __version__,
            "deltaflow.rows": rows,
        }
        if self.options.pipeline_id:
            meta["deltaflow.pipeline_id"] = self.options.pipeline_id
        if self.options.user_metadata is not None:
            meta["userMetadata"] = self.options.user_metadata
        if batch_id is not None:
            meta["deltaflow.epoch"] = batch_id
        if query_id:
            meta["deltaflow.query_id"] = query_id
        writers = {m.writer for m in messages if isinstance(m, DeltaCommitMessage) and m.files and m.writer}
        if writers:
            meta["deltaflow.writers"] = len(writers)  # executor processes that wrote this commit's files
        return meta


def delete_unreferenced(
    table_uri: str, storage_options: Mapping[str, str], files: Sequence[WrittenFile], what: str, then: str
) -> int:
    """Delete ``files`` of the table (files no log entry references); how many. A storage
    failure is logged (``what`` the files are, ``then`` what becomes of them) and leaves them."""
    if not files:
        return 0
    fs, root = filesystem(table_uri, storage_options)
    try:
        return delete_files(fs, root, (f.path for f in files))
    except OSError as exc:
        logger.warning("could not delete %d %s of %s (%s); %s", len(files), what, table_uri, exc, then)
        return 0


def sink_fence(options: SinkOptions) -> Any:
    """The writer epoch a stream's commits carry (``writer_epoch``), or ``None``."""
    from deltaflow.delta import commit

    if options.writer_epoch is None or not options.pipeline_id:
        return None
    return commit.Fence(commit.fence_app_id(options.pipeline_id), options.writer_epoch)


def _table_partitioning(spark_options: Any, options: SinkOptions, columns: Sequence[str]) -> SinkOptions:
    """Without ``partition_columns`` among the write's options, an existing table's partitioning
    (as delta-spark's append, ``deltaflow.write``, YAML sinks and ``ingest`` take it). Read once,
    when Spark plans the write, before any task writes a file; given ones are checked against
    the table at the commit, as before."""
    if any(str(key).lower() == "partition_columns" for key in spark_options):
        return options
    from deltaflow.delta import log as delta_log

    uri = normalize_uri(options.table_uri)
    table = delta_log.load(uri, options.storage_options)
    have = tuple(table.metadata().partition_columns) if table is not None else ()
    if not have:
        return options
    missing = [c for c in have if c not in columns]
    if missing:
        raise ConfigError(
            f"table {uri!r} is partitioned by {list(have)}, and an append takes the table's partitioning, "
            f"but the data has no column(s) {missing}; nothing was written",
            table_uri=uri,
        )
    logger.info("table %s is partitioned by %s: writing with its partitioning", uri, list(have))
    return options.model_copy(update={"partition_columns": have})


def _arrow_options(spark_options: Any) -> SinkOptions:
    options = SinkOptions.from_spark_options(spark_options)
    if options.write_mode == "merge":
        raise ConfigError(
            "write_mode='merge' is applied by deltaflow.write_stream() and pipelines (delta-rs MERGE "
            "on the driver), not by the deltaflow format",
            table_uri=options.table_uri,
        )
    if options.write_path == "spark":
        raise ConfigError(
            "write_path='spark' is only available through deltaflow.write_stream(); "
            "the deltaflow format writes through Python workers (write_path='arrow' or 'auto')",
            table_uri=options.table_uri,
        )
    return options


def _partition_matches(value: str | None, op: str, wanted: Any) -> bool:
    """Whether a file's partition value satisfies one ``replace_where`` term (numbers compare as
    numbers, everything else as the partition's text)."""
    if value is None:
        return False
    if op in ("in", "not in"):
        hit = any(_compare(value, w) == 0 for w in wanted)
        return hit if op == "in" else not hit
    order = _compare(value, wanted)
    return {
        "=": order == 0,
        "!=": order != 0,
        "<": order < 0,
        "<=": order <= 0,
        ">": order > 0,
        ">=": order >= 0,
    }[op]


def _compare(value: str, wanted: Any) -> int:
    try:
        a, b = float(value), float(str(wanted))
    except ValueError:
        a, b = value, str(wanted)  # type: ignore[assignment]
    return (a > b) - (a < b)


def _query_id(messages: Sequence[WriterCommitMessage | None]) -> str | None:
    """The streaming query's id, as the tasks saw it (``None`` when no task ran)."""
    return next((m.query_id for m in messages if isinstance(m, DeltaCommitMessage) and m.query_id), None)


def _collect(messages: Sequence[WriterCommitMessage | None]) -> list[WrittenFile]:
    files: list[WrittenFile] = []
    for m in messages:
        if not isinstance(m, DeltaCommitMessage):
            raise WriteValidationError(
                f"a write task returned {type(m).__name__} instead of a deltaflow commit "
                "message; nothing was committed"
            )
        files.extend(m.files)
    return files


def _trim_stats(f: WrittenFile, keep: frozenset[str]) -> WrittenFile:
    """Keep statistics for the columns in ``keep`` only (the table's indexed columns)."""
    stats = json.loads(f.stats)
    for key in ("minValues", "maxValues", "nullCount"):
        stats[key] = {k: v for k, v in stats.get(key, {}).items() if k in keep}
    return replace(f, stats=json.dumps(stats, separators=(",", ":")))


def _local_int(ctx: Any, key: str) -> int | None:
    if ctx is None:
        return None
    value = ctx.getLocalProperty(key)
    return int(value) if value not in (None, "") else None

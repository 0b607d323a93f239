"""Mirror tables from change topics (Debezium): one MERGE per table and batch, on the driver.

The source tasks folded each table's changes and staged them (:mod:`deltaflow.sources.change_topics`).
Per micro-batch and table (:meth:`KafkaMirrorSink.commit_batch`; the Arrow ingest writer runs
the tables side by side):

1. Load the table; a writer another process took the pipeline from stops here, and so does a
   mirror ordered by Kafka offsets whose topic was re-created (:data:`SEQUENCE_PROPERTY`). When
   no partition of the table's topics advances beyond the table's txns, the batch is in the
   table already (a replay): its staged files are deleted, nothing else happens.
2. Fold the tasks' staged files into one source (:meth:`deltaflow.io.changes.ChangeFold.add_staged`:
   per key in sequence order).
3. Columns the changes carry that the table lacks are added (a commit of their own); a value
   that does not fit its column's type stops the batch (:class:`MergeError`, nothing of it in
   this table).
4. What later batches must know first, as table properties (a truncate's sequence, below which
   no row is inserted again; ordering by Kafka offsets), then ONE delta-rs MERGE guarded by
   ``_change_sequence`` (:func:`deltaflow.sinks.mirror.merge_attempt`), with the txns of the
   table's topic-partitions, under the commit rule. A batch whose changes
   fold to nothing (tombstones only) still records the progress (a commit without files); a
   truncate alone is a DELETE of the older rows.
5. The staged files are deleted (no log entry names them; a process's first commit also sweeps
   every staged file left by earlier runs); report.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltaflow._version import __version__
from deltaflow.config.locations import normalize_uri
from deltaflow.config.sink import SinkOptions
from deltaflow.errors import MergeError
from deltaflow.io.changes import KAFKA_OFFSET, SEQUENCE_COLUMN, SEQUENCE_TYPE, STAGING_DIR, ChangeFold
from deltaflow.io.faults import maybe_crash
from deltaflow.io.parquet import WrittenFile, delete_files
from deltaflow.io.storage import filesystem
from deltaflow.metrics import metrics

__all__ = ["SEQUENCE_PROPERTY", "TRUNCATED_PROPERTY", "KafkaMirrorSink", "mirror_table_schema"]

logger = logging.getLogger(__name__)

_BATCH = re.compile(r"part-b(\d+)-")
#: A mirror's table property: the change sequence of the last truncate it applied. A row older
#: than it is never inserted again (Kafka may deliver an older change of another partition in a
#: later batch than the truncate).
TRUNCATED_PROPERTY = "deltaflow.mirror.truncatedBelow"
#: A mirror's table property, ``kafka-offset`` once a change was ordered by its Kafka offset
#: (its event named no database position): a re-created topic then stops the mirror.
SEQUENCE_PROPERTY = "deltaflow.mirror.sequence"

_NOTHING_COMMITTED = (
    "nothing of this batch was committed to this mirror (the pipeline's other mirrors may hold it; "
    "the batch's replay skips those)"
)


def mirror_table_schema(columns: pa.Schema) -> pa.Schema:
    """A new mirror table's schema: the row's columns (all nullable: a later change may leave
    one out), then ``_change_sequence``."""
    fields = [f.with_nullable(True) for f in columns if f.name != SEQUENCE_COLUMN]
    return pa.schema([*fields, pa.field(SEQUENCE_COLUMN, SEQUENCE_TYPE)])


class KafkaMirrorSink:
    """Applies the staged changes of each micro-batch to one mirror table.

    Args:
        options: The table's sink options (``pipeline_id``, the claimed ``writer_epoch``,
            storage and retry settings).
    """

    #: The Arrow ingest writer stops a table whose changes a task could not read (they went
    #: to the dead-letter table): a mirror that skips a change is wrong from then on.
    applies_changes = True

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.table_uri = normalize_uri(options.table_uri)
        self._swept = False

    # -- the batch ----------------------------------------------------------------------------

    def commit_batch(
        self,
        messages: Sequence[Any],
        batch_id: int,
        *,
        source: tuple[Mapping[str, Mapping[str, int]], Mapping[str, Mapping[str, Any]]] | None = None,
    ) -> None:
        from deltaflow.delta import commit
        from deltaflow.delta import log as delta_log
        from deltaflow.delta.progress import advancing_txns
        from deltaflow.sinks.datasource import _collect, sink_fence
        from deltaflow.sinks.mirror import report_commit
        from deltaflow.sinks.spark_checkpoint import read_batch_source

        opts = self.options
        app = opts.pipeline_id or ""
        started = time.monotonic()
        end, lost = source if source is not None else read_batch_source(opts, batch_id)
        files = _collect(messages)

        def txns(table: Any) -> dict[str, int]:
            return advancing_txns(table, app, end, lost)

        # Step 1. The fence, and the replay check.
        table = delta_log.load(self.table_uri, opts.storage_options)
        commit.check_fence(table, self.table_uri, sink_fence(opts))
        self._check_restarts(table, lost, batch_id)
        if not txns(table):
            metrics.batch_skipped(pipeline=app, table=self.table_uri)
            removed = self.delete_uncommitted(files)
            logger.info(
                "batch %s of %r skipped on %s: it is in the table already (a replay); deleted its %d "
                "staged file(s)",
                batch_id,
                app,
                self.table_uri,
                removed,
            )
            return
        # Step 2. Fold the staged changes.
        fold = ChangeFold()
        try:
            fold.add_staged(self._read(files))
        except ValueError as exc:
            raise MergeError(
                f"batch {batch_id}: the staged changes of {self.table_uri} do not agree: {exc}; "
                f"{_NOTHING_COMMITTED}",
                table_uri=self.table_uri,
                batch_id=batch_id,
            ) from None
        # Step 3. Columns.
        data = None
        if fold.rows():
            columns = self._columns(table, fold, batch_id)
            try:
                data = fold.to_table(columns)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
                raise MergeError(
                    f"batch {batch_id}: a change cannot be applied to "
                    f"{self.table_uri}: {exc}; {_NOTHING_COMMITTED}. A column's type changed in the "
                    "source: the mirror keeps the type it was made with. Take the mirror again (stop, "
                    "delete the table, start from the topics' beginning) or alter it to the new type",
                    table_uri=self.table_uri,
                    batch_id=batch_id,
                ) from None
        maybe_crash("before_commit", batch_id, self.table_uri)
        # Step 4. Commit: the truncate's sequence first (a row older than it that a later batch
        # brings, from a partition Kafka delivered late, must not come back), then the MERGE.
        floor = _truncated_below(table)
        record: dict[str, str] = {}
        if fold.truncated_below is not None and fold.truncated_below > (floor or -1):
            record[TRUNCATED_PROPERTY] = str(fold.truncated_below)
            floor = fold.truncated_below
        if fold.offset_sequenced and not _offset_sequenced(table):
            record[SEQUENCE_PROPERTY] = KAFKA_OFFSET
        if record:
            self._record(record, batch_id)
        outcome = self._commit(data, fold, batch_id, txns, floor)
        maybe_crash("after_commit", batch_id, self.table_uri)
        # Step 5. The staged files are done with (a failed commit leaves them: the replay stages anew).
        self.delete_uncommitted(files)
        self._sweep()
        rows = 0 if data is None else data.num_rows
        if not report_commit(outcome, app, self.table_uri, rows, started):
            return
        logger.info(
            "mirror %s: batch %s, %d row change(s)%s",
            self.table_uri,
            batch_id,
            rows,
            " after a truncate" if fold.truncated_below is not None else "",
        )

    def _check_restarts(self, table: Any, lost: Mapping[str, Mapping[str, Any]], batch_id: int) -> None:
        """A partition read again from a lower offset (the topic re-created) cannot feed a mirror
        whose changes are ordered by Kafka offsets: the new topic's offsets are below the rows'
        sequences, and the guard would pass over every change of a key the mirror holds.

        Raises:
            MergeError: such a restart, for such a mirror (nothing committed).
        """
        from deltaflow.delta.progress import WENT_BACK

        went_back = sorted(
            f"{topic}[{p}] (from offset {r.get('stored')} to {r.get('restart')})"
            for topic, parts in lost.items()
            for p, r in parts.items()
            if r.get("reason") == WENT_BACK
        )
        if went_back and _offset_sequenced(table):
            raise MergeError(
                f"batch {batch_id}: {', '.join(went_back)} went back: the topic was re-created. The "
                f"mirror {self.table_uri} orders changes by their Kafka offsets (its events name no "
                "database position), so the new topic's changes cannot be ordered against its rows "
                "and would be passed over. Take the mirror again: stop the pipeline, delete the mirror "
                "table, and start it (the topic is read from its beginning); "
                f"{_NOTHING_COMMITTED}",
                table_uri=self.table_uri,
                batch_id=batch_id,
            )

    def _read(self, files: Sequence[WrittenFile]) -> list[pa.Table]:
        fs, root = filesystem(self.table_uri, self.options.storage_options)
        return [pq.read_table(f"{root.rstrip('/')}/{f.path}", filesystem=fs) for f in files]

    def _columns(self, table: Any, fold: ChangeFold, batch_id: int) -> pa.Schema:
        """The table's row columns, with the ones the changes carry that it lacks added."""
        from deltaflow.delta import commit
        from deltaflow.delta.schema import plain_schema

        have = plain_schema(pa.schema(table.schema().to_arrow())) if table is not None else pa.schema([])
        new = [
            pa.field(n, t)
            for n, t in fold.fields.items()
            if n not in have.names and n != SEQUENCE_COLUMN and not pa.types.is_null(t)
        ]
        if SEQUENCE_COLUMN not in have.names:
            new.append(pa.field(SEQUENCE_COLUMN, SEQUENCE_TYPE))
        if new:
            logger.info(
                "batch %s: column(s) %s added to %s (the changes carry them)",
                batch_id,
                [f.name for f in new],
                self.table_uri,
            )
            commit.add_columns(
                self.table_uri,
                self.options.storage_options,
                new,
                policy=commit.RetryPolicy(max_retries=self.options.max_commit_retries),
            )
        return pa.schema([*(f for f in have if f.name != SEQUENCE_COLUMN), *new])

    def _record(self, properties: Mapping[str, str], batch_id: int) -> None:
        """Record what later batches must know as table properties (a commit of its own, before
        the batch's MERGE): :data:`TRUNCATED_PROPERTY`, :data:`SEQUENCE_PROPERTY`."""
        from deltaflow.delta import commit
        from deltaflow.ops.properties import set_properties
        from deltaflow.sinks.datasource import sink_fence

        set_properties(
            self.table_uri,
            self.options.storage_options,
            properties,
            fence=sink_fence(self.options),
            policy=commit.RetryPolicy(max_retries=self.options.max_commit_retries),
            what=f"the mirror properties of batch {batch_id}",
            metadata={"deltaflow.operation": "mirror properties", "deltaflow.epoch": batch_id},
        )

    def _commit(
        self, data: pa.Table | None, fold: ChangeFold, batch_id: int, txns: Any, floor: int | None
    ) -> Any:
        from deltaflow.delta import commit
        from deltaflow.sinks.datasource import sink_fence
        from deltaflow.sinks.mirror import merge_attempt, merge_failures

        opts = self.options
        app = opts.pipeline_id or ""
        metadata = {
            "deltaflow.version": __version__,
            "deltaflow.pipeline_id": app,
            "deltaflow.epoch": batch_id,
            "deltaflow.rows": 0 if data is None else data.num_rows,
        }
        policy = commit.RetryPolicy(max_retries=opts.max_commit_retries)

        def already_done(table: Any) -> bool:
            return not txns(table)

        with merge_failures(app, self.table_uri, f"merge of batch {batch_id}", batch_id):
            if data is not None:
                names = [n for n in data.column_names if n in fold.fields]
                attempt = merge_attempt(
                    self.table_uri, data, names, fold.key or (), fold.truncated_below, insert_floor=floor
                )
                what = f"merge of batch {batch_id} of {app!r}"
            elif fold.truncated_below is not None:
                attempt = _truncate_attempt(self.table_uri, fold.truncated_below)
                what = f"truncate of batch {batch_id} of {app!r}"
            else:
                return commit.commit_files(
                    self.table_uri,
                    [],
                    what=f"progress of batch {batch_id} of {app!r}",
                    schema=pa.schema([]),
                    partition_by=(),
                    properties={},
                    mode="append",
                    metadata=metadata,
                    storage_options=opts.storage_options,
                    policy=policy,
                    create_if_missing=False,
                    txns=txns,
                    already_done=already_done,
                    fence=sink_fence(opts),
                )
            return commit.commit(
                self.table_uri,
                opts.storage_options,
                attempt,
                what=what,
                metadata=metadata,
                txns=txns,
                already_done=already_done,
                fence=sink_fence(opts),
                policy=policy,
            )

    # -- staged files -------------------------------------------------------------------------

    def delete_uncommitted(self, files: Sequence[WrittenFile]) -> int:
        """Delete staged files (no log entry ever names them); a storage failure leaves them
        for the next start's sweep."""
        from deltaflow.sinks.datasource import delete_unreferenced

        return delete_unreferenced(
            self.table_uri,
            self.options.storage_options,
            files,
            "staged file(s)",
            "the next start's sweep deletes them",
        )

    def _sweep(self) -> None:
        """Once per process, after its first commit (its own staged files deleted): every
        staged file left, by a failed task attempt, a crash, or a run on a checkpoint since
        deleted (whose batch numbers may be ahead of this one's). No task of this query runs
        then; a zombie process's tasks may, but its commits are fenced."""
        if self._swept:
            return
        self._swept = True
        from pyarrow import fs as pafs

        fs, root = filesystem(self.table_uri, self.options.storage_options)
        try:
            listed = fs.get_file_info(
                pafs.FileSelector(f"{root.rstrip('/')}/{STAGING_DIR}", allow_not_found=True)
            )
            stale = [f"{STAGING_DIR}/{i.base_name}" for i in listed if _BATCH.match(i.base_name) is not None]
            if stale:
                removed = delete_files(fs, root, stale)
                logger.info("deleted %d stale staged file(s) of %s", removed, self.table_uri)
        except OSError as exc:
            logger.warning("could not list the staged files of %s (%s)", self.table_uri, exc)


def _offset_sequenced(table: Any) -> bool:
    return table is not None and table.metadata().configuration.get(SEQUENCE_PROPERTY) == KAFKA_OFFSET


def _truncated_below(table: Any) -> int | None:
    """The sequence of the table's last truncate (:data:`TRUNCATED_PROPERTY`), if any."""
    if table is None:
        return None
    value = table.metadata().configuration.get(TRUNCATED_PROPERTY)
    return int(value) if value else None


def _truncate_attempt(uri: str, below: int) -> Any:
    def attempt(table: Any, props: Any) -> Any:
        if table is None:
            raise MergeError(f"the mirror table {uri!r} does not exist", table_uri=uri)
        return table.delete(f"{SEQUENCE_COLUMN} < CAST('{below}' AS DECIMAL(38, 0))", commit_properties=props)

    return attempt

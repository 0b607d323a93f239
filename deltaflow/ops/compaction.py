"""Auto-compaction: small files of the partitions a stream writes are bin-packed in the
background, without blocking or conflicting with the stream's commits.

After each streaming commit the sink hands the partitions of the files it committed to the
table's :class:`AutoCompactor` (a dict update; nothing else on the commit path). Its thread
counts the small files (below half the target file size) of each of those partitions, and
compacts a partition once it holds ``min_files`` of them. It counts only when a partition is new
to it, or when the files committed since its last count could reach ``min_files`` (each new file
counted as small): one ingest of hundreds of tables pays one count per table every few dozen
commits, not one per commit. A count reads the table the sink loaded for its commit when no
other commit came between (the commit's files added to it), else loads the table: at a
stream's first batch, hundreds of tables' first counts loaded each table once more, beside
the commits. delta-rs commits a compaction
with ``dataChange=false`` and keeps the table's ``txn`` progress; it does not conflict with
blind appends (DELTA_NOTES). A compaction that conflicts with something else (an overwrite,
a schema change, another compaction) is retried with backoff, then left for the next commit:
it never fails the stream.

The same thread writes the table's log checkpoints: every :data:`CHECKPOINT_EVERY` commits,
staggered across tables, unless the table sets ``delta.checkpointInterval`` (delta-rs' commit
hook then keeps the table's own interval; its default is 100). Every load of a table replays
the commits since its last checkpoint, and a stream loads its table for each commit: at
delta-rs' interval a 200-table batch's commits took 0.6 s after 1 commit and 3.8 s after 40
(``benchmarks/commit_phase.py``). Written here, a checkpoint never lengthens a commit.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from deltaflow.metrics import metrics

__all__ = [
    "CHECKPOINT_EVERY",
    "AutoCompactor",
    "CompactionPolicy",
    "close_all",
    "compactor_for",
    "compactors",
]

logger = logging.getLogger(__name__)

#: Retries of one compaction (waits 0.5, 1, 2 s); then it waits for the next commit.
RETRIES = 3
RETRY_BACKOFF_S = 0.5

#: Commits between the log checkpoints of a table that sets no ``delta.checkpointInterval``
#: (Delta's default interval; delta-rs' own is 100).
CHECKPOINT_EVERY = 10
#: The table property whose presence leaves checkpoints to delta-rs' commit hook.
CHECKPOINT_INTERVAL_KEY = "delta.checkpointInterval"

PartitionKey = tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class CompactionPolicy:
    """When and how to compact: ``min_files`` small files in a partition trigger it; files
    below ``small_file_bytes`` are small; compaction writes files of ``target_bytes``.
    ``compact=False`` leaves only the scheduled vacuum (every ``vacuum_interval_s``, 0 = never),
    which keeps the table's own retention (``delta.deletedFileRetentionDuration``).
    ``checkpoint_every``: commits between log checkpoints (0: delta-rs' commit hook only)."""

    min_files: int
    target_bytes: int
    compact: bool = True
    vacuum_interval_s: float = 0.0
    checkpoint_every: int = CHECKPOINT_EVERY

    @property
    def small_file_bytes(self) -> int:
        return self.target_bytes // 2


class AutoCompactor:
    """One table's background compaction thread (started on first use)."""

    def __init__(
        self,
        table_uri: str,
        storage_options: Mapping[str, str],
        policy: CompactionPolicy,
        *,
        pipeline: str = "",
    ) -> None:
        self.table_uri = table_uri
        self._storage_options = dict(storage_options)
        self.policy = policy
        self._pipeline = pipeline
        self._pending: dict[PartitionKey, int] = {}  # new files per partition, not yet seen
        # The table as the last commit's sink loaded it, that commit's small files per partition
        # and its file count: a count from it needs no load (None: no such table, or another
        # commit came between).
        self._base: tuple[Any, dict[PartitionKey, int], int] | None = None
        # The version of this compactor's last compaction (inf: one whose outcome is unknown): a
        # sink's load older than it predates a compaction that landed after the sink's commit,
        # and still holds the files that compaction replaced. (Another process's compaction landing
        # there is not seen: a count may then find the files it replaced and compact again.)
        self._compacted_at: float = -1
        # Small files per partition at the last count, plus the files committed since (a
        # partition not in it is counted at its next commit); the table's file count alike.
        self._small: dict[PartitionKey, int] = {}
        self._files: int | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._busy = False
        self._thread: threading.Thread | None = None
        self.compactions = 0
        self.failures = 0
        self.vacuums = 0
        self._next_vacuum = (
            time.monotonic() + policy.vacuum_interval_s if policy.vacuum_interval_s > 0 else None
        )
        # The version from which the next log checkpoint is due (None: before the first commit
        # seen; inf: never, the table sets its own interval), and whether one is due now.
        self._checkpoint_at: float | None = None
        self._checkpoint_due = False
        self.checkpoints = 0

    def after_commit(
        self,
        partitions: Iterable[Mapping[str, str | None]],
        *,
        loaded: Any = None,
        version: int | None = None,
        small: Iterable[Mapping[str, str | None]] = (),
    ) -> None:
        """Note the partitions a commit added files to, one per file (never blocks on compaction).

        ``loaded``: the table the commit started from, ``version`` the one it made, ``small``
        the partitions of its files below :attr:`CompactionPolicy.small_file_bytes`, one per
        file. When the commit directly followed ``loaded`` (no commit between), a count reads
        ``loaded`` and adds ``small`` instead of loading the table."""
        keys = _counts(partitions) if self.policy.compact else {}
        follows = loaded is not None and version is not None and loaded.version() + 1 == version
        with self._cond:
            if self._closed:
                return
            checkpoint = self._note_version(version)
            if not keys and self._next_vacuum is None and not checkpoint:
                return
            self._checkpoint_due = self._checkpoint_due or checkpoint
            for key, count in keys.items():
                self._pending[key] = self._pending.get(key, 0) + count
            self._base = (loaded, _counts(small), sum(keys.values())) if follows else None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"deltaflow-compact-{self.table_uri}", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _note_version(self, version: int | None) -> bool:
        """Whether the commit that made ``version`` makes a log checkpoint due. The first is
        due 0 to ``checkpoint_every`` - 1 commits after the first commit this compactor sees
        (by the table's name): the tables of one stream, which commit in the same batches, do
        not all write their checkpoints after the same one."""
        every = self.policy.checkpoint_every
        if not every or version is None:
            return False
        if self._checkpoint_at is None:
            self._checkpoint_at = version + zlib.crc32(self.table_uri.encode()) % every
        return version >= self._checkpoint_at

    def wait_idle(self, timeout: float) -> bool:
        """Block until no compaction is pending or running (tests, clean shutdown)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy or self._checkpoint_due:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 60.0) -> None:
        """Stop taking work; let a running compaction finish (up to ``timeout``)."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._checkpoint_due = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._busy:
                logger.warning(
                    "compaction of %s still running after %.0f s; abandoned (its files stay "
                    "uncommitted and vacuum --full removes them)",
                    self.table_uri,
                    timeout,
                )

    def _vacuum_wait(self) -> float | None:
        """Seconds until the next scheduled vacuum (``None``: none scheduled)."""
        return None if self._next_vacuum is None else max(0.0, self._next_vacuum - time.monotonic())

    def _run(self) -> None:
        while True:
            with self._cond:
                while (
                    not self._pending
                    and not self._checkpoint_due
                    and not self._closed
                    and self._vacuum_wait() != 0.0
                ):
                    self._cond.wait(self._vacuum_wait())
                if self._closed:
                    return
                keys, self._pending = self._pending, {}
                base, self._base = self._base, None
                checkpoint, self._checkpoint_due = self._checkpoint_due, False
                self._busy = True
            try:
                if keys:
                    self._compact_due(keys, base)
                if checkpoint:
                    self._checkpoint()
                if self._vacuum_wait() == 0.0:
                    self._vacuum()
            except Exception:  # a maintenance problem must never stop the stream
                logger.exception("auto-maintenance of %s failed", self.table_uri)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _checkpoint(self) -> None:
        """Write a log checkpoint of the table's latest version (see the module docstring)."""
        from deltaflow.delta import log as delta_log

        started = time.monotonic()
        try:
            table = delta_log.load(self.table_uri, self._storage_options)
            if table is None:
                return
            if CHECKPOINT_INTERVAL_KEY in table.metadata().configuration:
                self._checkpoint_at = math.inf
                logger.debug(
                    "%s sets %s: its checkpoints are left to delta-rs",
                    self.table_uri,
                    CHECKPOINT_INTERVAL_KEY,
                )
                return
            table.create_checkpoint()
        except Exception as exc:  # noqa: BLE001 - the next commit asks again; readers just replay more
            logger.warning(
                "log checkpoint of %s failed, tried again at the next commit: %s", self.table_uri, exc
            )
            return
        self._checkpoint_at = table.version() + self.policy.checkpoint_every
        self.checkpoints += 1
        logger.debug(
            "log checkpoint of %s at version %d in %.2f s",
            self.table_uri,
            table.version(),
            time.monotonic() - started,
        )

    def _vacuum(self) -> None:
        """Delete the files the table's retention no longer protects (never below it): replaced
        ones, and files no commit references older than the retention (``vacuum --full``)."""
        from deltaflow import ops

        self._next_vacuum = time.monotonic() + self.policy.vacuum_interval_s
        started = time.monotonic()
        try:
            # Full: it lists the table, as Spark's VACUUM does. A log checkpoint drops the
            # tombstones past the retention, so a vacuum of tombstoned files only (delta-rs'
            # lite) left for good a replaced file whose tombstone a checkpoint dropped first.
            result = ops.vacuum(
                self.table_uri, dry_run=False, full=True, storage_options=self._storage_options
            )
        except Exception as exc:  # noqa: BLE001 - retried at the next interval
            metrics.vacuum(pipeline=self._pipeline, table=self.table_uri, outcome="failed")
            logger.warning("scheduled vacuum of %s failed, retried next interval: %s", self.table_uri, exc)
            return
        self.vacuums += 1
        metrics.vacuum(
            pipeline=self._pipeline, table=self.table_uri, outcome="success", files_deleted=len(result.files)
        )
        logger.info(
            "scheduled vacuum of %s: %d file(s) deleted (retention %d h) in %.2f s",
            self.table_uri,
            len(result.files),
            result.retention_hours,
            time.monotonic() - started,
        )

    def _compact_due(
        self,
        keys: Mapping[PartitionKey, int],
        base: tuple[Any, Mapping[PartitionKey, int], int] | None = None,
    ) -> None:
        """Count where a partition can be due and compact those that are. ``base``: the table as
        the last commit's sink loaded it and that commit's files (see :meth:`after_commit`)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from deltaflow.delta import log as delta_log

        counted = self._small
        for key, new in keys.items():
            if key in counted:
                counted[key] += new
        if self._files is not None:
            self._files += sum(keys.values())
        if all(counted.get(key, self.policy.min_files) < self.policy.min_files for key in keys):
            if self._files is not None:
                metrics.table_files(pipeline=self._pipeline, table=self.table_uri, count=self._files)
            return  # no partition can be due: no load
        # The last commit's files are not in its base table: its small ones are added below. A
        # base loaded before a compaction of this compactor that landed since is not read: it
        # still holds the files that compaction replaced (counted, they were compacted again).
        table, added, files = base if base is not None else (None, {}, 0)
        if table is not None and table.version() < self._compacted_at:
            table, added, files = None, {}, 0
        if table is None:
            table = delta_log.load(self.table_uri, self._storage_options)
            if table is None:
                return
        adds = pa.table(table.get_add_actions(flatten=True))
        self._files = adds.num_rows + files
        metrics.table_files(pipeline=self._pipeline, table=self.table_uri, count=self._files)
        partition_columns = list(table.metadata().partition_columns)
        # Counted in Arrow (no Python object per file): this thread shares the driver's GIL.
        small = adds.filter(pc.less(adds["size_bytes"], self.policy.small_file_bytes))
        values = {c: pc.cast(small[f"partition.{c}"], pa.string()) for c in partition_columns}
        for key in sorted(keys, key=str):
            ordered = tuple((c, dict(key).get(c)) for c in partition_columns)
            mask = pa.repeat(pa.scalar(True), small.num_rows)
            for column, value in ordered:
                text = _partition_text(value)
                match = pc.is_null(values[column]) if text is None else pc.equal(values[column], text)
                mask = pc.and_(mask, pc.fill_null(match, False))
            count = int(pc.sum(mask).as_py() or 0) + added.get(key, 0)
            counted[key] = count
            if count >= self.policy.min_files:
                counted.pop(key)  # counted again at its next commit
                self._files = None
                self._compact(ordered, count)

    def _compact(self, key: PartitionKey, small_files: int) -> None:
        from deltaflow.delta import commit
        from deltaflow.delta.leases import compaction_lease

        if any(value is None for _, value in key):
            logger.debug("auto-compaction skips the null partition %s of %s", key, self.table_uri)
            return
        filters = [(c, "=", _partition_text(v)) for c, v in key] or None
        where = " AND ".join(f"{c}={v}" for c, v in key) or "(whole table)"
        started = time.monotonic()
        try:
            # One compaction of a table at a time, across processes (deltaflow.delta.leases): two
            # concurrent ones would both commit and duplicate the rows they rewrote.
            with compaction_lease(self.table_uri, self._storage_options) as taken:
                if not taken:
                    metrics.compaction(pipeline=self._pipeline, table=self.table_uri, outcome="skipped")
                    logger.debug("auto-compaction of %s skipped: another compaction runs", self.table_uri)
                    return
                result = commit.commit(
                    self.table_uri,
                    self._storage_options,
                    lambda table, props: (
                        table.optimize.compact(
                            partition_filters=filters,
                            target_size=self.policy.target_bytes,
                            commit_properties=props,
                        )
                        if table is not None
                        else {}
                    ),
                    what=f"auto-compaction of [{where}]",
                    metadata={
                        "deltaflow.operation": "auto-compaction",
                        "deltaflow.compacted_for": self._pipeline,
                    },
                    policy=commit.RetryPolicy(max_retries=RETRIES, backoff_s=RETRY_BACKOFF_S),
                )
        except Exception as exc:  # noqa: BLE001 - never raised into the stream
            self._compacted_at = math.inf  # it may have landed (or still land): counts load
            self.failures += 1
            metrics.compaction(pipeline=self._pipeline, table=self.table_uri, outcome="failed")
            logger.warning(
                "auto-compaction of %s [%s] failed, retried after the next commit: %s",
                self.table_uri,
                where,
                exc,
            )
            return
        self._compacted_at = result.version if result.version is not None else math.inf
        done = dict(result.value or result.info.get("operationMetrics") or {})
        self.compactions += 1
        metrics.compaction(
            pipeline=self._pipeline,
            table=self.table_uri,
            outcome="success",
            files_removed=int(done.get("numFilesRemoved", 0)),
            files_added=int(done.get("numFilesAdded", 0)),
        )
        logger.info(
            "auto-compacted %s [%s]: %s small file(s) -> %s file(s) in %.2f s",
            self.table_uri,
            where,
            done.get("numFilesRemoved", small_files),
            done.get("numFilesAdded", "?"),
            time.monotonic() - started,
        )


def _counts(partitions: Iterable[Mapping[str, str | None]]) -> dict[PartitionKey, int]:
    """Files per partition (one item per file)."""
    out: dict[PartitionKey, int] = {}
    for p in partitions:
        key = tuple(sorted(p.items()))
        out[key] = out.get(key, 0) + 1
    return out


def _partition_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


_compactors: dict[tuple[str, str], AutoCompactor] = {}
_lock = threading.Lock()


def compactor_for(
    table_uri: str, storage_options: Mapping[str, str], policy: CompactionPolicy, *, pipeline: str
) -> AutoCompactor:
    """The process's compactor of ``table_uri`` (one per table and pipeline)."""
    with _lock:
        key = (table_uri, pipeline)
        compactor = _compactors.get(key)
        if compactor is None or compactor.policy != policy:
            if compactor is not None:
                compactor.close(timeout=0)
            compactor = _compactors[key] = AutoCompactor(
                table_uri, storage_options, policy, pipeline=pipeline
            )
        return compactor


def compactors() -> list[AutoCompactor]:
    """The compactors of this process (one per table and pipeline written to)."""
    with _lock:
        return list(_compactors.values())


def close_all(timeout: float = 60.0) -> None:
    """Stop every compactor of this process, letting running compactions finish."""
    with _lock:
        compactors = list(_compactors.values())
        _compactors.clear()
    for compactor in compactors:
        compactor.close(timeout)


atexit.register(close_all, 30.0)

"""Every access to the Delta log: table creation, txn versions, schema changes, commits.

Nothing else in deltaflow imports :mod:`deltalake` for writing. The rules this module enforces
come from measurements of delta-rs 1.6 (``DELTA_NOTES.md``):

* A commit validates nothing, so :func:`commit_files` checks its inputs itself.
* The log does not order ``txn`` versions, so callers compare before committing.
* A ``DeltaTable`` object does not advance with its own commits: every commit loads the table
  afresh (cheap with checkpoints, which are on by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.exceptions import TableNotFoundError as _DeltaTableNotFound
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from deltaflow._parquet import WrittenFile
from deltaflow._schema import delta_schema
from deltaflow.exceptions import CommitError, TableNotFoundError

__all__ = [
    "CommitOutcome",
    "kafka_progress",
    "kafka_txn_id",
    "add_columns",
    "commit_files",
    "create_table",
    "indexed_columns",
    "load",
    "transaction_version",
]

logger = logging.getLogger(__name__)

#: First backoff after a failed commit; doubled after each further failure (100, 200, 400 ms ...),
#: the schedule Rivven's Delta sink uses. Conflicts on a busy table clear within a few hundred ms.
COMMIT_BACKOFF_S = 0.1
#: Cap of one backoff step, so a high ``max_commit_retries`` does not sleep for minutes.
COMMIT_BACKOFF_MAX_S = 10.0
#: delta-rs' own retries per commit attempt (its internal conflict resolution); ours wrap them.
DELTA_RS_COMMIT_RETRIES = 15
#: Delta's default number of leading columns that get file statistics.
DEFAULT_INDEXED_COLUMNS = 32


def load(table_uri: str, storage_options: Mapping[str, str]) -> DeltaTable | None:
    """The table at its latest version, or ``None`` when there is no table at ``table_uri``."""
    try:
        return DeltaTable(table_uri, storage_options=dict(storage_options) or None)
    except _DeltaTableNotFound:
        return None


def transaction_version(table: DeltaTable | None, app_id: str) -> int | None:
    """The last ``txn`` version committed for ``app_id`` (``None`` if never)."""
    if table is None:
        return None
    return table.transaction_version(app_id)


def kafka_txn_id(app_id: str, topic: str, partition: int | str) -> str:
    """The txn app id that records a Kafka partition's progress (kafka-delta-ingest's scheme)."""
    return f"{app_id}-{topic}-{partition}"


def kafka_progress(
    table: DeltaTable | None, app_id: str, layout: Mapping[str, Sequence[int | str]]
) -> dict[str, dict[str, int]]:
    """Last committed offset per Kafka partition of ``layout`` (absent when never committed)."""
    out: dict[str, dict[str, int]] = {}
    if table is None:
        return out
    for topic, partitions in layout.items():
        for p in partitions:
            version = table.transaction_version(kafka_txn_id(app_id, topic, p))
            if version is not None:
                out.setdefault(topic, {})[str(p)] = int(version)
    return out


def indexed_columns(table: DeltaTable | None, properties: Mapping[str, str] | None = None) -> int:
    """``delta.dataSkippingNumIndexedCols`` of the table (or of properties about to be set)."""
    config: Mapping[str, str | None] = (
        table.metadata().configuration if table is not None else (properties or {})
    )
    raw = config.get("delta.dataSkippingNumIndexedCols")
    try:
        return int(raw) if raw is not None else DEFAULT_INDEXED_COLUMNS
    except ValueError:
        return DEFAULT_INDEXED_COLUMNS


def create_table(
    table_uri: str,
    schema: pa.Schema,
    *,
    partition_by: Sequence[str],
    properties: Mapping[str, str],
    storage_options: Mapping[str, str],
) -> DeltaTable:
    """Create an empty table once, from the driver.

    Creation is not safe to race: delta-rs rebases a create that lost the race for version 0
    onto a later version, a second CREATE that replaces the table's metadata (measured). So the
    create commits with NO retries: of racing writers exactly one creates version 0, the others
    fail and adopt that table.
    """
    try:
        table = DeltaTable.create(
            table_uri,
            schema,
            mode="error",
            partition_by=list(partition_by) or None,
            configuration=dict(properties) or None,
            storage_options=dict(storage_options) or None,
            commit_properties=CommitProperties(max_commit_retries=0),
        )
    except DeltaError as exc:
        existing = load(table_uri, storage_options)
        if existing is None:
            raise
        logger.info("table %s was created concurrently (%s); adopting it", table_uri, exc)
        return existing
    logger.info("created Delta table %s (partitioned by %s)", table_uri, list(partition_by))
    return table


def add_columns(table: DeltaTable, fields: Sequence[pa.Field]) -> None:
    """Add nullable columns to the table (schema_mode='merge'). A commit of its own."""
    nullable = [f.with_nullable(True) for f in fields]
    table.alter.add_columns(list(delta_schema(pa.schema(nullable)).fields))
    logger.info("added column(s) %s to %s", [f.name for f in fields], table.table_uri)


@dataclass(frozen=True)
class CommitOutcome:
    """What :func:`commit_files` did."""

    committed: bool  # False: the txn version was already in the log (a replay); nothing done
    table_version: int | None
    attempts: int
    retries: int


def _actions(files: Sequence[WrittenFile]) -> list[AddAction]:
    return [
        AddAction(f.path, f.size, dict(f.partition_values), f.modification_time, True, f.stats) for f in files
    ]


def commit_files(
    table_uri: str,
    files: Sequence[WrittenFile],
    *,
    schema: pa.Schema,
    partition_by: Sequence[str],
    mode: str,
    app_id: str | None,
    txn_version: int | None,
    metadata: Mapping[str, Any],
    storage_options: Mapping[str, str],
    max_retries: int,
    create_if_missing: bool,
    properties: Mapping[str, str],
    source_txns: Mapping[str, int] | None = None,
) -> CommitOutcome:
    """Commit ``files`` in ONE transaction with ``txn(app_id, txn_version)``.

    Before each attempt the table is loaded afresh and the txn version compared: when the
    version is already committed (a replay, or an earlier attempt that landed although it
    raised), nothing is committed. Failed attempts back off exponentially; after
    ``max_retries`` retries :class:`CommitError` is raised and nothing of the batch is in
    the log. ``source_txns`` (app id -> version) are recorded in the same transaction: the
    source progress that lets a pipeline resume from the table (one per Kafka partition).
    """
    attempts = 0
    delay = COMMIT_BACKOFF_S
    last_error: Exception | None = None
    while attempts <= max_retries:
        attempts += 1
        table = load(table_uri, storage_options)
        if app_id is not None and txn_version is not None:
            done = transaction_version(table, app_id)
            if done is not None and done >= txn_version:
                return CommitOutcome(False, table.version() if table else None, attempts, attempts - 1)
        now_ms = int(time.time() * 1000)
        txns = [Transaction(a, v, now_ms) for a, v in (source_txns or {}).items()]
        if app_id is not None and txn_version is not None:
            txns.append(Transaction(app_id, txn_version, now_ms))
        props = CommitProperties(
            custom_metadata=dict(metadata),
            # A create that loses the race must fail (not become a second CREATE): this loop
            # then reloads and appends to the table that won.
            max_commit_retries=DELTA_RS_COMMIT_RETRIES if table is not None else 0,
            app_transactions=txns or None,
        )
        hooks = PostCommitHookProperties(create_checkpoint=True)
        try:
            if table is None:
                if not create_if_missing:
                    raise TableNotFoundError(
                        f"no Delta table at {table_uri!r} and auto_create_table is off; "
                        "create the table or set auto_create_table=true",
                        table_uri=table_uri,
                    )
                create_table_with_add_actions(
                    table_uri,
                    delta_schema(schema),
                    _actions(files),
                    mode="error",
                    partition_by=list(partition_by) or None,
                    configuration=dict(properties) or None,
                    storage_options=dict(storage_options) or None,
                    commit_properties=props,
                    post_commithook_properties=hooks,
                )
            else:
                actions: list[AddAction | RemoveAction] = [*_actions(files)]
                table.create_write_transaction(
                    actions,
                    mode=mode,
                    schema=table.schema(),
                    partition_by=list(partition_by) or None,
                    commit_properties=props,
                    post_commithook_properties=hooks,
                )
        except TableNotFoundError:
            raise
        except (CommitFailedError, DeltaError, OSError) as exc:
            last_error = exc
            if attempts > max_retries:
                break
            logger.warning(
                "commit to %s failed (attempt %d of %d): %s; retrying in %.0f ms",
                table_uri,
                attempts,
                max_retries + 1,
                exc,
                delay * 1000,
            )
            time.sleep(delay)
            delay = min(delay * 2, COMMIT_BACKOFF_MAX_S)
            continue
        if table is None:
            return CommitOutcome(True, 0, attempts, attempts - 1)
        table.update_incremental()  # reads only the commits since the load: ours, maybe others
        return CommitOutcome(True, table.version(), attempts, attempts - 1)
    raise CommitError(
        f"commit to {table_uri!r} failed after {attempts} attempt(s): {last_error}; "
        "nothing of this batch was committed, its files are orphans for vacuum",
        table_uri=table_uri,
        app_id=app_id,
        txn_version=txn_version,
        attempts=attempts,
    )

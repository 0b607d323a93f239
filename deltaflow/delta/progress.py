"""Progress in the Delta log: what a pipeline has committed, read from ``txn`` actions.

A commit records its progress in the same transaction as its files (DESIGN.md "The commit
sequence"): ``txn(pipeline_id, batch_id)`` for a micro-batch, and for Kafka one
``txn(<pipeline_id>-<topic>-<partition>, last offset)`` per partition, so a replay is
recognised and a lost Spark checkpoint resumes from the table. kafka-delta-ingest records
``txn(<app_id>-<partition>, last offset)`` (no topic): a table it wrote is read with
:func:`resumed_progress`, so ``deltaflow ingest`` resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deltaflow.errors import CheckpointMismatchError

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = [
    "AGED_OUT",
    "DATA_LOSS_KEY",
    "DATA_LOSS_METADATA",
    "TXN_RETENTION",
    "WENT_BACK",
    "DataLoss",
    "advancing_txns",
    "batch_txns",
    "carry_txns",
    "checkpoint_mark",
    "checkpoint_txn_id",
    "committed_offsets",
    "data_loss_metadata",
    "is_committed",
    "kafka_delta_ingest_progress",
    "kafka_progress",
    "kafka_txn_id",
    "resumed_progress",
    "split_offsets",
    "stale_progress",
    "transaction_version",
    "warn_on_txn_retention",
]

logger = logging.getLogger(__name__)

#: The txn that names the Spark checkpoint a pipeline's batch-id txn came from (its version is
#: :func:`checkpoint_mark` of the query id, not a count: delta-rs and Delta readers take any long).
CHECKPOINT_TXN_PREFIX = "deltaflow-checkpoint:"

#: Under this table property delta-rs hides txns older than its span (Delta's txn expiry).
TXN_RETENTION = "delta.setTransactionRetentionDuration"

#: Beside the topics in a Kafka source's offsets (Spark's offset log): the partitions a batch
#: restarted at the broker's earliest offset with ``fail_on_data_loss`` false, as
#: ``{topic: {partition: DataLoss}}`` (:mod:`deltaflow.sources.kafka_data_loss`). No topic
#: name can hold a ``$``.
DATA_LOSS_KEY = "$data_loss"
#: The key of a batch's end offsets listing topics that match but have no table yet (ingest of
#: many topics: the driver makes their tables in that batch; they are read from the next one).
PENDING_KEY = "$pending"
#: The stored offset lies beyond the broker's latest: the offsets went back (a re-created topic).
WENT_BACK = "went_back"
#: The stored offset lies below the broker's earliest: the messages aged out (retention).
AGED_OUT = "aged_out"

#: One partition's record: ``reason`` (:data:`WENT_BACK` or :data:`AGED_OUT`), ``stored`` (the
#: next offset the pipeline held), ``restart`` (where it read on), ``earliest``, ``latest``.
DataLoss = dict[str, Any]


#: The commit metadata key listing a batch's restarted partitions (JSON text).
DATA_LOSS_METADATA = "deltaflow.kafka_data_loss"


def data_loss_metadata(lost: Mapping[str, Mapping[str, DataLoss]]) -> dict[str, str]:
    """Commit metadata recording the partitions a batch restarted (none: empty): a JSON list of
    ``{"topic", "partition", "reason", "stored", "restart", "earliest", "latest"}``."""
    import json

    if not lost:
        return {}
    rows = [
        {"topic": t, "partition": int(p), **r}
        for t, parts in sorted(lost.items())
        for p, r in sorted(parts.items())
    ]
    return {DATA_LOSS_METADATA: json.dumps(rows)}


def split_offsets(
    offsets: Mapping[str, Any],
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, DataLoss]]]:
    """A Kafka source's offsets as ``(next offset per topic and partition, data-loss records)``."""
    positions = {
        str(t): {str(p): int(o) for p, o in parts.items()}
        for t, parts in offsets.items()
        if not str(t).startswith("$")
    }
    lost = offsets.get(DATA_LOSS_KEY) or {}
    return positions, {str(t): {str(p): dict(r) for p, r in parts.items()} for t, parts in lost.items()}


def pending_topics(offsets: Mapping[str, Any]) -> list[str]:
    """The topics a batch's end offsets list as waiting for their tables (:data:`PENDING_KEY`)."""
    return [str(t) for t in offsets.get(PENDING_KEY) or ()]


def stale_progress(record: DataLoss | None, held: int | None) -> bool:
    """Whether ``held`` (the last offset a table holds for a partition) is the progress a batch
    restarted from because the partition's offsets went back (``record``): it names offsets
    the broker no longer has, and the batch's own progress replaces it, moving back."""
    return (
        record is not None
        and record.get("reason") == WENT_BACK
        and held is not None
        and held + 1 >= int(record["stored"])
    )


#: Txn versions already read, per live ``DeltaTable`` object (by id) and its version: delta-rs
#: replays the log segment for every lookup (~1/2 of a table load), and one commit asks the same
#: load for the writer fence twice and for each Kafka partition.
_TXNS: dict[int, tuple[int, dict[str, int | None]]] = {}
_TXNS_LOCK = threading.Lock()


def transaction_version(table: DeltaTable | None, app_id: str) -> int | None:
    """The last ``txn`` version committed for ``app_id`` (``None`` if never), as of the
    version ``table`` is loaded at (read once per table object and version)."""
    if table is None:
        return None
    key, version = id(table), table.version()
    with _TXNS_LOCK:
        memo = _TXNS.get(key)
        if memo is None:
            # The entry goes with the object, so a later object at the same id never sees it.
            weakref.finalize(table, _TXNS.pop, key, None)
        if memo is None or memo[0] != version:
            memo = _TXNS[key] = (version, {})
        if app_id in memo[1]:
            return memo[1][app_id]
    found = table.transaction_version(app_id)
    memo[1][app_id] = found
    return found


def carry_txns(table: DeltaTable, before: int, txns: Mapping[str, int]) -> bool:
    """Carry the txn versions read from ``table`` at version ``before`` over to the version it
    is at now, given ``txns``: every txn action of the commits after ``before`` up to now, read
    from their log entries (the later commit's version of an app id last). A txn changes only by
    a commit's txn action, so those versions are the log's at the new version: its lookups are
    then answered without replaying the log segment again (~0.4 ms each, three a table and
    batch). Not done (``False``) when ``before`` was not what the memo held, or when the table
    lets txns expire (:data:`TXN_RETENTION`: delta-rs' answer then also depends on the clock)."""
    if TXN_RETENTION in table.metadata().configuration:
        return False
    key, version = id(table), table.version()
    with _TXNS_LOCK:
        memo = _TXNS.get(key)
        if memo is None or memo[0] != before:
            return False
        _TXNS[key] = (version, {**memo[1], **txns})
    return True


def warn_on_txn_retention(table: DeltaTable | None, table_uri: str, pipeline_id: str) -> None:
    """A stream's progress lives in txns (batch ids, Kafka offsets, its writer claim) that a
    commit refreshes only when it advances them: a table that lets them expire can lose an idle
    source partition's progress. Said once per start (by the claim), loudly, since the table is
    the user's."""
    span = table.metadata().configuration.get(TXN_RETENTION) if table is not None else None
    if span:
        logger.warning(
            "table %s sets %s = %r: delta-rs hides txns older than that, and pipeline %r keeps its "
            "progress in txns (batch ids, Kafka offsets, its writer claim) that a commit refreshes "
            "only when it advances them. A source partition idle for longer loses its progress, so "
            "after a lost checkpoint or a replayed batch its rows could be written twice. Remove the "
            "property (Spark: ALTER TABLE ... UNSET TBLPROPERTIES ('%s')) or make it longer than "
            "any partition stays idle",
            table_uri,
            TXN_RETENTION,
            span,
            pipeline_id,
            TXN_RETENTION,
        )


def kafka_txn_id(app_id: str, topic: str, partition: int | str) -> str:
    """The txn app id that records a Kafka partition's progress."""
    return f"{app_id}-{topic}-{partition}"


def kafka_delta_ingest_progress(
    table: DeltaTable | None, app_id: str, partitions: Sequence[int | str]
) -> dict[str, int]:
    """Last offset per partition that kafka-delta-ingest committed as ``app_id`` (its txns
    ``<app_id>-<partition>`` carry no topic: one topic per app id)."""
    out: dict[str, int] = {}
    if table is None:
        return out
    for p in partitions:
        version = transaction_version(table, f"{app_id}-{p}")
        if version is not None:
            out[str(p)] = int(version)
    return out


def kafka_progress(
    table: DeltaTable | None, app_id: str, layout: Mapping[str, Sequence[int | str]]
) -> dict[str, dict[str, int]]:
    """Last committed offset per Kafka partition of ``layout`` (absent when never committed)."""
    out: dict[str, dict[str, int]] = {}
    if table is None:
        return out
    for topic, partitions in layout.items():
        for p in partitions:
            version = transaction_version(table, kafka_txn_id(app_id, topic, p))
            if version is not None:
                out.setdefault(topic, {})[str(p)] = int(version)
    return out


def committed_offsets(
    table: DeltaTable | None,
    app_id: str,
    layout: Mapping[str, Sequence[int | str]],
    *,
    kafka_delta_ingest: bool = False,
) -> dict[str, dict[str, int]]:
    """Last committed offset per Kafka partition of ``layout``: :func:`kafka_progress`, or
    with ``kafka_delta_ingest`` and one topic, :func:`resumed_progress` (a table
    kafka-delta-ingest wrote as ``app_id`` resumes where it stopped)."""
    if kafka_delta_ingest and len(layout) == 1:
        [(topic, parts)] = layout.items()
        done = resumed_progress(table, app_id, topic, parts)
        return {topic: done} if done else {}
    return kafka_progress(table, app_id, layout)


def resumed_progress(
    table: DeltaTable | None, app_id: str, topic: str, partitions: Sequence[int | str]
) -> dict[str, int]:
    """Last committed offset per partition of ``topic``: deltaflow's txns, else
    kafka-delta-ingest's (a table it wrote as ``app_id`` resumes where it stopped)."""
    ours = kafka_progress(table, app_id, {topic: partitions}).get(topic, {})
    return {**kafka_delta_ingest_progress(table, app_id, partitions), **ours}


def advancing_txns(
    table: DeltaTable | None,
    app_id: str,
    end: Mapping[str, Mapping[str, int]],
    lost: Mapping[str, Mapping[str, DataLoss]] | None = None,
) -> dict[str, int]:
    """Txns ``<app_id>-<topic>-<partition>`` = last offset of a batch ending at ``end`` (next
    offsets), for the partitions it advances beyond what ``table`` holds. Versions never move
    back, except where the batch restarted a partition whose offsets went back (``lost``, from
    the batch's offsets) and the table still holds the progress it restarted from."""
    done = kafka_progress(table, app_id, {t: list(parts) for t, parts in end.items()})
    out = {}
    for topic, parts in end.items():
        for p, stop in parts.items():
            held = done.get(topic, {}).get(p)
            if stale_progress((lost or {}).get(topic, {}).get(p), held) or (
                stop > 0 and stop - 1 > (-1 if held is None else held)
            ):
                out[kafka_txn_id(app_id, topic, p)] = stop - 1
    return out


def checkpoint_txn_id(app_id: str) -> str:
    """The txn app id whose version names the checkpoint ``txn(app_id)``'s batches came from."""
    return f"{CHECKPOINT_TXN_PREFIX}{app_id}"


def checkpoint_mark(query_id: str) -> int:
    """A Spark query id (the ``id`` of its checkpoint's ``metadata``: the same across restarts
    from that checkpoint, new for a new one) as a txn version: 63 bits of its SHA-256."""
    return int.from_bytes(hashlib.sha256(query_id.encode()).digest()[:8], "big") >> 1


def batch_txns(app_id: str, version: int, checkpoint: str | None) -> dict[str, int]:
    """The txns a stream's commit of batch ``version`` carries: ``txn(app_id, version)`` and,
    when the query id is known, the mark of the checkpoint it came from."""
    txns = {app_id: version}
    if checkpoint:
        txns[checkpoint_txn_id(app_id)] = checkpoint_mark(checkpoint)
    return txns


def is_committed(
    table: Any,
    table_uri: str,
    app_id: str | None,
    version: int | None,
    *,
    streaming: bool,
    checkpoint: str | None = None,
) -> bool:
    """Whether ``txn(app_id)`` in ``table`` already holds ``version`` (the batch is a replay).

    Args:
        checkpoint: the streaming query's id (Spark's ``sql.streaming.queryId``, which lives in
            its checkpoint). With it, a batch the table holds counts as a replay only when the
            table's batches came from this same checkpoint (:func:`checkpoint_mark`).

    Raises:
        CheckpointMismatchError: for a stream whose batch is OLDER than the txn version (Spark
            only ever replays its last batch, so an older id means the checkpoint was lost or
            swapped), or whose table holds batches of another checkpoint (a new checkpoint's
            first batch has the same id as the last one of the lost checkpoint: skipping it
            would drop its rows). Either way the stream must stop instead of skipping.
    """
    if app_id is None or version is None:
        return False
    done = transaction_version(table, app_id)
    if done is None:
        return False
    other = _other_checkpoint(table, app_id, checkpoint) if streaming else None
    if streaming and (done > version or other):
        why = (
            f"the stream now runs batch {version}"
            if done > version
            else f"they came from another Spark checkpoint than batch {version} (query id {checkpoint})"
        )
        raise CheckpointMismatchError(
            f"pipeline {app_id!r} has committed batches up to {done} to {table_uri!r}, but {why}: "
            "its Spark checkpoint is not the one those commits came from (deleted, moved or "
            "shared). Restore the checkpoint, or start over deliberately with a new pipeline_id "
            "and a new checkpoint location; nothing was committed",
            pipeline_id=app_id,
            batch_id=version,
            table_uri=table_uri,
            committed_version=done,
        )
    return bool(done >= version)


def _other_checkpoint(table: Any, app_id: str, checkpoint: str | None) -> bool:
    """Whether the table's batches of ``app_id`` came from a checkpoint other than ``checkpoint``.
    Unknown (``False``) without a query id, or for a table whose commits carry no mark (written
    before marks were recorded: its next commit records one)."""
    if not checkpoint:
        return False
    mark = transaction_version(table, checkpoint_txn_id(app_id))
    return mark is not None and mark != checkpoint_mark(checkpoint)

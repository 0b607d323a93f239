"""Debezium topics on the Arrow ingest path: a source task's changes, folded and staged.

With ``--cdc debezium`` a task (``kafka_ingest.write_task``) does step 0 of the mirror path
instead of writing data files:

Step 0.1. Read the task's ranges (raw keys and values).
Step 0.2. Decode each message (:func:`deltaflow.sources.debezium.decode`); a message that is
          no change event, or a change whose value does not fit its mirror column's type, is a
          dead letter. A tombstone (the key without a value, after a delete) is passed over.
Step 0.3. Fold each table's changes per key (:class:`deltaflow.io.changes.ChangeFold`), ordered
          by the change's sequence: the database's own position when the envelope's ``source``
          names one (PostgreSQL, MySQL), else the Kafka offset (a key's changes share a partition).
Step 0.4. Write each table's fold as ONE staging Parquet file under the table's
          ``_deltaflow_staging/`` folder (readers and vacuum pass over ``_`` folders; no log entry
          ever names it), the dead letters as data files of the dead-letter table, and describe
          them. The driver merges the staged changes (:mod:`deltaflow.sinks.kafka_mirror`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltaflow.io.changes import SEQUENCE_COLUMN, STAGING_DIR, ChangeFold
from deltaflow.io.parquet import WrittenFile
from deltaflow.io.storage import filesystem
from deltaflow.sources.debezium import AvroEnvelopes, Change, JsonEnvelopes, decode, event_data

if TYPE_CHECKING:
    from deltaflow.sources.topic_routes import TableFiles

__all__ = ["EVENT_SCHEMA", "ChangeReader", "events", "stage", "staging_path"]

#: The rows of ``--cdc_mode append``: each change event as Rivven's Delta connector writes it.
EVENT_SCHEMA = pa.schema(
    [
        pa.field("data", pa.string(), nullable=False),
        pa.field("event_type", pa.string(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("stream", pa.string()),
    ]
)


def staging_path(prefix: str) -> str:
    """A staged file's path, relative to the table root."""
    return f"{STAGING_DIR}/{prefix}-{uuid.uuid4().hex[:8]}.parquet"


class ChangeReader:
    """Steps 0.2-0.3 of one task: folds each table's messages (a :class:`ChangeFold` per table).

    Args:
        key_columns: The mirrors' key columns (``()``: each message key's fields).
    """

    def __init__(self, key_columns: Sequence[str] = (), avro: AvroEnvelopes | None = None) -> None:
        self._key = tuple(key_columns)
        self._reader = avro or JsonEnvelopes()
        self.folds: dict[str, ChangeFold] = {}
        self.tables: dict[str, TableFiles] = {}

    def fold(
        self,
        table: TableFiles,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        offsets: Sequence[int],
    ) -> list[str | None]:
        """Fold the messages of ``table``'s topic in (in offset order); per message, why it
        cannot be applied (``None``: folded, or a tombstone)."""
        fold = self.folds.get(table.table_uri)
        if fold is None:
            fold = self.folds[table.table_uri] = ChangeFold(self._key or None, _data_columns(table.schema))
            self.tables[table.table_uri] = table
        return [
            _fold_one(fold, decode(k, v, self._reader), o, self._key)
            for k, v, o in zip(keys, values, offsets, strict=True)
        ]


def events(
    topic: str,
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    timestamps: Sequence[Any],
    avro: AvroEnvelopes | None = None,
) -> tuple[pa.Table, list[str | None]]:
    """``--cdc_mode append``: the messages' change events as rows of :data:`EVENT_SCHEMA`
    (tombstones passed over), and per message why it is no change event (``None``: it is one,
    or a tombstone). ``timestamps``: the messages' Kafka timestamps (for events without a time)."""
    columns: dict[str, list[Any]] = {f.name: [] for f in EVENT_SCHEMA}
    errors: list[str | None] = []
    reader = avro or JsonEnvelopes()
    for key, value, stamp in zip(keys, values, timestamps, strict=True):
        change = decode(key, value, reader)
        errors.append(change.error)
        if change.error is not None or change.event is None:
            continue
        columns["data"].append(event_data(change))
        columns["event_type"].append(change.event)
        columns["timestamp"].append(
            change.timestamp_ms * 1000 if change.timestamp_ms is not None else _micros(stamp)
        )
        columns["stream"].append(change.stream or topic)
    return pa.table(columns, schema=EVENT_SCHEMA), errors


def _micros(stamp: Any) -> int:
    import datetime as dt

    if isinstance(stamp, dt.datetime):
        return int(stamp.timestamp() * 1_000_000)
    return int(stamp or 0) * 1000


def _data_columns(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f for f in schema if f.name != SEQUENCE_COLUMN])


def _fold_one(fold: ChangeFold, change: Change, offset: int, key_columns: tuple[str, ...]) -> str | None:
    """Fold one message in; why it cannot be applied (``None``: folded, or a tombstone)."""
    if change.error is not None:
        return change.error
    if change.op is None:
        return None  # a tombstone
    sequence = change.sequence if change.sequence is not None else offset
    if change.op == "truncate":
        if change.sequence is None:
            return (
                "a truncate without the database's position of the change (the event's source names "
                "no sequence or binlog position) cannot be ordered against the changes in the topic's "
                "other partitions: Kafka orders a topic only within a partition"
            )
        fold.add("truncate", (), (), None, sequence)
        return None
    image = change.image
    names = key_columns or tuple(change.key or ())
    if not names:
        return (
            "the message has no key (Debezium keys each change by the row's key): pass --key_columns "
            "for a table without one"
        )
    try:
        values = tuple(
            (change.key or {})[n] if change.key is not None and n in change.key else (image or {})[n]
            for n in names
        )
    except KeyError as exc:
        return f"the change carries no value of the key column {exc.args[0]!r}"
    problem = fold.check(names, image, change.schema)
    if problem is not None:
        return problem
    fold.add(
        change.op, names, values, image, sequence, change.schema, offset_sequence=change.sequence is None
    )
    return None


def stage(files: TableFiles, fold: ChangeFold, prefix: str) -> WrittenFile:
    """Write ``fold`` as one staging file of the table; its description."""
    fs, root = filesystem(files.table_uri, files.storage_options)
    table = fold.to_table(_data_columns(files.schema))
    rel = staging_path(prefix)
    path = f"{root.rstrip('/')}/{rel}"
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(table, path, filesystem=fs, compression="zstd")
    size = fs.get_file_info(path).size or 0
    return WrittenFile(rel, size, {}, table.num_rows, "", int(time.time() * 1000))

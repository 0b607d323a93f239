"""Mirror tables: one Delta table kept equal to one PostgreSQL table from ``postgres-cdc``
events (a sink with ``write_mode: merge`` and ``stream: schema.table``).

Per micro-batch, on the driver, for each mirror (:class:`MirrorWriter`):

1. The batch's events of the mirror's stream whose transaction the table does not hold yet
   (commit LSN above its txn ``<pipeline_id>-slot:<slot>-lsn``; the source resumes from the
   least advanced of the pipeline's tables, so another table may be ahead).
2. Folded in commit order into the last state of each key (:func:`fold`): an insert replaces,
   an update lays its new values over what the batch already knew of the row (a value
   PostgreSQL left out, an unchanged TOAST value, is taken from the table by the merge), a
   key-changing update deletes the old key and carries the old row's values to the new one, a
   delete deletes; a truncate forgets the batch's earlier changes and deletes every row of the
   table older than it. The initial snapshot replaces the table's rows as of the snapshot (a
   second snapshot, after a crash between two tables' commits, leaves nothing behind that the
   first had and PostgreSQL no longer has).
3. The values a re-keyed row lacks that neither the batch nor the old row PostgreSQL sent
   (REPLICA IDENTITY FULL) holds are read from the table's row at the old key
   (:meth:`MirrorWriter._take_moved_values`); without that row they are unknown, and the batch
   stops with :class:`MergeError` rather than write NULL.
4. Typed from the PostgreSQL catalog (:func:`arrow_type`), new columns added to the table.
5. ONE delta-rs MERGE, guarded by the change sequence (``lsn * 2**32 + seq`` in
   ``_change_sequence``, DECIMAL(38,0)), carrying the slot's txns; a batch with nothing for
   this table still records the progress (a commit without files).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltaflow._version import __version__
from deltaflow.config.locations import normalize_uri
from deltaflow.config.postgres import PgColumn, PgTable
from deltaflow.config.sink import SinkOptions
from deltaflow.errors import ConfigError, DeltaflowError, MergeError
from deltaflow.io.changes import OP_COLUMN as OP
from deltaflow.io.changes import PRESENT_PREFIX, SEQUENCE_COLUMN, SEQUENCE_TYPE
from deltaflow.io.faults import maybe_crash
from deltaflow.metrics import metrics

__all__ = [
    "Folded",
    "MirrorWriter",
    "arrow_type",
    "fold",
    "merge_attempt",
    "merge_failures",
    "mirror_schema",
    "report_commit",
]

logger = logging.getLogger(__name__)

_SHIFT = 1 << 32

_INTEGERS = {"int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64()}
_FLOATS = {"float4": pa.float32(), "float8": pa.float64()}
_TIMES = {
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "timestamp": pa.timestamp("us"),
    "date": pa.date32(),
}


def _scalar_type(name: str, kind: str | None, precision: int | None, scale: int | None) -> pa.DataType:
    if kind == "e":
        return pa.string()  # enums: their labels
    if name in _INTEGERS:
        return _INTEGERS[name]
    if name in _FLOATS:
        return _FLOATS[name]
    if name == "bool":
        return pa.bool_()
    if name == "numeric":
        if precision is not None and scale is not None and 0 < precision <= 38 and 0 <= scale <= precision:
            return pa.decimal128(precision, scale)
        return pa.string()  # unconstrained (or beyond Delta's 38 digits): the exact digits as text
    if name == "bytea":
        return pa.binary()
    if name in _TIMES:
        return _TIMES[name]
    return pa.string()  # text, varchar, uuid, json(b), time, interval, inet, money, ...


def arrow_type(column: PgColumn) -> pa.DataType:
    """The Delta (Arrow) type of a PostgreSQL column (see the table in the README)."""
    if column.element is not None:
        return pa.list_(_scalar_type(column.element, column.element_kind, column.precision, column.scale))
    return _scalar_type(column.type_name, column.kind, column.precision, column.scale)


def mirror_schema(table: PgTable) -> pa.Schema:
    """The mirror table's schema: the PostgreSQL table's columns, then ``_change_sequence``."""
    return pa.schema(
        [pa.field(c.name, arrow_type(c)) for c in table.columns] + [(SEQUENCE_COLUMN, SEQUENCE_TYPE)]
    )


# -- values --------------------------------------------------------------------------------------


class _UnrepresentableError(ValueError):
    pass


def _json_text(value: Any) -> str:
    """JSON text of a parsed json/jsonb value, numbers with their own digits."""
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_json_text(v)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, list):
        return "[" + ", ".join(_json_text(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def _converter(column: PgColumn, target: pa.DataType) -> Callable[[Any], Any]:
    """JSON value (as the event's ``data`` holds it) -> the Python value for ``target``."""
    if pa.types.is_list(target):
        inner = _scalar_converter(column.element or "", target.value_type)

        def array(value: Any) -> Any:
            if not isinstance(value, list):
                raise _UnrepresentableError(f"{value!r} is not an array")
            out = []
            for v in value:
                if isinstance(v, list):
                    raise _UnrepresentableError("a multi-dimensional array (a mirror holds one dimension)")
                out.append(None if v is None else inner(v))
            return out

        return array
    return _scalar_converter(column.type_name, target)


def _scalar_converter(pg_type: str, target: pa.DataType) -> Callable[[Any], Any]:
    if pa.types.is_integer(target):
        return int
    if pa.types.is_floating(target):
        return float  # Decimal, int, or "NaN"/"Infinity"/"-Infinity"
    if pa.types.is_boolean(target):
        return bool
    if pa.types.is_decimal(target):

        def decimal(value: Any) -> Decimal:
            if isinstance(value, str):
                raise _UnrepresentableError(
                    f"{value} has no DECIMAL value (declare the column numeric without precision)"
                )
            return Decimal(value)

        return decimal
    if pa.types.is_binary(target):
        return base64.b64decode
    if pa.types.is_timestamp(target):
        aware = target.tz is not None

        def timestamp(value: Any) -> dt.datetime:
            try:
                parsed = dt.datetime.fromisoformat(value)
            except (TypeError, ValueError):
                raise _UnrepresentableError(f"{value!r} is no timestamp a Delta table can hold") from None
            if aware and parsed.tzinfo is None:
                raise _UnrepresentableError(f"{value!r} has no time zone")
            return parsed

        return timestamp
    if pa.types.is_date(target):

        def date(value: Any) -> dt.date:
            try:
                return dt.date.fromisoformat(value)
            except (TypeError, ValueError):
                raise _UnrepresentableError(f"{value!r} is no date a Delta table can hold") from None

        return date
    if pg_type in ("json", "jsonb"):
        return _json_text
    return lambda value: value if isinstance(value, str) else _json_text(value)


# -- folding -------------------------------------------------------------------------------------


@dataclass
class _Row:
    op: str  # upsert | delete
    image: dict[str, Any]
    sequence: int
    complete: bool  # every column's value is known (an insert, a snapshot row, a full old row)
    #: The key whose row in the table (as before the batch) holds the values ``image`` lacks,
    #: when that is another key than the row's own (a key-changing update); ``None``: the
    #: merge keeps the values of the row's own key.
    moved_from: tuple[Any, ...] | None = None
    #: Values taken from the table's row at ``moved_from``, already typed.
    kept: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Folded:
    """A batch's changes to one table: the last state per key, and the truncate to apply."""

    rows: list[_Row]
    truncated_below: int | None  # delete every table row with a lower sequence (not in rows)
    changes: int
    truncates: int = 0  # TRUNCATE events among the changes
    snapshot: bool = False  # the batch holds a snapshot (it replaces the rows before it)

    def replaced(self) -> str:
        """What replaced the table's earlier rows, for log lines ("" when nothing did)."""
        if self.truncates:
            return " after a truncate"
        return " as a snapshot (rows not in it removed)" if self.snapshot else ""


def fold(events: pa.Table, key: Sequence[str], columns: Sequence[str]) -> Folded:
    """The last state of each key after ``events`` (one stream's, in any order)."""
    order = pc.sort_indices(events, [("lsn", "ascending"), ("seq", "ascending")])
    events = events.take(order)
    kinds = events.column("event_type").to_pylist()
    datas = events.column("data").to_pylist()
    lsns = events.column("lsn").to_pylist()
    seqs = events.column("seq").to_pylist()
    known = set(columns)
    state: dict[tuple[Any, ...], _Row] = {}
    truncated: int | None = None
    snapshot_floor: int | None = None

    def key_of(image: Mapping[str, Any]) -> tuple[Any, ...]:
        try:
            return tuple(image[k] for k in key)
        except KeyError as exc:
            raise _UnrepresentableError(f"a change without the key column {exc.args[0]!r}") from None

    for kind, data, lsn, seq in zip(kinds, datas, lsns, seqs, strict=True):
        sequence = lsn * _SHIFT + seq
        if kind == "truncate":
            state.clear()
            truncated = sequence
            continue
        doc = json.loads(data, parse_float=Decimal)
        if kind in ("insert", "snapshot"):
            if kind == "snapshot" and snapshot_floor is None:
                snapshot_floor = lsn * _SHIFT
            state[key_of(doc)] = _Row("upsert", doc, sequence, known <= doc.keys())
        elif kind == "update":
            # The new row lacks the values PostgreSQL did not send (unchanged TOAST values); they
            # are the old row's, whatever its key: what the batch knew of it, else the old row
            # PostgreSQL sent (replica identity full), else the table's row at the old key.
            after, before = doc["after"], doc.get("before")
            new_key = key_of(after)
            old_key = key_of(before) if before is not None and all(k in before for k in key) else new_key
            prior = state.get(old_key)
            if old_key != new_key:
                state[old_key] = _Row("delete", before, sequence, False)
            if prior is not None and prior.op == "upsert":
                image = {**prior.image, **after}
                source = prior.moved_from if prior.moved_from is not None else old_key
            elif before is not None and len(before) > len(key):  # replica identity full: the old row
                image, source = {**before, **after}, old_key
            else:
                image, source = dict(after), old_key
            complete = known <= image.keys()
            moved_from = None if complete or source == new_key else source
            state[new_key] = _Row("upsert", image, sequence, complete, moved_from)
        elif kind == "delete":
            state[key_of(doc)] = _Row("delete", doc, sequence, False)
    if snapshot_floor is not None:
        truncated = max(truncated or 0, snapshot_floor)
    return Folded(
        list(state.values()),
        truncated,
        len(kinds),
        truncates=kinds.count("truncate"),
        snapshot=snapshot_floor is not None,
    )


# -- the writer ----------------------------------------------------------------------------------

#: What a failed batch left in this mirror, and in the pipeline's others (they commit side by
#: side: some may hold the batch, and its replay skips them).
_NOTHING_COMMITTED = (
    "nothing of this batch was committed to this mirror (the pipeline's other mirrors may hold it; "
    "the batch's replay skips those)"
)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _no_identity(table: PgTable) -> str:
    return "none: REPLICA IDENTITY NOTHING" if table.replica_identity == "n" else "none: no primary key"


class MirrorWriter:
    """Applies one stream's events of each micro-batch to its mirror table.

    Args:
        options: The sink's options (``write_mode: merge``, the key columns resolved,
            ``kafka_offsets`` and ``checkpoint_location`` set by the pipeline).
        stream: ``schema.table``.
        slot_key: The source's offsets key (``slot:<slot>``).
        describe: Reads the PostgreSQL table's catalog (called at start, and again when changes
            carry a column the last reading lacked).
    """

    def __init__(
        self, options: SinkOptions, stream: str, slot_key: str, describe: Callable[[], PgTable]
    ) -> None:
        self._options = options
        self._uri = normalize_uri(options.table_uri)
        self._stream = stream
        self._slot_key = slot_key
        self._describe = describe
        self._table: PgTable | None = None

    @property
    def options(self) -> SinkOptions:
        return self._options

    def with_options(self, options: SinkOptions) -> MirrorWriter:
        """The same mirror writing with ``options`` (a writer epoch claimed), its catalog kept."""
        other = MirrorWriter(options, self._stream, self._slot_key, self._describe)
        other._table = self._table
        return other

    def shape(self) -> PgTable:
        if self._table is None:
            self._table = self._describe()
        return self._table

    def key_columns(self) -> tuple[str, ...]:
        """The columns identifying a row: the sink's ``key_columns``, else the primary key.

        Raises:
            ConfigError: no key, or one a delete does not carry (the replica identity).
        """
        table = self.shape()
        key = self._options.key_columns or table.primary_key
        where = f"mirror of {self._stream} ({self._uri})"
        if not key:
            # All the advice at once: a key alone is not enough while deletes carry no columns.
            identity = (
                f", and ALTER TABLE {self._stream} REPLICA IDENTITY FULL (or USING INDEX on a unique "
                "index of those columns) so that a delete carries them"
                if table.replica_identity == "n" or not table.identity_key
                else ""
            )
            raise ConfigError(
                f"{where}: {self._stream} has no primary key; set key_columns (the columns that identify "
                f"a row){identity}",
                table_uri=self._uri,
            )
        names = {c.name for c in table.columns}
        unknown = [k for k in key if k not in names]
        if unknown:
            raise ConfigError(
                f"{where}: key column(s) {unknown} are not columns of {self._stream}", table_uri=self._uri
            )
        if table.replica_identity == "n" or not set(key) <= set(table.identity_key):
            raise ConfigError(
                f"{where}: a delete in PostgreSQL carries only the replica identity's columns "
                f"({', '.join(table.identity_key) or _no_identity(table)}), not the key "
                f"{list(key)}: ALTER TABLE {self._stream} REPLICA IDENTITY FULL (or USING INDEX on the key), "
                "or set key_columns to the identity's columns",
                table_uri=self._uri,
            )
        return tuple(key)

    def prepare(self) -> None:
        """Check the key and create the table from the catalog (nothing is read from the slot)."""
        from deltaflow.delta import commit
        from deltaflow.delta import log as delta_log
        from deltaflow.delta.schema import check_partition_columns

        self.key_columns()
        schema = mirror_schema(self.shape())
        check_partition_columns(schema, self._options.partition_columns, self._uri)
        if delta_log.load(self._uri, self._options.storage_options) is None:
            if not self._options.auto_create_table:
                from deltaflow.errors import TableNotFoundError

                raise TableNotFoundError(
                    f"no Delta table at {self._uri!r} and auto_create_table is off", table_uri=self._uri
                )
            commit.create_table(
                self._uri,
                schema,
                partition_by=self._options.partition_columns,
                properties=self._options.table_properties,
                storage_options=self._options.storage_options,
            )

    def __call__(self, events: pa.Table, batch_id: int) -> None:
        from deltaflow.delta import commit
        from deltaflow.delta import log as delta_log
        from deltaflow.delta.progress import advancing_txns, kafka_progress
        from deltaflow.sinks.datasource import sink_fence
        from deltaflow.sinks.spark_checkpoint import read_batch_offsets

        opts = self._options
        app = opts.pipeline_id or ""
        started = time.monotonic()
        end = read_batch_offsets(opts, batch_id)
        table = delta_log.load(self._uri, opts.storage_options)
        commit.check_fence(table, self._uri, sink_fence(opts))  # also before a batch it skips
        held = kafka_progress(table, app, {self._slot_key: ["lsn"]}).get(self._slot_key, {}).get("lsn", -1)
        mine = events.filter(pc.equal(events.column("stream"), self._stream))
        mine = mine.filter(
            pc.or_(pc.greater(mine.column("lsn"), held), pc.equal(mine.column("event_type"), "snapshot"))
        )
        if not mine.num_rows and not advancing_txns(table, app, end):
            metrics.batch_skipped(pipeline=app, table=self._uri)
            return
        try:
            folded = fold(mine, self.key_columns(), [c.name for c in self.shape().columns])
            self._take_moved_values(folded, table, batch_id)
            data = self._typed(folded) if folded.rows or folded.truncated_below is not None else None
        except _UnrepresentableError as exc:
            raise MergeError(
                f"batch {batch_id}: a change of {self._stream} cannot be applied to {self._uri}: {exc}; "
                f"{_NOTHING_COMMITTED}. The change was captured with this value: altering the column in "
                "PostgreSQL now does not change it, and it comes again at every restart. Declare the "
                "column so that the mirror can hold its values (e.g. as text), then take the mirror "
                "again: stop the pipeline, delete the mirror table and the checkpoint, and start it "
                "(a new snapshot)",
                table_uri=self._uri,
                batch_id=batch_id,
            ) from None
        maybe_crash("before_commit", batch_id, self._uri)
        self._commit(data, folded, batch_id, end, started)
        maybe_crash("after_commit", batch_id, self._uri)

    def _take_moved_values(self, folded: Folded, table: Any, batch_id: int) -> None:
        """Give each re-keyed row the values it lacks from the table's row at its old key.

        The table is the one the batch's events were chosen against (its txn): its rows are
        as of before the batch's first change, so the old key's row holds the values the
        key-changing update left unchanged.

        Raises:
            MergeError: the table has no row at the old key (it predates the mirror, e.g. with
                ``snapshot: never``): the values are unknown, and nothing is committed.
        """
        moved = [r for r in folded.rows if r.op == "upsert" and r.moved_from is not None]
        if not moved:
            return
        key = self.key_columns()
        columns = {c.name: c for c in self.shape().columns}
        wanted = sorted({n for r in moved for n in columns if n not in r.image})
        stored = {f.name for f in table.schema().fields} if table is not None else set()
        typed_keys = {}
        for r in moved:
            assert r.moved_from is not None
            typed_keys[r.moved_from] = tuple(
                _converter(columns[k], arrow_type(columns[k]))(v)
                for k, v in zip(key, r.moved_from, strict=True)
            )
        found: dict[tuple[Any, ...], dict[str, Any]] = {}
        if table is not None and stored >= set(key):
            condition = None
            for i, k in enumerate(key):
                values = pa.array(list({t[i] for t in typed_keys.values()}), arrow_type(columns[k]))
                term = pc.field(k).isin(values)
                condition = term if condition is None else condition & term
            read = [*key, *(n for n in wanted if n in stored)]
            rows = table.to_pyarrow_table(columns=read, filters=condition).to_pylist()
            found = {tuple(row[k] for k in key): row for row in rows}
        for r in moved:
            assert r.moved_from is not None
            old = found.get(typed_keys[r.moved_from])
            lacking = [n for n in wanted if n not in r.image]
            if old is None or not set(lacking) <= old.keys():
                raise MergeError(
                    f"batch {batch_id}: an update of {self._stream} moved the row at "
                    f"{dict(zip(key, r.moved_from, strict=True))} to "
                    f"{dict(zip(key, (r.image[k] for k in key), strict=True))} leaving column(s) "
                    f"{lacking} unchanged (TOAST values PostgreSQL does not send), and {self._uri} has "
                    f"no row at the old key to take them from; {_NOTHING_COMMITTED}. ALTER TABLE "
                    f"{self._stream} REPLICA IDENTITY FULL makes PostgreSQL send the old row whole; "
                    "this change can only be mirrored by taking the mirror again (a new pipeline_id, "
                    "with snapshot: initial)",
                    table_uri=self._uri,
                    batch_id=batch_id,
                )
            r.kept = {n: old[n] for n in lacking}

    def _typed(self, folded: Folded) -> pa.Table:
        """The folded rows as the merge's source: typed columns, op, sequence, presence flags."""
        seen = set().union(*(r.image.keys() for r in folded.rows))
        names = {c.name for c in self.shape().columns}
        if not seen <= names:
            self._table = self._describe()  # a column was added since the catalog was read
            names = {c.name for c in self.shape().columns}
            gone = sorted(seen - names)
            if gone:
                logger.warning(
                    "changes of %s carry column(s) %s the table no longer has: not mirrored",
                    self._stream,
                    gone,
                )
        self._add_new_columns()
        rows = folded.rows
        arrays, fields = [], []
        for column in self.shape().columns:
            target = arrow_type(column)
            convert = _converter(column, target)
            values = []
            for r in rows:
                if column.name in r.kept:
                    values.append(r.kept[column.name])
                    continue
                v = r.image.get(column.name)
                try:
                    values.append(None if v is None else convert(v))
                except (_UnrepresentableError, ValueError, TypeError, ArithmeticError) as exc:
                    raise _UnrepresentableError(
                        f"column {column.name!r} ({column.type_name}): {exc}"
                    ) from None
            arrays.append(pa.array(values, target))
            fields.append(pa.field(column.name, target))
            if any(
                r.op == "upsert" and column.name not in r.image and column.name not in r.kept for r in rows
            ):
                arrays.append(
                    pa.array([column.name in r.image or column.name in r.kept for r in rows], pa.bool_())
                )
                fields.append(pa.field(PRESENT_PREFIX + column.name, pa.bool_()))
        arrays.append(pa.array([r.op for r in rows], pa.string()))
        fields.append(pa.field(OP, pa.string()))
        arrays.append(pa.array([Decimal(r.sequence) for r in rows], SEQUENCE_TYPE))
        fields.append(pa.field(SEQUENCE_COLUMN, SEQUENCE_TYPE))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def _add_new_columns(self) -> None:
        from deltaflow.delta import commit
        from deltaflow.delta import log as delta_log

        table = delta_log.load(self._uri, self._options.storage_options)
        have = {f.name for f in table.schema().fields} if table is not None else set()
        new = [f for f in mirror_schema(self.shape()) if f.name not in have]
        if new and table is not None:
            commit.add_columns(
                self._uri,
                self._options.storage_options,
                new,
                policy=commit.RetryPolicy(max_retries=self._options.max_commit_retries),
            )

    def _commit(
        self,
        data: pa.Table | None,
        folded: Folded,
        batch_id: int,
        end: Mapping[str, Mapping[str, int]],
        started: float,
    ) -> None:
        from deltaflow.delta import commit
        from deltaflow.delta.progress import advancing_txns
        from deltaflow.sinks.datasource import sink_fence

        opts = self._options
        app = opts.pipeline_id or ""
        key = self.key_columns()
        metadata = {
            "deltaflow.version": __version__,
            "deltaflow.pipeline_id": app,
            "deltaflow.epoch": batch_id,
            "deltaflow.rows": 0 if data is None else data.num_rows,
            "deltaflow.stream": self._stream,
        }

        def txns(table: Any) -> dict[str, int]:
            return advancing_txns(table, app, end)

        def already_done(table: Any) -> bool:
            # A batch that only records progress is done once nothing advances; one with rows
            # is found by this commit's token (a snapshot replacing an older one records
            # nothing new).
            return data is None and not txns(table)

        policy = commit.RetryPolicy(max_retries=opts.max_commit_retries)
        outcome: Any
        with merge_failures(app, self._uri, f"merge of batch {batch_id} of {self._stream}", batch_id):
            if data is None:
                outcome = commit.commit_files(
                    self._uri,
                    [],
                    what=f"progress of batch {batch_id} of {app!r}",
                    schema=mirror_schema(self.shape()),
                    partition_by=opts.partition_columns,
                    mode="append",
                    metadata=metadata,
                    storage_options=opts.storage_options,
                    policy=policy,
                    create_if_missing=False,
                    properties=opts.table_properties,
                    txns=txns,
                    already_done=already_done,
                    fence=sink_fence(opts),
                )
            else:
                outcome = commit.commit(
                    self._uri,
                    opts.storage_options,
                    merge_attempt(
                        self._uri, data, [c.name for c in self.shape().columns], key, folded.truncated_below
                    ),
                    what=f"merge of batch {batch_id} of {app!r} ({self._stream})",
                    metadata=metadata,
                    txns=txns,
                    already_done=already_done,
                    fence=sink_fence(opts),
                    policy=policy,
                )
        rows = 0 if data is None else data.num_rows
        if not report_commit(outcome, app, self._uri, rows, started):
            return
        logger.info(
            "mirror %s <- %s: batch %s, %d change(s) as %d row change(s)%s",
            self._uri,
            self._stream,
            batch_id,
            folded.changes,
            rows,
            folded.replaced(),
        )


def merge_attempt(
    uri: str,
    data: pa.Table,
    names: Sequence[str],
    key: Sequence[str],
    truncated_below: int | None,
    insert_floor: int | None = None,
) -> Callable[[Any, Any], Any]:
    """The delta-rs MERGE of folded changes ``data`` (columns ``names`` of the table, their
    presence flags, op and sequence) into the mirror at ``uri``, guarded by the sequence: a
    row older than the table's is passed over; with ``truncated_below`` every table row the
    batch does not touch whose sequence is lower is deleted; with ``insert_floor`` (the table's
    last truncate) a row older than it is not inserted. For :func:`deltaflow.delta.commit.commit`."""
    names = [n for n in names if n in data.column_names]
    partial = {n for n in names if PRESENT_PREFIX + n in data.column_names}
    on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in key)
    seq = _quote(SEQUENCE_COLUMN)
    newer = f"(t.{seq} IS NULL OR s.{seq} >= t.{seq})"
    updates = {
        _quote(n): (
            f"CASE WHEN s.{_quote(PRESENT_PREFIX + n)} THEN s.{_quote(n)} ELSE t.{_quote(n)} END"
            if n in partial
            else f"s.{_quote(n)}"
        )
        for n in names
    }
    updates[seq] = f"s.{seq}"
    inserts = {_quote(n): f"s.{_quote(n)}" for n in [*names, SEQUENCE_COLUMN]}

    def attempt(table: Any, props: Any) -> Any:
        if table is None:
            raise ConfigError(f"the mirror table {uri!r} does not exist", table_uri=uri)
        insert = f"s.{OP} = 'upsert'"
        if insert_floor is not None:
            insert += f" AND s.{seq} >= CAST('{insert_floor}' AS DECIMAL(38, 0))"
        merger = (
            table.merge(data, predicate=on, source_alias="s", target_alias="t", commit_properties=props)
            .when_matched_delete(predicate=f"s.{OP} = 'delete' AND {newer}")
            .when_matched_update(updates, predicate=f"s.{OP} = 'upsert' AND {newer}")
            .when_not_matched_insert(inserts, predicate=insert)
        )
        if truncated_below is not None:
            below = f"CAST('{truncated_below}' AS DECIMAL(38, 0))"
            merger = merger.when_not_matched_by_source_delete(predicate=f"t.{seq} < {below}")
        return merger.execute()

    return attempt


@contextlib.contextmanager
def merge_failures(app: str, uri: str, what: str, batch_id: int) -> Iterator[None]:
    """Count a failed mirror commit; a delta-rs error becomes :class:`MergeError` saying that
    nothing of the batch is in this mirror (``what``: "merge of batch 7 of orders")."""
    try:
        yield
    except DeltaflowError:
        metrics.commit_failed(pipeline=app, table=uri)
        raise
    except Exception as exc:
        from deltaflow.delta.log import is_delta_rs_error

        if not is_delta_rs_error(exc):
            raise
        metrics.commit_failed(pipeline=app, table=uri)
        raise MergeError(
            f"{what} into {uri!r} failed: {exc}; {_NOTHING_COMMITTED}", table_uri=uri, batch_id=batch_id
        ) from exc


def report_commit(outcome: Any, app: str, uri: str, rows: int, started: float) -> bool:
    """Meter a mirror commit's outcome; whether it committed (``False``: another commit held
    the batch already)."""
    if not outcome.committed:
        metrics.batch_skipped(pipeline=app, table=uri)
        return False
    metrics.batch_committed(
        pipeline=app,
        table=uri,
        rows=rows,
        files=0,
        bytes_=0,
        seconds=time.monotonic() - started,
        retries=outcome.attempts - 1,
    )
    return True

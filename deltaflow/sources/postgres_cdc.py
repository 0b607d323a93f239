"""PostgreSQL change data capture as a Spark streaming source (``postgres-cdc``), no JVM jar.

A publication's changes are read through logical replication with the built-in ``pgoutput``
plugin, from a replication slot (created if missing). Offsets are WAL positions (LSNs):
``{"slot:<slot>": {"lsn": N}}`` means "every transaction whose commit record starts below N is
taken". A micro-batch is the transactions whose commit LSN lies in ``[start, end)``, whole
transactions only, in commit order; each change becomes one event row (:data:`EVENT_SCHEMA`).

Exactly once, without trusting Spark's checkpoint alone:

* the Delta sink records the batch's end in the same commit as its rows (sink option
  ``kafka_offsets``: txn ``<pipeline_id>-slot:<slot>-lsn`` = end - 1, the scheme of Kafka
  partitions), and with ``delta_table_uri`` the source never reads a transaction the table
  holds and resumes from the table when the checkpoint is gone;
* the slot's ``confirmed_flush_lsn`` is advanced only to what the Delta table holds, so
  PostgreSQL keeps every change the table lacks, and recycles the rest of the WAL;
* changes are read with ``pg_logical_slot_peek_binary_changes``, which does not consume them:
  a batch Spark replays after a crash reads the same transactions again.

The slot serves one reader at a time, so a batch is one Spark task.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import struct
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from deltaflow.config.postgres import PostgresCdcOptions, slot_key
from deltaflow.errors import (
    CdcDecodeError,
    CdcPositionError,
    DeltaflowError,
    PostgresAccessError,
    PostgresSetupError,
    PostgresUnavailableError,
)
from deltaflow.io import logs
from deltaflow.sources import pgoutput

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = [
    "EVENT_SCHEMA",
    "FORMAT_NAME",
    "PostgresCdcDataSource",
    "PostgresCdcOptions",
    "event_arrow_schema",
    "slot_key",
]

logger = logging.getLogger(__name__)

#: ``spark.readStream.format(...)`` name (Rivven's connector name).
FORMAT_NAME = "postgres-cdc"

#: One row per change. ``data``, ``event_type``, ``timestamp`` and ``stream`` are Rivven's event
#: table columns; ``lsn`` (the transaction's commit LSN), ``xid`` and ``seq`` (the change's place
#: in its transaction) order the changes exactly.
EVENT_SCHEMA = (
    "data STRING, event_type STRING, timestamp TIMESTAMP, stream STRING, lsn BIGINT, xid BIGINT, seq INT"
)


def event_arrow_schema() -> pa.Schema:
    """:data:`EVENT_SCHEMA` as Arrow: what the tasks yield and the event table holds."""
    import pyarrow as pa

    return pa.schema(
        [
            ("data", pa.string()),
            ("event_type", pa.string()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("stream", pa.string()),
            ("lsn", pa.int64()),
            ("xid", pa.int64()),
            ("seq", pa.int32()),
        ]
    )


#: Rows per Arrow batch handed to Spark.
CHUNK_ROWS = 10_000
#: With nothing new, ``latestOffset()`` answers "no new data" after this long at most.
IDLE_POLL_S = 0.25
#: How long a reader waits for a slot another session still holds (a killed process's backend
#: finishing its last read) before the task fails.
SLOT_BUSY_WAIT_S = 60.0

Offsets = dict[str, dict[str, int]]
#: The offsets' entries: the next commit LSN, and (once taken) the initial snapshot.
_LSN, _SNAPSHOT = "lsn", "snapshot"


def _tables(options: PostgresCdcOptions) -> str:
    """The pipeline's tables, for messages."""
    return " and ".join(u for u, _ in options.progress_tables()) or "the table"


def _slot_gone(options: PostgresCdcOptions, held: str | None = None) -> str:
    """The error and the way out when the pipeline's replication slot was dropped."""
    holds = f" ({_tables(options)} holds changes up to {held} from it)" if held else ""
    return (
        f"replication slot {options.slot_name!r} at {options.where()} is gone{holds}: the changes "
        "made since it was dropped are no longer kept by PostgreSQL, and a dropped slot cannot be "
        "brought back, so this pipeline cannot continue without a gap. To start over from a new "
        f"snapshot: stop the pipeline, delete (or move aside) {_tables(options)} and its "
        "checkpoint, and start it again: it creates the slot and copies every published table "
        "afresh. A new pipeline_id on the same tables also starts over, but keeps rows deleted "
        "in PostgreSQL while the slot was gone"
    )


def _snapshot_pending(position: Mapping[str, int], options: PostgresCdcOptions) -> bool:
    return options.snapshot == "initial" and _SNAPSHOT not in position and int(position[_LSN]) == 0


# -- connections and errors ----------------------------------------------------------------

_ACCESS = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "does not exist",
    "permission denied",
    "SSL",
    "certificate",
)


def _failure(exc: BaseException, options: PostgresCdcOptions, doing: str) -> DeltaflowError:
    message = f"PostgreSQL at {options.where()}: {doing} failed: {_first_line(exc)}"
    if any(marker in str(exc) for marker in _ACCESS):
        return PostgresAccessError(message + " (check the connection settings and the role's rights)")
    return PostgresUnavailableError(message)


@contextmanager
def connection(options: PostgresCdcOptions, doing: str) -> Iterator[Any]:
    """An autocommit connection with fixed session settings (UTC, ISO dates, exact floats:
    ``SESSION_OPTIONS``). psycopg's errors become deltaflow's: unreachable →
    :class:`PostgresUnavailableError` (transient), refused → :class:`PostgresAccessError`, a
    slot PostgreSQL can no longer read from → :class:`CdcPositionError`, anything else the
    server refuses (a publication or slot dropped meanwhile) → :class:`PostgresSetupError`."""
    import psycopg

    try:
        conn = psycopg.connect(**options.connect_kwargs(), autocommit=True)
    except psycopg.Error as exc:
        raise _failure(exc, options, f"connecting ({doing})") from None
    try:
        yield conn
    except psycopg.OperationalError as exc:
        if isinstance(exc, psycopg.errors.ObjectNotInPrerequisiteState):
            raise CdcPositionError(
                f"PostgreSQL at {options.where()}: {doing} failed: {_first_line(exc)} (the slot cannot "
                "serve the changes the table lacks: start over deliberately with a new slot and pipeline_id)"
            ) from None
        raise _failure(exc, options, doing) from None
    except psycopg.Error as exc:
        raise PostgresSetupError(
            f"PostgreSQL at {options.where()}: {doing} failed: {_first_line(exc)}"
        ) from None
    finally:
        conn.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_encoding(conn: Any, options: PostgresCdcOptions) -> None:
    """pgoutput's text arrives in the client encoding (UTF8, ``SESSION_OPTIONS``), converted
    from the database's; a SQL_ASCII database's text has no encoding to convert from."""
    if str(conn.execute("SHOW server_encoding").fetchone()[0]) == "SQL_ASCII":
        raise PostgresSetupError(
            f"database {options.database or '$PGDATABASE'} at {options.where()} has encoding SQL_ASCII: "
            "its text has no known encoding, so change data cannot be decoded reliably (use a UTF8 "
            "database)"
        )


@dataclass(frozen=True)
class SlotState:
    plugin: str
    database: str
    confirmed: int


def check_setup(conn: Any, options: PostgresCdcOptions) -> SlotState | None:
    """Refuse, with what to change, a server that cannot serve this source; the slot's state
    (``None`` when it does not exist yet). Nothing is created or written."""
    where = options.where()
    level = conn.execute("SHOW wal_level").fetchone()[0]
    if level != "logical":
        raise PostgresSetupError(
            f"PostgreSQL at {where} runs with wal_level = {level}; logical replication needs "
            "wal_level = logical (ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL)"
        )
    row = conn.execute(
        "SELECT current_user, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    if not row or not row[1]:
        user = row[0] if row else options.user
        raise PostgresSetupError(
            f"role {user!r} at {where} may not use logical replication: grant it with "
            f"ALTER ROLE {user} WITH REPLICATION (or connect as a role that has it)"
        )
    if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (options.publication,)).fetchone():
        existing = [r[0] for r in conn.execute("SELECT pubname FROM pg_publication ORDER BY 1").fetchall()]
        raise PostgresSetupError(
            f"publication {options.publication!r} does not exist in {where} (existing: "
            f"{', '.join(existing) or 'none'}); create it with CREATE PUBLICATION {options.publication} "
            "FOR TABLE ... (or FOR ALL TABLES)"
        )
    state = slot_state(conn, options.slot_name)
    if state is not None:
        database = conn.execute("SELECT current_database()").fetchone()[0]
        if state.plugin != "pgoutput" or state.database != database:
            raise PostgresSetupError(
                f"replication slot {options.slot_name!r} at {where} belongs to plugin {state.plugin!r} in "
                f"database {state.database!r}; this source needs a pgoutput slot in {database!r}: name "
                "another slot (option slot)"
            )
    return state


def flush_lsn(conn: Any) -> int:
    """The WAL position flushed to disk: no commit below it is still to come."""
    return pgoutput.lsn_from_text(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])


def slot_state(conn: Any, slot: str) -> SlotState | None:
    row = conn.execute(
        "SELECT plugin, database, confirmed_flush_lsn::text FROM pg_replication_slots "
        "WHERE slot_name = %s AND slot_type = 'logical'",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    return SlotState(str(row[0]), str(row[1]), pgoutput.lsn_from_text(row[2]) if row[2] else 0)


def _peek_options(options: PostgresCdcOptions) -> tuple[str, ...]:
    return ("proto_version", "1", "publication_names", options.publication)


def _with_slot(conn: Any, options: PostgresCdcOptions, query: str, params: tuple[Any, ...]) -> Any:
    """Run a query that takes the slot, waiting while another session still holds it."""
    import psycopg

    deadline = time.monotonic() + SLOT_BUSY_WAIT_S
    while True:
        try:
            return conn.execute(query, params)
        except psycopg.errors.ObjectInUse as exc:
            if time.monotonic() > deadline:
                raise PostgresUnavailableError(
                    f"replication slot {options.slot_name!r} at {options.where()} stayed in use by another "
                    f"session for {SLOT_BUSY_WAIT_S:.0f} s: {str(exc).strip()} (is another pipeline "
                    "using it?)"
                ) from None
            time.sleep(0.5)


# -- the data source -----------------------------------------------------------------------


@dataclass(frozen=True)
class CdcRange(InputPartition):
    """Transactions with commit LSN in ``[start, end)`` of one slot, read in one task."""

    start: int
    end: int
    options: PostgresCdcOptions = field(repr=False)
    arrow_schema: Any = field(repr=False, default=None)


@dataclass(frozen=True)
class SnapshotRange(InputPartition):
    """One published table (or a ctid range of a large one) read in the exported snapshot."""

    relation: pgoutput.Relation
    copy_sql: str
    snapshot_name: str
    lsn: int  # the slot's consistent point: the snapshot holds every commit before it
    taken_us: int
    chunk: int  # the events' xid: (stream, lsn, xid, seq) stays unique across a table's tasks
    options: PostgresCdcOptions = field(repr=False)
    arrow_schema: Any = field(repr=False, default=None)


def create_slot_exporting_snapshot(options: PostgresCdcOptions) -> tuple[Any, int, str]:
    """Create the slot over a replication connection, exporting the snapshot its start matches.

    Returns the connection (the snapshot lives while it stays open and idle), the slot's
    consistent point and the snapshot's name.
    """
    import psycopg
    from psycopg import sql

    try:
        conn = psycopg.connect(**options.connect_kwargs(), replication="database", autocommit=True)
    except psycopg.Error as exc:
        failure = _failure(exc, options, "opening a replication connection for the snapshot")
        if isinstance(failure, PostgresAccessError):
            raise PostgresSetupError(
                f"{failure} (the initial snapshot needs a replication connection: a 'replication' line "
                "in pg_hba.conf for this role and host, and the REPLICATION attribute)"
            ) from None
        raise failure from None
    command = sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT").format(
        sql.Identifier(options.slot_name)
    )
    result = conn.pgconn.exec_(command.as_bytes(conn))
    if result.status != 2:  # PGRES_TUPLES_OK
        message = (result.error_message or b"").decode("utf-8", "replace").strip()
        conn.close()
        raise PostgresSetupError(
            f"creating replication slot {options.slot_name!r} at {options.where()} failed: {message}"
        )
    lsn = pgoutput.lsn_from_text(bytes(result.get_value(0, 1) or b"0/0").decode())
    name = bytes(result.get_value(0, 2) or b"").decode()
    logger.info(
        "created replication slot %r at %s (LSN %s) with snapshot %s",
        options.slot_name,
        options.where(),
        pgoutput.lsn_to_text(lsn),
        name,
    )
    return conn, lsn, name


def _in_snapshot(conn: Any, name: str) -> None:
    from psycopg import sql

    conn.autocommit = False
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name)))


def plan_snapshot(options: PostgresCdcOptions, name: str, lsn: int, arrow_schema: Any) -> list[SnapshotRange]:
    """The snapshot's tasks: every table of the publication as the snapshot sees it (its column
    list and row filter too, PostgreSQL 15+), large tables split into ctid ranges (14+)."""
    from psycopg import sql

    ranges: list[SnapshotRange] = []
    with connection(options, "planning the snapshot") as conn:
        check_encoding(conn, options)
        _in_snapshot(conn, name)
        version = int(conn.execute("SHOW server_version_num").fetchone()[0])
        extra = "pt.attnames, pt.rowfilter" if version >= 150000 else "NULL::text[], NULL::text"
        tables = conn.execute(
            "SELECT c.oid, pt.schemaname, pt.tablename, "
            f"pg_relation_size(c.oid) / current_setting('block_size')::int, {extra}, c.relkind "
            "FROM pg_publication_tables pt "
            "JOIN pg_namespace n ON n.nspname = pt.schemaname "
            "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename "
            "WHERE pt.pubname = %s ORDER BY 2, 3",
            (options.publication,),
        ).fetchall()
        taken = int(
            conn.execute("SELECT (extract(epoch FROM statement_timestamp()) * 1e6)::bigint").fetchone()[0]
        )
        generated = "AND a.attgenerated = ''" if version >= 120000 else ""
        block = int(conn.execute("SELECT current_setting('block_size')::int").fetchone()[0])
        chunk_pages = max(1, options.snapshot_chunk_mb * (1 << 20) // block)
        for oid, schema, table, pages, attnames, rowfilter, relkind in tables:
            columns = conn.execute(
                "SELECT a.attname, a.atttypid, coalesce(i.indisprimary, false) FROM pg_attribute a "
                "LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary "
                "AND a.attnum = ANY(i.indkey) WHERE a.attrelid = %s AND a.attnum > 0 "
                f"AND NOT a.attisdropped {generated} ORDER BY a.attnum",
                (oid,),
            ).fetchall()
            wanted = set(attnames) if attnames else None
            relation = pgoutput.Relation(
                int(oid),
                str(schema),
                str(table),
                "d",
                tuple(
                    pgoutput.Column(str(n), int(t), bool(k))
                    for n, t, k in columns
                    if wanted is None or n in wanted
                ),
            )
            # An inheritance parent without ONLY would repeat its children's rows (published, and
            # streamed, as their own tables); a partitioned root reads its partitions.
            only = sql.SQL("" if str(relkind) == "p" else "ONLY ")
            select = (
                sql.SQL("SELECT {} FROM {}{}.{}")
                .format(
                    sql.SQL(", ").join(sql.Identifier(c.name) for c in relation.columns),
                    only,
                    sql.Identifier(str(schema)),
                    sql.Identifier(str(table)),
                )
                .as_string(conn)
            )
            chunks = math.ceil(int(pages) / chunk_pages) if version >= 140000 else 1
            for i in range(max(1, chunks)):
                conditions = [f"({rowfilter})"] if rowfilter else []
                if chunks > 1:
                    if i:
                        conditions.append(f"ctid >= '({i * chunk_pages},0)'::tid")
                    if i < chunks - 1:
                        conditions.append(f"ctid < '({(i + 1) * chunk_pages},0)'::tid")
                where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
                ranges.append(
                    SnapshotRange(
                        relation,
                        f"COPY ({select}{where}) TO STDOUT",
                        name,
                        lsn,
                        taken,
                        i,
                        options,
                        arrow_schema,
                    )
                )
        conn.rollback()
    return ranges


def read_snapshot(task: SnapshotRange) -> Iterator[pa.RecordBatch]:
    """The rows of one snapshot task as ``snapshot`` events (commit LSN = consistent point - 1:
    before every change the slot streams)."""
    import psycopg

    opts = task.options
    encoder = pgoutput.ValueEncoder()
    out = _Events(task.arrow_schema)
    marker = pgoutput.Begin(task.lsn - 1, task.taken_us, task.chunk)
    with connection(opts, f"reading the snapshot of {task.relation.stream}") as conn:
        try:
            _in_snapshot(conn, task.snapshot_name)
        except psycopg.errors.InvalidParameterValue as exc:
            raise PostgresUnavailableError(
                f"the snapshot of publication {opts.publication!r} at {opts.where()} is no longer available "
                f"({str(exc).strip()}): the replication connection that exported it is gone (its "
                "planning process stopped, or the server or a proxy closed it); the batch is planned "
                "again (a new slot and snapshot) when the pipeline restarts"
            ) from None
        with conn.cursor().copy(task.copy_sql) as copy:
            for seq, row in enumerate(copy.rows()):
                out.add(encoder.encode_row(task.relation, row), "snapshot", task.relation.stream, marker, seq)
                if out.size >= CHUNK_ROWS:
                    yield out.flush()
        conn.rollback()
    if out.size:
        yield out.flush()


class PostgresCdcDataSource(DataSource):
    """Spark data source ``postgres-cdc`` (streaming reads)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        options = PostgresCdcOptions.from_spark_options(self.options)
        with connection(options, "checking the server") as conn:
            check_setup(conn, options)
        return EVENT_SCHEMA

    def streamReader(self, schema: StructType) -> PostgresCdcStreamReader:  # noqa: N802
        return PostgresCdcStreamReader(PostgresCdcOptions.from_spark_options(self.options), schema)


class PostgresCdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; :meth:`read` runs on an executor."""

    def __init__(self, options: PostgresCdcOptions, schema: StructType | pa.Schema) -> None:
        logs.configure_worker()  # planned in a Python worker Spark starts
        import pyarrow as pa

        from deltaflow.delta.schema import spark_to_arrow

        self._options = options
        self._arrow = schema if isinstance(schema, pa.Schema) else spark_to_arrow(schema)
        self._initial: Offsets | None = None
        self._target: int | None = None  # availableNow: the WAL position at start
        self._confirmed: int | None = None  # the slot's confirmed_flush_lsn, as last seen
        self._latest: Offsets | None = None
        self._export: Any = None  # the connection whose slot creation exported the snapshot
        self._start_checked = False  # _check_start ran (once per start: Spark builds a new reader)
        self._published: frozenset[str] | None = None  # the publication's tables, as last seen
        # Pacing (batch_interval): when the next batch is due, and whether the last one reached
        # the change budget (more is waiting: the next starts at once).
        self._due = 0.0
        self._left_behind = False

    # -- driver ------------------------------------------------------------------------------

    def _held(self) -> dict[str, dict[str, int]]:
        """What each of the pipeline's Delta tables holds of this slot (URI -> its ``lsn`` and
        ``snapshot`` txns; empty: nothing)."""
        opts = self._options
        if not opts.pipeline_id:
            return {}
        from deltaflow.config.locations import normalize_uri
        from deltaflow.delta import log as delta_log
        from deltaflow.delta.progress import kafka_progress

        held: dict[str, dict[str, int]] = {}
        for uri, storage in opts.progress_tables():
            table = delta_log.load(normalize_uri(uri), storage)
            held[uri] = kafka_progress(table, opts.pipeline_id, {opts.key: [_LSN, _SNAPSHOT]}).get(
                opts.key, {}
            )
        return held

    def _progress(self) -> tuple[int | None, bool]:
        """What the pipeline's Delta tables hold, ALL of them (mirror tables and the event
        table record the same progress; a crash between their commits leaves one behind): the
        next LSN (``None``: some table has no change batch yet) and whether the initial
        snapshot is in every table."""
        held = self._held()
        if not held:
            return None, False
        nexts = [None if done.get(_LSN) is None else done[_LSN] + 1 for done in held.values()]
        known = [n for n in nexts if n is not None]
        return (min(known) if len(known) == len(nexts) else None), all(_SNAPSHOT in d for d in held.values())

    def _check_start(self, position: Mapping[str, int]) -> None:
        """At every start, before this reader's first batch is planned or re-planned: with
        ``snapshot: initial``, a stream past its snapshot needs every table to hold something
        of the slot (its snapshot at least). A table holding nothing was added to a running
        pipeline: it would get neither the snapshot nor the changes read before (Spark calls
        ``initialOffset``, whose checks cover a start without a checkpoint, only then)."""
        if self._start_checked:
            return
        opts = self._options
        if opts.snapshot == "initial" and not _snapshot_pending(position, opts):
            empty = [uri for uri, done in self._held().items() if not done]
            if empty:
                raise CdcPositionError(
                    f"{', '.join(empty)} hold(s) nothing read from replication slot {opts.slot_name!r}, "
                    f"but the stream is past its initial snapshot (at LSN "
                    f"{pgoutput.lsn_to_text(int(position[_LSN]))}): a table added to a running "
                    "postgres-cdc pipeline would get neither the snapshot nor the changes read before. "
                    "Mirror it in a pipeline of its own (its own pipeline_id and slot), or start every "
                    "table over",
                    pipeline_id=opts.pipeline_id,
                )
        self._start_checked = True

    def _check_no_changes_held(self, doing: str) -> None:
        """Refuse to start the slot afresh while a table holds changes read from it (a table
        added to a running pipeline: a new slot would lose those tables' changes since)."""
        opts = self._options
        from deltaflow.config.locations import normalize_uri
        from deltaflow.delta import log as delta_log
        from deltaflow.delta.progress import kafka_progress

        tables = opts.progress_tables()
        for uri, storage in tables:
            table = delta_log.load(normalize_uri(uri), storage)
            if kafka_progress(table, opts.pipeline_id or "", {opts.key: [_LSN]}).get(opts.key):
                behind = [u for u, _ in tables if u != uri]
                raise CdcPositionError(
                    f"{doing} for {', '.join(behind)} would start replication slot {opts.slot_name!r} "
                    f"afresh, but {uri} holds changes read from it: a table added to a running "
                    "postgres-cdc pipeline cannot be given its snapshot there. Mirror it in a pipeline "
                    "of its own (its own pipeline_id and slot), or start every table over",
                    pipeline_id=opts.pipeline_id,
                )

    def _committed(self) -> int | None:
        return self._progress()[0]

    def initialOffset(self) -> Offsets:  # noqa: N802
        if self._initial is None:
            self._initial = {self._options.key: self._initial_position()}
        return {k: dict(v) for k, v in self._initial.items()}

    def _initial_position(self) -> dict[str, int]:
        opts = self._options
        committed, snapshot_done = self._progress()
        if opts.snapshot == "initial" and committed is None and not snapshot_done:
            self._check_no_changes_held("the initial snapshot")
            with connection(opts, "checking the server") as conn:
                check_setup(conn, opts)
            logger.info(
                "postgres-cdc source starts with a snapshot of publication %r (slot %r)",
                opts.publication,
                opts.slot_name,
            )
            return {_LSN: 0}  # the first batch is the snapshot (latestOffset)
        with connection(opts, "preparing the replication slot") as conn:
            state = check_setup(conn, opts)
            if state is None:
                if committed is not None or snapshot_done:
                    held = pgoutput.lsn_to_text(committed) if committed is not None else "its snapshot"
                    raise CdcPositionError(_slot_gone(opts, held), pipeline_id=opts.pipeline_id)
                row = conn.execute(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
                    (opts.slot_name,),
                ).fetchone()
                logger.info(
                    "created replication slot %r at %s (LSN %s)", opts.slot_name, opts.where(), row[0]
                )
                state = slot_state(conn, opts.slot_name)
                assert state is not None
        self._confirmed = state.confirmed
        if committed is None:
            start = state.confirmed
        elif state.confirmed > committed:
            raise CdcPositionError(
                f"replication slot {opts.slot_name!r} at {opts.where()} has moved to LSN "
                f"{pgoutput.lsn_to_text(state.confirmed)}, past what {_tables(opts)} holds (up to "
                f"{pgoutput.lsn_to_text(committed)}): the changes in between are no longer kept. Another "
                "reader used the slot, or the table was restored; start over deliberately (a new slot and "
                "pipeline_id)",
                pipeline_id=opts.pipeline_id,
            )
        else:
            start = committed
        logger.info(
            "postgres-cdc source starts at LSN %s (slot %r; from the Delta log: %s)",
            pgoutput.lsn_to_text(start),
            opts.slot_name,
            "yes" if committed is not None else "nothing",
        )
        return {_LSN: start, _SNAPSHOT: 1} if snapshot_done else {_LSN: start}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        with connection(self._options, "reading the WAL position") as conn:
            self._target = flush_lsn(conn)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self._options.max_changes_per_batch:
            return ReadMaxRows(self._options.max_changes_per_batch)
        return ReadAllAvailable()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:  # noqa: N802
        opts = self._options
        position = start[opts.key]
        self._check_start(position)
        if _snapshot_pending(position, opts):
            return {opts.key: {_LSN: 0, _SNAPSHOT: 1}}  # the snapshot batch
        self._close_export()  # the snapshot batch, if any, is done
        begin = int(position[_LSN])
        nchanges = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        with connection(opts, "reading the slot's changes") as conn:
            self._advance(conn, begin)
            self._check_position(begin, position)
            flushed = flush_lsn(conn)
            upto = min(flushed, self._target) if self._target is not None else flushed
            # Only what planning needs: each transaction's commit LSN (B) and whether it changed
            # anything of the publication (I/U/D/T); one (null) row per other message, so that
            # an exhausted change budget shows.
            rows = _with_slot(
                conn,
                opts,
                "SELECT CASE WHEN get_byte(data, 0) IN (66, 73, 85, 68, 84) THEN substr(data, 1, 9) END "
                "FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, %s, %s, %s, %s)",
                (opts.slot_name, pgoutput.lsn_to_text(upto), nchanges, *_peek_options(opts)),
            ).fetchall()
            if self._published is None or any(h is not None and bytes(h)[0] != 0x42 for (h,) in rows):
                self._watch_publication(conn)
        commit_lsn, last, newest = -1, None, None
        for (head,) in rows:
            if head is None:
                continue
            head = bytes(head)
            if head[0] == 0x42:
                commit_lsn = int.from_bytes(head[1:9], "big", signed=True)
                if commit_lsn >= begin:
                    newest = commit_lsn
            elif commit_lsn >= begin:
                last = commit_lsn
        if last is not None:
            end = last + 1
        elif nchanges is not None and len(rows) >= nchanges and newest is not None:
            # The budget went to transactions without captured changes (PostgreSQL < 15 sends
            # empty ones): move past them, or the next plan would see the same ones again.
            end = newest + 1
        elif upto - max(begin, self._confirmed or 0) >= opts.idle_progress_bytes:
            end = upto  # nothing captured for a while: record the position, free the WAL
        else:
            end = begin
        self._latest = {opts.key: {**position, _LSN: max(end, upto)}}
        if end == begin and self._target is None:
            time.sleep(IDLE_POLL_S)
        elif opts.batch_interval and self._target is None:
            now = time.monotonic()
            full = nchanges is not None and len(rows) >= nchanges
            if now < self._due and not (full or self._left_behind):
                time.sleep(min(IDLE_POLL_S, self._due - now))
                return {opts.key: dict(position)}  # held back: "no new data" until due
            self._due, self._left_behind = now + opts.batch_interval, full
        return {opts.key: {**position, _LSN: end}}

    def _watch_publication(self, conn: Any) -> None:
        """Warn when a table joins the publication while the stream runs (read at the first
        plan, then whenever changes are planned): its changes are read from then on, but its
        earlier rows never are (the initial snapshot covered the tables published then). Warn
        too when one leaves it (a DROP TABLE sends no change: seen at the next planned change).
        A ``FOR ALL TABLES`` publication is left alone: its tables belong from their creation."""
        opts = self._options
        rows = conn.execute(
            "SELECT pt.schemaname || '.' || pt.tablename FROM pg_publication p "
            "JOIN pg_publication_tables pt ON pt.pubname = p.pubname "
            "WHERE p.pubname = %s AND NOT p.puballtables",
            (opts.publication,),
        ).fetchall()
        now = frozenset(str(r[0]) for r in rows)
        joined = sorted(now - self._published) if self._published is not None else []
        left = sorted(self._published - now) if self._published is not None else []
        self._published = now
        if left:
            logger.warning(
                "table(s) %s left publication %r while pipeline %r runs (dropped, or removed with "
                "ALTER PUBLICATION ... DROP TABLE): no more of their changes are read, and their "
                "mirrors keep the rows they hold. Remove their mirror sinks from the pipeline: it "
                "refuses to start with a mirror of a table it cannot read",
                left,
                opts.publication,
                opts.pipeline_id,
            )
        if joined:
            logger.warning(
                "table(s) %s joined publication %r while pipeline %r runs: their changes from now on "
                "are read, their earlier rows are not (the initial snapshot covered the tables "
                "published then). To get them, mirror such a table in a pipeline of its own (its own "
                "pipeline_id and slot, snapshot: initial), or re-take the snapshot of every table "
                "(a new pipeline_id)",
                joined,
                opts.publication,
                opts.pipeline_id,
            )

    def _check_position(self, begin: int, position: Mapping[str, int]) -> None:
        """A slot beyond both this stream's position and the table's: another reader moved it,
        and the changes in between are gone for this stream."""
        confirmed = self._confirmed
        if confirmed is None:
            raise CdcPositionError(_slot_gone(self._options), pipeline_id=self._options.pipeline_id)
        after_snapshot = begin == 0 and _SNAPSHOT in position  # the slot starts where the snapshot ends
        if confirmed <= begin or after_snapshot:
            return
        committed = self._committed()
        if committed is None or confirmed > committed:
            raise CdcPositionError(
                f"replication slot {self._options.slot_name!r} at {self._options.where()} has moved to LSN "
                f"{pgoutput.lsn_to_text(confirmed)}, past this stream's position "
                f"{pgoutput.lsn_to_text(begin)} and what its table holds: another reader uses the slot, "
                "and the changes in between are lost to this stream; give each pipeline its own slot",
                pipeline_id=self._options.pipeline_id,
            )

    def reportLatestOffset(self) -> Offsets | None:  # noqa: N802
        return self._latest

    def _advance(self, conn: Any, to: int) -> None:
        """Move the slot's confirmed position to ``to``, never beyond what the table holds.

        The slot's state is read every time: an advance reaches disk only at PostgreSQL's next
        checkpoint, so after a server crash the slot may stand where it stood before.
        """
        opts = self._options
        state = slot_state(conn, opts.slot_name)
        self._confirmed = state.confirmed if state else None
        if state is None or to <= state.confirmed:
            return
        committed = self._committed() if opts.progress_tables() else to
        target = min(to, committed) if committed is not None else None
        if target is None or target <= state.confirmed:
            return
        _with_slot(
            conn,
            opts,
            "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
            (opts.slot_name, pgoutput.lsn_to_text(target)),
        )
        self._confirmed = target
        logger.debug("slot %r advanced to %s", opts.slot_name, pgoutput.lsn_to_text(target))

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        key = self._options.key
        self._check_start(start[key])  # a restart re-plans its unfinished batch before latestOffset
        committed, snapshot_done = self._progress()
        if _snapshot_pending(start[key], self._options):
            # Replayed after its commit landed: nothing to read.
            return [] if snapshot_done else self._snapshot_partitions()
        begin, stop = int(start[key][_LSN]), int(end[key][_LSN])
        if committed is not None:
            begin = max(begin, committed)  # never read what the table holds already
        return [CdcRange(begin, stop, self._options, self._arrow)] if stop > begin else []

    def _snapshot_partitions(self) -> list[InputPartition]:
        """Start a new slot whose creation exports a snapshot (held open by this process until
        the next batch is planned) and plan reading every published table in it."""
        opts = self._options
        self._close_export()
        self._check_no_changes_held("the initial snapshot")
        with connection(opts, "preparing the snapshot") as conn:
            if check_setup(conn, opts) is not None:
                # Nothing of this slot is in the table (the snapshot is not): a new slot, whose
                # start the snapshot matches exactly, replaces it.
                logger.warning(
                    "replication slot %r exists but %s holds nothing from it: it is replaced by a new "
                    "slot whose start the snapshot matches",
                    opts.slot_name,
                    _tables(opts),
                )
                _with_slot(conn, opts, "SELECT pg_drop_replication_slot(%s)", (opts.slot_name,))
        self._export, lsn, name = create_slot_exporting_snapshot(opts)
        try:
            ranges = plan_snapshot(opts, name, lsn, self._arrow)
        except BaseException:
            self._close_export()
            raise
        logger.info(
            "snapshot of publication %r at LSN %s: %d table(s) in %d task(s)",
            opts.publication,
            pgoutput.lsn_to_text(lsn),
            len({r.relation.oid for r in ranges}),
            len(ranges),
        )
        return list(ranges)

    def _close_export(self) -> None:
        if self._export is not None:
            with contextlib.suppress(Exception):
                self._export.close()
            self._export = None

    def commit(self, end: Offsets) -> None:
        with connection(self._options, "advancing the replication slot") as conn:
            self._advance(conn, int(end[self._options.key][_LSN]))

    def stop(self) -> None:
        self._close_export()

    # -- executor ----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SnapshotRange):
            yield from read_snapshot(partition)
        else:
            assert isinstance(partition, CdcRange)
            yield from read_range(partition)


def read_range(task: CdcRange) -> Iterator[pa.RecordBatch]:
    """The change events of the transactions with commit LSN in ``[task.start, task.end)``."""
    import psycopg

    opts = task.options
    encoder = pgoutput.ValueEncoder()
    relations: dict[int, pgoutput.Relation] = {}
    out = _Events(task.arrow_schema)
    with connection(opts, "reading the slot's changes") as conn:
        check_encoding(conn, opts)
        conn.autocommit = False
        query = (
            "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, "
            "%s, %s, %s, %s)"
        )
        params = (opts.slot_name, pgoutput.lsn_to_text(task.end), *_peek_options(opts))
        deadline = time.monotonic() + SLOT_BUSY_WAIT_S
        while True:
            try:
                with conn.cursor(name="deltaflow_cdc") as cursor:
                    cursor.itersize = CHUNK_ROWS
                    cursor.execute(query, params)
                    begin: pgoutput.Begin | None = None
                    seq, taken = 0, False
                    for at, data in cursor:
                        try:
                            message = pgoutput.decode(bytes(data))
                            if isinstance(message, pgoutput.Relation):
                                relations[message.oid] = message
                            elif isinstance(message, pgoutput.Begin):
                                begin, seq = message, 0
                                taken = task.start <= message.commit_lsn < task.end
                            elif begin is None or not taken:
                                continue
                            elif isinstance(message, pgoutput.Change):
                                out.change(encoder, relations[message.relation_oid], message, begin, seq)
                                seq += 1
                            elif isinstance(message, pgoutput.Truncate):
                                for oid in message.relation_oids:
                                    out.truncate(relations[oid], message, begin, seq)
                                    seq += 1
                        except (ValueError, KeyError, IndexError, struct.error) as exc:
                            raise CdcDecodeError(
                                f"publication {opts.publication!r} at {opts.where()}: the change at LSN {at} "
                                f"(transaction {begin.xid if begin else '?'}) could not be decoded: "
                                f"{type(exc).__name__}: {exc}",
                                lsn=at,
                            ) from None
                        if out.size >= CHUNK_ROWS:
                            yield out.flush()
                conn.rollback()
                break
            except psycopg.errors.ObjectInUse:
                conn.rollback()
                if out.size or out.flushed or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    if out.size:
        yield out.flush()


class _Events:
    """Event rows, gathered column by column into Arrow batches."""

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema
        self._columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self.size = 0
        self.flushed = False

    def add(self, data: str, kind: str, stream: str, begin: pgoutput.Begin, seq: int) -> None:
        c = self._columns
        c["data"].append(data)
        c["event_type"].append(kind)
        c["timestamp"].append(begin.commit_time_us)
        c["stream"].append(stream)
        c["lsn"].append(begin.commit_lsn)
        c["xid"].append(begin.xid)
        c["seq"].append(seq)
        self.size += 1

    def change(
        self,
        encoder: pgoutput.ValueEncoder,
        relation: pgoutput.Relation,
        change: pgoutput.Change,
        begin: pgoutput.Begin,
        seq: int,
    ) -> None:
        if change.kind == "insert":
            assert change.new is not None
            data = encoder.encode_row(relation, change.new)
        elif change.kind == "update":
            assert change.new is not None
            before = "null" if change.old is None else _old(encoder, relation, change)
            data = '{"before":' + before + ',"after":' + encoder.encode_row(relation, change.new) + "}"
        else:
            data = _old(encoder, relation, change)
        self.add(data, change.kind, relation.stream, begin, seq)

    def truncate(
        self, relation: pgoutput.Relation, message: pgoutput.Truncate, begin: pgoutput.Begin, seq: int
    ) -> None:
        data = json.dumps({"cascade": message.cascade, "restart_identity": message.restart_identity})
        self.add(data, "truncate", relation.stream, begin, seq)

    def flush(self) -> pa.RecordBatch:
        import pyarrow as pa

        arrays = [pa.array(self._columns[f.name], f.type) for f in self._schema]
        self._columns = {name: [] for name in self._schema.names}
        self.size = 0
        self.flushed = True
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)


def _old(encoder: pgoutput.ValueEncoder, relation: pgoutput.Relation, change: pgoutput.Change) -> str:
    """The old row of an update/delete: only the key columns when PostgreSQL sent the key."""
    assert change.old is not None
    if not change.old_is_key:
        return encoder.encode_row(relation, change.old)
    keyed = pgoutput.Relation(
        relation.oid,
        relation.namespace,
        relation.name,
        relation.replica_identity,
        tuple(c for c in relation.columns if c.key),
    )
    return encoder.encode_row(
        keyed, tuple(v for c, v in zip(relation.columns, change.old, strict=True) if c.key)
    )

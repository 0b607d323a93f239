"""What a mirror table needs to know of a PostgreSQL table, from its catalog: columns and
their (base) types, the primary key, and what a delete carries (the replica identity).

Read on the driver when a pipeline starts and again when changes carry a column the last
reading did not have (an added column).
"""

from __future__ import annotations

import logging
from typing import Any

from deltaflow.config.postgres import PgColumn, PgTable, PostgresCdcOptions
from deltaflow.errors import PostgresSetupError
from deltaflow.sources.postgres_cdc import connection

__all__ = ["describe_table", "published_streams", "table_exists"]

logger = logging.getLogger(__name__)

_COLUMNS = """
SELECT a.attname,
       b.typname,
       b.typtype,
       e.typname,
       e.typtype,
       CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
LEFT JOIN pg_type e ON e.oid = b.typelem AND b.typcategory = 'A'
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_INDEX_COLUMNS = """
SELECT a.attname
FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s AND {which}
ORDER BY array_position(i.indkey::int2[], a.attnum)
"""


def published_streams(options: PostgresCdcOptions) -> list[str]:
    """The ``schema.table`` names the publication captures."""
    with connection(options, "listing the publication's tables") as conn:
        rows = conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
            (options.publication,),
        ).fetchall()
    return [f"{s}.{t}" for s, t in rows]


def table_exists(options: PostgresCdcOptions, stream: str) -> bool:
    """Whether the database has the table ``stream`` (``schema.table``)."""
    with connection(options, f"looking for {stream}") as conn:
        return _find_table(conn, stream) is not None


def _find_table(conn: Any, stream: str) -> tuple[Any, ...] | None:
    """The table ``stream``'s oid and replica identity (``None``: no such table)."""
    schema, _, name = stream.partition(".")
    row = conn.execute(
        "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        (schema, name),
    ).fetchone()
    return tuple(row) if row is not None else None


def describe_table(options: PostgresCdcOptions, stream: str) -> PgTable:
    """The catalog's description of ``stream`` (``schema.table``).

    Raises:
        PostgresSetupError: no such table.
    """
    with connection(options, f"reading the catalog of {stream}") as conn:
        row = _find_table(conn, stream)
        if row is None:
            raise PostgresSetupError(
                f"no table {stream!r} at {options.where()} (a mirror's stream is schema.table, as the "
                "event table's stream column shows it)"
            )
        oid, identity = int(row[0]), str(row[1])
        columns = tuple(_column(*r) for r in conn.execute(_COLUMNS, (oid,)).fetchall())
        primary = tuple(r[0] for r in conn.execute(_INDEX_COLUMNS.format(which="i.indisprimary"), (oid,)))
        if identity == "i":
            keyed = tuple(r[0] for r in conn.execute(_INDEX_COLUMNS.format(which="i.indisreplident"), (oid,)))
        elif identity == "d":
            keyed = primary
        elif identity == "f":
            keyed = tuple(c.name for c in columns)
        else:
            keyed = ()
    return PgTable(stream, columns, primary, keyed, identity)


def _column(
    name: str, type_name: str, kind: str, element: str | None, element_kind: str | None, typmod: int
) -> PgColumn:
    precision = scale = None
    base = element if element is not None else type_name
    if base == "numeric" and typmod >= 4:
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
    return PgColumn(name, type_name, kind, element, element_kind, precision, scale)

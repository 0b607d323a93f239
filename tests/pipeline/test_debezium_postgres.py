"""Debezium topics of a REAL PostgreSQL database into mirror tables (``deltaflow ingest --cdc
debezium``): the database's own changes, read from a logical replication slot and written as
Debezium's PostgreSQL connector writes them (:mod:`tests.fixtures.pg_debezium`), through the
broker; after every round each mirror, read by DuckDB, equals its PostgreSQL table. Once with
Kafka Connect's JSON converter, once with Confluent's Avro converter and a schema registry (fewer
tables: each part of the rounds is played by one of them)."""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from deltaflow.config.ingest import IngestConfig
from deltaflow.pipeline.topic_ingest import start
from tests.fixtures.pg_debezium import UNAVAILABLE, Message, PgDebezium
from tests.fixtures.readers import duckdb_delta


@dataclass(frozen=True)
class Layout:
    """The tables, and which of them (their indices) play which part of the rounds."""

    tables: int
    #: REPLICA IDENTITY FULL from round 2 on (updates and deletes carry the old row).
    full: frozenset[int]
    #: With more column types.
    typed: frozenset[int]
    #: Row 11 holds a TOASTed text (an update that leaves it is sent without it); not FULL.
    toasted: int
    #: A TOASTed text inserted and updated in one batch: ``toasted`` and a FULL table.
    toast_inserted: tuple[int, int]
    #: Keys changed: a FULL table and a default identity one.
    key_changed: tuple[int, int]
    #: Round 4: a truncate between changes (FULL), one in a transaction (default identity), a
    #: delete of another table.
    truncated: int
    truncated_in_transaction: int
    deleted: int
    #: Round 5: one transaction over these.
    transaction: tuple[int, ...]
    #: Round 6: a column added (a FULL table, then a default identity one, whose events' schemas
    #: are checked), and a table without it.
    new_column: tuple[int, int]
    without_new_column: int


#: The JSON converter: 20 tables.
MANY = Layout(
    tables=20,
    full=frozenset(range(0, 7)),
    typed=frozenset(range(0, 20, 5)),
    toasted=12,
    toast_inserted=(12, 0),
    key_changed=(1, 10),
    truncated=4,
    truncated_in_transaction=16,
    deleted=5,
    transaction=(3, 7, 8, 9, 15, 17),
    new_column=(1, 13),
    without_new_column=2,
)
#: The Avro converter: 6 tables, every column type and both replica identities.
FEW = Layout(
    tables=6,
    full=frozenset({0, 1, 2}),
    typed=frozenset({0, 3}),
    toasted=4,
    toast_inserted=(4, 0),
    key_changed=(1, 3),
    truncated=2,
    truncated_in_transaction=5,
    deleted=0,
    transaction=(0, 1, 3),
    new_column=(1, 4),
    without_new_column=3,
)
#: The mirror's columns of a typed table (DuckDB's types).
TYPED_COLUMNS = {
    "id": "INTEGER",
    "name": "VARCHAR",
    "amount": "DECIMAL(10,2)",
    "at": "TIMESTAMP WITH TIME ZONE",
    "active": "BOOLEAN",
    "doc": "VARCHAR",
    "big": "BIGINT",
    "small": "SMALLINT",
    "ratio": "DOUBLE",
    "day": "DATE",
    "local": "TIMESTAMP",
    "ref": "VARCHAR",
    "label": "VARCHAR",
    "exact": "VARCHAR",
    "_change_sequence": "DECIMAL(38,0)",
}
ZONE = dt.timezone(dt.timedelta(hours=-7, minutes=-30))


def _create(conn, name: str, typed: bool) -> None:
    extra = (
        ", big int8, small int2, ratio float8, day date, local timestamp, ref uuid, label varchar(20), "
        "exact numeric"
        if typed
        else ""
    )
    conn.execute(
        f"CREATE TABLE {name} (id int PRIMARY KEY, name text, amount numeric(10, 2), at timestamptz, "
        f"active bool, doc jsonb{extra})"
    )


def _values(rnd: random.Random, k: int, typed: bool) -> dict[str, Any]:
    from psycopg.types.json import Jsonb

    row: dict[str, Any] = {
        "id": k,
        "name": None if k % 7 == 3 else f"name {k} ü",
        "amount": Decimal(rnd.randint(-(10**8), 10**8)) / 100,
        "at": None
        if k % 9 == 4
        else dt.datetime(2024, 1, 1, tzinfo=ZONE)
        + dt.timedelta(seconds=rnd.randint(0, 10**8), microseconds=k),
        "active": None if k % 11 == 5 else k % 2 == 0,
        "doc": None if k % 13 == 6 else Jsonb({"k": k, "tags": ["a", str(k)], "nested": {"x": k * 2}}),
    }
    if typed:
        row |= {
            "big": rnd.randint(-(2**62), 2**62),
            "small": rnd.randint(-(2**15), 2**15 - 1),
            "ratio": rnd.random() * 1e6,
            "day": dt.date(2000, 1, 1) + dt.timedelta(days=rnd.randint(-20000, 20000)),
            "local": dt.datetime(2020, 2, 29, 23, 59, 59, 999999)
            + dt.timedelta(seconds=rnd.randint(-(10**9), 10**9)),
            "ref": uuid.UUID(int=rnd.getrandbits(128)),
            "label": None if k % 3 == 0 else f"l{k}",
            "exact": Decimal(rnd.randint(-(10**20), 10**20)).scaleb(-rnd.randint(0, 12)),
        }
    return row


def _insert(conn, table: str, row: dict[str, Any]) -> None:
    names = ", ".join(row)
    marks = ", ".join(["%s"] * len(row))
    conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", list(row.values()))


def _normal(column: str, value: Any) -> Any:
    """A value as both sides can be compared: instants in UTC, JSON parsed, exact numbers as
    ``Decimal``, UUIDs as text."""
    if value is None:
        return None
    if column == "doc":
        return json.loads(value) if isinstance(value, str) else value
    if column == "exact":  # numeric without a scale: the mirror keeps its digits as text
        return Decimal(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _rows(cursor) -> dict[Any, dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    rows = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
    return {r["id"]: {k: _normal(k, v) for k, v in r.items() if k != "_change_sequence"} for r in rows}


def _run(spark, kafka, prefix: str, root, registry) -> None:
    avro = {"value_format": "avro", "avro": registry.url} if registry is not None else {}
    config = IngestConfig.build(
        topic_pattern=rf"{prefix}\.public\.(.*)",
        table_uri=str(root / "{1}"),
        brokers=kafka.bootstrap,
        pipeline_id="pg-debezium",
        ends_at_latest_offsets=True,
        cdc="debezium",
        **avro,
    )
    query = start(spark, config)
    assert query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def _ops(messages: list[Message]) -> Counter[str]:
    """How many messages of each op (``tombstone``: no value)."""
    ops: Counter[str] = Counter()
    for m in messages:
        if m.payload is None:
            ops["tombstone"] += 1
        else:
            payload = m.payload
            ops[payload["op"] + ("+before" if payload["before"] and payload["op"] == "u" else "")] += 1
    return ops


@pytest.mark.parametrize("converter", ["json", "avro"])
def test_a_postgres_databases_changes_through_debezium_topics_equal_its_tables(
    spark, kafka, postgres, tmp_path, request, converter
):
    registry = request.getfixturevalue("schema_registry") if converter == "avro" else None
    layout = MANY if registry is None else FEW
    full, typed = layout.full, layout.typed
    prefix = f"pgdbz{uuid.uuid4().hex[:6]}"
    tables = [f"{prefix}_t{i:02d}" for i in range(layout.tables)]
    conn = postgres.connect()
    for i, t in enumerate(tables):
        _create(conn, t, i in typed)
    connector = PgDebezium(
        postgres, kafka, prefix, [f"public.{t}" for t in tables], partitions=2, registry=registry
    )
    root = tmp_path / "lake"
    duck = duckdb_delta()
    rnd = random.Random(7)

    def check(expected: Counter[str] | None = None) -> list[Message]:
        sent = connector.publish()
        if expected is not None:
            assert _ops(sent) == expected
        _run(spark, kafka, prefix, root, registry)
        for t in tables:
            mirror = _rows(duck.execute(f"SELECT * FROM delta_scan('{root / t}')"))
            assert mirror == _rows(conn.execute(f"SELECT * FROM {t}")), t
        return sent

    try:
        # Round 1: inserts (one TOASTed text).
        for i, t in enumerate(tables):
            for k in range(30):
                _insert(conn, t, _values(rnd, k, i in typed))
        big = "".join(rnd.choice("0123456789abcdef") for _ in range(9000))
        conn.execute(f"UPDATE {tables[layout.toasted]} SET name = %s WHERE id = 11", (big,))
        check(Counter({"c": 30 * len(tables), "u": 1}))

        # Round 2: updates, the old row sent for some tables (REPLICA IDENTITY FULL); a row
        # updated twice; a key changed (a delete, its tombstone and a create); a TOASTed value
        # left as it was (the placeholder: the mirror keeps it).
        for i in full:
            conn.execute(f"ALTER TABLE {tables[i]} REPLICA IDENTITY FULL")
        for i, t in enumerate(tables):
            conn.execute(f"UPDATE {t} SET amount = amount + 1.25, name = 'updated' WHERE id % 6 = 1")
            conn.execute(
                f"UPDATE {t} SET at = NULL, active = NOT active, doc = '[1, 2.5, null]' WHERE id = 2"
            )
            conn.execute(f"UPDATE {t} SET name = NULL, amount = NULL WHERE id = 2")
            if i in typed:
                conn.execute(
                    f"UPDATE {t} SET big = -big, day = day + 1, ref = NULL, exact = exact * 3 WHERE id < 4"
                )
        conn.execute(f"UPDATE {tables[layout.toasted]} SET active = true, amount = 7 WHERE id = 11")
        for i in layout.toast_inserted:  # inserted and updated in one batch (one table FULL)
            conn.execute(f"INSERT INTO {tables[i]} (id, name) VALUES (40, %s)", (big[::-1],))
            conn.execute(f"UPDATE {tables[i]} SET amount = 40 WHERE id = 40")
        for i in layout.key_changed:  # one FULL, one default identity
            conn.execute(f"UPDATE {tables[i]} SET id = id + 1000 WHERE id IN (3, 9)")
        # The keys changed aside: 7 per table, 4 more per typed one, row 11, the rows 40.
        updated = [*(i for i in range(len(tables)) for _ in range(7)), *(i for i in typed for _ in range(4))]
        updated += [layout.toasted, *layout.toast_inserted]
        with_before = sum(i in full for i in updated)
        sent = check(
            Counter(
                {
                    "u": len(updated) - with_before,
                    "u+before": with_before,
                    "d": 4,
                    "tombstone": 4,
                    "c": 4 + len(layout.toast_inserted),
                }
            )
        )
        assert sum(UNAVAILABLE.encode() in (m.value or b"") for m in sent) == 3
        toasted = _rows(duck.execute(f"SELECT * FROM delta_scan('{root / tables[layout.toasted]}')"))
        assert toasted[11]["name"] == big and toasted[11]["amount"] == 7
        assert toasted[40]["name"] == big[::-1] and toasted[40]["amount"] == 40

        # Round 3: deletes (the whole old row with REPLICA IDENTITY FULL, else its key), and a
        # key deleted and inserted again.
        for i, t in enumerate(tables):
            conn.execute(f"DELETE FROM {t} WHERE id IN (5, 8, 20)")
            _insert(conn, t, _values(rnd, 8, i in typed))
        check(Counter({"d": 3 * len(tables), "tombstone": 3 * len(tables), "c": len(tables)}))

        # Round 4: a truncate between changes of its table (of rows it then holds again, and of
        # rows it does not), one in a transaction that then inserts rows, and changes of another.
        t4, t16 = tables[layout.truncated], tables[layout.truncated_in_transaction]
        conn.execute(f"UPDATE {t4} SET name = 'before the truncate' WHERE id = 1")
        conn.execute(f"UPDATE {t4} SET name = 'gone with the truncate' WHERE id = 6")
        _insert(conn, t4, _values(rnd, 100, False))
        conn.execute(f"TRUNCATE {t4}")
        for k in (1, 2, 200):
            _insert(conn, t4, _values(rnd, k, False))
        conn.execute(f"UPDATE {t4} SET name = 'after the truncate' WHERE id = 2")
        conn.execute(f"DELETE FROM {tables[layout.deleted]} WHERE id = 1")
        with conn.transaction():
            conn.execute(f"UPDATE {t16} SET name = 'before the truncate' WHERE id = 3")
            conn.execute(f"TRUNCATE {t16}")
            for k in (3, 4):
                _insert(conn, t16, _values(rnd, k, False))
        assert layout.truncated in full and layout.truncated_in_transaction not in full
        check(Counter({"u": 1, "u+before": 3, "c": 6, "t": 2, "d": 1, "tombstone": 1}))

        # Round 5: one transaction over several tables (and a row it inserts, updates, deletes).
        with conn.transaction():
            for i in layout.transaction:
                t = tables[i]
                _insert(conn, t, _values(rnd, 300, i in typed))
                conn.execute(
                    f"UPDATE {t} SET name = 'in the transaction', amount = 0.01 WHERE id IN (4, 300)"
                )
                conn.execute(f"DELETE FROM {t} WHERE id = 10")
                _insert(conn, t, _values(rnd, 301, i in typed))
                conn.execute(f"DELETE FROM {t} WHERE id = 301")
        n, with_before = len(layout.transaction), 2 * len(full & set(layout.transaction))
        sent = check(
            Counter(
                {
                    "c": 2 * n,
                    "u": 2 * n - with_before,
                    "u+before": with_before,
                    "d": 2 * n,
                    "tombstone": 2 * n,
                }
            )
        )
        assert len({m.payload["source"]["txId"] for m in sent if m.payload}) == 1

        # Round 6: a column added, then updates and inserts that use it, and a delete of a row
        # with it (the whole old row: REPLICA IDENTITY FULL).
        t13 = tables[layout.new_column[1]]
        conn.execute(f"UPDATE {t13} SET name = 'before the new column' WHERE id = 1")
        for t in (tables[layout.new_column[0]], t13):
            conn.execute(f"ALTER TABLE {t} ADD COLUMN note text, ADD COLUMN rank int4")
            conn.execute(f"UPDATE {t} SET note = 'noted ' || id, rank = id * 10 WHERE id % 4 = 0")
            conn.execute(f"INSERT INTO {t} (id, name, note, rank) VALUES (500, 'with a note', 'n', -1)")
            conn.execute(f"DELETE FROM {t} WHERE id = 12")
            conn.execute(f"UPDATE {t} SET note = NULL WHERE id = 16")
        other = tables[layout.without_new_column]
        conn.execute(f"UPDATE {other} SET name = 'a table without the new column' WHERE id = 1")
        sent = check()
        columns = [m.columns for m in sent if m.topic.endswith(t13) and m.payload]
        assert "note" not in columns[0] and all("note" in c for c in columns[1:])
        mirror = _rows(duck.execute(f"SELECT * FROM delta_scan('{root / t13}')"))
        assert mirror[4]["note"] == "noted 4" and mirror[500]["rank"] == -1
        # Both converters type the mirrors alike: as the database's columns.
        described = duck.execute(f"DESCRIBE SELECT * FROM delta_scan('{root / tables[min(typed)]}')")
        assert {r[0]: r[1] for r in described.fetchall()} == TYPED_COLUMNS
        if registry is not None:  # the Avro converter's messages, read through the registry
            assert all(m.key[0] == 0 for m in connector.sent if m.key) and all(
                m.value[0] == 0 for m in connector.sent if m.value
            )
            assert any(r.startswith("/schemas/ids/") for r in registry.requests)
            # One version per subject, two for the tables that got a column.
            topics = [f"{prefix}.public.{t}" for t in tables]
            added = {topics[i] for i in layout.new_column}
            assert {s: len(ids) for s, ids in registry.subjects.items()} == {
                f"{t}-key": 1 for t in topics
            } | {f"{t}-value": 1 + (t in added) for t in topics}
    finally:
        connector.close()
        conn.close()

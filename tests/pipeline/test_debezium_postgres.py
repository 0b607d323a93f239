"""Debezium topics of a REAL PostgreSQL database into mirror tables (``deltaflow ingest --cdc
debezium``): the database's own changes, read from a logical replication slot and written as
Debezium's PostgreSQL connector writes them (:mod:`tests.fixtures.pg_debezium`), through the
broker; after every round each mirror, read by DuckDB, equals its PostgreSQL table."""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from collections import Counter
from decimal import Decimal
from typing import Any

from deltaflow.config.ingest import IngestConfig
from deltaflow.pipeline.topic_ingest import start
from tests.fixtures.pg_debezium import UNAVAILABLE, Message, PgDebezium
from tests.fixtures.readers import duckdb_delta

TABLES = 20
#: Tables with REPLICA IDENTITY FULL from round 2 on (updates and deletes carry the old row).
FULL = range(0, 7)
#: Tables with more column types.
TYPED = range(0, TABLES, 5)
#: A table whose row 11 holds a TOASTed text (an update that leaves it is sent without it).
TOASTED = 12
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


def _run(spark, kafka, prefix: str, root) -> None:
    config = IngestConfig.build(
        topic_pattern=rf"{prefix}\.public\.(.*)",
        table_uri=str(root / "{1}"),
        brokers=kafka.bootstrap,
        pipeline_id="pg-debezium",
        ends_at_latest_offsets=True,
        cdc="debezium",
    )
    query = start(spark, config)
    assert query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def _ops(messages: list[Message]) -> Counter[str]:
    """How many messages of each op (``tombstone``: no value)."""
    ops: Counter[str] = Counter()
    for m in messages:
        if m.value is None:
            ops["tombstone"] += 1
        else:
            payload = json.loads(m.value)["payload"]
            ops[payload["op"] + ("+before" if payload["before"] and payload["op"] == "u" else "")] += 1
    return ops


def _columns(message: Message) -> list[str]:
    """The columns of a change event's row schema."""
    (after,) = (f for f in json.loads(message.value or b"")["schema"]["fields"] if f["field"] == "after")
    return [f["field"] for f in after["fields"]]


def test_a_postgres_databases_changes_through_debezium_topics_equal_its_tables(
    spark, kafka, postgres, tmp_path
):
    prefix = f"pgdbz{uuid.uuid4().hex[:6]}"
    tables = [f"{prefix}_t{i:02d}" for i in range(TABLES)]
    conn = postgres.connect()
    for i, t in enumerate(tables):
        _create(conn, t, i in TYPED)
    connector = PgDebezium(postgres, kafka, prefix, [f"public.{t}" for t in tables], partitions=2)
    root = tmp_path / "lake"
    duck = duckdb_delta()
    rnd = random.Random(7)

    def check(expected: Counter[str] | None = None) -> list[Message]:
        sent = connector.publish()
        if expected is not None:
            assert _ops(sent) == expected
        _run(spark, kafka, prefix, root)
        for t in tables:
            mirror = _rows(duck.execute(f"SELECT * FROM delta_scan('{root / t}')"))
            assert mirror == _rows(conn.execute(f"SELECT * FROM {t}")), t
        return sent

    try:
        # Round 1: inserts (one TOASTed text).
        for i, t in enumerate(tables):
            for k in range(30):
                _insert(conn, t, _values(rnd, k, i in TYPED))
        big = "".join(rnd.choice("0123456789abcdef") for _ in range(9000))
        conn.execute(f"UPDATE {tables[TOASTED]} SET name = %s WHERE id = 11", (big,))
        check(Counter({"c": 30 * TABLES, "u": 1}))

        # Round 2: updates, the old row sent for some tables (REPLICA IDENTITY FULL); a row
        # updated twice; a key changed (a delete, its tombstone and a create); a TOASTed value
        # left as it was (the placeholder: the mirror keeps it).
        for i in FULL:
            conn.execute(f"ALTER TABLE {tables[i]} REPLICA IDENTITY FULL")
        for i, t in enumerate(tables):
            conn.execute(f"UPDATE {t} SET amount = amount + 1.25, name = 'updated' WHERE id % 6 = 1")
            conn.execute(
                f"UPDATE {t} SET at = NULL, active = NOT active, doc = '[1, 2.5, null]' WHERE id = 2"
            )
            conn.execute(f"UPDATE {t} SET name = NULL, amount = NULL WHERE id = 2")
            if i in TYPED:
                conn.execute(
                    f"UPDATE {t} SET big = -big, day = day + 1, ref = NULL, exact = exact * 3 WHERE id < 4"
                )
        conn.execute(f"UPDATE {tables[TOASTED]} SET active = true, amount = 7 WHERE id = 11")
        for t in (tables[TOASTED], tables[0]):  # inserted and updated in one batch (FULL: table 0)
            conn.execute(f"INSERT INTO {t} (id, name) VALUES (40, %s)", (big[::-1],))
            conn.execute(f"UPDATE {t} SET amount = 40 WHERE id = 40")
        for t in (tables[1], tables[10]):  # one FULL, one default identity
            conn.execute(f"UPDATE {t} SET id = id + 1000 WHERE id IN (3, 9)")
        updates = 7 * TABLES + 4 * len(TYPED) + 3  # the keys changed aside
        with_before = 7 * len(FULL) + 4 * len(set(TYPED) & set(FULL)) + 1
        sent = check(
            Counter({"u": updates - with_before, "u+before": with_before, "d": 4, "tombstone": 4, "c": 6})
        )
        assert sum(UNAVAILABLE.encode() in (m.value or b"") for m in sent) == 3
        toasted = _rows(duck.execute(f"SELECT * FROM delta_scan('{root / tables[TOASTED]}')"))
        assert toasted[11]["name"] == big and toasted[11]["amount"] == 7
        assert toasted[40]["name"] == big[::-1] and toasted[40]["amount"] == 40

        # Round 3: deletes (the whole old row with REPLICA IDENTITY FULL, else its key), and a
        # key deleted and inserted again.
        for i, t in enumerate(tables):
            conn.execute(f"DELETE FROM {t} WHERE id IN (5, 8, 20)")
            _insert(conn, t, _values(rnd, 8, i in TYPED))
        check(Counter({"d": 3 * TABLES, "tombstone": 3 * TABLES, "c": TABLES}))

        # Round 4: a truncate between changes of its table (of rows it then holds again, and of
        # rows it does not), one in a transaction that then inserts rows, and changes of another.
        t4 = tables[4]
        conn.execute(f"UPDATE {t4} SET name = 'before the truncate' WHERE id = 1")
        conn.execute(f"UPDATE {t4} SET name = 'gone with the truncate' WHERE id = 6")
        _insert(conn, t4, _values(rnd, 100, False))
        conn.execute(f"TRUNCATE {t4}")
        for k in (1, 2, 200):
            _insert(conn, t4, _values(rnd, k, False))
        conn.execute(f"UPDATE {t4} SET name = 'after the truncate' WHERE id = 2")
        conn.execute(f"DELETE FROM {tables[5]} WHERE id = 1")
        with conn.transaction():
            conn.execute(f"UPDATE {tables[16]} SET name = 'before the truncate' WHERE id = 3")
            conn.execute(f"TRUNCATE {tables[16]}")
            for k in (3, 4):
                _insert(conn, tables[16], _values(rnd, k, False))
        check(Counter({"u": 1, "u+before": 3, "c": 6, "t": 2, "d": 1, "tombstone": 1}))

        # Round 5: one transaction over several tables (and a row it inserts, updates, deletes).
        with conn.transaction():
            for i in (3, 7, 8, 9, 15, 17):
                t = tables[i]
                _insert(conn, t, _values(rnd, 300, i in TYPED))
                conn.execute(
                    f"UPDATE {t} SET name = 'in the transaction', amount = 0.01 WHERE id IN (4, 300)"
                )
                conn.execute(f"DELETE FROM {t} WHERE id = 10")
                _insert(conn, t, _values(rnd, 301, i in TYPED))
                conn.execute(f"DELETE FROM {t} WHERE id = 301")
        sent = check(Counter({"c": 12, "u": 10, "u+before": 2, "d": 12, "tombstone": 12}))
        assert len({json.loads(m.value)["payload"]["source"]["txId"] for m in sent if m.value}) == 1

        # Round 6: a column added, then updates and inserts that use it, and a delete of a row
        # with it (the whole old row: REPLICA IDENTITY FULL).
        conn.execute(f"UPDATE {tables[13]} SET name = 'before the new column' WHERE id = 1")
        for t in (tables[1], tables[13]):
            conn.execute(f"ALTER TABLE {t} ADD COLUMN note text, ADD COLUMN rank int4")
            conn.execute(f"UPDATE {t} SET note = 'noted ' || id, rank = id * 10 WHERE id % 4 = 0")
            conn.execute(f"INSERT INTO {t} (id, name, note, rank) VALUES (500, 'with a note', 'n', -1)")
            conn.execute(f"DELETE FROM {t} WHERE id = 12")
            conn.execute(f"UPDATE {t} SET note = NULL WHERE id = 16")
        conn.execute(f"UPDATE {tables[2]} SET name = 'a table without the new column' WHERE id = 1")
        sent = check()
        columns = [_columns(m) for m in sent if m.topic.endswith(tables[13]) and m.value]
        assert "note" not in columns[0] and all("note" in c for c in columns[1:])
        mirror = _rows(duck.execute(f"SELECT * FROM delta_scan('{root / tables[13]}')"))
        assert mirror[4]["note"] == "noted 4" and mirror[500]["rank"] == -1
    finally:
        connector.close()
        conn.close()

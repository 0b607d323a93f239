"""Mirror tables from a real PostgreSQL: each Delta table equals its PostgreSQL table after
every round (snapshot, inserts, updates, deletes, a transaction over two tables, a truncate,
an added column, unchanged TOAST values), typed from the catalog."""

from __future__ import annotations

import json
import secrets
import textwrap
import uuid
from decimal import Decimal

import pytest
from deltalake import DeltaTable

from deltaflow.config.pipeline import load_pipelines
from deltaflow.config.postgres import slot_key
from deltaflow.errors import CdcPositionError, ConfigError, MergeError, PipelineConfigError
from deltaflow.service.daemon import run_pipelines
from deltaflow.sinks.merge import SEQUENCE_COLUMN
from deltaflow.sources.postgres_cdc import PostgresCdcStreamReader, event_arrow_schema
from tests.fixtures.postgres import cdc_options, read_all_events

TYPES = """
    CREATE TYPE mirror_mood AS ENUM ('sad', 'ok', 'happy');
    CREATE TABLE mirror_typed (
        id bigint PRIMARY KEY,
        price numeric(12, 3),
        exact numeric,
        at timestamptz,
        local timestamp,
        day date,
        doc jsonb,
        tags text[],
        counts int[],
        ref uuid,
        raw bytea,
        feeling mirror_mood,
        ok boolean,
        ratio float8,
        small smallint,
        body text
    )
"""


def _pipeline(tmp_path, postgres, publication: str, slot: str, sinks: str, snapshot: str = "initial") -> str:
    path = tmp_path / f"{slot}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            pipelines:
              - id: {slot}
                source:
                  type: postgres-cdc
                  host: {postgres.host}
                  port: {postgres.port}
                  user: {postgres.user}
                  database: {postgres.dbname}
                  publication: {publication}
                  slot: {slot}
                  max_changes_per_batch: 7
                  snapshot: {snapshot}
                sinks:
            """
        )
        + textwrap.indent(textwrap.dedent(sinks), "      ")
    )
    return str(path)


def _mirror(table) -> list[dict]:
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    for r in rows:
        del r[SEQUENCE_COLUMN]
    return sorted(rows, key=lambda r: r["id"])


def _source(conn, table: str) -> list[dict]:
    cur = conn.execute(f"SELECT * FROM {table} ORDER BY id")
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _drop(conn, slot: str, publication: str) -> None:
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )
    conn.execute(f"DROP PUBLICATION {publication}")


def _run(spark, path: str) -> None:
    run_pipelines(spark, load_pipelines(path).pipelines, available_now=True)


def test_two_mirrors_and_the_event_table_follow_every_kind_of_change(spark, postgres, tmp_path):
    conn = postgres.connect()
    conn.execute("CREATE TABLE m_orders (id int PRIMARY KEY, customer int, total numeric(10, 2), note text)")
    conn.execute("CREATE TABLE m_customers (id int PRIMARY KEY, name text)")
    conn.execute("CREATE PUBLICATION m_pub FOR TABLE m_orders, m_customers")
    conn.execute("INSERT INTO m_customers SELECT i, 'c' || i FROM generate_series(1, 20) i")
    conn.execute("INSERT INTO m_orders SELECT i, i % 20 + 1, i * 1.5, NULL FROM generate_series(1, 50) i")
    orders, customers, events = tmp_path / "orders", tmp_path / "customers", tmp_path / "events"
    path = _pipeline(
        tmp_path,
        postgres,
        "m_pub",
        "m_slot",
        f"""
        - {{table_uri: "{events}"}}
        - {{table_uri: "{orders}", write_mode: merge, stream: public.m_orders}}
        - {{table_uri: "{customers}", write_mode: merge, stream: public.m_customers}}
        """,
    )

    def check() -> None:
        assert _mirror(orders) == _source(conn, "m_orders")
        assert _mirror(customers) == _source(conn, "m_customers")

    try:
        _run(spark, path)  # the snapshot
        check()
        # Round 1: every kind of change, a transaction over both tables, a key changed.
        conn.execute("INSERT INTO m_orders VALUES (100, 1, 9.99, 'new')")
        conn.execute("UPDATE m_orders SET total = total + 1 WHERE id <= 10")
        conn.execute("DELETE FROM m_orders WHERE id BETWEEN 11 AND 15")
        with conn.transaction():
            conn.execute("INSERT INTO m_customers VALUES (21, 'late')")
            conn.execute("UPDATE m_orders SET customer = 21 WHERE id = 100")
            conn.execute("DELETE FROM m_customers WHERE id = 20")
        conn.execute("UPDATE m_orders SET id = 200 WHERE id = 100")
        conn.execute("INSERT INTO m_orders VALUES (300, 2, 1, 'x')")
        conn.execute("DELETE FROM m_orders WHERE id = 300")
        conn.execute("INSERT INTO m_orders VALUES (300, 3, 2, 'back')")
        _run(spark, path)
        check()
        # Round 2: a truncate between changes, and an added column.
        conn.execute("INSERT INTO m_customers VALUES (22, 'before truncate')")
        conn.execute("TRUNCATE m_customers")
        conn.execute("INSERT INTO m_customers VALUES (1, 'after truncate')")
        conn.execute("ALTER TABLE m_orders ADD COLUMN status text")
        conn.execute("UPDATE m_orders SET status = 'paid' WHERE id <= 5")
        conn.execute("INSERT INTO m_orders VALUES (400, 4, 4, NULL, 'open')")
        _run(spark, path)
        check()
        # Every table records the same progress; the slot never passes it.
        key = f"m_slot-{slot_key('m_slot')}-lsn"
        versions = {DeltaTable(str(t)).transaction_version(key) for t in (orders, customers, events)}
        assert len(versions) == 1
        confirmed = conn.execute(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'm_slot'"
        ).fetchone()[0]
        (version,) = versions
        assert version is not None and int(confirmed) <= version + 1
        # The event table has every event once (the mirrors did not take any from it).
        kinds = DeltaTable(str(events)).to_pyarrow_table(columns=["event_type"]).column(0).to_pylist()
        assert kinds.count("snapshot") == 70 and kinds.count("truncate") == 1
    finally:
        _drop(conn, "m_slot", "m_pub")


def test_types_from_the_catalog_and_unchanged_toast_values(spark, postgres, tmp_path):
    conn = postgres.connect()
    conn.execute(TYPES)
    conn.execute("CREATE PUBLICATION t_pub FOR TABLE mirror_typed")
    big = secrets.token_hex(50_000)  # stored out of line (TOAST): an update leaving it alone omits it
    row = (
        1,
        Decimal("1234.500"),
        Decimal("12345678901234567890.123456789012345678901"),
        "2024-03-01 12:34:56.123456+02",
        "2024-03-01 12:34:56.654321",
        "2024-02-29",
        json.dumps({"a": [1, 2.50, None], "b": {"c": "é"}}),
        ["x", None, 'q"uote'],
        [1, 2, None],
        str(uuid.UUID(int=7)),
        b"\x00\xffbytes",
        "happy",
        True,
        0.1,
        -3,
        big,
    )
    conn.execute(f"INSERT INTO mirror_typed VALUES ({', '.join(['%s'] * len(row))})", row)
    mirror = tmp_path / "typed"
    path = _pipeline(
        tmp_path,
        postgres,
        "t_pub",
        "t_slot",
        f'- {{table_uri: "{mirror}", write_mode: merge, stream: public.mirror_typed}}',
    )
    try:
        _run(spark, path)
        schema = DeltaTable(str(mirror)).to_pyarrow_table().schema
        assert str(schema.field("price").type) == "decimal128(12, 3)"
        assert schema.field("exact").type in ("string", "large_string", "string_view")
        assert (
            str(schema.field("at").type) == "timestamp[us, tz=UTC]"
            and str(schema.field("local").type) == "timestamp[us]"
        )
        conn.execute("SELECT pg_create_logical_replication_slot('t_ref', 'pgoutput')")
        conn.execute("UPDATE mirror_typed SET small = 4, ratio = 'NaN' WHERE id = 1")  # body is not sent
        conn.execute("INSERT INTO mirror_typed (id, body) VALUES (2, NULL)")
        update = read_all_events(postgres, cdc_options(postgres, "t_pub", "t_ref"))[0]
        assert update["event_type"] == "update" and '"body"' not in update["data"]
        _run(spark, path)
        got = _mirror(mirror)
        want = _source(conn, "mirror_typed")
        assert len(got) == len(want) == 2
        first, expected = got[0], want[0]
        assert first["body"] == big  # the unchanged TOAST value kept from the table
        assert first["small"] == 4 and first["ratio"] != first["ratio"]  # NaN
        assert first["price"] == expected["price"]
        assert Decimal(first["exact"]) == expected["exact"] and first["exact"] == str(expected["exact"])
        assert (
            first["at"] == expected["at"]
            and first["local"] == expected["local"]
            and first["day"] == expected["day"]
        )
        assert json.loads(first["doc"]) == expected["doc"]
        assert first["tags"] == expected["tags"] and first["counts"] == expected["counts"]
        assert first["ref"] == str(expected["ref"]) and first["raw"] == expected["raw"]
        assert first["feeling"] == "happy" and first["ok"] is True
        assert got[1] == {**{k: None for k in got[1]}, "id": 2}
    finally:
        conn.execute("SELECT pg_drop_replication_slot('t_ref')")
        _drop(conn, "t_slot", "t_pub")


def test_mirror_settings_that_cannot_work_are_refused_before_anything_is_written(spark, postgres, tmp_path):
    conn = postgres.connect()
    conn.execute("CREATE TABLE no_key (id int, name text)")
    conn.execute("CREATE TABLE keyed (id int PRIMARY KEY, name text)")
    conn.execute("CREATE TABLE dropped (id int PRIMARY KEY)")
    conn.execute("CREATE TABLE unpublished (id int PRIMARY KEY)")
    conn.execute("CREATE PUBLICATION r_pub FOR TABLE no_key, keyed, dropped")
    conn.execute("DROP TABLE dropped")  # mirrored once, then dropped: advice to add it is wrong
    target = tmp_path / "t"
    try:
        for sink, problem in [
            # Every step at once: a key, and deletes that carry it.
            (
                "{table_uri: T, write_mode: merge, stream: public.no_key}",
                r"has no primary key; set key_columns .*, and ALTER TABLE public.no_key REPLICA "
                r"IDENTITY FULL",
            ),
            (
                "{table_uri: T, write_mode: merge, stream: public.dropped}",
                r"does not have \(dropped\? a typo",
            ),
            (
                "{table_uri: T, write_mode: merge, stream: public.no_key, key_columns: [id]}",
                "REPLICA IDENTITY FULL",
            ),
            ("{table_uri: T, write_mode: merge, stream: public.elsewhere}", "does not have"),
            ("{table_uri: T, write_mode: merge, stream: public.unpublished}", "ADD TABLE public.unpublished"),
        ]:
            path = _pipeline(tmp_path, postgres, "r_pub", "r_slot", "- " + sink.replace("T", f'"{target}"'))
            with pytest.raises(ConfigError, match=problem):
                _run(spark, path)
            assert not (tmp_path / "t").exists()
        for sink, problem in [
            ("{table_uri: T, write_mode: merge}", "stream: schema.table"),
            ("{table_uri: T, write_mode: merge, key_columns: [id]}", "set stream: schema.table"),
            ("{table_uri: T, stream: public.keyed}", "set write_mode: merge"),
            ("{table_uri: T, write_mode: merge, stream: public.keyed, sequence_by: x}", "ordered by LSN"),
        ]:
            path = _pipeline(tmp_path, postgres, "r_pub", "r_slot", "- " + sink.replace("T", f'"{target}"'))
            with pytest.raises(PipelineConfigError, match=problem):
                load_pipelines(path)
        conn.execute("ALTER TABLE no_key REPLICA IDENTITY FULL")
        path = _pipeline(
            tmp_path,
            postgres,
            "r_pub",
            "r_slot",
            f'- {{table_uri: "{tmp_path}/t", write_mode: merge, stream: public.no_key, key_columns: [id]}}',
        )
        conn.execute("INSERT INTO no_key VALUES (1, 'a'), (2, 'b')")
        _run(spark, path)
        conn.execute("DELETE FROM no_key WHERE id = 1")
        conn.execute("UPDATE no_key SET name = 'B' WHERE id = 2")
        _run(spark, path)
        assert _mirror(tmp_path / "t") == [{"id": 2, "name": "B"}]
    finally:
        _drop(conn, "r_slot", "r_pub")


def test_a_key_changing_update_keeps_the_unchanged_toast_values(spark, postgres, tmp_path):
    """PostgreSQL leaves an unchanged TOAST value out of the new row of an update, also when the
    key changes: the mirror takes it from the old key's row (its own, the batch's earlier image,
    or the old row PostgreSQL sends with REPLICA IDENTITY FULL), never NULL."""
    conn = postgres.connect()
    streams = ("rekey", "rekey_full")
    for name in streams:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, name text, doc text)")
    conn.execute("ALTER TABLE rekey_full REPLICA IDENTITY FULL")
    conn.execute("CREATE PUBLICATION rk_pub FOR TABLE rekey, rekey_full")
    docs = {i: secrets.token_hex(50_000) for i in range(1, 10)}  # 100 kB each: stored out of line
    for name in streams:
        for i in range(1, 9):
            conn.execute(f"INSERT INTO {name} VALUES (%s, %s, %s)", (i, f"n{i}", docs[i]))
    mirrors = {name: tmp_path / name for name in streams}
    path = _pipeline(
        tmp_path,
        postgres,
        "rk_pub",
        "rk_slot",
        "".join(f'- {{table_uri: "{mirrors[n]}", write_mode: merge, stream: public.{n}}}\n' for n in streams),
    )
    try:
        _run(spark, path)  # the snapshot
        conn.execute("SELECT pg_create_logical_replication_slot('rk_ref', 'pgoutput')")
        for name in streams:
            # The old key's row is in the mirror.
            conn.execute(f"UPDATE {name} SET id = 101 WHERE id = 3")
            conn.execute(f"UPDATE {name} SET id = 102, name = 'moved4' WHERE id = 4")
            with conn.transaction():  # one batch: the old row is the batch's own earlier image
                conn.execute(f"INSERT INTO {name} VALUES (9, 'n9', %s)", (docs[9],))
                conn.execute(f"UPDATE {name} SET id = 109 WHERE id = 9")
                conn.execute(f"UPDATE {name} SET name = 'five' WHERE id = 5")
                conn.execute(f"UPDATE {name} SET id = 105 WHERE id = 5")
                conn.execute(f"UPDATE {name} SET id = 106 WHERE id = 6")
                conn.execute(f"UPDATE {name} SET id = 206, name = 'twice' WHERE id = 106")
                conn.execute(f"UPDATE {name} SET id = 300 WHERE id = 7")
                conn.execute(f"UPDATE {name} SET id = 7 WHERE id = 300")
        moved = [
            e
            for e in read_all_events(postgres, cdc_options(postgres, "rk_pub", "rk_ref"))
            if e["event_type"] == "update"
        ]
        assert moved and all('"doc"' not in json.loads(e["data"])["after"] for e in moved)  # never sent
        _run(spark, path)
        got = {name: _mirror(mirrors[name]) for name in streams}
        assert {n: [r["id"] for r in rows if r["doc"] is None] for n, rows in got.items()} == {
            n: [] for n in streams
        }
        for name in streams:
            assert [r["id"] for r in got[name]] == [1, 2, 7, 8, 101, 102, 105, 109, 206]
            assert got[name] == _source(conn, name)
    finally:
        conn.execute("SELECT pg_drop_replication_slot('rk_ref')")
        _drop(conn, "rk_slot", "rk_pub")


def test_a_re_keyed_row_the_mirror_lacks_stops_the_pipeline_naming_replica_identity_full(
    spark, postgres, tmp_path
):
    conn = postgres.connect()
    conn.execute("CREATE TABLE rekey_gap (id int PRIMARY KEY, name text, doc text)")
    conn.execute("CREATE PUBLICATION gap_pub FOR TABLE rekey_gap")
    conn.execute("INSERT INTO rekey_gap VALUES (1, 'a', %s)", (secrets.token_hex(50_000),))
    mirror = tmp_path / "gap"
    path = _pipeline(
        tmp_path,
        postgres,
        "gap_pub",
        "gap_slot",
        f'- {{table_uri: "{mirror}", write_mode: merge, stream: public.rekey_gap}}',
        snapshot="never",  # row 1 predates the slot: the mirror never holds it
    )
    try:
        _run(spark, path)
        progress = f"gap_slot-{slot_key('gap_slot')}-lsn"
        held = DeltaTable(str(mirror)).transaction_version(progress)
        conn.execute("UPDATE rekey_gap SET id = 11 WHERE id = 1")
        with pytest.raises(MergeError, match="REPLICA IDENTITY FULL") as caught:
            _run(spark, path)
        assert "['doc']" in str(caught.value)
        assert "nothing of this batch was committed to this mirror" in str(caught.value)
        assert _mirror(mirror) == []  # no row 11 with a NULL doc
        assert DeltaTable(str(mirror)).transaction_version(progress) == held  # the change is not passed
    finally:
        _drop(conn, "gap_slot", "gap_pub")


def test_a_mirror_added_to_a_pipeline_that_read_changes_is_refused_at_every_start(spark, postgres, tmp_path):
    """A table joining the publication while the pipeline runs, then a mirror of it added and
    the pipeline restarted with its checkpoint: the mirror would get neither the snapshot nor
    the changes read before, so the start is refused, nothing written to it."""
    conn = postgres.connect()
    conn.execute("CREATE TABLE late_a (id int PRIMARY KEY, name text)")
    conn.execute("CREATE TABLE late_b (id int PRIMARY KEY, name text)")
    conn.execute("CREATE PUBLICATION late_pub FOR TABLE late_a")
    conn.execute("INSERT INTO late_a SELECT i, 'a' FROM generate_series(1, 20) i")
    conn.execute("INSERT INTO late_b SELECT i, 'b' FROM generate_series(1, 50) i")
    events, mirror_a, mirror_b = tmp_path / "events", tmp_path / "late_a", tmp_path / "late_b"
    sinks = f"""
        - {{table_uri: "{events}"}}
        - {{table_uri: "{mirror_a}", write_mode: merge, stream: public.late_a}}
        """
    try:
        path = _pipeline(tmp_path, postgres, "late_pub", "late_slot", sinks)
        _run(spark, path)  # the snapshot of late_a
        conn.execute("INSERT INTO late_a VALUES (21, 'a')")
        _run(spark, path)
        conn.execute("ALTER PUBLICATION late_pub ADD TABLE late_b")
        conn.execute("INSERT INTO late_b SELECT i, 'b' FROM generate_series(51, 60) i")
        _run(spark, path)  # late_b's ten inserts land in the event table, as events
        assert _mirror(mirror_a) == _source(conn, "late_a")

        added = sinks + f'- {{table_uri: "{mirror_b}", write_mode: merge, stream: public.late_b}}\n'
        path = _pipeline(tmp_path, postgres, "late_pub", "late_slot", added)
        conn.execute("INSERT INTO late_b VALUES (61, 'b')")
        for _ in range(2):  # every start, not only the first (Spark skips initialOffset then)
            with pytest.raises(CdcPositionError, match="pipeline of its own") as caught:
                _run(spark, path)
            assert str(mirror_b) in str(caught.value)
            assert not (mirror_b / "_delta_log").exists() or _mirror(mirror_b) == []
        # A restart after a crash re-plans its unfinished batch (partitions) before any
        # latestOffset: refused there too.
        options = cdc_options(
            postgres,
            "late_pub",
            "late_slot",
            snapshot="initial",
            pipeline_id="late_slot",
            delta_table_uri=str(events),
            more_delta_tables={str(mirror_a): {}, str(mirror_b): {}},
        )
        reader = PostgresCdcStreamReader(options, event_arrow_schema())
        held = DeltaTable(str(events)).transaction_version(f"late_slot-{options.key}-lsn")
        start = {options.key: {"lsn": held + 1, "snapshot": 1}}
        with pytest.raises(CdcPositionError, match="pipeline of its own"):
            reader.partitions(start, {options.key: {"lsn": held + 100, "snapshot": 1}})
    finally:
        _drop(conn, "late_slot", "late_pub")

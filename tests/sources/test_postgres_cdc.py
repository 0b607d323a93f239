"""The ``postgres-cdc`` source against a real PostgreSQL (``wal_level = logical``), through Spark
into Delta: the events, exactly once from the table's progress, the slot held back to it, and
the setup errors."""

from __future__ import annotations

import json
import logging
import shutil
import time

import pytest
from deltalake import DeltaTable

import deltaflow
from deltaflow.errors import CdcPositionError, ConfigError, PostgresSetupError
from deltaflow.sources import pgoutput
from deltaflow.sources.postgres_cdc import (
    PostgresCdcOptions,
    check_setup,
    connection,
    event_arrow_schema,
    read_range,
    slot_key,
)
from tests.fixtures.postgres import cdc_options, read_all_events, running_postgres


def _source_options(postgres, publication: str, slot: str, **extra: str) -> dict[str, str]:
    return {
        "host": postgres.host,
        "port": str(postgres.port),
        "user": postgres.user,
        "database": postgres.dbname,
        "publication": publication,
        "slot": slot,
        "snapshot": "never",
        **extra,
    }


def _run(spark, postgres, table: str, checkpoint: str, publication: str, slot: str, **extra: str) -> None:
    """One availableNow run of publication -> events table, progress recorded per slot."""
    options = _source_options(postgres, publication, slot, delta_table_uri=table, pipeline_id="cdc", **extra)
    df = spark.readStream.format("postgres-cdc").options(**options).load()
    query = (
        df.writeStream.format("deltaflow")
        .option("table_uri", table)
        .option("pipeline_id", "cdc")
        .option("kafka_offsets", "true")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()


def _events(table: str) -> list[tuple]:
    rows = DeltaTable(table).to_pyarrow_table().sort_by([("lsn", "ascending"), ("seq", "ascending")])
    return [(r["stream"], r["event_type"], json.loads(r["data"])) for r in rows.to_pylist()]


def _slot_confirmed(conn, slot: str) -> int:
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    return pgoutput.lsn_from_text(row[0])


def _table_progress(table: str, slot: str) -> int | None:
    return DeltaTable(table).transaction_version(f"cdc-{slot_key(slot)}-lsn")


def test_changes_land_once_from_the_tables_progress_and_the_slot_never_passes_it(spark, postgres, tmp_path):
    deltaflow.register(spark)
    conn = postgres.connect()
    conn.execute("DROP TABLE IF EXISTS shop_customers, shop_orders")
    conn.execute("CREATE TABLE shop_customers (id int PRIMARY KEY, name text, vip boolean)")
    conn.execute(
        "CREATE TABLE shop_orders (id bigint PRIMARY KEY, customer int, amount numeric(12,2), at timestamptz)"
    )
    conn.execute("CREATE PUBLICATION shop FOR TABLE shop_customers, shop_orders")
    table, checkpoint = str(tmp_path / "events"), str(tmp_path / "cp")

    # The slot is created at the first start: changes from then on are captured.
    _run(spark, postgres, table, checkpoint, "shop", "shop_slot")
    conn.execute("INSERT INTO shop_customers VALUES (1, 'Ada', false), (2, 'Bob', NULL)")
    with conn.transaction():  # one transaction touching two tables
        conn.execute("UPDATE shop_customers SET vip = true WHERE id = 1")
        conn.execute("INSERT INTO shop_orders VALUES (10, 1, 12345678.90, '2024-01-15 10:30:00+02')")
    conn.execute("DELETE FROM shop_customers WHERE id = 2")
    _run(spark, postgres, table, checkpoint, "shop", "shop_slot")

    want = [
        ("public.shop_customers", "insert", {"id": 1, "name": "Ada", "vip": False}),
        ("public.shop_customers", "insert", {"id": 2, "name": "Bob", "vip": None}),
        ("public.shop_customers", "update", {"before": None, "after": {"id": 1, "name": "Ada", "vip": True}}),
        (
            "public.shop_orders",
            "insert",
            {"id": 10, "customer": 1, "amount": 12345678.90, "at": "2024-01-15T08:30:00+00:00"},
        ),
        ("public.shop_customers", "delete", {"id": 2}),
    ]
    assert _events(table) == want
    raw = DeltaTable(table).to_pyarrow_table().to_pylist()
    assert '"amount":12345678.90' in next(r["data"] for r in raw if r["stream"] == "public.shop_orders")
    update = next(r for r in raw if r["event_type"] == "update")
    order = next(r for r in raw if r["stream"] == "public.shop_orders")
    assert (update["lsn"], update["xid"]) == (order["lsn"], order["xid"])  # one transaction
    assert (update["seq"], order["seq"]) == (0, 1)

    # The slot stands where the table's progress ends, never beyond.
    progress = _table_progress(table, "shop_slot")
    assert progress is not None
    assert _slot_confirmed(conn, "shop_slot") <= progress + 1

    # A lost checkpoint: the source resumes from the table, nothing twice.
    shutil.rmtree(checkpoint)
    conn.execute("TRUNCATE shop_orders")
    conn.execute("ALTER TABLE shop_customers ADD COLUMN email text")
    conn.execute("INSERT INTO shop_customers VALUES (3, 'Cy', true, 'cy@example.com')")
    _run(spark, postgres, table, checkpoint, "shop", "shop_slot")
    assert _events(table) == [
        *want,
        ("public.shop_orders", "truncate", {"cascade": False, "restart_identity": False}),
        ("public.shop_customers", "insert", {"id": 3, "name": "Cy", "vip": True, "email": "cy@example.com"}),
    ]
    # Nothing new: a run commits nothing, and the slot has moved up to the table's progress.
    version = DeltaTable(table).version()
    _run(spark, postgres, table, checkpoint, "shop", "shop_slot")
    assert DeltaTable(table).version() == version
    assert _slot_confirmed(conn, "shop_slot") == _table_progress(table, "shop_slot") + 1

    # The slot must never be behind... nor ahead of the table: moved by someone else, it is refused.
    conn.execute("INSERT INTO shop_customers VALUES (4, 'Di', false, NULL)")
    conn.execute("SELECT pg_replication_slot_advance('shop_slot', pg_current_wal_flush_lsn())")
    query = (
        spark.readStream.format("postgres-cdc")
        .options(**_source_options(postgres, "shop", "shop_slot", delta_table_uri=table, pipeline_id="cdc"))
        .load()
        .writeStream.format("deltaflow")
        .option("table_uri", table)
        .option("pipeline_id", "cdc")
        .option("kafka_offsets", "true")
        .option("checkpointLocation", str(tmp_path / "cp2"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="CdcPositionError") as caught:
        query.awaitTermination(180)
    assert "has moved to LSN" in str(caught.value)
    assert DeltaTable(table).version() == version
    conn.execute("SELECT pg_drop_replication_slot('shop_slot')")
    conn.execute("DROP PUBLICATION shop")


def test_types_print_as_exact_json(postgres):
    conn = postgres.connect()
    conn.execute("DROP TABLE IF EXISTS typed")
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
    conn.execute(
        "CREATE TABLE typed (id int PRIMARY KEY, n numeric, f float8, big bigint, t timestamp, d date, "
        "j jsonb, tags text[], nums numeric[], u uuid, b bytea, m mood, i interval, nan float8)"
    )
    conn.execute("CREATE PUBLICATION typed_pub FOR TABLE typed")
    conn.execute("SELECT pg_create_logical_replication_slot('typed_slot', 'pgoutput')")
    conn.execute(
        "INSERT INTO typed VALUES (1, 123456789012345678901234.5678, 0.1, 9007199254740993, "
        "'2024-02-29 23:59:59.123456', '2024-02-29', '{\"a\": [1, null]}', '{x,\"y z\",NULL}', "
        "'{1.10,2.25}', '6ecd8c99-4036-403d-bf84-cf8400f67836', '\\x00ff', 'happy', '1 day 02:00:00', 'NaN')"
    )
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes('typed_slot', NULL, NULL, "
        "'proto_version', '1', 'publication_names', 'typed_pub')"
    ).fetchall()
    messages = [pgoutput.decode(bytes(r[0])) for r in rows]
    relation = next(m for m in messages if isinstance(m, pgoutput.Relation))
    change = next(m for m in messages if isinstance(m, pgoutput.Change))
    text = pgoutput.ValueEncoder().encode_row(relation, change.new)
    assert '"n":123456789012345678901234.5678' in text and '"big":9007199254740993' in text
    assert '"nums":[1.10,2.25]' in text
    assert json.loads(text) == {
        "id": 1,
        "n": pytest.approx(1.2345678901234568e23),
        "f": 0.1,
        "big": 9007199254740993,
        "t": "2024-02-29T23:59:59.123456",
        "d": "2024-02-29",
        "j": {"a": [1, None]},
        "tags": ["x", "y z", None],
        "nums": [1.1, 2.25],
        "u": "6ecd8c99-4036-403d-bf84-cf8400f67836",
        "b": "AP8=",
        "m": "happy",
        "i": "1 day 02:00:00",
        "nan": "NaN",
    }
    assert relation.stream == "public.typed" and [c.name for c in relation.columns if c.key] == ["id"]
    conn.execute("SELECT pg_drop_replication_slot('typed_slot')")
    conn.execute("DROP PUBLICATION typed_pub")


def test_setup_problems_are_named_before_anything_is_written(spark, postgres, tmp_path):
    deltaflow.register(spark)
    conn = postgres.connect()
    base = cdc_options(postgres, "nope", "nope_slot")
    with (
        connection(base, "test") as c,
        pytest.raises(PostgresSetupError, match="publication 'nope' does not exist"),
    ):
        check_setup(c, base)

    conn.execute("CREATE PUBLICATION setup_pub FOR ALL TABLES")
    conn.execute("CREATE ROLE plain LOGIN")
    plain = base.model_copy(update={"publication": "setup_pub", "user": "plain"})
    with connection(plain, "test") as c, pytest.raises(PostgresSetupError, match="WITH REPLICATION"):
        check_setup(c, plain)

    conn.execute("SELECT pg_create_logical_replication_slot('other_plugin', 'test_decoding')")
    other = base.model_copy(update={"publication": "setup_pub", "slot": "other_plugin"})
    with connection(other, "test") as c, pytest.raises(PostgresSetupError, match="plugin 'test_decoding'"):
        check_setup(c, other)

    # Through Spark: the query does not start, no table, no slot.
    with pytest.raises(Exception, match="does not exist"):
        spark.readStream.format("postgres-cdc").options(
            **_source_options(postgres, "missing_pub", "missing_slot")
        ).load()
    assert not (tmp_path / "never").exists()
    assert (
        conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'missing_slot'").fetchone()[
            0
        ]
        == 0
    )

    with pytest.raises(ConfigError, match="delta_table_uri and pipeline_id"):
        PostgresCdcOptions.from_spark_options({"publication": "p", "pipeline_id": "x"})
    conn.execute("SELECT pg_drop_replication_slot('other_plugin')")
    conn.execute("DROP PUBLICATION setup_pub")
    conn.execute("DROP ROLE plain")


def test_a_server_without_logical_wal_is_refused():
    with running_postgres("replica") as server:
        options = cdc_options(server, "p", "p_slot")
        with connection(options, "test") as c, pytest.raises(PostgresSetupError, match="wal_level = logical"):
            check_setup(c, options)


def test_a_dropped_slot_with_progress_in_the_table_is_refused(spark, postgres, tmp_path):
    deltaflow.register(spark)
    conn = postgres.connect()
    conn.execute("CREATE TABLE gone (id int PRIMARY KEY)")
    conn.execute("CREATE PUBLICATION gone_pub FOR TABLE gone")
    table, checkpoint = str(tmp_path / "events"), str(tmp_path / "cp")
    _run(spark, postgres, table, checkpoint, "gone_pub", "gone_slot")
    conn.execute("INSERT INTO gone VALUES (1)")
    _run(spark, postgres, table, checkpoint, "gone_pub", "gone_slot")
    conn.execute("SELECT pg_drop_replication_slot('gone_slot')")
    with pytest.raises(Exception) as caught:
        _run(spark, postgres, table, str(tmp_path / "cp2"), "gone_pub", "gone_slot")
    assert "is gone" in str(caught.value)
    assert "cannot be brought back" in str(caught.value)  # and what to do instead
    assert f"delete (or move aside) {table}" in str(caught.value)
    assert CdcPositionError.__name__ in str(caught.value)
    assert (
        conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'gone_slot'").fetchone()[0]
        == 0
    )
    conn.execute("DROP PUBLICATION gone_pub")


def test_the_initial_snapshot_matches_the_slots_start_then_the_changes_follow(spark, postgres, tmp_path):
    deltaflow.register(spark)
    conn = postgres.connect()
    conn.execute("CREATE TABLE snap_a (id int PRIMARY KEY, name text, secret text)")
    conn.execute("CREATE TABLE snap_b (id int PRIMARY KEY, amount numeric(10, 2), pad text)")
    # A column list and a row filter (PostgreSQL 15): the snapshot applies them as pgoutput does.
    conn.execute("CREATE PUBLICATION snap_pub FOR TABLE snap_a (id, name), snap_b WHERE (id > 0)")
    conn.execute("INSERT INTO snap_a VALUES (1, 'one', 'x'), (2, 'two', 'y'), (3, NULL, 'z')")
    # ~3 MiB: read by several tasks with snapshot_chunk_mb = 1.
    conn.execute(
        "INSERT INTO snap_b SELECT i - 5, i / 100.0, repeat('p', 300) FROM generate_series(1, 9000) i"
    )
    # A slot that exists but gave the table nothing is replaced by one whose start the
    # snapshot matches.
    conn.execute("SELECT pg_create_logical_replication_slot('snap_slot', 'pgoutput')")
    table, checkpoint = str(tmp_path / "events"), str(tmp_path / "cp")
    options = {"snapshot": "initial", "snapshot_chunk_mb": "1"}

    _run(spark, postgres, table, checkpoint, "snap_pub", "snap_slot", **options)
    rows = DeltaTable(table).to_pyarrow_table().to_pylist()
    assert {r["event_type"] for r in rows} == {"snapshot"}
    a = sorted(json.loads(r["data"])["id"] for r in rows if r["stream"] == "public.snap_a")
    assert a == [1, 2, 3]
    assert all("secret" not in r["data"] for r in rows if r["stream"] == "public.snap_a")
    b = sorted(json.loads(r["data"])["id"] for r in rows if r["stream"] == "public.snap_b")
    assert b == list(range(1, 9000 - 4))  # ids <= 0 filtered out, each row once
    assert len(rows) == 3 + len(b)
    (lsn,) = {r["lsn"] for r in rows}
    history = DeltaTable(table).history()
    assert len([h for h in history if "deltaflow.epoch" in h]) == 1  # one commit...
    assert len(DeltaTable(table).file_uris()) >= 3  # ...of several tasks' files
    progress = DeltaTable(table).transaction_version(f"cdc-{slot_key('snap_slot')}-snapshot")
    assert progress == 0
    consistent = _slot_confirmed(conn, "snap_slot")
    assert lsn == consistent - 1  # before every change the new slot streams

    conn.execute("INSERT INTO snap_a VALUES (4, 'four', 's')")
    conn.execute("UPDATE snap_b SET amount = 0 WHERE id = 1")
    conn.execute("DELETE FROM snap_a WHERE id = 2")
    _run(spark, postgres, table, checkpoint, "snap_pub", "snap_slot", **options)
    changes = sorted(
        (r["lsn"], r["seq"], r["event_type"], r["stream"], r["data"])
        for r in DeltaTable(table).to_pyarrow_table().to_pylist()
        if r["event_type"] != "snapshot"
    )
    assert [(k, s, json.loads(d)) for _, _, k, s, d in changes] == [
        ("insert", "public.snap_a", {"id": 4, "name": "four"}),
        ("update", "public.snap_b", {"before": None, "after": {"id": 1, "amount": 0.0, "pad": "p" * 300}}),
        ("delete", "public.snap_a", {"id": 2}),
    ]
    assert all(c[0] > lsn for c in changes)
    assert len(DeltaTable(table).to_pyarrow_table()) == len(rows) + 3
    conn.execute("SELECT pg_drop_replication_slot('snap_slot')")
    conn.execute("DROP PUBLICATION snap_pub")


def test_values_read_exactly_whatever_the_roles_session_defaults(postgres):
    conn = postgres.connect()
    conn.execute("CREATE ROLE odd LOGIN REPLICATION")
    for setting in ("DateStyle = 'SQL, DMY'", "extra_float_digits = 0", "IntervalStyle = sql_standard"):
        conn.execute(f"ALTER ROLE odd SET {setting}")
    conn.execute("ALTER ROLE odd SET bytea_output = escape")
    conn.execute(
        "CREATE TABLE odd_t (id int PRIMARY KEY, ts timestamptz, tsi timestamp, d date, t time, f float8, "
        "i interval, b bytea, ja jsonb[], fa float8[], ia interval[], ra int4range[], m int[][])"
    )
    conn.execute("GRANT SELECT ON odd_t TO odd")
    conn.execute("CREATE PUBLICATION odd_pub FOR TABLE odd_t")
    conn.execute("SELECT pg_create_logical_replication_slot('odd_slot', 'pgoutput')")
    conn.execute(
        "INSERT INTO odd_t VALUES (1, '2024-03-01 12:00+00', '2024-03-01 12:00', '2024-03-01', '12:00', "
        "0.1::float8 + 0.2::float8, "
        "'1 mon 1 day', '\\x00ff', ARRAY['{\"a\": 1}'::jsonb], ARRAY['NaN'::float8, 'Infinity'], "
        "ARRAY['1 mon 1 day'::interval], ARRAY[int4range(1, 5)], '{{1,2},{3,NULL}}')"
    )
    conn.execute(
        "INSERT INTO odd_t (id, ts, tsi, d, t) VALUES (2, 'infinity', '-infinity', '2000-01-01 BC', '24:00')"
    )
    options = cdc_options(postgres, "odd_pub", "odd_slot", user="odd")
    rows = [json.loads(r["data"]) for r in read_all_events(postgres, options)]
    assert rows[0] == {
        "id": 1,
        "ts": "2024-03-01T12:00:00+00:00",
        "tsi": "2024-03-01T12:00:00",
        "d": "2024-03-01",
        "t": "12:00:00",
        "f": 0.30000000000000004,  # every digit: extra_float_digits is the source's, not the role's
        "i": "1 mon 1 day",
        "b": "AP8=",
        "ja": [{"a": 1}],
        "fa": ["NaN", "Infinity"],
        "ia": ["1 mon 1 day"],
        "ra": ["[1,5)"],
        "m": [[1, 2], [3, None]],
    }
    # Values Python's date types cannot hold stay PostgreSQL's text; the stream goes on.
    assert {k: v for k, v in rows[1].items() if v is not None} == {
        "id": 2,
        "ts": "infinity",
        "tsi": "-infinity",
        "d": "2000-01-01 BC",
        "t": "24:00:00",
    }
    conn.execute("SELECT pg_drop_replication_slot('odd_slot')")
    conn.execute("DROP PUBLICATION odd_pub")


def test_a_latin1_database_decodes_its_text(postgres):
    admin = postgres.connect()
    admin.execute("CREATE DATABASE latin ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    conn = postgres.connect(dbname="latin")
    conn.execute("CREATE TABLE café (id int PRIMARY KEY, name text)")
    conn.execute("CREATE PUBLICATION latin_pub FOR TABLE café")
    conn.execute("SELECT pg_create_logical_replication_slot('latin_slot', 'pgoutput')")
    conn.execute("INSERT INTO café VALUES (1, 'naïve crème brûlée')")
    options = cdc_options(postgres, "latin_pub", "latin_slot", database="latin")
    (row,) = read_all_events(postgres, options)
    assert (row["stream"], json.loads(row["data"])) == (
        "public.café",
        {"id": 1, "name": "naïve crème brûlée"},
    )
    conn.execute("SELECT pg_drop_replication_slot('latin_slot')")


def test_planning_keeps_transactions_whole_under_a_budget_and_records_idle_progress(postgres):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from deltaflow.sources.postgres_cdc import PostgresCdcStreamReader

    conn = postgres.connect()
    conn.execute("CREATE TABLE plan_t (id int PRIMARY KEY)")
    conn.execute("CREATE TABLE plan_other (id int)")
    conn.execute("CREATE PUBLICATION plan_pub FOR TABLE plan_t")
    options = cdc_options(postgres, "plan_pub", "plan_slot", idle_progress_bytes=512 * 1024)
    reader = PostgresCdcStreamReader(options, event_arrow_schema())
    start = reader.initialOffset()
    key = slot_key("plan_slot")
    with conn.transaction():
        conn.execute("INSERT INTO plan_t SELECT generate_series(1, 30)")  # one transaction, 30 changes
    conn.execute("INSERT INTO plan_t VALUES (31)")
    conn.execute("INSERT INTO plan_t VALUES (32)")

    # A budget of 5 messages: the whole first transaction (never split); then a budget of 3:
    # the one transaction that reaches it.
    first = reader.latestOffset(start, ReadMaxRows(5))
    (part,) = reader.partitions(start, first)
    ids = [json.loads(r["data"])["id"] for b in read_range(part) for r in b.to_pylist()]
    assert ids == list(range(1, 31))
    second = reader.latestOffset(first, ReadMaxRows(3))  # B, R, I, C of one transaction
    (part,) = reader.partitions(first, second)
    assert [json.loads(r["data"])["id"] for b in read_range(part) for r in b.to_pylist()] == [31]
    everything = reader.latestOffset(second, ReadAllAvailable())
    (part,) = reader.partitions(second, everything)
    assert [json.loads(r["data"])["id"] for b in read_range(part) for r in b.to_pylist()] == [32]

    # Nothing captured, other tables writing: no batch until idle_progress_bytes of WAL passed,
    # then an empty batch that moves the position (and lets the slot free the WAL).
    assert reader.latestOffset(everything, ReadAllAvailable()) == everything
    conn.execute("INSERT INTO plan_other SELECT generate_series(1, 20000)")  # ~1 MiB of WAL
    idle = reader.latestOffset(everything, ReadAllAvailable())
    assert idle[key]["lsn"] > everything[key]["lsn"]
    (part,) = reader.partitions(everything, idle)
    assert list(read_range(part)) == []
    reader.commit(idle)
    assert _slot_confirmed(conn, "plan_slot") == idle[key]["lsn"]  # no table: Spark's commit is the word

    # The publication dropped under a running stream: a terminal error naming it.
    conn.execute("DROP PUBLICATION plan_pub")
    conn.execute("INSERT INTO plan_t VALUES (33)")
    with pytest.raises(PostgresSetupError, match="plan_pub"):
        reader.latestOffset(idle, ReadAllAvailable())
    conn.execute("SELECT pg_drop_replication_slot('plan_slot')")


def test_the_snapshot_reads_each_row_once_under_its_own_table_and_outlives_idle_timeouts(postgres):
    admin = postgres.connect()
    admin.execute("CREATE DATABASE strict_db")
    # A managed database's habit: idle transactions are ended after a second.
    admin.execute("ALTER DATABASE strict_db SET idle_in_transaction_session_timeout = '1s'")
    conn = postgres.connect(dbname="strict_db")
    conn.execute("CREATE TABLE parent (id int PRIMARY KEY, v text)")
    conn.execute("CREATE TABLE child () INHERITS (parent)")
    conn.execute("CREATE PUBLICATION inh_pub FOR TABLE parent")  # publishes the child too
    conn.execute("INSERT INTO parent VALUES (1, 'p')")
    conn.execute("INSERT INTO child VALUES (2, 'c')")
    options = cdc_options(postgres, "inh_pub", "inh_slot", database="strict_db", snapshot="initial")
    from deltaflow.sources.postgres_cdc import create_slot_exporting_snapshot, plan_snapshot, read_snapshot

    exporter, lsn, name = create_slot_exporting_snapshot(options)
    try:
        ranges = plan_snapshot(options, name, lsn, event_arrow_schema())
        time.sleep(2)  # past the database's idle timeout: the exporting connection must stay
        rows = [row for task in ranges for batch in read_snapshot(task) for row in batch.to_pylist()]
    finally:
        exporter.close()
    assert sorted((r["stream"], r["data"]) for r in rows) == [
        ("public.child", '{"id":2,"v":"c"}'),
        ("public.parent", '{"id":1,"v":"p"}'),
    ]
    assert {r["lsn"] for r in rows} == {lsn - 1}
    conn.execute("SELECT pg_drop_replication_slot('inh_slot')")


def test_another_reader_moving_the_slot_stops_the_stream_and_pacing_holds_batches(postgres):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from deltaflow.sources.postgres_cdc import PostgresCdcStreamReader

    conn = postgres.connect()
    conn.execute("CREATE TABLE paced (id int PRIMARY KEY)")
    conn.execute("CREATE PUBLICATION paced_pub FOR TABLE paced")
    options = cdc_options(postgres, "paced_pub", "paced_slot", batch_interval=30)
    reader = PostgresCdcStreamReader(options, event_arrow_schema())
    start = reader.initialOffset()
    conn.execute("INSERT INTO paced VALUES (1)")
    first = reader.latestOffset(start, ReadAllAvailable())
    assert first != start  # the first batch is due at once
    reader.commit(first)
    conn.execute("INSERT INTO paced VALUES (2)")
    assert reader.latestOffset(first, ReadAllAvailable()) == first  # held back: not due for 30 s
    conn.execute("INSERT INTO paced SELECT generate_series(3, 10)")
    assert reader.latestOffset(first, ReadMaxRows(3)) != first  # the budget is reached: at once

    # Someone else advances the slot past this stream's position: refused, nothing skipped.
    conn.execute("SELECT pg_replication_slot_advance('paced_slot', pg_current_wal_flush_lsn())")
    with pytest.raises(CdcPositionError, match="another reader uses the slot"):
        reader.latestOffset(first, ReadAllAvailable())
    conn.execute("SELECT pg_drop_replication_slot('paced_slot')")
    conn.execute("DROP PUBLICATION paced_pub")

    with pytest.raises(ConfigError, match="snapshot 'initial' needs delta_table_uri"):
        PostgresCdcOptions.from_spark_options({"publication": "p"})


def test_a_table_joining_the_publication_while_the_stream_runs_is_logged_with_the_way_to_its_rows(
    postgres, caplog
):
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from deltaflow.sources.postgres_cdc import PostgresCdcStreamReader

    conn = postgres.connect()
    conn.execute("CREATE TABLE joined_a (id int PRIMARY KEY)")
    conn.execute("CREATE TABLE joined_b (id int PRIMARY KEY)")
    conn.execute("INSERT INTO joined_b SELECT generate_series(1, 50)")
    conn.execute("CREATE PUBLICATION joined_pub FOR TABLE joined_a")
    reader = PostgresCdcStreamReader(cdc_options(postgres, "joined_pub", "joined_slot"), event_arrow_schema())
    try:
        start = reader.initialOffset()
        conn.execute("INSERT INTO joined_a VALUES (1)")
        first = reader.latestOffset(start, ReadAllAvailable())
        assert "joined publication" not in caplog.text
        conn.execute("ALTER PUBLICATION joined_pub ADD TABLE joined_b")
        conn.execute("INSERT INTO joined_b VALUES (51)")
        with caplog.at_level(logging.WARNING, logger="deltaflow.sources.postgres_cdc"):
            reader.latestOffset(first, ReadAllAvailable())
        warned = [r.getMessage() for r in caplog.records if "joined publication" in r.getMessage()]
        assert len(warned) == 1
        assert "public.joined_b" in warned[0] and "earlier rows are not" in warned[0]
        assert "pipeline of its own" in warned[0]
        # A dropped table sends no change: it is seen leaving at the next change planned.
        second = reader.latestOffset(first, ReadAllAvailable())
        conn.execute("DROP TABLE joined_b")
        conn.execute("INSERT INTO joined_a VALUES (2)")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="deltaflow.sources.postgres_cdc"):
            reader.latestOffset(second, ReadAllAvailable())
        left = [r.getMessage() for r in caplog.records if "left publication" in r.getMessage()]
        assert len(left) == 1 and "['public.joined_b']" in left[0] and "Remove their mirror sinks" in left[0]
    finally:
        conn.execute("SELECT pg_drop_replication_slot('joined_slot')")
        conn.execute("DROP PUBLICATION joined_pub")

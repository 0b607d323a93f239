"""A YAML ``postgres-cdc`` pipeline (an event table and two mirror tables) run by ``deltaflow run
--once`` in its own process: SIGKILL between the tables' commits of the initial snapshot and of
a later batch (before the slot's advance), a lost checkpoint, restarts; every row and change
lands exactly once in the event table (checked against a second slot created beside the
pipeline's and never consumed) and each mirror equals its PostgreSQL table after every round."""

from __future__ import annotations

import shutil
import signal
import textwrap

from deltalake import DeltaTable

from deltaflow.config.postgres import slot_key
from deltaflow.sources import pgoutput
from tests.config.test_rivven import BASIC, PRODUCTION
from tests.fixtures.postgres import cdc_options, read_all_events
from tests.pipeline.test_runner import _run_cli


def _reference(postgres, slot: str) -> list[tuple]:
    """Every event of ``slot`` (never advanced), read by the source's own reader."""
    rows = read_all_events(postgres, cdc_options(postgres, "crash_pub", slot))
    return [(r["lsn"], r["seq"], r["xid"], r["stream"], r["event_type"], r["data"]) for r in rows]


def _landed(table: str) -> list[tuple]:
    rows = DeltaTable(table).to_pyarrow_table().to_pylist()
    return sorted((r["lsn"], r["seq"], r["xid"], r["stream"], r["event_type"], r["data"]) for r in rows)


def _confirmed(conn, slot: str) -> int:
    text = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )
    return pgoutput.lsn_from_text(text.fetchone()[0])


def _mirrored(table) -> list[dict]:
    rows = DeltaTable(str(table)).to_pyarrow_table().drop_columns(["_change_sequence"]).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def _rows(conn, table: str) -> list[dict]:
    cur = conn.execute(f"SELECT * FROM {table} ORDER BY id")
    return [dict(zip([d.name for d in cur.description], row, strict=True)) for row in cur.fetchall()]


def _least_progress(tables) -> int:
    return min(DeltaTable(str(t)).transaction_version(f"cdc-{slot_key('crash_slot')}-lsn") for t in tables)


def _changes(conn, round_: int) -> None:
    """Twelve transactions: inserts, updates, deletes, one touching both tables."""
    base = round_ * 100
    for i in range(6):
        conn.execute("INSERT INTO crash_a VALUES (%s, %s)", (base + i, f"a{i}"))
    with conn.transaction():
        conn.execute("UPDATE crash_a SET name = name || '!' WHERE id BETWEEN %s AND %s", (base, base + 99))
        conn.execute("INSERT INTO crash_b VALUES (%s, 1.25)", (base,))
    for _ in range(3):
        conn.execute("UPDATE crash_b SET amount = amount + 1 WHERE id = %s", (base,))
    conn.execute("DELETE FROM crash_a WHERE id = %s", (base + 1,))
    conn.execute("INSERT INTO crash_b VALUES (%s, 99.99)", (base + 1,))


def test_killed_in_the_snapshot_and_after_a_commit_then_checkpoint_lost_is_exactly_once(postgres, tmp_path):
    conn = postgres.connect()
    conn.execute("CREATE TABLE crash_a (id int PRIMARY KEY, name text)")
    conn.execute("CREATE TABLE crash_b (id int PRIMARY KEY, amount numeric(10, 2))")
    conn.execute("CREATE PUBLICATION crash_pub FOR TABLE crash_a, crash_b")
    conn.execute("INSERT INTO crash_a SELECT i, 'before' FROM generate_series(1000, 1199) i")
    conn.execute("INSERT INTO crash_b SELECT i, i FROM generate_series(1000, 1049) i")
    table, mirror_a, mirror_b = tmp_path / "events", tmp_path / "crash_a", tmp_path / "crash_b"
    tables = (table, mirror_a, mirror_b)
    path = tmp_path / "cdc.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            spark: {{master: "local[2]", conf: {{spark.sql.shuffle.partitions: "2"}}}}
            pipelines:
              - id: cdc
                source:
                  type: postgres-cdc
                  host: {postgres.host}
                  port: {postgres.port}
                  user: {postgres.user}
                  database: {postgres.dbname}
                  publication: crash_pub
                  slot: crash_slot
                  max_changes_per_batch: 10
                sinks:
                  - table_uri: "{table}"
                  - {{table_uri: "{mirror_a}", write_mode: merge, stream: public.crash_a}}
                  - {{table_uri: "{mirror_b}", write_mode: merge, stream: public.crash_b}}
            """
        )
    )

    def mirrors_equal() -> None:
        for mirror, source in ((mirror_a, "crash_a"), (mirror_b, "crash_b")):
            assert _mirrored(mirror) == _rows(conn, source), source

    # SIGKILL once mirror a committed the snapshot (mirrors commit side by side: b may hold it
    # too; the event table, committed after them, has nothing): the exported snapshot is gone
    # with the process, so the restart takes a new slot and snapshot for the same batch, which
    # replaces what the mirrors hold.
    crashed = _run_cli(["run", str(path), "--once"], DELTAFLOW_TEST_CRASH_AT="after_commit:0:crash_a")
    _, err = crashed.communicate(timeout=300)
    assert crashed.returncode == -signal.SIGKILL, err[-3000:]
    assert len(_mirrored(mirror_a)) == 200 and len(_mirrored(mirror_b)) in (0, 50)
    assert not _landed(str(table))
    conn.execute("DELETE FROM crash_a WHERE id >= 1100")  # gone before the second snapshot
    restarted = _run_cli(["run", str(path), "--once"])
    _, err = restarted.communicate(timeout=300)
    assert restarted.returncode == 0, err[-3000:]
    mirrors_equal()
    snapshot = _landed(str(table))
    assert {r[4] for r in snapshot} == {"snapshot"}
    assert sorted((r[3], r[5]) for r in snapshot) == sorted(
        [("public.crash_a", f'{{"id":{i},"name":"before"}}') for i in range(1000, 1100)]
        + [("public.crash_b", f'{{"id":{i},"amount":{i}.00}}') for i in range(1000, 1050)]
    )
    conn.execute("SELECT pg_create_logical_replication_slot('crash_ref', 'pgoutput')")
    _changes(conn, 0)

    # SIGKILL after mirror a's commit of batch 2 (batch 0 is the snapshot): the event table and
    # Spark have not recorded it, the slot is not advanced past it.
    crashed = _run_cli(["run", str(path), "--once"], DELTAFLOW_TEST_CRASH_AT="after_commit:2:crash_a")
    _, err = crashed.communicate(timeout=300)
    assert crashed.returncode == -signal.SIGKILL, err[-3000:]
    progress = {
        t: DeltaTable(str(t)).transaction_version(f"cdc-{slot_key('crash_slot')}-lsn") for t in tables
    }
    assert progress[mirror_a] >= progress[mirror_b] >= progress[table]
    assert progress[mirror_a] > progress[table]
    assert _confirmed(conn, "crash_slot") <= progress[table] + 1
    assert {h.get("deltaflow.epoch") for h in DeltaTable(str(table)).history()} - {None} == {0, 1}

    restarted = _run_cli(["run", str(path), "--once"])
    _, err = restarted.communicate(timeout=300)
    assert restarted.returncode == 0, err[-3000:]
    reference = _reference(postgres, "crash_ref")
    assert (
        len(reference) == 18
    )  # per round: 6 inserts, 6 + 1 in one transaction, 3 updates, 1 delete, 1 insert
    assert _landed(str(table)) == sorted(snapshot + reference)
    assert _confirmed(conn, "crash_slot") <= _least_progress(tables) + 1
    mirrors_equal()

    # Round 2 with the Spark checkpoint lost: the source resumes from the table.
    _changes(conn, 1)
    conn.execute("ALTER TABLE crash_b ADD COLUMN note text")
    conn.execute("INSERT INTO crash_b VALUES (500, 5, 'added column')")
    conn.execute("TRUNCATE crash_a")
    shutil.rmtree(table / "_deltaflow" / "checkpoints")
    again = _run_cli(["run", str(path), "--once"])
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    reference = _reference(postgres, "crash_ref")
    assert len(reference) == 18 + 18 + 2
    assert _landed(str(table)) == sorted(snapshot + reference)
    assert any('"note":"added column"' in r[5] for r in reference)
    assert _confirmed(conn, "crash_slot") <= _least_progress(tables) + 1
    mirrors_equal()
    assert "note" in _mirrored(mirror_b)[0]
    for slot in ("crash_ref", "crash_slot"):
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    conn.execute("DROP PUBLICATION crash_pub")


def _rivven_database(postgres, database: str):
    """``database`` with a publication ``rivven_pub``, owned by a role named as this OS user
    (Rivven's examples name no user: libpq then connects as the OS user)."""
    import getpass

    import psycopg

    user = getpass.getuser()
    admin = postgres.connect()
    if not admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,)).fetchone():
        admin.execute(f'CREATE ROLE "{user}" LOGIN REPLICATION')
    if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone():
        admin.execute(f'CREATE DATABASE {database} OWNER "{user}"')
    conn = psycopg.connect(
        host=postgres.host, port=postgres.port, user=user, dbname=database, autocommit=True
    )
    if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = 'rivven_pub'").fetchone():
        conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text, joined timestamptz)")
        conn.execute("CREATE PUBLICATION rivven_pub FOR TABLE users")
        conn.execute("INSERT INTO users VALUES (1, 'Alice', '2024-01-15 10:30:00Z'), (2, 'Bob', NULL)")
    return conn


def test_rivvens_basic_local_setup_runs_as_written(spark, postgres, tmp_path, caplog):
    import logging
    import re

    from deltaflow.config.pipeline import load_pipelines
    from deltaflow.service.daemon import run_pipelines

    conn = _rivven_database(postgres, "mydb")
    table = tmp_path / "events"
    path = tmp_path / "rivven.yaml"
    # Rivven's Basic Local Setup as its document prints it; only host, port and path differ.
    text = textwrap.dedent(BASIC).replace("host: localhost", f"host: {postgres.host}")
    path.write_text(text.replace("port: 5432", f"port: {postgres.port}").replace("/tmp/events", str(table)))
    file = load_pipelines(path)
    try:
        run_pipelines(spark, file.pipelines, available_now=True)  # the snapshot
        conn.execute("UPDATE users SET name = 'Alice B.' WHERE id = 1")
        conn.execute("DELETE FROM users WHERE id = 2")
        with caplog.at_level(logging.INFO, logger="deltaflow.service.daemon"):
            run_pipelines(spark, file.pipelines, available_now=True)  # the changes
    finally:  # slots are the cluster's: the next example's database uses the same name
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = 'deltaflow_rivven_pub'"
        )

    # The lag of a CDC source is WAL, in bytes: never "messages", never a time from a rate of changes.
    lines = [r.getMessage() for r in caplog.records if r.name == "deltaflow.service.daemon"]
    progress = [line for line in lines if "change(s) in" in line]
    wal = r"; \d+ byte\(s\) of WAL behind the newest position$"
    assert progress and all(re.search(wal, line) for line in progress), progress
    assert not [line for line in lines if "message(s)" in line], lines

    rows = DeltaTable(str(table)).to_pyarrow_table().sort_by([("lsn", "ascending"), ("seq", "ascending")])
    events = [(r["event_type"], r["stream"], r["data"]) for r in rows.to_pylist()]
    assert sorted(events[:2]) == [
        ("snapshot", "public.users", '{"id":1,"name":"Alice","joined":"2024-01-15T10:30:00+00:00"}'),
        ("snapshot", "public.users", '{"id":2,"name":"Bob","joined":null}'),
    ]
    assert events[2:] == [
        (
            "update",
            "public.users",
            '{"before":null,"after":{"id":1,"name":"Alice B.","joined":"2024-01-15T10:30:00+00:00"}}',
        ),
        ("delete", "public.users", '{"id":2}'),
    ]
    # Rivven's four columns, as its readers query them.
    names = DeltaTable(str(table)).schema().to_arrow().names
    assert names[:4] == ["data", "event_type", "timestamp", "stream"]


def test_rivvens_production_s3_setup_runs_against_an_s3_endpoint(spark, postgres, s3, tmp_path, monkeypatch):
    from deltaflow.config.pipeline import load_pipelines
    from deltaflow.service.daemon import run_pipelines

    conn = _rivven_database(postgres, "production")
    monkeypatch.setenv("DELTAFLOW_STATE_DIR", str(tmp_path / "state"))
    uri = s3.uri("warehouse-events")
    # Rivven's Production S3 Setup as its document prints it, pointed at this server and at moto
    # with the S3-compatible keys its document shows for MinIO; the database is "production".
    text = textwrap.dedent(PRODUCTION).replace("host: db.prod.internal", f"host: {postgres.host}")
    text = text.replace("port: 5432", f"port: {postgres.port}")
    text = text.replace("s3://data-lake/warehouse/events", uri).replace(
        "    region: us-east-1",
        f"    region: us-east-1\n        endpoint: {s3.endpoint}\n        access_key_id: testing\n"
        "        secret_access_key: testing\n        path_style_access: true\n        allow_http: true",
    )
    path = tmp_path / "rivven.yaml"
    path.write_text(text)
    file = load_pipelines(path)
    run_pipelines(spark, file.pipelines, available_now=True)
    conn.execute("INSERT INTO users VALUES (3, 'Cy', now())")
    run_pipelines(spark, file.pipelines, available_now=True)

    table = DeltaTable(uri, storage_options=s3.storage_options)
    rows = table.to_pyarrow_table().to_pylist()
    assert sorted((r["event_type"], r["data"][:8]) for r in rows) == [
        ("insert", '{"id":3,'),
        ("snapshot", '{"id":1,'),
        ("snapshot", '{"id":2,'),
    ]
    assert table.metadata().partition_columns == ["event_type"]
    assert table.metadata().configuration["delta.deletedFileRetentionDuration"] == "interval 7 days"
    assert all(uri.endswith(".zstd.parquet") for uri in table.file_uris())
    assert (tmp_path / "state" / "checkpoints" / "postgres-delta").is_dir()
    conn.execute("SELECT pg_drop_replication_slot('deltaflow_rivven_pub')")

"""CDC merge (write_mode: merge): upserts and deletes by key, latest change per key, older
changes never winning, replays as no-ops; Debezium envelopes from a real PostgreSQL."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltaflow.config.pipeline import load_pipelines
from deltaflow.delta import commit
from deltaflow.errors import CheckpointMismatchError, ConfigError
from deltaflow.service.daemon import run_pipelines
from deltaflow.sinks.merge import MergeWriter
from tests.fixtures.frames import settled


def _spec(tmp_path: Path, text: str, **env: str):
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(text))
    return load_pipelines(path, env={"DIR": str(tmp_path), **env}).pipelines


def _table(uri: Path, *columns: str) -> list[tuple]:
    table = DeltaTable(str(uri)).to_pyarrow_table(columns=list(columns))
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def _land(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    settled(folder / name)


def test_op_column_changes_upsert_delete_in_sequence_and_replays_do_nothing(spark, tmp_path):
    landing = tmp_path / "landing"
    specs = _spec(
        tmp_path,
        """
        pipelines:
          - id: cdc
            source:
              type: files
              path: "${DIR}/landing"
              format: json
              schema: "id INT, name STRING, op STRING, seq BIGINT"
              rescued_data_column: null
              max_files_per_trigger: 1
            sinks:
              - table_uri: "${DIR}/t"
                write_mode: merge
                key_columns: [id]
                cdc_format: op
                sequence_by: seq
                table_properties: {delta.enableChangeDataFeed: "true"}
        """,
    )
    _land(landing, "1.json", [{"id": i, "name": f"n{i}", "op": "c", "seq": i} for i in range(1, 6)])
    run_pipelines(spark, specs, available_now=True)
    assert _table(tmp_path / "t", "id", "name", "_change_sequence") == [(i, f"n{i}", i) for i in range(1, 6)]

    _land(
        landing,
        "2.json",
        [
            {"id": 2, "name": "two", "op": "u", "seq": 10},
            {"id": 3, "name": None, "op": "d", "seq": 11},
            {"id": 4, "name": "four-late", "op": "U", "seq": 13},  # the later of two in the batch wins
            {"id": 4, "name": "four-early", "op": "update", "seq": 12},
            {"id": 6, "name": "six", "op": "insert", "seq": 14},
            {"id": 1, "name": "stale", "op": "u", "seq": 0},  # older than the row's: ignored
            {"id": 5, "name": None, "op": "d", "seq": 1},  # an older delete: ignored
            {"id": 99, "name": None, "op": "d", "seq": 15},  # deleting an unknown key: nothing
            {"id": 7, "name": "x", "op": "truncate", "seq": 16},  # not a row change: skipped
        ],
    )
    run_pipelines(spark, specs, available_now=True)
    assert _table(tmp_path / "t", "id", "name") == [
        (1, "n1"),
        (2, "two"),
        (4, "four-late"),
        (5, "n5"),
        (6, "six"),
    ]
    table = DeltaTable(str(tmp_path / "t"))
    version = table.version()
    assert table.transaction_version("cdc") == 1
    # The target's own change feed records what the merge did.
    feed = pa.table(table.load_cdf(starting_version=version).read_all()).to_pylist()
    kinds = sorted((r["id"], r["_change_type"]) for r in feed)
    assert (3, "delete") in kinds and (6, "insert") in kinds and (2, "update_postimage") in kinds

    # Equal sequences: the later change wins (a source with coarse sequences, e.g. ts_ms); a
    # Change Data Feed's post-image is an upsert, its pre-image is skipped.
    _land(
        landing,
        "3.json",
        [
            {"id": 2, "name": "two-again", "op": "update_postimage", "seq": 10},
            {"id": 2, "name": "two-before", "op": "update_preimage", "seq": 10},
        ],
    )
    run_pipelines(spark, specs, available_now=True)
    assert _table(tmp_path / "t", "id", "name")[1] == (2, "two-again")
    table = DeltaTable(str(tmp_path / "t"))
    version = table.version()

    # A replay of batch 2 (a crash after its commit) changes nothing, whatever it carries.
    writer = MergeWriter(specs[0].sinks[0].sink_options("cdc", str(tmp_path / "ckpt")))
    writer(spark.createDataFrame([(2, "again", "u", 99)], "id INT, name STRING, op STRING, seq BIGINT"), 2)
    assert DeltaTable(str(tmp_path / "t")).version() == version
    # A lost checkpoint (batch ids from 0 again) is refused, as for appends: nothing merged twice.
    shutil.rmtree(tmp_path / "t" / "_deltaflow" / "checkpoints")
    with pytest.raises(CheckpointMismatchError, match="checkpoint is not the one"):
        run_pipelines(spark, specs, available_now=True)
    # Nothing was committed: no rows, no files, and no second claim by this process.
    assert DeltaTable(str(tmp_path / "t")).version() == version


def test_a_lost_checkpoint_after_one_merged_batch_is_refused_not_skipped(spark, tmp_path):
    # The new checkpoint's batch 0 (every file) has the id of the one batch the table holds:
    # the checkpoint mark, not the batch id, tells it from a replay.
    landing = tmp_path / "landing"
    specs = _spec(
        tmp_path,
        """
        pipelines:
          - id: cdc
            source:
              type: files
              path: "${DIR}/landing"
              format: json
              schema: "id INT, name STRING, op STRING, seq BIGINT"
              rescued_data_column: null
            sinks:
              - table_uri: "${DIR}/t"
                write_mode: merge
                key_columns: [id]
                cdc_format: op
                sequence_by: seq
        """,
    )
    _land(landing, "1.json", [{"id": i, "name": f"n{i}", "op": "c", "seq": i} for i in range(1, 4)])
    run_pipelines(spark, specs, available_now=True)
    assert DeltaTable(str(tmp_path / "t")).transaction_version("cdc") == 0
    version = DeltaTable(str(tmp_path / "t")).version()
    shutil.rmtree(tmp_path / "t" / "_deltaflow" / "checkpoints")
    _land(landing, "2.json", [{"id": 9, "name": "new", "op": "c", "seq": 9}])
    with pytest.raises(CheckpointMismatchError, match="another Spark checkpoint"):
        run_pipelines(spark, specs, available_now=True)
    assert _table(tmp_path / "t", "id", "name") == [(1, "n1"), (2, "n2"), (3, "n3")]
    assert DeltaTable(str(tmp_path / "t")).version() == version  # nothing committed, no claim again


def test_changes_without_a_sequence_are_refused_with_nothing_merged(spark, tmp_path):
    from deltaflow.config.sink import SinkOptions
    from deltaflow.errors import MergeError
    from deltaflow.sinks.merge import target_rows

    options = SinkOptions.build(
        {
            "table_uri": str(tmp_path / "t"),
            "pipeline_id": "p",
            "write_mode": "merge",
            "key_columns": ["id"],
            "cdc_format": "debezium",
            "sequence_by": "after.v",  # NULL for deletes, whose 'after' is NULL
        }
    )
    image = "STRUCT<id: INT, v: BIGINT>"
    rows = spark.createDataFrame(
        [((1, 5), None, "c"), (None, (1, 5), "d")], f"after {image}, before {image}, op STRING"
    )
    schema = target_rows(rows, options).schema
    import pyarrow as pa

    from deltaflow.delta.schema import spark_to_arrow

    commit.create_table(
        str(tmp_path / "t"), spark_to_arrow(schema), partition_by=(), properties={}, storage_options={}
    )
    with pytest.raises(MergeError, match=r"1 change\(s\) have no sequence .*nothing was merged"):
        MergeWriter(options)(rows, 0)
    assert DeltaTable(str(tmp_path / "t")).version() == 0
    assert pa.table(DeltaTable(str(tmp_path / "t")).to_pyarrow_table()).num_rows == 0


def test_merge_needs_keys_and_the_envelope(tmp_path):
    with pytest.raises(Exception, match="write_mode merge needs key_columns"):
        _spec(
            tmp_path,
            """
            pipelines:
              - id: x
                source: {type: generator}
                sinks: [{table_uri: /t, write_mode: merge}]
            """,
        )
    with pytest.raises(Exception, match="a merge from a generator source needs sequence_by"):
        _spec(
            tmp_path,
            """
            pipelines:
              - id: x
                source: {type: generator}
                sinks: [{table_uri: /t, write_mode: merge, key_columns: [id]}]
            """,
        )
    with pytest.raises(Exception, match="apply to write_mode merge only"):
        _spec(
            tmp_path,
            """
            pipelines:
              - id: x
                source: {type: generator}
                sinks: [{table_uri: /t, key_columns: [id]}]
            """,
        )


def test_debezium_without_its_envelope_is_refused_before_anything_runs(spark, tmp_path):
    specs = _spec(
        tmp_path,
        """
        pipelines:
          - id: dbz
            source: {type: generator, total_rows: 10}
            sinks:
              - {table_uri: "${DIR}/t", write_mode: merge, key_columns: [id], cdc_format: debezium}
        """,
    )
    with pytest.raises(ConfigError, match="needs the envelope's columns before, after and op"):
        run_pipelines(spark, specs, available_now=True)


_TRIGGER = """
CREATE TABLE customers (id INT PRIMARY KEY, name TEXT, email TEXT, balance DOUBLE PRECISION,
                        updated_at TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE TABLE cdc_log (seq BIGSERIAL PRIMARY KEY, op CHAR(1), before JSONB, after JSONB,
                      ts_ms BIGINT DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
CREATE FUNCTION capture() RETURNS trigger AS $$
BEGIN
  INSERT INTO cdc_log (op, before, after) VALUES (
    CASE TG_OP WHEN 'INSERT' THEN 'c' WHEN 'UPDATE' THEN 'u' ELSE 'd' END,
    CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE to_jsonb(OLD) END,
    CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE to_jsonb(NEW) END);
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER customers_cdc AFTER INSERT OR UPDATE OR DELETE ON customers
  FOR EACH ROW EXECUTE FUNCTION capture();
"""


class _DebeziumProducer:
    """Turns the trigger's change log into Debezium-shaped JSON events on a Kafka topic (keyed
    by the primary key, so one key's changes stay in order on one partition)."""

    def __init__(self, conn, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer

        self._conn = conn
        self._topic = topic
        self._last = 0
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})

    def ship(self) -> int:
        rows = self._conn.execute(
            "SELECT seq, op, before, after, ts_ms FROM cdc_log WHERE seq > %s ORDER BY seq", (self._last,)
        ).fetchall()
        for seq, op, before, after, ts_ms in rows:
            event = {
                "schema": None,
                "payload": {
                    "before": before,
                    "after": after,
                    "op": op,
                    "ts_ms": ts_ms,
                    "source": {"connector": "postgresql", "db": "postgres", "table": "customers", "lsn": seq},
                },
            }
            key = json.dumps({"id": (after or before)["id"]})
            self._producer.produce(self._topic, key=key.encode(), value=json.dumps(event).encode())
            self._last = seq
        assert self._producer.flush(30) == 0
        return len(rows)


def test_postgres_changes_as_debezium_events_keep_the_delta_table_equal_to_postgres(
    spark, kafka, postgres, tmp_path
):
    conn = postgres.connect()
    conn.execute(
        "DROP TABLE IF EXISTS customers; DROP TABLE IF EXISTS cdc_log; DROP FUNCTION IF EXISTS capture"
    )
    conn.execute(_TRIGGER)
    topic = kafka.create_topic(partitions=3)
    producer = _DebeziumProducer(conn, kafka.bootstrap, topic)
    image = "STRUCT<id: INT, name: STRING, email: STRING, balance: DOUBLE, updated_at: TIMESTAMP>"
    specs = _spec(
        tmp_path,
        """
        pipelines:
          - id: pg-customers
            source:
              type: kafka
              bootstrap_servers: "${BROKER}"
              topic: "${TOPIC}"
              schema: "payload STRUCT<before: ${IMAGE}, after: ${IMAGE}, op: STRING, ts_ms: BIGINT,
                       source: STRUCT<table: STRING, lsn: BIGINT>>"
            sinks:
              - table_uri: "${DIR}/customers"
                write_mode: merge
                key_columns: [id]
                cdc_format: debezium
        """,
        BROKER=kafka.bootstrap,
        TOPIC=topic,
        IMAGE=image,
    )
    columns = ("id", "name", "email", "balance", "updated_at")

    def postgres_rows() -> list[tuple]:
        return sorted(conn.execute(f"SELECT {', '.join(columns)} FROM customers").fetchall())

    rounds = [
        # 1. the initial load
        [
            "INSERT INTO customers (id, name, email, balance) "
            "SELECT i, 'name ' || i, 'c' || i || '@example.com', i * 1.5 FROM generate_series(1, 60) i"
        ],
        # 2. updates, deletes, inserts; one row updated twice in one transaction
        [
            "UPDATE customers SET balance = balance + 100, updated_at = now() WHERE id % 7 = 0",
            "DELETE FROM customers WHERE id % 10 = 3",
            "INSERT INTO customers (id, name, email, balance) SELECT i, 'new ' || i, NULL, 0 "
            "FROM generate_series(61, 70) i",
            "BEGIN; UPDATE customers SET name = 'first' WHERE id = 1; "
            "UPDATE customers SET name = 'second', email = NULL WHERE id = 1; COMMIT",
        ],
        # 3. a key deleted and inserted again, then updated; a row deleted after its update
        [
            "DELETE FROM customers WHERE id = 5",
            "INSERT INTO customers (id, name, email, balance) VALUES (5, 'reborn', 'r@example.com', 5)",
            "UPDATE customers SET balance = 55 WHERE id = 5",
            "UPDATE customers SET name = 'doomed' WHERE id = 14",
            "DELETE FROM customers WHERE id = 14",
        ],
    ]
    for number, statements in enumerate(rounds, start=1):
        for statement in statements:
            conn.execute(statement)
        assert producer.ship() > 0
        run_pipelines(spark, specs, available_now=True)
        delta = _table(tmp_path / "customers", *columns)
        want = postgres_rows()
        assert [r[0] for r in delta] == [r[0] for r in want], f"round {number}: keys differ"
        assert delta == want, f"round {number}: the Delta table differs from PostgreSQL"
    conn.close()


def test_a_refused_checkpoint_leaves_no_mark_that_refuses_the_restored_one(spark, tmp_path):
    # Review 29: a pipeline writes its dead letters before its sinks. A dead-letter table that
    # never held a batch of the pipeline carries no mark, so a lost checkpoint's replacement
    # commits its first batch's dead letters there (with its own mark) and is refused only at
    # the sink. The error says "Restore the checkpoint"; the restored checkpoint is then refused
    # by the dead-letter table for good (its mark is the refused query's), and the refused
    # query's dead letters stay in it.
    landing = tmp_path / "landing"
    specs = _spec(
        tmp_path,
        """
        pipelines:
          - id: dl
            source:
              type: files
              path: "${DIR}/landing"
              format: json
              schema: "id INT, name STRING"
              rescued_data_column: null
            expectations:
              - {name: positive, expr: "id > 0", action: drop}
            dead_letter: {table_uri: "${DIR}/rejected"}
            sinks:
              - table_uri: "${DIR}/t"
        """,
    )
    _land(landing, "1.json", [{"id": i, "name": f"n{i}"} for i in range(1, 4)])
    run_pipelines(spark, specs, available_now=True)
    assert DeltaTable(str(tmp_path / "t")).transaction_version("dl") == 0
    checkpoints = tmp_path / "t" / "_deltaflow" / "checkpoints"
    shutil.move(checkpoints, tmp_path / "saved")  # lost (the operator still has a copy)
    _land(landing, "2.json", [{"id": 9, "name": "new"}, {"id": -1, "name": "bad"}])
    with pytest.raises(CheckpointMismatchError, match="another Spark checkpoint"):
        run_pipelines(spark, specs, available_now=True)

    shutil.rmtree(checkpoints)
    shutil.move(tmp_path / "saved", checkpoints)  # what the error says: restore the checkpoint
    run_pipelines(spark, specs, available_now=True)
    assert _table(tmp_path / "t", "id", "name") == [(1, "n1"), (2, "n2"), (3, "n3"), (9, "new")]
    assert _table(tmp_path / "rejected", "batch_id", "record") == [(1, '{"id":-1,"name":"bad"}')]

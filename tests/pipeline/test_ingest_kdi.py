"""``deltaflow ingest`` as a drop-in for kafka-delta-ingest: its seek offsets, its progress,
the table's partitioning, its dead-letter rows (in-process, on the shared Spark session); its
README walkthrough and its multi-worker and schema-update scenarios (CLI processes)."""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake

from deltaflow.config.ingest import IngestConfig
from deltaflow.errors import ConfigError
from deltaflow.io.faults import lose_commit_responses
from deltaflow.pipeline.ingest import ingest
from tests.fixtures.ingest_messages import EVENTS_SCHEMA as SCHEMA
from tests.fixtures.ingest_messages import SCHEMA as DLQ_SCHEMA
from tests.fixtures.ingest_messages import TRANSFORMS, _good, _message, events, poll, table_rows


def _events(start, count):
    return events(start, count, users=3, days=2)


def _config(kafka, topic, table, pipeline_id, **options):
    """An ingest of ``topic`` (JSON values, of :data:`SCHEMA` unless given) into ``table``."""
    return IngestConfig(
        topic=topic,
        table_uri=str(table),
        brokers=kafka.bootstrap,
        pipeline_id=pipeline_id,
        **{"value_schema": SCHEMA, **options},
    )


def _ids(table):
    return sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["id"])["id"].to_pylist())


def test_seek_offsets_are_seeked_past_recorded_and_never_skip_stored_progress(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _events(0, 40), partitions=2)  # event i: partition i % 2, offset i // 2
    table = tmp_path / "t"
    config = functools.partial(_config, kafka, topic, table, "seek", ends_at_latest_offsets=True)
    # The seek offsets' commit lands but its response is lost: the log decides, once.
    with lose_commit_responses("seek offsets", times=1) as lost:
        assert ingest(spark, config(seek_offsets={"0": 4, "1": 9})).awaitTermination(300)
    assert len(lost.lost) == 1
    # kafka-delta-ingest's meaning: the first message ingested is seek + 1.
    assert _ids(table) == sorted([2 * o for o in range(5, 20)] + [2 * o + 1 for o in range(10, 20)])
    history = DeltaTable(str(table)).history()
    seeks = [h for h in history if h.get("deltaflow.operation") == "seek offsets"]
    assert len(seeks) == 1  # recorded once, as txns, before the first batch

    # Progress behind the seek offsets: refused before anything is read (kafka-delta-ingest's
    # InconsistentStoredOffsets), the table untouched.
    version = DeltaTable(str(table)).version()
    with pytest.raises(ConfigError, match=r"behind the seek offsets \(partition 0: stored=19/seek=30\)"):
        ingest(spark, config(seek_offsets={"0": 30, "1": 2}))
    assert DeltaTable(str(table)).version() == version

    # Progress at or beyond them: the table's progress wins, nothing is read twice.
    kafka.produce(topic, _events(40, 10), partitions=2)
    assert ingest(spark, config(seek_offsets={"0": 3, "1": 2})).awaitTermination(300)
    assert _ids(table) == sorted(
        [2 * o for o in range(5, 20)] + [2 * o + 1 for o in range(10, 20)] + list(range(40, 50))
    )


def test_a_kafka_delta_ingest_table_keeps_its_partitioning_and_its_progress(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, _events(0, 30), partitions=1)
    table = tmp_path / "t"
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("user", pa.string()),
            ("meta", pa.struct([("producer", pa.struct([("timestamp", pa.string())]))])),
            ("date", pa.string()),
        ]
    )
    # The table as kafka-delta-ingest left it: partitioned by date, its txn <app_id>-<partition>
    # saying offsets 0..9 are in.
    write_deltalake(
        str(table),
        schema.empty_table(),
        partition_by=["date"],
        commit_properties=CommitProperties(app_transactions=[Transaction("kdi-0", 9)]),
    )
    base = {
        "topic": topic,
        "table_uri": str(table),
        "brokers": kafka.bootstrap,
        "pipeline_id": "kdi",
        "transforms": ["date: substr(meta.producer.timestamp, `0`, `10`)"],
        "ends_at_latest_offsets": True,
    }
    with pytest.raises(
        ConfigError, match=r"partitioned by \['date'\], but --partition_by \['user'\] was given"
    ):
        ingest(spark, IngestConfig(**base, partition_by=["user"]))
    assert ingest(spark, IngestConfig(**base)).awaitTermination(300)  # no --partition_by: the table's
    dt_ = DeltaTable(str(table))
    assert dt_.metadata().partition_columns == ["date"]
    rows = dt_.to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(10, 30))  # resumed after kafka-delta-ingest
    assert {r["date"] for r in rows} == {"2026-11-20", "2026-11-21"}
    paths = [f.split("/")[-2] for f in dt_.file_uris()]
    assert set(paths) == {"date=2026-11-20", "date=2026-11-21"}  # files in the table's partitions
    assert dt_.transaction_version(f"kdi-{topic}-0") == 29


class _Running:
    """An ingest query as a ``poll`` liveness check (its failure ends the wait)."""

    def __init__(self, query):
        self.query, self.returncode = query, None

    def poll(self):
        if not self.query.isActive:
            self.returncode = repr(self.query.exception())
            return self.returncode
        return None


def test_flush_by_size_by_latency_and_never_an_empty_commit(spark, kafka, tmp_path):
    """kafka-delta-ingest's buffer flush scenarios: with an hour's latency a batch is written
    once its Parquet would reach --min_bytes_per_file; under that size it waits for the
    latency; an idle interval commits nothing. (The first batch after a start runs at once.)"""
    topic = kafka.create_topic(partitions=1)
    table = tmp_path / "t"
    # max_messages_per_batch: never the reason for a batch here
    config = functools.partial(
        _config,
        kafka,
        topic,
        table,
        "flush",
        value_schema="id LONG, date STRING",
        max_messages_per_batch=5000,
    )

    def produce(first):
        messages = [json.dumps({"id": i, "date": "2022-06-03"}).encode() for i in range(first, first + 10)]
        kafka.produce(topic, messages, partitions=1)

    def landed(count, timeout_s, query):
        poll(lambda: table_rows(table) == count, timeout_s, f"{count} rows", _Running(query))

    # By size: 20 bytes of Parquet are reached long before the hour.
    query = ingest(spark, config(allowed_latency=3600, min_bytes_per_file=20))
    try:
        produce(0)
        landed(10, 120, query)
        produce(10)
        landed(20, 120, query)
    finally:
        query.stop()
    # Under the size and the latency: held back.
    query = ingest(
        spark,
        config(allowed_latency=3600, min_bytes_per_file=1_000_000),
    )
    try:
        produce(20)
        landed(30, 120, query)  # the first batch of a start
        produce(30)
        time.sleep(5)
        assert table_rows(table) == 30 and query.isActive
    finally:
        query.stop()
    # By latency, and no empty commit when nothing came.
    query = ingest(spark, config(allowed_latency=2, min_bytes_per_file=1_000_000))
    try:
        landed(40, 120, query)  # the held messages: the first batch of a start
        produce(40)
        landed(50, 120, query)
        version = DeltaTable(str(table)).version()
        time.sleep(5)  # two and a half intervals with nothing new
        assert DeltaTable(str(table)).version() == version and query.isActive
    finally:
        query.stop()
    assert sorted(_ids(table)) == list(range(50))


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_start_from_earliest_or_latest(spark, kafka, tmp_path, reset):
    """kafka-delta-ingest's starting offset scenarios: messages produced before the first start
    are ingested with --auto_offset_reset earliest and skipped with latest; those produced
    after it are ingested with either."""
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, _events(1, 5), partitions=3)
    table = tmp_path / "t"
    config = _config(kafka, topic, table, f"start-{reset}", auto_offset_reset=reset, allowed_latency=1)
    query = ingest(spark, config)
    try:
        # The query has its start offsets once it waits for data.
        poll(
            lambda: query.status["message"] == "Waiting for data to arrive",
            120,
            "a started query",
            _Running(query),
        )
        kafka.produce(topic, _events(6, 10), partitions=3)
        expected = list(range(1 if reset == "earliest" else 6, 16))
        poll(lambda: table_rows(table) == len(expected), 120, f"{len(expected)} rows", _Running(query))
    finally:
        query.stop()
    assert _ids(table) == expected


def test_ends_at_the_initial_offsets(spark, kafka, tmp_path):
    """kafka-delta-ingest's --ends_at_latest_offsets scenario: the run ends at the offsets the
    topic had when it started; messages produced while it runs wait for the next run."""
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, _events(0, 15), partitions=3)
    table = tmp_path / "t"
    # Three batches of five: the run is still going after the first.
    config = _config(kafka, topic, table, "ends", max_messages_per_batch=5, ends_at_latest_offsets=True)
    query = ingest(spark, config)
    poll(lambda: table_rows(table) > 0, 120, "the first batch", _Running(query))
    kafka.produce(topic, _events(15, 15), partitions=3)  # while it runs
    assert query.awaitTermination(300) and query.exception() is None
    assert _ids(table) == list(range(15))
    assert ingest(spark, config).awaitTermination(300)  # the next run takes the rest
    assert _ids(table) == list(range(30))


@pytest.mark.parametrize("engine", ["spark", "arrow"])
def test_kafka_delta_ingest_dead_letter_rows(spark, kafka, tmp_path, engine):
    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, [_message(i) for i in range(30)], partitions=1)
    config = IngestConfig(
        topic=topic,
        table_uri=str(tmp_path / "t"),
        brokers=kafka.bootstrap,
        pipeline_id="kdi-dlq",
        value_schema=DLQ_SCHEMA,
        transforms=TRANSFORMS,
        dlq_table_location=str(tmp_path / "dlq"),
        dlq_format="kafka-delta-ingest",
        dlq_transforms=["src_offset: kafka.offset"],
        ends_at_latest_offsets=True,
        engine=engine,
    )
    before = dt.datetime.now(dt.UTC)
    assert ingest(spark, config).awaitTermination(300)
    assert _ids(tmp_path / "t") == _good(30)
    dlq = DeltaTable(str(tmp_path / "dlq"))
    assert dlq.schema().to_arrow().names == [
        "base64_bytes",
        "json_string",
        "error",
        "timestamp",
        "date",
        "src_offset",
    ]
    assert pa.schema(dlq.schema().to_arrow()).field("timestamp").type == pa.timestamp("us", tz="UTC")
    rows = {r["src_offset"]: r for r in dlq.to_pyarrow_table().to_pylist()}
    assert sorted(rows) == [i for i in range(30) if i % 10 in (3, 5, 7)]
    for offset, row in rows.items():
        raw = _message(offset)
        if offset % 10 == 3:  # not JSON: the bytes
            assert (base64.b64decode(row["base64_bytes"]), row["json_string"]) == (raw, None)
        else:  # JSON that a column type (5) or a transform (7) refused: the text
            assert (row["base64_bytes"], row["json_string"]) == (None, raw.decode())
        assert row["error"]
        assert before - dt.timedelta(seconds=1) <= row["timestamp"] <= dt.datetime.now(dt.UTC)
        assert row["date"] == row["timestamp"].strftime("%Y-%m-%d")


# --- kafka-delta-ingest's README walkthrough and its multi-process scenarios (CLI processes) ---

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
URLS = ("http://www.youku.com", "http://www.google.co.uk", "https://example.org/a", "http://example.com/b")


def _web_requests(n):
    """Messages of the shape of kafka-delta-ingest's tests/json/web_requests-100.json (generated,
    not its file): a producer timestamp, method, session id, status, url, uuid."""
    return [
        {
            "meta": {
                "producer": {"timestamp": f"2021-03-24T15:06:{17 + i // 60:02d}.{321710 + i * 183:06d}+00:00"}
            },
            "method": METHODS[i % 5],
            "session_id": str(uuid.UUID(int=(i + 1) * 7919)),
            "status": (200, 201, 204, 400, 401, 404, 500)[i % 7],
            "url": URLS[i % 4],
            "uuid": str(uuid.UUID(int=(i + 1) * 104729)),
        }
        for i in range(n)
    ]


def _cli_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DELTAFLOW_TEST_", "KAFKA_", "TABLE_"))}
    return {**env, **extra}


def test_readme_walkthrough_from_a_container_manifest(kafka, tmp_path):
    topic = kafka.create_topic(partitions=1)
    messages = _web_requests(100)
    kafka.produce(topic, [json.dumps(m).encode() for m in messages], partitions=1)
    table = tmp_path / "web_requests"
    # Created by another writer first, as the walkthrough's table is: its schema, partitioned by date.
    kafka_meta = pa.struct([("offset", pa.int64()), ("topic", pa.string()), ("partition", pa.int32())])
    schema = pa.schema(
        [
            (
                "meta",
                pa.struct([("producer", pa.struct([("timestamp", pa.string())])), ("kafka", kafka_meta)]),
            ),
            ("method", pa.string()),
            ("session_id", pa.string()),
            ("status", pa.int32()),
            ("url", pa.string()),
            ("uuid", pa.string()),
            ("date", pa.string()),
        ]
    )
    DeltaTable.create(str(table), schema, partition_by=["date"])
    # `ingest web_requests ./tests/data/web_requests --allowed_latency 60 --app_id web_requests
    #  --transform ... (four) --auto_offset_reset earliest`, every value from the environment.
    env = _cli_env(
        KAFKA_TOPIC=topic,
        TABLE_LOCATION=str(table),
        KAFKA_BROKERS=kafka.bootstrap,
        APP_ID="web_requests",
        ALLOWED_LATENCY="60",
        KAFKA_AUTO_OFFSET_RESET="earliest",
        TRANSFORMS="date: substr(meta.producer.timestamp, `0`, `10`)\n"
        "meta.kafka.offset: kafka.offset\n"
        "meta.kafka.partition: kafka.partition\n"
        "meta.kafka.topic: kafka.topic\n",
        ENDS_AT_LATEST_OFFSETS="true",
        RUST_LOG="debug",
    )
    out = subprocess.run(
        [sys.executable, "-m", "deltaflow.cli", "ingest"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ingested 100 message(s)" in out.stdout
    assert " DEBUG " in out.stderr  # RUST_LOG=debug
    dt_ = DeltaTable(str(table))
    assert dt_.metadata().partition_columns == ["date"]
    assert {f.split("/")[-2] for f in dt_.file_uris()} == {"date=2021-03-24"}
    rows = sorted(dt_.to_pyarrow_table().to_pylist(), key=lambda r: r["meta"]["kafka"]["offset"])
    assert len(rows) == 100
    for offset, (row, message) in enumerate(zip(rows, messages, strict=True)):
        assert row["meta"] == {
            "producer": message["meta"]["producer"],
            "kafka": {"offset": offset, "topic": topic, "partition": 0},
        }
        assert {k: row[k] for k in ("method", "session_id", "status", "url", "uuid")} == {
            k: message[k] for k in ("method", "session_id", "status", "url", "uuid")
        }
        assert row["date"] == "2021-03-24"
    assert dt_.transaction_version(f"web_requests-{topic}-0") == 99


def test_two_workers_and_a_column_added_by_another_writer(kafka, tmp_path):
    """kafka-delta-ingest runs several workers on one topic (its consumer group splits the
    partitions). deltaflow runs one writer per --app_id (Spark's tasks read the partitions in
    parallel): a second worker takes the pipeline over, the first stops, every message lands
    once. The worker then follows a column another writer adds while it runs."""
    topic = kafka.create_topic(partitions=2)
    table = tmp_path / "t"
    command = [sys.executable, "-m", "deltaflow.cli", "ingest", topic, str(table), "-k", kafka.bootstrap]
    command += ["-a", "workers", "-l", "1", "--schema", "id LONG, user STRING"]
    logs = [tmp_path / "a.txt", tmp_path / "b.txt"]
    workers = []
    try:
        with logs[0].open("w") as err:
            workers.append(
                subprocess.Popen(
                    command, cwd=ROOT, env=_cli_env(), stdout=subprocess.PIPE, stderr=err, text=True
                )
            )
        kafka.produce(topic, [json.dumps({"id": i, "user": "a"}).encode() for i in range(100)], partitions=2)
        poll(lambda: table_rows(table) == 100, 240, "100 rows from worker 1", *workers)
        with logs[1].open("w") as err:
            workers.append(
                subprocess.Popen(
                    command, cwd=ROOT, env=_cli_env(), stdout=subprocess.PIPE, stderr=err, text=True
                )
            )
        poll(lambda: "as epoch 2" in logs[1].read_text(), 240, "worker 2's claim", workers[1])
        kafka.produce(
            topic, [json.dumps({"id": i, "user": "b"}).encode() for i in range(100, 200)], partitions=2
        )
        poll(lambda: workers[0].poll() is not None, 120, "worker 1 to stop")
        poll(lambda: table_rows(table) == 200, 120, "200 rows", workers[1])

        DeltaTable(str(table)).alter.add_columns([Field("color", "string", nullable=True)])  # another writer
        new = [json.dumps({"id": i, "user": "c", "color": f"c{i}"}).encode() for i in range(200, 220)]
        kafka.produce(topic, new, partitions=2)
        poll(lambda: table_rows(table) == 220, 120, "220 rows", workers[1])
        workers[1].send_signal(signal.SIGTERM)
        workers[1].communicate(timeout=120)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    first, second = (log.read_text() for log in logs)
    assert workers[0].returncode == 2, first[-3000:]
    assert "pipeline 'workers' was taken over" in first
    assert workers[1].returncode == 0, second[-3000:]
    assert "that the query does not decode (added since it started)" in second
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(220))  # every message once
    assert {r["id"]: r["color"] for r in rows if r["id"] >= 200} == {i: f"c{i}" for i in range(200, 220)}

"""``deltaflow ingest``: Kafka -> Delta with decoding, transforms and progress in the log."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from deltalake import DeltaTable

from deltaflow.cli import cli
from deltaflow.config.ingest import IngestConfig
from deltaflow.pipeline.ingest import ingest
from tests.fixtures.ingest_messages import EVENTS_SCHEMA as SCHEMA
from tests.fixtures.ingest_messages import events, poll, table_rows

ROOT = Path(__file__).resolve().parents[2]


def test_ingest_decodes_transforms_and_resumes(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, events(0, 400), partitions=2)
    config = IngestConfig(
        topic=topic,
        table_uri=str(tmp_path / "t"),
        brokers=kafka.bootstrap,
        pipeline_id="ingest-test",
        ends_at_latest_offsets=True,
        max_messages_per_batch=150,
        transforms=[
            "date: substr(meta.producer.timestamp, `0`, `10`)",
            "meta.kafka.offset: kafka.offset",
            "meta.kafka.partition: kafka.partition",
            "meta.kafka.topic: kafka.topic",
            "key_head: substr(kafka.key, 0, 2)",  # metadata inside a function: built too
            "header: sql: cast(kafka.headers[0].value as string)",
        ],
        partition_by=["date"],
    )
    assert ingest(spark, config).awaitTermination(300)
    kafka.produce(topic, events(400, 100), partitions=2)
    assert ingest(spark, config).awaitTermination(300)  # the table's schema decodes the rest

    table = DeltaTable(str(tmp_path / "t"))
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(500))
    assert table.metadata().partition_columns == ["date"]
    for r in rows:  # the second run too: meta.kafka, a table column, filled by the transforms
        assert r["date"] == f"2026-11-{20 + r['id'] % 3}"
        assert r["user"] == f"u{r['id'] % 7}"
        assert r["meta"]["kafka"] == {"offset": r["id"] // 2, "partition": r["id"] % 2, "topic": topic}
        key = r["id"] if r["id"] < 400 else r["id"] - 400  # keys count from 0 in each produce
        assert (r["key_head"], r["header"]) == (str(key)[:2], str(key))
    assert table.transaction_version(f"ingest-test-{topic}-0") == 249
    assert table.transaction_version(f"ingest-test-{topic}-1") == 249


def test_help_shows_kafka_delta_ingest_flags_and_env_vars():
    result = CliRunner().invoke(cli, ["ingest", "--help"])
    assert result.exit_code == 0
    for flag, env in [
        ("--kafka", "KAFKA_BROKERS"),
        ("--app_id", "APP_ID"),
        ("--allowed_latency", "ALLOWED_LATENCY"),
        ("--max_messages_per_batch", "MAX_MESSAGES_PER_BATCH"),
        ("--auto_offset_reset", "AUTO_OFFSET_RESET"),
        ("--seek_offsets", "SEEK_OFFSETS"),
        ("--transform", "TRANSFORMS"),
        ("--ends_at_latest_offsets", "ENDS_AT_LATEST_OFFSETS"),
        ("--kafka_setting", "KAFKA_SETTINGS"),
    ]:
        assert flag in result.output and env in result.output


def test_bad_transform_is_refused_before_spark_starts(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "deltaflow.cli",
            "ingest",
            "topic",
            str(tmp_path / "t"),
            "-t",
            "oops",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "transform 'oops' must look like 'target.path: source'" in out.stderr
    assert not (tmp_path / "t").exists()


def test_cli_ends_at_latest_offsets(kafka, tmp_path):
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, events(0, 300), partitions=3)
    args = [
        sys.executable,
        "-m",
        "deltaflow.cli",
        "ingest",
        topic,
        str(tmp_path / "t"),
        "--kafka",
        kafka.bootstrap,
        "--app_id",
        "cli",
        "--ends_at_latest_offsets",
        "-t",
        "meta.kafka.offset: kafka.offset",
        "--schema",
        "id LONG, user STRING, meta STRUCT<producer: STRUCT<timestamp: STRING>>",
    ]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ingested 300 message(s)" in out.stdout
    assert DeltaTable(str(tmp_path / "t")).to_pyarrow_table().num_rows == 300
    # Logged by the source in the Python worker Spark plans it in: it reaches the CLI's stderr.
    assert "INFO deltaflow.sources.kafka: Kafka source starts at" in out.stderr

    # Run again with nothing new (a scheduled job of an idle topic): no Spark, no claim, no commit.
    version = DeltaTable(str(tmp_path / "t")).version()
    again = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to ingest: 1 table(s) hold every message" in again.stderr
    assert "ingested 0 message(s) in 0 batch(es)" in again.stdout
    assert "session on" not in again.stderr
    assert DeltaTable(str(tmp_path / "t")).version() == version


def test_a_job_whose_broker_never_comes_up_gives_up_with_the_transient_code(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = subprocess.run(
        [
            *(sys.executable, "-m", "deltaflow.cli", "ingest", "orders", str(tmp_path / "t")),
            *("--kafka", f"127.0.0.1:{port}", "--app_id", "cli", "--ends_at_latest_offsets"),
            # A bound below the first restart's wait (1 s): it gives up at the first failure
            # instead of a second wait for the broker's metadata (15 s). The restarts before a
            # give-up are tests/service/test_daemon.py's.
            *("--give_up_after", "500ms", "--schema", "id LONG"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert out.returncode == 1, out.stderr[-3000:]  # transient: a scheduler may run it again
    assert "'cli' gave up after" in out.stderr, out.stderr[-3000:]
    assert "(--give_up_after 0.5 s); the last failure: reading the topics of" in out.stderr
    assert not list((tmp_path / "t").glob("*.parquet"))  # no data (the table from --schema may exist)
    # librdkafka's record of each refused connection (~20 a second, each client) is one record
    # per process: the CLI's check and the query's source runner. Spark's own record of the
    # failure (the Java trace around the Python traceback) is left out: the daemon reports it.
    refused = [line for line in out.stderr.splitlines() if "Connection refused" in line]
    assert 1 <= len(refused) <= 2, out.stderr[-3000:]
    assert all("ERROR deltaflow.sources.kafka.librdkafka: FAIL [rdkafka#" in line for line in refused)
    assert "terminated with error" not in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.splitlines()) < 40, out.stderr[-3000:]


def test_sigterm_stops_cleanly_and_the_next_start_resumes_exactly(kafka, tmp_path):
    import signal
    import time

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, events(0, 200), partitions=2)
    table = str(tmp_path / "t")
    base = [
        sys.executable,
        "-m",
        "deltaflow.cli",
        "ingest",
        topic,
        table,
        "--kafka",
        kafka.bootstrap,
    ]
    base += ["--app_id", "sig", "--schema", SCHEMA]
    daemon = subprocess.Popen(
        [*base, "--allowed_latency", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    while table_rows(tmp_path / "t") < 200 and daemon.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)  # condition poll: the daemon commits in the background
    assert table_rows(tmp_path / "t") == 200
    kafka.produce(topic, events(200, 100), partitions=2)
    daemon.send_signal(signal.SIGTERM)
    _out, err = daemon.communicate(timeout=180)
    assert daemon.returncode == 0, err[-3000:]
    assert "received signal" in err

    rest = subprocess.run(
        [*base, "--ends_at_latest_offsets"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert rest.returncode == 0, rest.stderr[-3000:]
    ids = sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table()["id"].to_pylist())
    assert ids == list(range(300))


def test_daemon_rides_out_a_broker_outage(tmp_path):
    import signal
    from concurrent.futures import ThreadPoolExecutor

    from deltaflow.testing import start_broker_behind_proxy

    # Every client reaches this broker through the proxy: cutting it is a broker outage.
    broker, proxy = start_broker_behind_proxy()
    try:
        topic = broker.create_topic(partitions=2)
        broker.produce(topic, events(0, 100), partitions=2)
        table, log = tmp_path / "t", tmp_path / "stderr.txt"
        command = [
            sys.executable,
            "-m",
            "deltaflow.cli",
            "ingest",
            topic,
            str(table),
            "--kafka",
            proxy.address,
        ]
        command += ["--app_id", "outage", "--schema", SCHEMA, "--allowed_latency", "1"]
        with log.open("w") as stderr:
            daemon = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            poll(lambda: table_rows(table) == 100, 240, "first 100 rows", daemon)
            proxy.cut()
            with ThreadPoolExecutor(1) as pool:
                # Produced during the outage: they wait in the producer's queue until the restore.
                produced = pool.submit(broker.produce, topic, events(100, 100), partitions=2)
                # The source's metadata calls time out (15 s): the query fails, the daemon retries.
                poll(lambda: "restarting in" in log.read_text(), 90, "retry", daemon)
                proxy.restore()
                produced.result(timeout=60)
            poll(lambda: table_rows(table) == 200, 120, "200 rows after the restore", daemon)
            # The summary counts Spark's progress reports, which come after the commit: a stop
            # between the two would leave the last batch out of "ingested 200".
            poll(lambda: "; 200 message(s) in" in log.read_text(), 60, "the last batch's progress", daemon)
            daemon.send_signal(signal.SIGTERM)
            out, _ = daemon.communicate(timeout=120)
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
    finally:
        proxy.close()
        broker.stop()
    err = log.read_text()
    assert daemon.returncode == 0, err[-3000:]
    assert "query 'outage' failed, restarting in 1 s (transient: retrying may help)" in err
    # The Kafka error is named, librdkafka's records come through deltaflow's logger (not its
    # own "%3|..." lines, one per reconnect attempt), and Spark's Java trace is left out.
    assert "reading the topics of" in err and "_TRANSPORT" in err
    assert "deltaflow.sources.kafka.librdkafka: FAIL [rdkafka#" in err
    assert not re.search(r"^%\d\|", err, re.M) and "terminated with error" not in err
    assert "query 'outage' restarted (restart 1)" in err
    assert "ingested 200 message(s)" in out
    ids = sorted(DeltaTable(str(table)).to_pyarrow_table()["id"].to_pylist())
    assert ids == list(range(200))


def test_commit_to_group_mirrors_the_committed_offsets(spark, kafka, tmp_path):
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, events(0, 40), partitions=2)
    config = IngestConfig(
        topic=topic,
        table_uri=str(tmp_path / "t"),
        brokers=kafka.bootstrap,
        pipeline_id="group-mirror",
        value_schema=SCHEMA,
        consumer_group="deltaflow-lag-watch",
        commit_to_group=True,
        ends_at_latest_offsets=True,
    )
    assert ingest(spark, config).awaitTermination(300)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "deltaflow-lag-watch"})
    try:
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=15)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == [20, 20]  # the next offset to read, as Kafka counts


def test_a_job_is_caught_up_only_when_every_partition_is_committed_up_to_its_latest_offset(kafka, tmp_path):
    import uuid

    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltaflow.delta.progress import kafka_txn_id
    from deltaflow.pipeline.ingest import caught_up
    from deltaflow.sources.kafka import KafkaSourceOptions, watermarks

    prefix = f"cu{uuid.uuid4().hex[:6]}"
    a, b = kafka.create_topic(2, f"{prefix}.a"), kafka.create_topic(1, f"{prefix}.b")
    kafka.produce(a, events(0, 10), partitions=2)
    kafka.produce(b, events(0, 5), partitions=1)
    config = IngestConfig.build(
        topic_pattern=rf"{prefix}\..*",
        table_uri=str(tmp_path / "{topic}"),
        brokers=kafka.bootstrap,
        pipeline_id="cu",
        ends_at_latest_offsets=True,
    )
    assert caught_up(config) is None  # no tables yet
    uris = {t: config.table_template().render(t) for t in (a, b)}

    def commit_progress(topic, skip=()):
        options = KafkaSourceOptions(bootstrap_servers=kafka.bootstrap, topic=(topic,))
        latest = watermarks(options, {topic: [0, 1] if topic == a else [0]}, "latest")[topic]
        txns = [Transaction(kafka_txn_id("cu", topic, p), n - 1) for p, n in latest.items() if p not in skip]
        props = CommitProperties(app_transactions=txns)
        write_deltalake(uris[topic], pa.table({"id": [1]}), mode="append", commit_properties=props)

    commit_progress(a, skip=("1",))
    commit_progress(b)
    assert caught_up(config) is None  # partition 1 of a: no progress, and messages
    commit_progress(a)
    assert caught_up(config) == sorted(uris.values())
    assert caught_up(config.model_copy(update={"ends_at_latest_offsets": False})) is None  # jobs only
    kafka.produce(b, events(5, 6), partitions=1)
    assert caught_up(config) is None  # b moved on

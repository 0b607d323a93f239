"""The Kafka source against a real Kafka-protocol broker (tansu), through Spark into Delta."""

from __future__ import annotations

import json
import time

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

import deltaflow
from deltaflow.errors import ConfigError, UnknownOptionError
from deltaflow.io import logs
from deltaflow.sources.kafka import IDLE_POLL_S, KafkaSourceOptions, KafkaStreamReader, _admit


def test_options_mask_secrets_and_pass_kafka_settings_through():
    opts = KafkaSourceOptions.from_spark_options(
        {
            "bootstrap_servers": "b:9092",
            "topic": "a, b",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.username": "svc",
            "kafka.ssl.key.password": "hunter2",
            "sasl_password": "s3cret",
            "starting_offsets": '{"a": {"0": 5}}',
        }
    )
    assert opts.topic == ("a", "b")
    assert opts.starting_offsets == {"a": {"0": 5}}
    conf = opts.client_config()
    assert conf["sasl.password"] == "s3cret" and conf["ssl.key.password"] == "hunter2"
    shown = json.dumps(opts.describe())
    assert "s3cret" not in shown and "hunter2" not in shown
    assert "SASL_SSL" in shown and "svc" in shown
    assert "s3cret" not in repr(opts)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"bootstrap_servers": "b:1"}, ConfigError, "exactly one of 'topic' and 'topic_pattern'"),
        ({"bootstrap_servers": "b:1", "topic": "a", "topic_pattern": "a.*"}, ConfigError, "exactly one"),
        ({"bootstrap_servers": "b:1", "topic": "a", "max_messages": "5"}, UnknownOptionError, "max_messages"),
        (
            {"bootstrap_servers": "b:1", "topic": "a", "starting_offsets": "middle"},
            ConfigError,
            "starting_offsets",
        ),
    ],
    ids=["no-topic", "both", "unknown", "bad-start"],
)
def test_bad_options(options, error, match):
    with pytest.raises(error, match=match):
        KafkaSourceOptions.from_spark_options(options)


def test_admission_control_shares_the_budget_by_backlog():
    start = {"t": {"0": 0, "1": 100, "2": 50}}
    end = {"t": {"0": 900, "1": 200, "2": 50}}
    capped = _admit(start, end, 500)
    taken = {k: capped["t"][k] - start["t"][k] for k in start["t"]}
    assert sum(taken.values()) == 500
    assert taken == {"0": 450, "1": 50, "2": 0}
    assert _admit(start, end, 10_000) == end


def test_pacing_drains_a_backlog_at_once_and_holds_a_partial_batch_until_due(spark, kafka):
    # batch_interval (ingest's --allowed_latency): a batch is due once the interval has passed
    # since the previous one started, except that full batches and the rest of a backlog run
    # at once. Asked the way Spark's default trigger asks: latestOffset(start) again and again.
    from pyspark.sql.streaming.datasource import ReadMaxRows
    from pyspark.sql.types import _parse_datatype_string

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [b"m"] * 25, partitions=2)
    options = KafkaSourceOptions(bootstrap_servers=kafka.bootstrap, topic=(topic,), batch_interval=600)
    reader = KafkaStreamReader(options, _parse_datatype_string(options.source_schema()))
    limit = ReadMaxRows(10)

    def count(start, end):
        return sum(end[topic][p] - start[topic][p] for p in end[topic])

    start = reader.initialOffset()
    sizes = []
    while sum(sizes) < 25:  # 10 + 10 (full), then the 5 left behind: none waits 600 s
        end = reader.latestOffset(start, limit)
        assert end != start, f"held back after {sizes}"
        sizes.append(count(start, end))
        start = end
    assert sizes == [10, 10, 5]

    kafka.produce(topic, [b"n"] * 3, partitions=2)  # a partial batch, not due for 600 s
    began = time.monotonic()
    assert reader.latestOffset(start, limit) == start  # "no new data" ...
    assert time.monotonic() - began < IDLE_POLL_S + 5  # ... after a short wait, not the interval
    kafka.produce(topic, [b"f"] * 8, partitions=2)  # now a full batch waits: it runs at once
    end = reader.latestOffset(start, limit)
    assert count(start, end) == 10
    reader.stop()


def _stream(spark, kafka, topic, tmp_path, *, pipeline="k", **source_options):
    reader = spark.readStream.format("deltaflow-kafka").option("bootstrap_servers", kafka.bootstrap)
    reader = reader.option("topic", topic)
    for key, value in source_options.items():
        reader = reader.option(key, value)
    query = deltaflow.write_stream(
        reader.load(),
        str(tmp_path / "t"),
        pipeline_id=pipeline,
        checkpoint_location=str(tmp_path / "cp"),
        trigger={"availableNow": True},
    )
    assert query.awaitTermination(300)
    return query


def test_multi_partition_topic_lands_exactly_once_with_metadata(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, [json.dumps({"n": i}).encode() for i in range(3000)], partitions=3)
    query = _stream(spark, kafka, topic, tmp_path, max_messages_per_batch="1000")
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3  # admission control

    data = DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    assert data.num_rows == 3000
    assert [f.name for f in data.schema] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestamp_type",
        "headers",
    ]
    rows = sorted(data.to_pylist(), key=lambda r: int(r["key"]))
    for i, row in enumerate(rows):
        assert json.loads(row["value"]) == {"n": i}
        assert (row["topic"], row["partition"], row["offset"]) == (topic, i % 3, i // 3)
        assert row["headers"] == [{"key": "seq", "value": str(i).encode()}]
        assert row["timestamp"] is not None and row["timestamp_type"] == 1
    pairs = pc.unique(
        pc.binary_join_element_wise(
            pc.cast(data["partition"], "string"), pc.cast(data["offset"], "string"), ":"
        )
    )
    assert len(pairs) == 3000


def test_unused_metadata_is_filled_for_failed_messages_only(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [b'{"n": %d}' % i if i % 5 else b"not json" for i in range(40)], partitions=2)
    _stream(spark, kafka, topic, tmp_path, value_format="json", value_schema="n INT", metadata="headers")
    rows = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()
    assert len(rows) == 40
    for row in rows:
        (header,) = row["headers"]  # asked for: filled for every message
        i = int(header["value"])
        if i % 5:
            assert (row["data"], row["error"]) == ({"n": i}, None)
            assert (row["key"], row["timestamp"], row["timestamp_type"], row["value"]) == (None,) * 4
        else:  # a failed message keeps everything a dead letter needs
            assert row["error"] is not None and row["value"] == b"not json"
            assert row["key"] == str(i).encode() and row["timestamp"] is not None
            assert row["timestamp_type"] == 1


def test_restart_reads_only_new_messages(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [b"a"] * 100, partitions=2)
    _stream(spark, kafka, topic, tmp_path)
    kafka.produce(topic, [b"b"] * 50, partitions=2)
    _stream(spark, kafka, topic, tmp_path)
    values = DeltaTable(str(tmp_path / "t")).to_pyarrow_table()["value"].to_pylist()
    assert sorted(values) == [b"a"] * 100 + [b"b"] * 50


def test_starting_offsets_json_and_latest(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [str(i).encode() for i in range(20)], partitions=2)
    _stream(spark, kafka, topic, tmp_path / "json", starting_offsets=json.dumps({topic: {"0": 7}}))
    data = DeltaTable(str(tmp_path / "json" / "t")).to_pyarrow_table()
    offsets = sorted(zip(data["partition"].to_pylist(), data["offset"].to_pylist(), strict=True))
    assert offsets == [(0, o) for o in range(7, 10)] + [(1, o) for o in range(10)]

    _stream(spark, kafka, topic, tmp_path / "latest", starting_offsets="latest")
    assert DeltaTable(str(tmp_path / "latest" / "t")).to_pyarrow_table().num_rows == 0


def test_topic_pattern_reads_every_matching_topic(spark, kafka, tmp_path):
    prefix = kafka.create_topic(partitions=1)
    first, second = kafka.create_topic(1, f"{prefix}-x"), kafka.create_topic(2, f"{prefix}-y")
    kafka.produce(first, [b"1"] * 5, partitions=1)
    kafka.produce(second, [b"2"] * 6, partitions=2)
    reader = (
        spark.readStream.format("deltaflow-kafka")
        .option("bootstrap_servers", kafka.bootstrap)
        .option("topic_pattern", f"{prefix}-.*")
    )
    query = deltaflow.write_stream(
        reader.load(),
        str(tmp_path / "t"),
        pipeline_id="pat",
        checkpoint_location=str(tmp_path / "cp"),
        trigger={"availableNow": True},
    )
    assert query.awaitTermination(300)
    data = DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    assert sorted(data["topic"].to_pylist()) == [first] * 5 + [second] * 6

    # Partitions that appear later (here: a new matching topic) are read from their start.
    third = kafka.create_topic(2, f"{prefix}-z")
    kafka.produce(third, [b"3"] * 4, partitions=2)
    kafka.produce(first, [b"1"] * 2, partitions=1)
    query = deltaflow.write_stream(
        reader.load(),
        str(tmp_path / "t"),
        pipeline_id="pat",
        checkpoint_location=str(tmp_path / "cp"),
        trigger={"availableNow": True},
    )
    assert query.awaitTermination(300)
    data = DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    assert sorted(data["topic"].to_pylist()) == [first] * 7 + [second] * 6 + [third] * 4


def test_missing_topic_is_a_clear_error(spark, kafka, tmp_path):
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException, match="does not exist"):
        _stream(spark, kafka, "no-such-topic", tmp_path)


def test_pacing_by_size_starts_a_batch_once_its_parquet_would_reach_min_batch_bytes(spark, kafka, tmp_path):
    # min_batch_bytes (ingest's --min_bytes_per_file): a batch held back by the interval starts
    # at once when the messages waiting would make files of that much Parquet (each Kafka
    # partition with messages writes one), by the bytes per row of the table's newest files.
    from deltalake import write_deltalake

    from deltaflow.delta import log as delta_log

    table = str(tmp_path / "t")
    write_deltalake(table, _payload_rows(100))
    per_row = delta_log.bytes_per_row(DeltaTable(table))
    assert per_row is not None and per_row > 2  # int() below rounds off less than a row
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [b"m"] * 4, partitions=2)
    reader = _sized_reader(kafka, topic, table, int(per_row * 4))  # per file: 8 in two partitions
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())  # the first batch: at once
    assert sum(end[topic].values()) - sum(start[topic].values()) == 4
    start = end

    kafka.produce(topic, [b"n"] * 7, partitions=2)  # 7 messages in both partitions: held back
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == start
    kafka.produce(topic, [b"o"] * 1, partitions=2)  # 8: big enough, long before 600 s
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert sum(end[topic].values()) - sum(start[topic].values()) == 8
    reader.stop()

    with pytest.raises(ConfigError, match="min_batch_bytes needs delta_table_uri"):
        KafkaSourceOptions.from_spark_options(
            {"bootstrap_servers": "b:1", "topic": "a", "min_batch_bytes": "9"}
        )


def test_pacing_by_size_rides_out_a_store_that_refuses_and_comes_back(spark, kafka, s3, monkeypatch, caplog):
    # The estimate only decides when a batch starts: a store that refuses while the table is
    # read (a 403 during a credential rotation) is logged, never fails the query, and the table
    # is read again ESTIMATE_RETRY_S later: flush by size is back with the store, long before
    # the interval.
    from deltalake import write_deltalake

    from deltaflow.sources import kafka as kafka_source
    from deltaflow.testing import FaultyHttpProxy

    monkeypatch.setattr(kafka_source, "ESTIMATE_RETRY_S", 1.0)
    with FaultyHttpProxy(s3.endpoint) as proxy:
        storage = {**s3.storage_options, "AWS_ENDPOINT_URL": proxy.endpoint, "AWS_ALLOW_HTTP": "true"}
        uri = s3.uri()
        write_deltalake(uri, _payload_rows(100), storage_options=storage)
        topic = kafka.create_topic(partitions=1)
        kafka.produce(topic, [b"m"] * 4, partitions=1)
        reader = _sized_reader(kafka, topic, uri, 1000, storage)
        limit = reader.getDefaultReadLimit()
        start = reader.latestOffset(reader.initialOffset(), limit)  # the first batch: at once

        proxy.outage(status=403)
        kafka.produce(topic, [b"n"] * 2000, partitions=1)  # far more than 1000 bytes of Parquet
        with caplog.at_level("WARNING", logger="deltaflow.sources.kafka"):
            assert reader.latestOffset(start, limit) == start  # no estimate: held, no failure
        assert "no size estimate from" in caplog.text and "trying again in 1 s" in caplog.text
        assert proxy.counts["fail"] >= 1

        proxy.heal()
        deadline = time.monotonic() + 30
        while (end := reader.latestOffset(start, limit)) == start:
            assert time.monotonic() < deadline, "flush by size did not come back with the store"
        assert sum(end[topic].values()) - sum(start[topic].values()) == 2000
        reader.stop()


def test_planned_ranges_follow_commits_to_the_table_made_while_the_reader_runs(spark, kafka, tmp_path):
    # partitions() never plans what the table already holds. The reader keeps the table and
    # brings it up to date in each batch: it must see a table created after it started, every
    # later commit (here by another writer, as a replayed batch's earlier attempt would be), and
    # a table whose old log entries were cleaned up after a checkpoint.
    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltaflow.delta.progress import kafka_txn_id

    table = str(tmp_path / "t")
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [b"m"] * 40, partitions=2)
    reader = _sized_reader(kafka, topic, table, 10**9)
    start = reader.initialOffset()  # no table yet: from the earliest offsets
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end[topic] == {"0": 20, "1": 20}

    def commit_progress(**offsets):
        txns = [Transaction(kafka_txn_id("sized", topic, p), v) for p, v in offsets.items()]
        write_deltalake(
            table,
            _payload_rows(1),
            mode="append",
            commit_properties=CommitProperties(app_transactions=txns),
            configuration={"delta.logRetentionDuration": "interval 0 seconds"},  # cleaned at once
        )

    def planned():
        return {p.partition: (p.start, p.end) for p in reader.partitions(start, end)}

    assert planned() == {0: (0, 20), 1: (0, 20)}
    commit_progress(**{"0": 4})  # the table appears: offsets up to 4 of partition 0 are in it
    assert planned() == {0: (5, 20), 1: (0, 20)}
    commit_progress(**{"0": 9, "1": 2})
    assert planned() == {0: (10, 20), 1: (3, 20)}
    for _ in range(3):
        commit_progress(**{"1": 19})
    dt = DeltaTable(table)
    dt.create_checkpoint()
    dt.cleanup_metadata()
    assert not (tmp_path / "t" / "_delta_log" / f"{1:020}.json").exists()  # cleaned up
    commit_progress(**{"0": 19})
    assert planned() == {}  # everything is in the table
    reader.stop()


def test_a_batch_starting_where_the_readers_last_plan_ended_reads_no_table(spark, kafka, tmp_path):
    # Steady batches: the table cannot hold more than the last batch this reader planned, so
    # only the first plan (after a start, a restart, a lost checkpoint) and restarted or new
    # partitions read the table's progress. 200 tables a batch made this most of the planning.
    table = str(tmp_path / "t")
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [b"m"] * 40, partitions=2)
    reader = _sized_reader(kafka, topic, table, 10**9)
    reads = []
    load = reader._sink_table

    def counted():
        reads.append(1)
        return load()

    reader._sink_table = counted
    first = {topic: {"0": 0, "1": 0}}
    second = {topic: {"0": 10, "1": 10}}
    third = {topic: {"0": 20, "1": 20}}
    assert len(reader.partitions(first, second)) == 2 and len(reads) == 1
    assert len(reader.partitions(second, third)) == 2 and len(reads) == 1  # from its own last end
    # Planned again from a start this reader did not end at (Spark re-plans after a restart):
    # the table is read again, and a partition it holds is not read twice.
    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltaflow.delta.progress import kafka_txn_id

    write_deltalake(
        table,
        _payload_rows(1),
        commit_properties=CommitProperties(
            app_transactions=[Transaction(kafka_txn_id("sized", topic, "0"), 14)]
        ),
    )
    ranges = {p.partition: (p.start, p.end) for p in reader.partitions(second, third)}
    assert ranges == {0: (15, 20), 1: (10, 20)} and len(reads) == 2
    reader.stop()


def test_a_partition_absent_from_a_batchs_start_is_read_from_where_its_table_is(spark, kafka, tmp_path):
    # A topic missing from one batch's end (a metadata answer without it) comes back in the
    # next: the reader has no start for it, so the table says where it is, not the earliest offset.
    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltaflow.delta.progress import kafka_txn_id

    x, z = kafka.create_topic(partitions=1), kafka.create_topic(partitions=1)
    kafka.produce(x, [b"1"] * 10, partitions=1)
    kafka.produce(z, [b"2"] * 10, partitions=1)
    table = str(tmp_path / "t")
    txns = [Transaction(kafka_txn_id("sized", t, "0"), 4) for t in (x, z)]
    write_deltalake(table, _payload_rows(1), commit_properties=CommitProperties(app_transactions=txns))
    reader = _sized_reader(kafka, x, table, 10**9)
    reader.partitions({x: {"0": 5}, z: {"0": 5}}, {x: {"0": 7}, z: {"0": 5}})
    reader.partitions({x: {"0": 7}, z: {"0": 5}}, {x: {"0": 8}})
    planned = {
        p.topic: (p.start, p.end) for p in reader.partitions({x: {"0": 8}}, {x: {"0": 10}, z: {"0": 10}})
    }
    reader.stop()
    assert planned == {x: (8, 10), z: (5, 10)}


def _sized_reader(kafka, topic, table_uri, min_batch_bytes, storage=None):
    """A reader of ``topic`` paced by a 600 s interval and by size, estimated from the table."""
    from pyspark.sql.types import _parse_datatype_string

    options = KafkaSourceOptions(
        bootstrap_servers=kafka.bootstrap,
        topic=(topic,),
        batch_interval=600,
        min_batch_bytes=min_batch_bytes,
        delta_table_uri=table_uri,
        pipeline_id="sized",
        delta_storage_options=storage or {},
    )
    return KafkaStreamReader(options, _parse_datatype_string(options.source_schema()))


def _payload_rows(count):
    import pyarrow as pa

    return pa.table({"id": list(range(count)), "payload": [f"row {i}" for i in range(count)]})


def test_a_topic_the_query_read_that_is_gone_is_transient_and_a_wrong_name_is_not(spark, kafka):
    """A topic deleted and made again while the query runs (seen in the soak: a re-created
    topic) is not there for a moment: the query restarts and finds it. A topic the query never
    read that does not exist is a wrong name: refused."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.types import _parse_datatype_string

    from deltaflow.errors import ConfigError, KafkaUnavailableError

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [b"m"] * 4, partitions=2)
    options = KafkaSourceOptions(bootstrap_servers=kafka.bootstrap, topic=(topic,))
    reader = KafkaStreamReader(options, _parse_datatype_string(options.source_schema()))
    start = reader.initialOffset()
    admin = kafka.admin()
    admin.delete_topics([topic])[topic].result(timeout=10)
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline
        time.sleep(0.1)  # condition poll on the broker's metadata
    with pytest.raises(KafkaUnavailableError, match="which this query has read, is not on"):
        reader.latestOffset(start, ReadAllAvailable())
    fresh = KafkaStreamReader(options, _parse_datatype_string(options.source_schema()))
    with pytest.raises(ConfigError, match="does not exist on"):
        fresh.initialOffset()
    kafka.create_topic(2, topic)
    assert reader.latestOffset(start, ReadAllAvailable())  # back: planned again


def test_librdkafka_records_of_one_failure_are_alike_whatever_the_client_and_the_attempt():
    from deltaflow.sources.kafka import CLIENT_LOGGER, _client_log_key

    def failure(client: str, ms: int, broker: str = "b:9092") -> str:
        return (
            f"FAIL [{client}] [thrd:{broker}/bootstrap]: {broker}/bootstrap: Connect to "
            f"ipv4#10.0.0.1:9092 failed: Connection refused (after {ms}ms in state CONNECT)"
        )

    first = _client_log_key(failure("rdkafka#consumer-1", 0))
    assert first == _client_log_key(failure("rdkafka#producer-12", 3))
    assert first == _client_log_key(failure("orders-ingest#consumer-7", 0))  # client.id set
    assert first != _client_log_key(failure("rdkafka#consumer-1", 0, "c:9092"))  # another broker
    assert any(isinstance(f, logs.RepeatFilter) for f in CLIENT_LOGGER.filters)
    # Every client this module makes passes its records there (confluent-kafka's "logger").
    conf = KafkaSourceOptions.from_spark_options({"bootstrap_servers": "b:1", "topic": "t"}).client_config()
    assert conf["logger"] is CLIENT_LOGGER
    # Asked-for debug contexts are librdkafka's own lines, whole and timed (no logger).
    options = {"bootstrap_servers": "b:1", "topic": "t", "kafka.debug": "broker"}
    assert "logger" not in KafkaSourceOptions.from_spark_options(options).client_config()

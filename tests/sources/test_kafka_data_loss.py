"""Kafka offsets the broker no longer holds (a re-created topic, retention): Spark's
``failOnDataLoss`` for the Kafka source, against the broker where it can drive the case."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable

import deltaflow
from deltaflow.delta.progress import AGED_OUT, DATA_LOSS_KEY, WENT_BACK, advancing_txns
from deltaflow.errors import KafkaDataLossError, TerminalError
from deltaflow.metrics import Metrics
from deltaflow.sources.kafka import KafkaSourceOptions, KafkaStreamReader
from deltaflow.sources.kafka_data_loss import check_partition


@pytest.mark.parametrize(
    ("stored", "earliest", "latest", "reason"),
    [
        (0, 0, 0, None),
        (50, 0, 80, None),
        (80, 0, 80, None),  # caught up
        (300, 300, 900, None),
        (500, 0, 20, WENT_BACK),  # the topic was re-created: offsets started again at 0
        (500, 0, 0, WENT_BACK),  # ... and holds nothing yet
        (100, 300, 900, AGED_OUT),  # retention removed 100..299 (the test broker cannot)
        (100, 300, 300, AGED_OUT),  # ... and everything since
    ],
)
def test_the_decision_on_the_watermarks(stored, earliest, latest, reason):
    if reason is None:
        assert check_partition("t", 0, stored, earliest, latest, fail=True) is None
        assert check_partition("t", 0, stored, earliest, latest, fail=False) is None
        return
    with pytest.raises(KafkaDataLossError) as raised:
        check_partition("orders", 3, stored, earliest, latest, fail=True)
    err = raised.value
    assert isinstance(err, TerminalError)  # the daemon stops, it does not retry
    assert (err.topic, err.partition, err.stored_offset) == ("orders", 3, stored)
    assert (err.earliest_offset, err.latest_offset, err.reason) == (earliest, latest, reason)
    text = str(err)
    assert f"Kafka topic 'orders' partition 3: the pipeline's next offset is {stored}" in text
    assert f"run from {earliest} (earliest) to {latest} (latest)" in text
    assert "Nothing was written" in text and "fail_on_data_loss false" in text
    assert "failOnDataLoss" in text and "FAIL_ON_DATA_LOSS" in text
    cause = "deleted and re-created" if reason == WENT_BACK else "retention"
    assert cause in text
    record = check_partition("orders", 3, stored, earliest, latest, fail=False)
    assert record == {
        "reason": reason,
        "stored": stored,
        "restart": earliest,
        "earliest": earliest,
        "latest": latest,
    }


def test_a_partition_that_aged_out_is_planned_from_the_earliest_offset(spark, kafka):
    # The test broker cannot remove records below its log start; a stored offset below the
    # earliest is what Spark hands the reader after retention did (here: a negative one).
    from pyspark.sql.types import _parse_datatype_string

    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, [b"m"] * 5, partitions=1)

    def reader(fail):
        options = KafkaSourceOptions(
            bootstrap_servers=kafka.bootstrap, topic=(topic,), fail_on_data_loss=fail
        )
        return KafkaStreamReader(options, _parse_datatype_string(options.source_schema()))

    limit = reader(True).getDefaultReadLimit()
    with pytest.raises(KafkaDataLossError, match="retention"):
        reader(True).latestOffset({topic: {"0": -3}}, limit)
    lenient = reader(False)
    end = lenient.latestOffset({topic: {"0": -3}}, limit)
    assert end == {
        topic: {"0": 5},
        DATA_LOSS_KEY: {
            topic: {"0": {"reason": AGED_OUT, "stored": -3, "restart": 0, "earliest": 0, "latest": 5}}
        },
    }
    [planned] = lenient.partitions({topic: {"0": -3}}, end)
    assert (planned.start, planned.end) == (0, 5)
    assert lenient.latestOffset(end, limit) == {topic: {"0": 5}}  # caught up: no record carried on


def test_progress_moves_back_only_from_what_the_batch_restarted(tmp_path):
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    write_deltalake(
        str(tmp_path / "t"),
        pa.table({"a": [1]}),
        commit_properties=CommitProperties(
            app_transactions=[Transaction("p-t-0", 499), Transaction("p-t-1", 499)]
        ),
    )
    table = DeltaTable(str(tmp_path / "t"))
    went_back = {"reason": WENT_BACK, "stored": 500, "restart": 0, "earliest": 0, "latest": 20}
    # Partition 0 restarted at 0 in this batch; partition 1 only re-read (never back).
    end = {"t": {"0": 20, "1": 20}}
    assert advancing_txns(table, "p", end, {"t": {"0": went_back}}) == {"p-t-0": 19}
    assert advancing_txns(table, "p", {"t": {"0": 0}}, {"t": {"0": went_back}}) == {"p-t-0": -1}
    assert advancing_txns(table, "p", end) == {}
    write_deltalake(
        str(tmp_path / "t"),
        pa.table({"a": [2]}),
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction("p-t-0", 19)]),
    )
    # The batch's commit landed: a replay of it advances nothing (it is in the log).
    assert advancing_txns(DeltaTable(str(tmp_path / "t")), "p", end, {"t": {"0": went_back}}) == {}


def _stream(spark, kafka, topics, tmp_path, **options):
    reader = spark.readStream.format("deltaflow-kafka").option("bootstrap_servers", kafka.bootstrap)
    reader = reader.option("topic", ",".join(topics))
    for key, value in options.items():
        reader = reader.option(key, value)
    return deltaflow.write_stream(
        reader.load(),
        str(tmp_path / "t"),
        pipeline_id="loss",
        checkpoint_location=str(tmp_path / "cp"),
        trigger={"availableNow": True},
    )


def _values(tmp_path):
    rows = DeltaTable(str(tmp_path / "t")).to_pyarrow_table(columns=["topic", "value"]).to_pylist()
    return sorted((r["topic"], r["value"].decode()) for r in rows)


def test_a_recreated_topic_stops_a_multi_topic_stream_from_its_checkpoint(spark, kafka, tmp_path):
    # Progress in Spark's checkpoint (the Spark engine of YAML pipelines): one of two topics is
    # deleted and re-created. The stream stops naming it, and writes nothing; with
    # failOnDataLoss false it reads the new topic from its earliest offset.
    keep, again = kafka.create_topic(partitions=2), kafka.create_topic(partitions=2)
    kafka.produce(keep, [f"k{i}".encode() for i in range(40)], partitions=2)
    kafka.produce(again, [f"old{i}".encode() for i in range(40)], partitions=2)
    assert _stream(spark, kafka, [keep, again], tmp_path).awaitTermination(300)
    assert len(_values(tmp_path)) == 80

    kafka.recreate_topic(again, partitions=2)
    kafka.produce(again, [f"new{i}".encode() for i in range(10)], partitions=2)
    kafka.produce(keep, [f"k{i}".encode() for i in range(40, 46)], partitions=2)
    files = DeltaTable(str(tmp_path / "t")).file_uris()
    query = _stream(spark, kafka, [keep, again], tmp_path)
    with pytest.raises(Exception, match="KafkaDataLossError") as raised:
        query.awaitTermination(300)
    text = str(raised.value)
    assert f"Kafka topic '{again}' partition" in text and "the pipeline's next offset is 20" in text
    assert "run from 0 (earliest) to 5 (latest)" in text and "re-created" in text
    assert DeltaTable(str(tmp_path / "t")).file_uris() == files  # nothing written (a claim only)

    query = _stream(spark, kafka, [keep, again], tmp_path, failOnDataLoss="false")
    assert query.awaitTermination(300)
    values = _values(tmp_path)
    assert [v for t, v in values if t == again] == sorted(
        [f"old{i}" for i in range(40)] + [f"new{i}" for i in range(10)]
    )
    assert [v for t, v in values if t == keep] == sorted(f"k{i}" for i in range(46))
    metrics = Metrics()
    for progress in query.recentProgress:
        metrics.restarts_reported("loss", json.loads(progress.json))
    counted = {
        sample.labels["source"]: sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "deltaflow_source_data_loss_total"
    }
    assert counted == {f"{again}:0": 1.0, f"{again}:1": 1.0}


def test_the_option_in_its_forms():
    from deltaflow.config.pipeline import KafkaSourceSpec
    from deltaflow.pipeline.runner import _kafka_options

    def parsed(**options):
        return KafkaSourceOptions.from_spark_options({"bootstrap_servers": "b:1", "topic": "t", **options})

    assert parsed().fail_on_data_loss is True
    assert parsed(failOnDataLoss="false").fail_on_data_loss is False  # Spark's Kafka option name
    assert parsed(fail_on_data_loss="false").fail_on_data_loss is False
    spec = KafkaSourceSpec(
        type="kafka", bootstrap_servers="b:1", topic="t", schema="id LONG", fail_on_data_loss=False
    )
    assert KafkaSourceOptions.from_spark_options(_kafka_options(spec)).fail_on_data_loss is False

"""``deltaflow ingest`` as a drop-in for kafka-delta-ingest: its seek offsets, its progress,
the table's partitioning, its dead-letter rows (in-process, on the shared Spark session)."""

from __future__ import annotations

import base64
import datetime as dt
import json

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deltaflow.config.ingest import IngestConfig
from deltaflow.errors import ConfigError
from deltaflow.pipeline.ingest import ingest
from tests.fixtures.ingest_messages import SCHEMA as DLQ_SCHEMA
from tests.fixtures.ingest_messages import TRANSFORMS, _good, _message

SCHEMA = "id LONG, user STRING, meta STRUCT<producer: STRUCT<timestamp: STRING>>"


def _events(start, count):
    return [
        json.dumps(
            {
                "id": i,
                "user": f"u{i % 3}",
                "meta": {"producer": {"timestamp": f"2026-11-{20 + i % 2}T10:00:00Z"}},
            }
        ).encode()
        for i in range(start, start + count)
    ]


def _ids(table):
    return sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["id"])["id"].to_pylist())


def test_seek_offsets_are_seeked_past_recorded_and_never_skip_stored_progress(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _events(0, 40), partitions=2)  # event i: partition i % 2, offset i // 2
    table = tmp_path / "t"
    base = {
        "topic": topic,
        "table_uri": str(table),
        "brokers": kafka.bootstrap,
        "pipeline_id": "seek",
        "value_schema": SCHEMA,
        "ends_at_latest_offsets": True,
    }
    assert ingest(spark, IngestConfig(**base, seek_offsets={"0": 4, "1": 9})).awaitTermination(300)
    # kafka-delta-ingest's meaning: the first message ingested is seek + 1.
    assert _ids(table) == sorted([2 * o for o in range(5, 20)] + [2 * o + 1 for o in range(10, 20)])
    history = DeltaTable(str(table)).history()
    seeks = [h for h in history if h.get("deltaflow.operation") == "seek offsets"]
    assert len(seeks) == 1  # recorded once, as txns, before the first batch

    # Progress behind the seek offsets: refused before anything is read (kafka-delta-ingest's
    # InconsistentStoredOffsets), the table untouched.
    version = DeltaTable(str(table)).version()
    with pytest.raises(ConfigError, match=r"behind the seek offsets \(partition 0: stored=19/seek=30\)"):
        ingest(spark, IngestConfig(**base, seek_offsets={"0": 30, "1": 2}))
    assert DeltaTable(str(table)).version() == version

    # Progress at or beyond them: the table's progress wins, nothing is read twice.
    kafka.produce(topic, _events(40, 10), partitions=2)
    assert ingest(spark, IngestConfig(**base, seek_offsets={"0": 3, "1": 2})).awaitTermination(300)
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

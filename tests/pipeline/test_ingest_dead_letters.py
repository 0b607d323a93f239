"""``deltaflow ingest`` with bad messages: the dead-letter table, gzip, Avro with a registry."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltaflow.config.ingest import IngestConfig
from deltaflow.metrics import progress_messages, progress_report
from deltaflow.pipeline.ingest import ingest
from tests.fixtures.ingest_messages import SCHEMA, TRANSFORMS, _assert_split, _bad, _good, _message
from tests.fixtures.registry import AVRO_V1, AVRO_V2
from tests.fixtures.tables import referenced_files, stored_data_files

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("engine", "write_path"),
    [("spark", "spark"), ("spark", "arrow"), ("arrow", "auto")],
    ids=["spark-engine-spark-writes", "spark-engine-arrow-writes", "arrow-engine"],
)
def test_bad_messages_go_to_the_dead_letter_table(spark, kafka, tmp_path, engine, write_path, caplog):
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, [_message(i) for i in range(300)], partitions=3)
    config = IngestConfig(
        topic=topic,
        table_uri=str(tmp_path / "t"),
        brokers=kafka.bootstrap,
        pipeline_id="dlq-test",
        value_schema=SCHEMA,
        transforms=TRANSFORMS,
        dlq_table_location=str(tmp_path / "dlq"),
        ends_at_latest_offsets=True,
        max_messages_per_batch=120,
        write_path=write_path,
        engine=engine,
    )
    with caplog.at_level("WARNING", logger="deltaflow.pipeline.ingest"):
        query = ingest(spark, config)
        assert query.awaitTermination(300)
    assert "carry fields the table lacks, not stored: extra" in caplog.text
    _assert_split(tmp_path / "t", tmp_path / "dlq", 300, 3)
    # Each message counted once, though the Spark engine reads a batch with dead letters twice
    # (Spark's numInputRows counted it twice: "ingested 124 message(s)" for 62).
    assert sum(progress_messages(progress_report(p)) for p in query.recentProgress) == 300

    kafka.produce(topic, [_message(i) for i in range(300, 330)], partitions=3)
    assert ingest(spark, config).awaitTermination(300)
    _assert_split(tmp_path / "t", tmp_path / "dlq", 330, 3, second_produce=300)
    dlq = DeltaTable(str(tmp_path / "dlq"))
    for p in range(3):  # the dead-letter table's own progress, per partition
        assert dlq.transaction_version(f"dlq-test-dlq-{topic}-{p}") == 109


def test_without_a_dead_letter_table_bad_messages_are_counted_and_skipped(spark, kafka, tmp_path, caplog):
    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, [_message(i) for i in range(20)], partitions=1)
    config = IngestConfig(
        topic=topic,
        table_uri=str(tmp_path / "t"),
        brokers=kafka.bootstrap,
        pipeline_id="no-dlq",
        value_schema=SCHEMA,
        transforms=TRANSFORMS,
        ends_at_latest_offsets=True,
    )
    with caplog.at_level("WARNING", logger="deltaflow.pipeline.ingest"):
        assert ingest(spark, config).awaitTermination(300)
    assert "6 message(s) could not be decoded or transformed and are skipped" in caplog.text
    assert sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table()["id"].to_pylist()) == _good(20)


def _cli(kafka, topic, tmp_path, checkpoint, crash_at=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTAFLOW_TEST_")}
    if crash_at:
        env["DELTAFLOW_TEST_CRASH_AT"] = crash_at
    args = [sys.executable, "-m", "deltaflow.cli", "ingest", topic, str(tmp_path / "t")]
    args += ["--kafka", kafka.bootstrap, "--app_id", "dlq-crash", "--schema", SCHEMA]
    args += ["--dlq_table_location", str(tmp_path / "dlq"), "--checkpoint_location", str(checkpoint)]
    args += ["--max_messages_per_batch", "90", "--ends_at_latest_offsets"]
    for t in TRANSFORMS:
        args += ["-t", t]
    return subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, start_new_session=True
    )


@pytest.mark.parametrize("checkpoint", ["kept", "deleted"])
def test_crash_between_dead_letter_and_main_commit_is_exactly_once(kafka, tmp_path, checkpoint):
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, [_message(i) for i in range(270)], partitions=3)
    # Batch 1's first commit is its dead letters': the kill lands between the two commits.
    crashed = _cli(kafka, topic, tmp_path, tmp_path / "cp", crash_at="after_commit:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    main, dead = DeltaTable(str(tmp_path / "t")), DeltaTable(str(tmp_path / "dlq"))
    assert main.to_pyarrow_table().num_rows == len(_good(90))  # batch 0 only
    assert dead.to_pyarrow_table().num_rows == len(_bad(180))  # batches 0 and 1

    if checkpoint == "deleted":
        shutil.rmtree(tmp_path / "cp")  # the source replans from the main table's progress
    restarted = _cli(kafka, topic, tmp_path, tmp_path / "cp")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    _assert_split(tmp_path / "t", tmp_path / "dlq", 270, 3)


def test_gzip_values_and_a_payload_that_is_not_gzip(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=1)
    values = [gzip.compress(json.dumps({"id": i, "user": "u"}).encode()) for i in range(10)]
    values.append(b'{"id": 10, "user": "plain"}')
    kafka.produce(topic, values, partitions=1)
    config = IngestConfig(
        topic=topic,
        table_uri=str(tmp_path / "t"),
        brokers=kafka.bootstrap,
        pipeline_id="gz",
        decompress_gzip=True,  # schema inferred from the decompressed samples
        dlq_table_location=str(tmp_path / "dlq"),
        ends_at_latest_offsets=True,
    )
    assert ingest(spark, config).awaitTermination(300)
    assert sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table()["id"].to_pylist()) == list(range(10))
    (dead,) = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert dead["error"].startswith("gzip:") and dead["offset"] == 10


def test_avro_with_a_schema_registry_end_to_end(kafka, schema_registry, tmp_path):
    topic = kafka.create_topic(partitions=2)
    v1 = schema_registry.register(f"{topic}-value", AVRO_V1)
    v2 = schema_registry.register(f"{topic}-value", AVRO_V2)
    at = dt.datetime(2026, 11, 22, 8, 30, tzinfo=dt.UTC)
    values = [
        schema_registry.encode(v1, {"id": i, "url": f"/p/{i}", "at": at})
        if i < 20
        else schema_registry.encode(v2, {"id": i, "url": f"/p/{i}", "at": at, "ref": f"r{i}"})
        for i in range(40)
    ]
    values.append(b"\x00\x00\x00\x00\x63garbage")  # an unknown schema id: a dead letter
    kafka.produce(topic, values, partitions=2)
    args = [sys.executable, "-m", "deltaflow.cli", "ingest", topic, str(tmp_path / "t")]
    args += ["--kafka", kafka.bootstrap, "--app_id", "avro", "--avro", schema_registry.url]
    args += ["--dlq_table_location", str(tmp_path / "dlq"), "--ends_at_latest_offsets"]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]

    rows = sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(40))
    assert all(r["at"] == at and r["url"] == f"/p/{r['id']}" for r in rows)
    assert [r["ref"] for r in rows] == [None] * 20 + [f"r{i}" for i in range(20, 40)]
    (dead,) = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert "HTTP 404" in dead["error"]


@pytest.mark.parametrize("engine", ["spark", "arrow"])
def test_schema_evolution_adds_new_fields_as_columns_and_restarts(kafka, tmp_path, engine):
    topic = kafka.create_topic(partitions=2)
    values = []
    for i in range(30):
        record: dict[str, object] = {"id": i, "meta": {"a": i}}
        if i >= 10:
            record |= {"score": i / 2, "tag": f"t{i}"}
        if i == 20:
            record["meta"] = {"a": i, "deep": True}  # nested: reported, not added
        values.append(json.dumps(record).encode())
    kafka.produce(topic, values, partitions=2)
    args = [sys.executable, "-m", "deltaflow.cli", "ingest", topic, str(tmp_path / "t")]
    args += ["--kafka", kafka.bootstrap, "--app_id", "evolve", "--schema", "id LONG, meta STRUCT<a: INT>"]
    args += ["--schema_evolution", "--ends_at_latest_offsets", "--max_messages_per_batch", "10"]
    args += ["--engine", engine]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "added column(s) score double, tag string" in out.stderr
    assert "meta.deep" in out.stderr  # reported
    assert f"; {engine} engine)" in out.stderr

    table = DeltaTable(str(tmp_path / "t"))
    assert table.schema().to_arrow().names == ["id", "meta", "score", "tag"]
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(30))
    assert [r["score"] for r in rows] == [None] * 10 + [i / 2 for i in range(10, 30)]
    assert [r["tag"] for r in rows] == [None] * 10 + [f"t{i}" for i in range(10, 30)]
    # The batch that met the new fields had its files written, then deleted uncommitted.
    assert stored_data_files(str(tmp_path / "t"), {}) == referenced_files(table)
    assert "uncommitted file(s) deleted" in out.stderr

"""``deltaflow ingest`` when the topic was deleted and re-created: the table's progress names
offsets the broker no longer holds (``--fail_on_data_loss``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltaflow.cli import cli
from deltaflow.config.ingest import IngestConfig
from deltaflow.delta.progress import DATA_LOSS_METADATA
from deltaflow.pipeline.ingest import ingest
from tests.fixtures.ingest_messages import SCHEMA, TRANSFORMS, _good, _message


def _recorded(table):
    """The restarts the table's commits record: (partition, reason, stored, restart, latest)."""
    commits = [c for c in DeltaTable(str(table)).history() if DATA_LOSS_METADATA in c]
    rows = [r for c in commits for r in json.loads(c[DATA_LOSS_METADATA])]
    return {(r["partition"], r["reason"], r["stored"], r["restart"], r["latest"]) for r in rows}


def _ids(table):
    return sorted(r["id"] for r in DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).to_pylist())


@pytest.mark.parametrize("engine", ["arrow", "spark"])
def test_a_recreated_topic_stops_ingest_and_with_false_restarts_it_at_the_earliest(
    spark, kafka, tmp_path, engine
):
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [_message(i) for i in range(100)], partitions=2)  # offsets 0..49 each
    settings = {
        "topic": topic,
        "table_uri": str(tmp_path / "t"),
        "brokers": kafka.bootstrap,
        "pipeline_id": "gone",
        "value_schema": SCHEMA,
        "transforms": TRANSFORMS,
        "dlq_table_location": str(tmp_path / "dlq"),
        "ends_at_latest_offsets": True,
        "engine": engine,
    }
    assert ingest(spark, IngestConfig(**settings)).awaitTermination(300)
    main, dlq = DeltaTable(str(tmp_path / "t")), DeltaTable(str(tmp_path / "dlq"))
    assert main.transaction_version(f"gone-{topic}-0") == 49
    files = (main.file_uris(), dlq.file_uris())

    # The topic is deleted and re-created: offsets start again at 0, below the table's 49.
    # Its first messages are good ones: the batch that restarts it holds no dead letter.
    kafka.recreate_topic(topic, partitions=2)
    kafka.produce(topic, [_message(i) for i in range(2)], partitions=2)  # offset 0 of each
    query = ingest(spark, IngestConfig(**settings))
    with pytest.raises(Exception, match="KafkaDataLossError") as raised:
        query.awaitTermination(300)
    text = str(raised.value)
    assert f"Kafka topic '{topic}' partition" in text and "the pipeline's next offset is 50" in text
    assert "run from 0 (earliest) to 1 (latest)" in text and "re-created" in text
    after = (DeltaTable(str(tmp_path / "t")).file_uris(), DeltaTable(str(tmp_path / "dlq")).file_uris())
    assert after == files  # nothing written (the claims only)

    assert ingest(spark, IngestConfig(**settings, fail_on_data_loss=False)).awaitTermination(300)
    main, dlq = DeltaTable(str(tmp_path / "t")), DeltaTable(str(tmp_path / "dlq"))
    assert _ids(tmp_path / "t") == sorted(_good(100) + _good(2))  # the new topic's messages
    for p in range(2):  # the progress moved back to the new topic's offsets, in both tables
        assert main.transaction_version(f"gone-{topic}-{p}") == 0
        assert dlq.transaction_version(f"gone-dlq-{topic}-{p}") == 0
    assert _recorded(tmp_path / "t") == {(0, "went_back", 50, 0, 1), (1, "went_back", 50, 0, 1)}
    assert _recorded(tmp_path / "dlq") == _recorded(tmp_path / "t")

    # Read on from there as usual: dead letters below the old topic's offsets land too.
    kafka.produce(topic, [_message(i) for i in range(2, 42)], partitions=2)  # offsets 1..20
    assert ingest(spark, IngestConfig(**settings, fail_on_data_loss=False)).awaitTermination(300)
    assert _ids(tmp_path / "t") == sorted(_good(100) + _good(42))
    dead = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table(columns=["partition", "offset"]).to_pylist()
    assert len(dead) == (100 - len(_good(100))) + (42 - len(_good(42)))


def test_the_flag_and_its_environment_variable():
    result = CliRunner().invoke(cli, ["ingest", "--help"])
    assert "--fail_on_data_loss" in result.output and "FAIL_ON_DATA_LOSS" in result.output

"""Debezium topics into mirror tables, one query for all (``deltaflow ingest --cdc debezium``),
against the broker: every kind of change, rounds compared with what the database holds, read
back by DuckDB."""

from __future__ import annotations

import uuid

import pytest
from deltalake import DeltaTable

from deltaflow.config.ingest import IngestConfig
from deltaflow.pipeline.topic_ingest import start
from tests.fixtures.debezium import FLOAT64, INT32, INT64, STRING, UNAVAILABLE, ChangeTopic, Sequencer
from tests.fixtures.readers import duckdb_delta

COLUMNS = [("id", INT32), ("name", STRING), ("score", FLOAT64)]


def _config(kafka, prefix: str, root, **extra) -> IngestConfig:
    return IngestConfig.build(
        topic_pattern=rf"{prefix}\.inventory\.(.*)",
        table_uri=str(root / "{1}"),
        brokers=kafka.bootstrap,
        pipeline_id="mirrors",
        ends_at_latest_offsets=True,
        cdc="debezium",
        **extra,
    )


def _run(spark, config: IngestConfig) -> None:
    query = start(spark, config)
    assert query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def _mirror(uri) -> dict:
    """The mirror's rows by key, read by DuckDB (the bookkeeping column left out)."""
    con = duckdb_delta()
    cursor = con.execute(f"SELECT * FROM delta_scan('{uri}')")
    names = [d[0] for d in cursor.description]
    rows = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
    return {r["id"]: {k: v for k, v in r.items() if k != "_change_sequence"} for r in rows}


def _expected(topic: ChangeTopic) -> dict:
    return {k[0]: dict(v) for k, v in topic.rows.items()}


def _check(root, topics: dict[str, ChangeTopic]) -> None:
    for name, topic in topics.items():
        assert _mirror(root / name) == _expected(topic), name


@pytest.mark.parametrize("converter", ["json-with-schemas", "json", "avro"])
def test_every_kind_of_change_lands_in_its_mirror(spark, kafka, tmp_path, request, converter):
    prefix = f"db{uuid.uuid4().hex[:6]}"
    sequencer = Sequencer()
    names = ["customers", "orders", "items"]
    registry = request.getfixturevalue("schema_registry") if converter == "avro" else None
    topics = {
        n: ChangeTopic(
            kafka,
            f"{prefix}.inventory.{n}",
            COLUMNS,
            schemas=converter == "json-with-schemas",
            sequencer=sequencer,
            registry=registry,
        )
        for n in names
    }
    root = tmp_path / "lake"
    avro = {"value_format": "avro", "avro": registry.url} if registry is not None else {}
    # Round 1: a snapshot and inserts, an update and a delete of rows the batch inserted.
    for i, topic in enumerate(topics.values()):
        for k in range(20):
            topic.insert({"id": k, "name": f"n{k}", "score": k * 1.5}, op="r" if k < 10 else "c")
        sequencer.commit()
        topic.update({"id": 3, "name": "three", "score": 3.0})
        topic.update({"id": 3, "name": "three again", "score": 4.0})
        topic.delete([4])
        topic.insert({"id": 4, "name": "four back", "score": None})
        topic.delete([5 + i], full=True)
        sequencer.commit()
        topic.send()
    _run(spark, _config(kafka, prefix, root, **avro))
    _check(root, topics)
    # Round 2: updates with and without the old row, a value the database did not send (kept),
    # deletes with tombstones, a truncate of one table followed by new rows.
    for topic in topics.values():
        topic.update({"id": 1, "name": "one", "score": 11.0}, before=topic.rows[(1,)])
        topic.update({"id": 2, "name": UNAVAILABLE, "score": 22.0})
        topic.delete([12])
        sequencer.commit()
    topics["orders"].truncate(partition=1)
    sequencer.commit()
    topics["orders"].insert({"id": 100, "name": "after the truncate", "score": 1.0})
    topics["orders"].insert({"id": 3, "name": "three after the truncate", "score": 2.0})
    for topic in topics.values():
        topic.send()
    _run(spark, _config(kafka, prefix, root, **avro))
    _check(root, topics)
    assert _mirror(root / "customers")[2]["name"] == "n2"  # kept: the database did not send it


def test_a_column_added_in_the_source_is_added_to_the_mirror(spark, kafka, tmp_path):
    prefix = f"db{uuid.uuid4().hex[:6]}"
    topic = ChangeTopic(kafka, f"{prefix}.inventory.people", COLUMNS)
    root = tmp_path / "lake"
    for k in range(5):
        topic.insert({"id": k, "name": f"p{k}", "score": 1.0})
    topic.send()
    _run(spark, _config(kafka, prefix, root))
    topic.add_column("age", INT64)
    topic.update({"id": 1, "name": "p1", "score": 2.0, "age": 41})
    topic.insert({"id": 9, "name": "p9", "score": 9.0, "age": 9})
    topic.send()
    _run(spark, _config(kafka, prefix, root))
    assert _mirror(root / "people") == _expected(topic)


MIRRORS_PIPELINE = """
pipelines:
  - pipeline_id: inventory
    engine: auto
    source:
      type: kafka
      bootstrap_servers: ${BROKER}
      topic_pattern: '${PREFIX}\\.inventory\\.(.*)'
    sinks: [{table_uri: "${DIR}/lake/{1}", write_mode: merge, cdc_format: debezium}]
    dead_letter: {table_uri: "${DIR}/dead-letters"}
"""


def test_a_yaml_pipeline_keeps_mirrors_and_a_change_it_cannot_read_stops_its_mirror(spark, kafka, tmp_path):
    from deltaflow.errors import MergeError
    from deltaflow.service.daemon import run_pipelines
    from tests.fixtures.pipelines import pipelines

    prefix = f"y{uuid.uuid4().hex[:6]}"
    good, bad = (ChangeTopic(kafka, f"{prefix}.inventory.{n}", COLUMNS) for n in ("good", "bad"))
    for topic in (good, bad):
        for k in range(6):
            topic.insert({"id": k, "name": f"n{k}", "score": 0.5})
        topic.send()
    specs = pipelines(tmp_path, MIRRORS_PIPELINE, BROKER=kafka.bootstrap, PREFIX=prefix)
    run_pipelines(spark, specs, available_now=True)
    root = tmp_path / "lake"
    _check(root, {"good": good, "bad": bad})
    # A message that is no change event: a dead letter, and its mirror stops (the other commits).
    bad.update({"id": 1, "name": "kept back", "score": 1.0})
    bad._pending.insert(0, (b'{"id": 3}', b"not json", 0))
    bad.send()
    good.delete([2])
    good.send()
    with pytest.raises(MergeError, match=r"1 change\(s\) for the mirror .*/bad cannot be applied"):
        run_pipelines(spark, specs, available_now=True)
    assert _mirror(root / "good") == _expected(good)
    assert _mirror(root / "bad")[1]["name"] == "n1"  # nothing of the batch applied to it
    letters = DeltaTable(str(tmp_path / "dead-letters")).to_pyarrow_table().to_pylist()
    assert [(r["topic"], r["value_base64"]) for r in letters] == [(bad.name, "bm90IGpzb24=")]


def test_append_mode_keeps_every_change_event_as_a_row(spark, kafka, tmp_path):
    import json

    prefix = f"db{uuid.uuid4().hex[:6]}"
    topic = ChangeTopic(kafka, f"{prefix}.inventory.events", COLUMNS)
    topic.insert({"id": 1, "name": "a", "score": 1.0}, op="r")
    topic.insert({"id": 2, "name": "b", "score": 2.0})
    topic.update({"id": 2, "name": "b2", "score": 2.5}, before={"id": 2, "name": "b", "score": 2.0})
    topic.delete([1])  # and its tombstone: no row
    topic.truncate()
    topic.send()
    root = tmp_path / "lake"
    _run(spark, _config(kafka, prefix, root, cdc_mode="append"))
    con = duckdb_delta()
    rows = con.execute(
        f"SELECT event_type, data, stream, timestamp FROM delta_scan('{root / 'events'}') ORDER BY timestamp"
    ).fetchall()
    assert [r[0] for r in rows] == ["snapshot", "insert", "update", "delete", "truncate"]
    assert {r[2] for r in rows} == {"inventory.events"}
    assert json.loads(rows[2][1]) == {
        "before": {"id": 2, "name": "b", "score": 2.0},
        "after": {"id": 2, "name": "b2", "score": 2.5},
    }
    assert json.loads(rows[3][1]) == {"id": 1, "name": None, "score": None}
    assert len({r[3] for r in rows}) == 5  # each event's own time, from its source


def test_cdc_errors_dead_letter_goes_on_past_a_change_that_stopped_the_mirror(spark, kafka, tmp_path):
    from pyspark.errors import StreamingQueryException

    prefix = f"db{uuid.uuid4().hex[:6]}"
    topic = ChangeTopic(kafka, f"{prefix}.inventory.stuck", COLUMNS)
    for k in range(4):
        topic.insert({"id": k, "name": f"n{k}", "score": 1.0})
    topic._pending.insert(2, (b'{"id": 9}', b"not a change event", 0))
    topic.send()
    root, dlq = tmp_path / "lake", str(tmp_path / "dead-letters")
    query = start(spark, _config(kafka, prefix, root, dlq_table_location=dlq))
    with pytest.raises(StreamingQueryException, match="restart with --cdc_errors dead_letter"):
        query.awaitTermination(300)
    assert _mirror(root / "stuck") == {}
    _run(spark, _config(kafka, prefix, root, dlq_table_location=dlq, cdc_errors="dead_letter"))
    assert _mirror(root / "stuck") == _expected(topic)
    letters = DeltaTable(dlq).to_pyarrow_table().to_pylist()
    assert [r["value_base64"] for r in letters] == ["bm90IGEgY2hhbmdlIGV2ZW50"]  # once, not per run


def test_a_table_created_in_the_database_while_running_gets_its_mirror(spark, kafka, tmp_path):
    from tests.fixtures.ingest_messages import poll

    prefix = f"db{uuid.uuid4().hex[:6]}"
    sequencer = Sequencer()
    first = ChangeTopic(kafka, f"{prefix}.inventory.first", COLUMNS, sequencer=sequencer)
    first.insert({"id": 1, "name": "a", "score": 1.0})
    first.send()
    root = tmp_path / "lake"
    config = _config(kafka, prefix, root).model_copy(
        update={"ends_at_latest_offsets": False, "allowed_latency": 0.2}
    )
    query = start(spark, config)

    def mirrored(name: str, topic: ChangeTopic) -> bool:
        try:
            return _mirror(root / name) == _expected(topic)
        except Exception:  # noqa: BLE001 - no table yet
            return False

    try:
        poll(lambda: mirrored("first", first), 120, "the first mirror")
        later = ChangeTopic(kafka, f"{prefix}.inventory.later", COLUMNS, sequencer=sequencer)
        for k in range(3):
            later.insert({"id": k, "name": f"l{k}", "score": 2.0})
        later.update({"id": 1, "name": "updated", "score": 3.0})
        later.send()
        first.delete([1])
        first.send()
        poll(lambda: mirrored("later", later) and mirrored("first", first), 120, "the new table's mirror")
        assert query.exception() is None
    finally:
        query.stop()

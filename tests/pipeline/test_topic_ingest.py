"""Many topics in one query (``deltaflow ingest --topic_pattern REGEX TEMPLATE``), against the
real broker: each topic exactly its messages in its own table, new topics picked up while the
query runs, and a table moving between ingest of one topic and of a pattern without a gap."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltaflow.cli import cli
from deltaflow.config.ingest import IngestConfig
from deltaflow.errors import ConfigError
from deltaflow.pipeline.ingest import ingest
from deltaflow.pipeline.topic_ingest import start
from tests.fixtures.ingest_messages import poll, table_rows
from tests.fixtures.readers import duckdb_delta


def _messages(topic: str, count: int, *, bad_every: int = 0) -> list[bytes]:
    out = []
    for i in range(count):
        if bad_every and i % bad_every == bad_every - 1:
            out.append(b'{"id": not json')
        else:
            out.append(json.dumps({"id": i, "name": f"{topic}-{i}", "n": i * 1.5}).encode())
    return out


def _streaming(kafka, prefix: str, root, pipeline_id: str) -> IngestConfig:
    """Every topic ``<prefix>.*`` into ``<root>/<topic>``, a batch every 0.2 s."""
    return IngestConfig.build(
        topic_pattern=rf"{prefix}\..*",
        table_uri=str(root / "{topic}"),
        brokers=kafka.bootstrap,
        pipeline_id=pipeline_id,
        allowed_latency=0.2,
    )


def _ingest_alone(spark, kafka, topic: str, lake, tmp_path) -> None:
    """``topic`` into ``<lake>/<topic>`` by ingest of that one topic, as pipeline ``events``
    (the pattern tests' pipeline id: the same txns), up to its latest offsets."""
    single = IngestConfig.build(
        topic=topic,
        table_uri=str(lake / "{topic}"),
        brokers=kafka.bootstrap,
        pipeline_id="events",
        ends_at_latest_offsets=True,
        checkpoint_location=str(tmp_path / "one-topic-checkpoint"),
    )
    assert ingest(spark, single.for_one_topic()).awaitTermination(300)


def _ids(uri) -> list[int]:
    return sorted(r["id"] for r in DeltaTable(str(uri)).to_pyarrow_table(columns=["id"]).to_pylist())


def _duckdb_ids(uri) -> list[int]:
    con = duckdb_delta()
    return sorted(r[0] for r in con.execute(f"SELECT id FROM delta_scan('{uri}')").fetchall())


def test_fifty_topics_by_pattern_land_each_in_its_own_table_in_one_query(spark, kafka, tmp_path):
    prefix = f"bronze{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}.orders{i:02d}" for i in range(50)]
    for i, topic in enumerate(topics):
        kafka.create_topic(partitions=2, name=topic)
        kafka.produce(topic, _messages(topic, 10 + i, bad_every=7 if i % 10 == 0 else 0), partitions=2)
    other = kafka.create_topic(partitions=1, name=f"{prefix}-other")  # matches no pattern
    kafka.produce(other, _messages(other, 5), partitions=1)
    config = IngestConfig.build(
        topic_pattern=rf"{prefix}\.(.*)",
        table_uri=str(tmp_path / "lake" / "{1}"),
        dlq_table_location=str(tmp_path / "dead-letters"),
        brokers=kafka.bootstrap,
        pipeline_id="bronze",
        ends_at_latest_offsets=True,
        transforms=["source_topic: kafka.topic", "offset: kafka.offset"],
    )
    query = start(spark, config)
    assert query.awaitTermination(300)
    assert query.exception() is None
    progress = query.recentProgress
    assert len({p["id"] for p in progress}) == 1  # one query for every topic

    letters = DeltaTable(str(tmp_path / "dead-letters")).to_pyarrow_table().to_pylist()
    for i, topic in enumerate(topics):
        uri = tmp_path / "lake" / f"orders{i:02d}"
        expected = [j for j in range(10 + i) if not (i % 10 == 0 and j % 7 == 6)]
        assert _ids(uri) == expected, topic
        assert _duckdb_ids(uri) == expected, topic
        rows = DeltaTable(str(uri)).to_pyarrow_table().to_pylist()
        assert {r["source_topic"] for r in rows} == {topic}
        assert all(r["name"] == f"{topic}-{r['id']}" for r in rows)
        table = DeltaTable(str(uri))
        # The txn ids of ingest of one topic: <pipeline_id>-<topic>-<partition>.
        ends = {p: (10 + i + (1 - p)) // 2 - 1 for p in (0, 1)}
        assert {p: table.transaction_version(f"bronze-{topic}-{p}") for p in (0, 1)} == ends
        bad = 0 if i % 10 else (10 + i) // 7
        assert sum(1 for r in letters if r["topic"] == topic) == bad, topic
    assert not (tmp_path / "lake" / "other").exists()
    assert sorted(p.name for p in (tmp_path / "lake").iterdir() if not p.name.startswith("_")) == [
        f"orders{i:02d}" for i in range(50)
    ]


def test_new_topics_land_and_a_table_moves_between_one_topic_and_a_pattern(spark, kafka, tmp_path):
    prefix = f"evt{uuid.uuid4().hex[:6]}"
    first = kafka.create_topic(partitions=2, name=f"{prefix}.a")
    kafka.produce(first, _messages(first, 30), partitions=2)
    lake = tmp_path / "lake"
    # The table starts under ingest of its one topic, ...
    _ingest_alone(spark, kafka, first, lake, tmp_path)
    assert _ids(lake / first) == list(range(30))
    kafka.produce(first, _messages(first, 50)[30:], partitions=2)
    # ... then a pattern takes it (and a new topic), where the table's progress says.
    config = _streaming(kafka, prefix, lake, "events")
    query = start(spark, config)
    try:
        poll(lambda: table_rows(lake / first) == 50, 120, "the rest of the first topic", query_alive(query))
        assert _ids(lake / first) == list(range(50))
        second = kafka.create_topic(partitions=1, name=f"{prefix}.b")
        kafka.produce(second, _messages(second, 7), partitions=1)
        batches = len(query.recentProgress)
        poll(lambda: table_rows(lake / second) == 7, 120, "the new topic's table", query_alive(query))
        assert _ids(lake / second) == list(range(7))
        kafka.produce(first, _messages(first, 60)[50:], partitions=2)
        poll(lambda: table_rows(lake / first) == 60, 120, "more of the first topic", query_alive(query))
        # The status page lists every table: rows committed, last commit, lag of its topics.
        from deltaflow.service.status import board

        board.register("events", table_uri=config.table_uri, table_of=config.table_template().render)
        board.progress("events", query.lastProgress)
        (shown,) = [p for p in board.snapshot()["pipelines"] if p["name"] == "events"]
        tables = {t["table_uri"]: t for t in shown["tables"]}
        assert set(tables) == {str(lake / first), str(lake / second)}
        assert tables[str(lake / first)]["committed"] == 60  # both runs of this process
        assert tables[str(lake / second)]["committed"] == 7
        assert all(t["last_commit"] and t["lag"] == 0 for t in tables.values())
        # A topic deleted while running: the others go on, its table stays.
        admin = kafka.admin()  # must outlive the future
        admin.delete_topics([second])[second].result(timeout=10)
        kafka.produce(first, _messages(first, 64)[60:], partitions=2)
        poll(
            lambda: table_rows(lake / first) == 64,
            120,
            "the first topic after a deletion",
            query_alive(query),
        )
        assert _ids(lake / second) == list(range(7))
    finally:
        query.stop()
    # The new topic took at most two batches with data after it appeared (one to make its table).
    landed = [p for p in query.recentProgress[batches:] if p["numInputRows"]]
    assert landed
    # A deleted checkpoint: the tables' progress says where each topic is.
    shutil.rmtree(lake / "_deltaflow" / "checkpoints" / "events")
    kafka.produce(first, _messages(first, 70)[64:], partitions=2)
    again = start(spark, config.model_copy(update={"ends_at_latest_offsets": True}))
    assert again.awaitTermination(300)
    assert _ids(lake / first) == list(range(70))


def test_a_topic_ingested_alone_meanwhile_resumes_where_its_table_is_under_a_patterns_checkpoint(
    spark, kafka, tmp_path
):
    # The pattern's checkpoint has never seen topic b (b was made, and ingested by itself under
    # the same pipeline id, while the pattern was stopped): the restarted pattern must start b
    # where its table is, not at the earliest offset (found by a review: rows 0-6 landed twice).
    prefix = f"mv{uuid.uuid4().hex[:6]}"
    lake = tmp_path / "lake"
    pattern = _streaming(kafka, prefix, lake, "events").model_copy(update={"ends_at_latest_offsets": True})
    a = kafka.create_topic(partitions=1, name=f"{prefix}.a")
    kafka.produce(a, _messages(a, 5), partitions=1)
    assert start(spark, pattern).awaitTermination(300)
    b = kafka.create_topic(partitions=1, name=f"{prefix}.b")
    kafka.produce(b, _messages(b, 7), partitions=1)
    _ingest_alone(spark, kafka, b, lake, tmp_path)
    assert _ids(lake / b) == list(range(7))
    kafka.produce(b, _messages(b, 10)[7:], partitions=1)
    kafka.produce(a, _messages(a, 6)[5:], partitions=1)
    query = start(spark, pattern)
    assert query.awaitTermination(300) and query.exception() is None
    assert _ids(lake / a) == list(range(6))
    assert _ids(lake / b) == list(range(10))


def test_a_pattern_that_matches_nothing_yet_waits_for_its_topics(spark, kafka, tmp_path):
    """No topic at start (and one without messages): the query runs, and a topic that appears,
    or gets its first messages, gets its table and lands."""
    prefix = f"w{uuid.uuid4().hex[:6]}"
    empty = kafka.create_topic(partitions=1, name=f"{prefix}.empty")
    config = _streaming(kafka, prefix, tmp_path, "waits")
    query = start(spark, config)
    try:
        assert not (tmp_path / empty).exists()  # nothing to infer its columns from yet
        late = kafka.create_topic(partitions=2, name=f"{prefix}.late")
        kafka.produce(late, _messages(late, 6), partitions=2)
        poll(lambda: table_rows(tmp_path / late) == 6, 120, "the late topic's table", query_alive(query))
        kafka.produce(empty, _messages(empty, 3), partitions=1)
        poll(lambda: table_rows(tmp_path / empty) == 3, 30, "the empty topic's table", query_alive(query))
    finally:
        query.stop()
    assert _ids(tmp_path / late) == list(range(6))
    assert _ids(tmp_path / empty) == list(range(3))


def test_schema_evolution_and_dead_letters_apply_per_table(kafka, tmp_path):
    """Each topic's new fields become columns of its own table only (the CLI, whose daemon
    restarts the query after columns were added), and one topic's bad messages hold up no
    other table."""
    import subprocess
    import sys
    from pathlib import Path

    prefix = f"ev{uuid.uuid4().hex[:6]}"
    a, b = f"{prefix}.a", f"{prefix}.b"
    for topic, extra in ((a, {"score": 1.5}), (b, {"tag": "x"})):
        kafka.create_topic(partitions=2, name=topic)
        values = [json.dumps({"id": i, **(extra if i >= 6 else {})}).encode() for i in range(12)]
        if topic == b:
            values[3] = b"{broken"
        kafka.produce(topic, values, partitions=2)
    root = Path(__file__).resolve().parents[2]
    args = [sys.executable, "-m", "deltaflow.cli", "ingest", f"{a},{b}", str(tmp_path / "{topic}")]
    args += ["--kafka", kafka.bootstrap, "--app_id", "evolve", "--schema", "id LONG"]
    args += ["--schema_evolution", "--ends_at_latest_offsets", "--max_messages_per_batch", "8"]
    args += [
        "--dlq_table_location",
        str(tmp_path / "dlq"),
        "--commit_to_group",
        "--consumer_group_id",
        prefix,
    ]
    out = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    # The consumer group follows every topic (lag monitoring only).
    from confluent_kafka import Consumer, TopicPartition

    group = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": prefix})
    try:
        done = group.committed([TopicPartition(t, p) for t in (a, b) for p in (0, 1)], timeout=10)
    finally:
        group.close()
    assert {(tp.topic, tp.partition): tp.offset for tp in done} == {(t, p): 6 for t in (a, b) for p in (0, 1)}
    ta, tb = DeltaTable(str(tmp_path / a)), DeltaTable(str(tmp_path / b))
    assert ta.schema().to_arrow().names == ["id", "score"]
    assert tb.schema().to_arrow().names == ["id", "tag"]
    assert _ids(tmp_path / a) == list(range(12))
    assert _ids(tmp_path / b) == [i for i in range(12) if i != 3]
    rows = sorted(ta.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [r["score"] for r in rows] == [None] * 6 + [1.5] * 6
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert [(r["topic"], r["offset"]) for r in letters] == [(b, 1)]


def test_avro_topics_take_their_own_registry_subjects(spark, kafka, schema_registry, tmp_path):
    """``--avro URL`` with several topics: each topic's columns come from its subject
    ``<topic>-value``."""
    from tests.fixtures.registry import AVRO_V1

    prefix = f"av{uuid.uuid4().hex[:6]}"
    other = {
        "type": "record",
        "name": "Pay",
        "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}],
    }
    clicks, pays = f"{prefix}.clicks", f"{prefix}.pays"
    for topic, schema, record in (
        (clicks, AVRO_V1, lambda i: {"id": i, "url": f"/p{i}", "at": 1_700_000_000_000 + i}),
        (pays, other, lambda i: {"id": i, "amount": i * 2.5}),
    ):
        schema_id = schema_registry.register(f"{topic}-value", schema)
        kafka.create_topic(partitions=2, name=topic)
        kafka.produce(topic, [schema_registry.encode(schema_id, record(i)) for i in range(9)], partitions=2)
    config = IngestConfig.build(
        topic_pattern=rf"{prefix}\..*",
        table_uri=str(tmp_path / "{topic}"),
        brokers=kafka.bootstrap,
        pipeline_id="avro-topics",
        value_format="avro",
        avro=schema_registry.url,
        ends_at_latest_offsets=True,
    )
    assert start(spark, config).awaitTermination(300)
    assert DeltaTable(str(tmp_path / clicks)).schema().to_arrow().names == ["id", "url", "at"]
    assert DeltaTable(str(tmp_path / pays)).schema().to_arrow().names == ["id", "amount"]
    assert _ids(tmp_path / clicks) == _ids(tmp_path / pays) == list(range(9))
    rows = sorted(DeltaTable(str(tmp_path / pays)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [r["amount"] for r in rows] == [i * 2.5 for i in range(9)]


def query_alive(query):
    class Alive:
        returncode = "stopped"

        def poll(self):
            return None if query.isActive else query.exception()

        def __repr__(self):
            return f"query {query.name}"

    return Alive()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topic_pattern", "x.*", "{table}/t"], "one table for several topics"),
        (["--topic_pattern", "x(.*)", "{table}/{2}"], "has 1 group"),
        (["a,b", "{table}/{1}"], "listed, not matched"),
        (
            ["a,b", "{table}/{topic}", "--engine", "spark"],
            "--engine spark is not available with several topics",
        ),
        (["{table}/{topic}"], "Missing argument 'TABLE_URI'"),
    ],
    ids=["no-placeholder", "missing-group", "group-of-a-list", "spark-engine", "no-topic"],
)
def test_bad_templates_are_refused_before_anything_is_written(tmp_path, args, message):
    args = [a.replace("{table}", str(tmp_path / "lake")) for a in args]
    result = CliRunner().invoke(cli, ["ingest", *args, "--kafka", "127.0.0.1:1"])
    # A usage error, or a ConfigError (the CLI's boundary, deltaflow.cli.main, exits 2 on it).
    assert result.exit_code == 2 or isinstance(result.exception, ConfigError), result.output
    assert message in result.output + str(result.exception)
    assert not (tmp_path / "lake").exists()


TOPICS_PIPELINE = """
pipelines:
  - pipeline_id: bronze-yaml
    engine: ${ENGINE}
    source:
      type: kafka
      bootstrap_servers: ${BROKER}
      topic_pattern: '${PREFIX}\\..*'
      schema: "id BIGINT, name STRING, n DOUBLE"
    transforms:
      source_topic: kafka.topic
    sinks: [{table_uri: "${DIR}/lake/{topic}"}]
    dead_letter: {table_uri: "${DIR}/dead-letters"}
"""


def test_a_yaml_pipeline_with_a_table_template_runs_as_ingest_of_many_topics(spark, kafka, tmp_path):
    from deltaflow.service.daemon import run_pipelines
    from tests.fixtures.pipelines import pipelines

    prefix = f"y{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}.t{i}" for i in range(3)]
    for i, topic in enumerate(topics):
        kafka.create_topic(partitions=2, name=topic)
        kafka.produce(topic, _messages(topic, 8 + i, bad_every=4), partitions=2)
    specs = pipelines(tmp_path, TOPICS_PIPELINE, BROKER=kafka.bootstrap, PREFIX=prefix, ENGINE="auto")
    run_pipelines(spark, specs, available_now=True)
    letters = DeltaTable(str(tmp_path / "dead-letters")).to_pyarrow_table().to_pylist()
    for i, topic in enumerate(topics):
        assert _ids(tmp_path / "lake" / topic) == [j for j in range(8 + i) if j % 4 != 3]
        assert sum(r["topic"] == topic for r in letters) == (8 + i) // 4
    with pytest.raises(ConfigError, match="a table per topic runs on the Arrow engine"):
        pipelines(tmp_path, TOPICS_PIPELINE, BROKER=kafka.bootstrap, PREFIX=prefix, ENGINE="spark")

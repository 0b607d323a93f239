"""``deltaflow.sources.kafka_ingest``: the Arrow ingest path against a real broker.

The same topic is ingested by both engines and the tables compared; the Arrow engine is
killed at each step of its commit sequence and restarted, and holds every message once.
"""

from __future__ import annotations

import itertools
import shutil
import signal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltaflow.config.ingest import IngestConfig
from deltaflow.errors import ConfigError
from deltaflow.pipeline.arrow_ingest import choose_engine
from deltaflow.pipeline.ingest import ingest
from tests.fixtures.ingest_messages import SCHEMA, TRANSFORMS, _assert_split, _message
from tests.jobs import run_job

DLQ_TRANSFORMS = ("source_topic: kafka.topic",)


def _rows(path: Path, drop: tuple[str, ...] = ()) -> list[dict]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted(
        ({k: v for k, v in r.items() if k not in drop} for r in rows), key=lambda r: str(sorted(r.items()))
    )


def test_both_engines_write_the_same_tables(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, [_message(i) for i in range(300)], partitions=3)
    for engine in ("spark", "arrow"):
        config = IngestConfig.build(
            topic=topic,
            table_uri=str(tmp_path / engine),
            brokers=kafka.bootstrap,
            pipeline_id=f"both-{engine}",
            value_schema=SCHEMA,
            transforms=(
                *TRANSFORMS,
                "day: substr(at, `0`, `4`)",
                # Per message (the jmespath library) on both engines.
                "label: join('-', [user, to_string(kafka.partition)])",
                "kind: kafka.timestamp_type",
            ),
            partition_by=("day",),
            dlq_table_location=str(tmp_path / f"{engine}-dlq"),
            dlq_transforms=DLQ_TRANSFORMS,
            max_messages_per_batch=120,
            ends_at_latest_offsets=True,
            engine=engine,
        )
        assert choose_engine(config) == engine
        assert ingest(spark, config).awaitTermination(300)
    assert _rows(tmp_path / "arrow") == _rows(tmp_path / "spark")
    assert _rows(tmp_path / "arrow-dlq", drop=("dead_lettered_at",)) == _rows(
        tmp_path / "spark-dlq", drop=("dead_lettered_at",)
    )
    _assert_split(tmp_path / "arrow", tmp_path / "arrow-dlq", 300, 3, extra_dlq_columns=("source_topic",))
    assert {r["source_topic"] for r in _rows(tmp_path / "arrow-dlq")} == {topic}
    for r in _rows(tmp_path / "arrow"):
        assert (r["label"], r["kind"]) == (f"{r['user']}-{r['id'] % 3}", 0)  # create time
    arrow = DeltaTable(str(tmp_path / "arrow"))
    assert arrow.metadata().partition_columns == ["day"]
    ops = [h["operation"] for h in arrow.history()]
    assert ops.count("WRITE") >= 3  # one commit per micro-batch (120 messages each)


def _cli(kafka, topic, tmp_path, crash_at=None):
    args = [topic, str(tmp_path / "t"), "--kafka", kafka.bootstrap, "--app_id", "arrow-crash"]
    args += ["--schema", SCHEMA, "--engine", "arrow", "--dlq_table_location", str(tmp_path / "dlq")]
    args += ["--checkpoint_location", str(tmp_path / "cp"), "--max_messages_per_batch", "90"]
    args += ["--ends_at_latest_offsets", "--no_auto_compact"]
    for t in TRANSFORMS:
        args += ["-t", t]
    return run_job("ingest_job", *args, crash_at=crash_at)


@pytest.mark.parametrize(
    ("crash_at", "checkpoint"),
    [
        ("write:1", "kept"),
        ("before_commit:1", "kept"),
        ("after_commit:1", "kept"),  # between the dead letters' commit and the main table's
        ("after_commit:1", "deleted"),
    ],
    ids=["in-a-task", "before-commit", "between-commits", "between-commits-checkpoint-lost"],
)
def test_killed_at_each_step_and_restarted_is_exactly_once(kafka, tmp_path, crash_at, checkpoint):
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, [_message(i) for i in range(270)], partitions=3)
    crashed = _cli(kafka, topic, tmp_path, crash_at)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    if checkpoint == "deleted":
        shutil.rmtree(tmp_path / "cp")  # the source replans from the main table's progress
    restarted = _cli(kafka, topic, tmp_path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "arrow engine" in restarted.stderr
    _assert_split(tmp_path / "t", tmp_path / "dlq", 270, 3)


def test_auto_takes_spark_for_what_only_spark_runs(tmp_path):
    base = {"topic": "t", "table_uri": str(tmp_path / "t"), "pipeline_id": "p"}
    assert choose_engine(IngestConfig.build(**base)) == "arrow"
    sql = IngestConfig.build(**base, transforms=("x: sql: upper(user)",))
    assert choose_engine(sql) == "spark"
    with pytest.raises(
        ConfigError, match=r"--engine arrow cannot run this ingest: it uses Spark SQL transforms"
    ):
        choose_engine(IngestConfig.build(**base, transforms=("x: sql: upper(user)",), engine="arrow"))
    evolving = IngestConfig.build(**base, schema_evolution=True)
    assert choose_engine(evolving) == "arrow"  # the driver types new fields with Spark


def test_evolution_samples_only_what_can_become_a_column_and_stay_small():
    """A task returns values of good messages with a new top-level field (not nested, not made
    by a transform), at most ``limit`` of them and about ``SAMPLE_BYTES``."""
    import pyarrow as pa

    from deltaflow.sources.kafka_ingest import SAMPLE_BYTES, TableResult, _sample_unknown

    unknown = pa.chunked_array([[["meta.deep"], ["made"], None, ["tag"], ["Tag", "meta.x"], ["tag"]]])
    values = pa.chunked_array([[b"nested", b"produced", b"known", b"bad", b"new", b"new2"]])
    ok = pa.chunked_array([[True, True, True, False, True, True]])
    result = TableResult()
    _sample_unknown(result, values, unknown, ok, produced={"made"}, limit=10)
    assert result.samples == [b"new", b"new2"]
    capped = TableResult()
    _sample_unknown(capped, values, unknown, ok, produced={"made"}, limit=1)
    assert capped.samples == [b"new"]
    big = pa.chunked_array([[b"x" * (SAMPLE_BYTES // 2 + 1)] * 6])
    sized = TableResult()
    _sample_unknown(sized, big, pa.chunked_array([[["tag"]] * 6]), pa.chunked_array([[True] * 6]), set(), 10)
    assert len(sized.samples) == 2  # stops once the bytes reach the cap


def test_tasks_are_sized_by_messages_not_partitions():
    """Small topic-partitions share a task, a large one is split by offsets, and the tasks are
    balanced: at least the cores' count of tasks once each can hold the least messages."""
    from deltaflow.sources.kafka import KafkaPartitionRange
    from deltaflow.sources.kafka_ingest import IngestRange, pack

    def ranges(*sizes):
        return [IngestRange(KafkaPartitionRange(f"t{i}", 0, 10, 10 + n)) for i, n in enumerate(sizes)]

    def loads(tasks):
        return sorted(sum(r.size for r in task) for task in tasks)

    assert len(pack(ranges(*[5] * 200), parallelism=2, least=20_000)) == 1  # 200 small topics: 1 task
    assert loads(pack(ranges(*[5] * 200), parallelism=2, least=100)) == [500, 500]
    split = pack(ranges(1_000_000), parallelism=4, least=20_000)
    assert loads(split) == [250_000] * 4
    pieces = sorted((r.range.start, r.range.end) for task in split for r in task)
    assert pieces[0][0] == 10 and pieces[-1][1] == 1_000_010
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))  # no gap, no overlap
    assert loads(pack(ranges(100, 100, 20, 20), parallelism=2, least=1)) == [120, 120]
    assert pack([], parallelism=2) == []


def test_the_start_offsets_read_no_table_the_driver_made_for_the_query(kafka, tmp_path):
    # ``--topic_pattern`` into new tables: the driver made and claimed them just before the
    # query; their progress is empty, so the source's start loads only the others (200 tables
    # made for a new estate were 200 loads in the streaming source runner).
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltaflow.config.locations import normalize_uri
    from deltaflow.delta.progress import kafka_txn_id
    from deltaflow.sources.kafka import KafkaSourceOptions
    from deltaflow.sources.kafka_ingest import IngestPlan, KafkaIngestReader
    from deltaflow.sources.topic_routes import TableFiles, TopicRoute

    made, old = kafka.create_topic(partitions=1), kafka.create_topic(partitions=1)
    for topic in (made, old):
        kafka.produce(topic, [b'{"id": 1}'] * 10, partitions=1)
    uris = {t: normalize_uri(str(tmp_path / t)) for t in (made, old)}
    schema = pa.schema([("id", pa.int64())])
    write_deltalake(uris[made], pa.table({"id": pa.array([], pa.int64())}))
    txn = Transaction(kafka_txn_id("estate", old, "0"), 3)
    write_deltalake(
        uris[old], pa.table({"id": [0]}), commit_properties=CommitProperties(app_transactions=[txn])
    )
    plan = IngestPlan(
        source_schema_ipc=schema.serialize().to_pybytes(),
        routes={t: TopicRoute(TableFiles.of(u, schema)) for t, u in uris.items()},
        pipeline_id="estate",
        made=frozenset({uris[made]}),
    )
    reader = KafkaIngestReader(
        KafkaSourceOptions(bootstrap_servers=kafka.bootstrap, topic=(made, old), pipeline_id="estate"), plan
    )
    loads = []
    real = reader._load_table
    reader._load_table = lambda uri, storage: loads.append(uri) or real(uri, storage)
    assert reader.initialOffset() == {made: {"0": 0}, old: {"0": 4}}
    assert loads == [uris[old]]
    reader.stop()

"""Debezium mirrors under faults the happy path does not meet, against the broker: a partition
whose delivery lags behind a truncate, a truncate without a database sequence, a column no
sampled event gives a value, a change that cannot be applied, a lost checkpoint."""

from __future__ import annotations

import shutil
import uuid

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltaflow.pipeline.topic_ingest import start
from deltaflow.sinks.kafka_mirror import KafkaMirrorSink
from tests.fixtures.debezium import UNAVAILABLE, ChangeTopic, Sequencer
from tests.pipeline.test_debezium_mirrors import COLUMNS, _config, _expected, _mirror, _run

#: Keys (ids) of each partition of a 2-partition ChangeTopic (crc32 of the key's JSON, mod 2).
P0, P1 = [1, 3, 5, 7], [0, 2, 4, 6]


def _two_tables(kafka, prefix: str) -> dict[str, ChangeTopic]:  # type: ignore[no-untyped-def]
    """The topics of two tables of one database (one change sequence)."""
    sequencer = Sequencer()
    return {
        n: ChangeTopic(kafka, f"{prefix}.inventory.{n}", COLUMNS, sequencer=sequencer)
        for n in ("customers", "orders")
    }


def _prefix() -> str:
    return f"db{uuid.uuid4().hex[:6]}"


def test_an_insert_older_than_a_truncate_read_in_a_later_batch_stays_truncated(spark, kafka, tmp_path):
    """PostgreSQL's sequence orders all changes of the database, so a truncate deletes every
    row changed before it, whichever partition the change is in. Kafka orders only within a
    partition: an insert on partition 0 made before the truncate (sent on partition 1) may be
    read in a later batch than the truncate. The mirror must not bring it back."""
    prefix = _prefix()
    topic = ChangeTopic(kafka, f"{prefix}.inventory.t", COLUMNS)
    root = tmp_path / "lake"
    topic.insert({"id": P1[0], "name": "before", "score": 1.0})
    topic.send()
    _run(spark, _config(kafka, prefix, root))
    topic.sequencer.commit()
    topic.insert({"id": P0[0], "name": "inserted before the truncate", "score": 2.0})
    topic.sequencer.commit()
    topic.truncate(partition=1)
    topic.sequencer.commit()
    topic.send(partition=1)  # partition 0's delivery lags: its insert comes in the next batch
    _run(spark, _config(kafka, prefix, root))
    assert _mirror(root / "t") == {}
    topic.insert({"id": P0[1], "name": "after the truncate", "score": 3.0})
    topic.send()
    _run(spark, _config(kafka, prefix, root))
    assert _mirror(root / "t") == _expected(topic)


def test_a_truncate_without_a_database_sequence_stops_its_mirror_rather_than_guess(spark, kafka, tmp_path):
    """Without ``source.sequence`` (or a binlog position) the Kafka offset orders a key's changes,
    and offsets of two partitions say nothing of each other: a truncate on partition 1 at offset
    4 and an insert on partition 0 at offset 0 could be in either order. Deleting or keeping
    that row would be a guess; the truncate is a dead letter and its mirror stops."""
    from pyspark.errors import StreamingQueryException

    prefix = _prefix()
    topic = ChangeTopic(kafka, f"{prefix}.inventory.t", COLUMNS, sequence=False)
    root = tmp_path / "lake"
    for k in P1:
        topic.insert({"id": k, "name": f"n{k}", "score": 1.0})
    topic.send()
    _run(spark, _config(kafka, prefix, root))
    topic.truncate(partition=1)
    topic.insert({"id": P0[0], "name": "after the truncate?", "score": 2.0})
    topic.send()
    dlq = str(tmp_path / "dlq")
    query = start(spark, _config(kafka, prefix, root, dlq_table_location=dlq))
    with pytest.raises(StreamingQueryException, match="a truncate without the database's position"):
        query.awaitTermination(300)
    assert sorted(_mirror(root / "t")) == sorted(P1)  # nothing of the batch applied
    letters = DeltaTable(dlq).to_pyarrow_table().to_pylist()
    assert [r["error"][:40] for r in letters] == ["a truncate without the database's positi"]


def test_a_column_null_in_every_sampled_event_takes_the_type_of_its_first_value(spark, kafka, tmp_path):
    """Without schemas the mirror's columns are inferred from the first events; a nullable column
    that is NULL in all of them has no type yet. A later value of it (a number) must land, not
    fail the query in a task with ``ArrowTypeError: Expected bytes, got a 'float' object``."""
    prefix = _prefix()
    topic = ChangeTopic(kafka, f"{prefix}.inventory.t", COLUMNS, schemas=False)
    root = tmp_path / "lake"
    for k in range(4):
        topic.insert({"id": k, "name": f"n{k}", "score": None})
    topic.send()
    _run(spark, _config(kafka, prefix, root))
    topic.insert({"id": 9, "name": "nine", "score": 2.5})
    topic.update({"id": 1, "name": "one", "score": 1.5})
    topic.send()
    _run(spark, _config(kafka, prefix, root))
    assert _mirror(root / "t") == _expected(topic)
    assert pa.schema(DeltaTable(str(root / "t")).schema().to_arrow()).field("score").type == pa.float64()


def test_a_change_that_cannot_be_applied_stops_its_mirror_after_its_dead_letter(spark, kafka, tmp_path):
    """One message of orders is no change event: it lands in the dead-letter table, customers'
    batch commits, orders' does not, and the query stops saying so."""
    from pyspark.errors import StreamingQueryException

    prefix = _prefix()
    topics = _two_tables(kafka, prefix)
    root = tmp_path / "lake"
    for topic in topics.values():
        for k in range(4):
            topic.insert({"id": k, "name": f"n{k}", "score": 1.0})
    topics["orders"].raw(b'{"id": 1}', b"not a change event", partition=0)
    for topic in topics.values():
        topic.send()
    dlq = str(tmp_path / "dlq")
    query = start(spark, _config(kafka, prefix, root, dlq_table_location=dlq))
    with pytest.raises(
        StreamingQueryException, match=r"1 change\(s\) for the mirror .*orders cannot be applied"
    ):
        query.awaitTermination(300)
    assert _mirror(root / "customers") == _expected(topics["customers"])
    assert _mirror(root / "orders") == {}
    assert DeltaTable(dlq).to_pyarrow_table().num_rows == 1


def test_a_mirror_behind_the_others_then_the_checkpoint_deleted(spark, kafka, tmp_path, monkeypatch):
    """Batch 1 lands in customers and not in orders (its commit fails); the Spark checkpoint is
    then deleted: each mirror goes on from its own txns, orders gets batch 1's updates and
    deletes once, customers is not moved back."""
    from pyspark.errors import StreamingQueryException

    prefix = _prefix()
    topics = _two_tables(kafka, prefix)
    root = tmp_path / "lake"
    for topic in topics.values():
        for k in range(6):
            topic.insert({"id": k, "name": f"n{k}", "score": 1.0})
        topic.send()
    _run(spark, _config(kafka, prefix, root))
    for topic in topics.values():
        topic.update({"id": 1, "name": "one", "score": 2.0})
        topic.delete([2])
        topic.insert({"id": 2, "name": "two again", "score": 3.0})
        topic.delete([3])
        topic.send()
    commit_batch = KafkaMirrorSink.commit_batch

    def commit_or_fail(self, messages, batch_id, **kwargs):  # type: ignore[no-untyped-def]
        if batch_id == 1 and self.table_uri.rstrip("/").endswith("/orders"):
            raise RuntimeError("batch 1 of orders is not committed (injected)")
        return commit_batch(self, messages, batch_id, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(KafkaMirrorSink, "commit_batch", commit_or_fail)
        query = start(spark, _config(kafka, prefix, root))
        with pytest.raises(StreamingQueryException, match="injected"):
            query.awaitTermination(300)
    assert _mirror(root / "customers") == _expected(topics["customers"])
    shutil.rmtree(root / "_deltaflow" / "checkpoints" / "mirrors")
    topics["customers"].update({"id": 4, "name": "four", "score": 4.0})
    topics["customers"].send()
    _run(spark, _config(kafka, prefix, root))
    for name, topic in topics.items():
        assert _mirror(root / name) == _expected(topic), name


def test_killed_in_a_task_and_between_two_mirrors_commits_then_restarted(spark, kafka, tmp_path):
    """SIGKILL of the whole process group in batch 1: in a task (staged files written), then,
    replaying it from the kept checkpoint, right after orders' commit (customers' not). The
    restart to the end: every mirror exact, each batch once in each, no staged file left."""
    import signal

    from tests.jobs import run_job

    prefix = _prefix()
    topics = _two_tables(kafka, prefix)
    root = tmp_path / "lake"
    for topic in topics.values():
        for k in range(8):
            topic.insert({"id": k, "name": f"n{k}", "score": 1.0})
        for k in (1, 2, 3):
            topic.update({"id": k, "name": f"u{k}", "score": 2.0})
        topic.delete([4])
        topic.insert({"id": 4, "name": "four again", "score": 4.0})
        topic.update({"id": 5, "name": UNAVAILABLE, "score": 5.0})
        topic.delete([6])
        topic.send()
    args = ["--topic_pattern", rf"{prefix}\.inventory\.(.*)", str(root / "{1}"), "--kafka", kafka.bootstrap]
    args += [
        "--app_id",
        "mirrors",
        "--cdc",
        "debezium",
        "--max_messages_per_batch",
        "10",
        "--ends_at_latest_offsets",
    ]
    for crash_at in ("write:1", "between_tables:1:/orders"):
        crashed = run_job("ingest_job", *args, crash_at=crash_at)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert DeltaTable(str(root / "orders")).history(1)[0]["deltaflow.epoch"] == 1
    _run(spark, _config(kafka, prefix, root, max_messages_per_batch=10))
    for name, topic in topics.items():
        assert _mirror(root / name) == _expected(topic), name
        epochs = [
            h["deltaflow.epoch"] for h in DeltaTable(str(root / name)).history() if "deltaflow.epoch" in h
        ]
        assert len(epochs) == len(set(epochs)), f"{name}: a batch committed twice: {epochs}"
        staging = root / name / "_deltaflow_staging"
        assert not staging.exists() or not list(staging.iterdir()), (name, list(staging.iterdir()))

"""The mirror sink of Debezium topics on the driver: staged folds merged once per batch, replays
skipped, a truncate alone, new columns, a value its column cannot hold, stale staged files."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltaflow.config.sink import SinkOptions
from deltaflow.delta import commit
from deltaflow.errors import MergeError
from deltaflow.io.changes import STAGING_DIR, ChangeFold
from deltaflow.sinks.datasource import DeltaCommitMessage
from deltaflow.sinks.kafka_mirror import KafkaMirrorSink, mirror_table_schema
from deltaflow.sources.change_topics import stage
from deltaflow.sources.topic_routes import TableFiles

SCHEMA = pa.schema([("id", pa.int32()), ("name", pa.string())])


@pytest.fixture
def mirror(tmp_path):
    uri = str(tmp_path / "m")
    commit.create_table(uri, mirror_table_schema(SCHEMA), partition_by=[], properties={}, storage_options={})
    return uri, KafkaMirrorSink(SinkOptions(table_uri=uri, pipeline_id="p", kafka_offsets=True))


def _staged(uri: str, batch: int, changes, schema=SCHEMA) -> DeltaCommitMessage:
    fold = ChangeFold(["id"], schema)
    for op, row, seq in changes:
        if op == "truncate":
            fold.add("truncate", (), (), None, seq)
        else:
            fold.add(op, ["id"], (row["id"],), row, seq)
    files = TableFiles.of(uri, mirror_table_schema(schema))
    return DeltaCommitMessage([stage(files, fold, f"part-b{batch:06d}-k00000-a0")], partition_id=0)


def _rows(uri: str) -> dict:
    return {r["id"]: r["name"] for r in DeltaTable(uri).to_pyarrow_table(columns=["id", "name"]).to_pylist()}


def _staging(uri: str) -> list[str]:
    import os

    folder = os.path.join(uri, STAGING_DIR)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_a_batch_is_merged_once_and_its_replay_skipped(mirror):
    uri, sink = mirror
    changes = [("upsert", {"id": 1, "name": "a"}, 1), ("upsert", {"id": 2, "name": "b"}, 2)]
    sink.commit_batch([_staged(uri, 0, changes)], 0, source=({"t": {"0": 2}}, {}))
    assert _rows(uri) == {1: "a", 2: "b"}
    assert DeltaTable(uri).transaction_version("p-t-0") == 1
    assert _staging(uri) == []  # deleted once merged
    version = DeltaTable(uri).version()
    sink.commit_batch([_staged(uri, 0, changes)], 0, source=({"t": {"0": 2}}, {}))  # the replay
    assert DeltaTable(uri).version() == version and _staging(uri) == []
    # An older change (a replayed one of an earlier batch, in a later batch) never wins.
    later = [("upsert", {"id": 1, "name": "old"}, 0), ("delete", {"id": 2}, 3)]
    sink.commit_batch([_staged(uri, 1, later)], 1, source=({"t": {"0": 4}}, {}))
    assert _rows(uri) == {1: "a"}


def test_a_truncate_alone_deletes_the_older_rows(mirror):
    uri, sink = mirror
    sink.commit_batch(
        [_staged(uri, 0, [("upsert", {"id": 1, "name": "a"}, 1)])], 0, source=({"t": {"0": 1}}, {})
    )
    sink.commit_batch([_staged(uri, 1, [("truncate", None, 5)])], 1, source=({"t": {"0": 2}}, {}))
    assert _rows(uri) == {}
    assert DeltaTable(uri).transaction_version("p-t-0") == 1


def test_tombstones_alone_record_the_progress(mirror):
    uri, sink = mirror
    sink.commit_batch([DeltaCommitMessage([], partition_id=0)], 0, source=({"t": {"0": 3}}, {}))
    assert DeltaTable(uri).transaction_version("p-t-0") == 2


def test_a_new_column_is_added_and_a_value_its_column_cannot_hold_stops_the_batch(mirror):
    uri, sink = mirror
    wider = pa.schema([("id", pa.int32()), ("name", pa.string()), ("age", pa.int64())])
    sink.commit_batch([_staged(uri, 0, [("upsert", {"id": 1, "name": "a", "age": 4}, 1)], wider)], 0,
                      source=({"t": {"0": 1}}, {}))  # fmt: skip
    assert DeltaTable(uri).to_pyarrow_table(columns=["age"]).to_pylist() == [{"age": 4}]
    changed = pa.schema([("id", pa.int32()), ("name", pa.string()), ("age", pa.string())])
    fold = ChangeFold(["id"])  # a task that read the column as text
    fold.add("upsert", ["id"], (2,), {"id": 2, "name": "b", "age": "four"}, 2, changed)
    staged = DeltaCommitMessage(
        [stage(TableFiles.of(uri, mirror_table_schema(SCHEMA)), fold, "part-b000001-k0-a0")]
    )
    version = DeltaTable(uri).version()
    with pytest.raises(MergeError, match=r"cannot be applied to .*A column's type changed in the source"):
        sink.commit_batch([staged], 1, source=({"t": {"0": 2}}, {}))
    assert DeltaTable(uri).version() == version
    assert _rows(uri) == {1: "a"}


def test_the_first_commit_sweeps_staged_files_earlier_attempts_left(mirror):
    uri, sink = mirror
    _staged(uri, 0, [("upsert", {"id": 9, "name": "orphan"}, 1)])  # a failed attempt's file
    _staged(uri, 7, [("upsert", {"id": 9, "name": "later"}, 1)])  # a deleted checkpoint's batch 7
    sink.commit_batch(
        [_staged(uri, 3, [("upsert", {"id": 1, "name": "a"}, 2)])], 3, source=({"t": {"0": 1}}, {})
    )
    assert _staging(uri) == []
    assert _rows(uri) == {1: "a"}
    _staged(uri, 4, [("upsert", {"id": 9, "name": "orphan"}, 1)])  # the sweep runs once per process
    sink.commit_batch(
        [_staged(uri, 4, [("upsert", {"id": 2, "name": "b"}, 3)])], 4, source=({"t": {"0": 2}}, {})
    )
    assert len(_staging(uri)) == 1 and _rows(uri) == {1: "a", 2: "b"}


def test_a_row_older_than_the_tables_last_truncate_is_never_inserted_again(mirror):
    """Kafka orders a topic only within a partition: a change made before a truncate may come in
    a later batch (its partition delivered late). The truncate's sequence stays in the table."""
    from deltaflow.sinks.kafka_mirror import TRUNCATED_PROPERTY

    uri, sink = mirror
    sink.commit_batch(
        [_staged(uri, 0, [("upsert", {"id": 1, "name": "a"}, 10)])], 0, source=({"t": {"0": 1}}, {})
    )
    sink.commit_batch([_staged(uri, 1, [("truncate", None, 20)])], 1, source=({"t": {"1": 1}}, {}))
    assert DeltaTable(uri).metadata().configuration[TRUNCATED_PROPERTY] == "20"
    late = [
        ("upsert", {"id": 2, "name": "made before the truncate"}, 15),
        ("upsert", {"id": 3, "name": "after"}, 25),
    ]
    sink.commit_batch([_staged(uri, 2, late)], 2, source=({"t": {"0": 3}}, {}))
    assert _rows(uri) == {3: "after"}


def test_a_re_created_topic_stops_a_mirror_ordered_by_kafka_offsets(mirror):
    """Offsets of a re-created topic start again below the rows' sequences: the guard would pass
    over every change of a key the mirror holds. A mirror ordered by the database's position
    goes on."""
    from deltaflow.sinks.kafka_mirror import SEQUENCE_PROPERTY

    uri, sink = mirror
    fold = ChangeFold(["id"], SCHEMA)
    fold.add("upsert", ["id"], (1,), {"id": 1, "name": "a"}, 500, offset_sequence=True)
    staged = DeltaCommitMessage(
        [stage(TableFiles.of(uri, mirror_table_schema(SCHEMA)), fold, "part-b000000-k0-a0")]
    )
    sink.commit_batch([staged], 0, source=({"t": {"0": 501}}, {}))
    assert DeltaTable(uri).metadata().configuration[SEQUENCE_PROPERTY] == "kafka-offset"
    went_back = {"t": {"0": {"reason": "went_back", "stored": 501, "restart": 0}}}
    version = DeltaTable(uri).version()
    with pytest.raises(
        MergeError, match=r"t\[0\] \(from offset 501 to 0\) went back: the topic was re-created"
    ):
        sink.commit_batch(
            [_staged(uri, 1, [("upsert", {"id": 1, "name": "b"}, 3)])], 1, source=({"t": {"0": 4}}, went_back)
        )
    assert DeltaTable(uri).version() == version


def test_a_mirror_ordered_by_the_databases_position_goes_on_past_a_re_created_topic(tmp_path):
    uri = str(tmp_path / "m")
    commit.create_table(uri, mirror_table_schema(SCHEMA), partition_by=[], properties={}, storage_options={})
    sink = KafkaMirrorSink(SinkOptions(table_uri=uri, pipeline_id="p", kafka_offsets=True))
    sink.commit_batch(
        [_staged(uri, 0, [("upsert", {"id": 1, "name": "a"}, 1 << 70)])], 0, source=({"t": {"0": 501}}, {})
    )
    went_back = {"t": {"0": {"reason": "went_back", "stored": 501, "restart": 0}}}
    later = [("upsert", {"id": 1, "name": "b"}, (1 << 70) + 1)]
    sink.commit_batch([_staged(uri, 1, later)], 1, source=({"t": {"0": 1}}, went_back))
    assert _rows(uri) == {1: "b"}

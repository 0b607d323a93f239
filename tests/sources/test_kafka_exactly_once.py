"""Kafka -> Delta exactly once with the progress in the Delta log: crashes at each step of the
commit sequence, then a deleted Spark checkpoint, against a real broker."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.jobs import run_job

PARTITIONS = 3
MESSAGES = 900  # 300 per micro-batch: 3 batches


def _run(kafka, topic, table, checkpoint, write_path, crash_at=None):
    return run_job(
        "kafka_job", kafka.bootstrap, topic, str(table), str(checkpoint), write_path, crash_at=crash_at
    )


def _assert_exactly_once(table: Path, topic: str, produced: int) -> None:
    delta = DeltaTable(str(table))
    data = delta.to_pyarrow_table()
    values = sorted(int(v) for v in data["value"].to_pylist())
    assert values == list(range(produced))
    coords = set(zip(data["partition"].to_pylist(), data["offset"].to_pylist(), strict=True))
    assert len(coords) == produced
    for p in range(PARTITIONS):
        last = max(o for q, o in coords if q == p)
        assert delta.transaction_version(f"kafka-crash-{topic}-{p}") == last  # progress in the log
    assert delta.transaction_version("kafka-crash") is None  # no batch-id txn: no checkpoint tie


# The crash points where progress kept in the log (per partition, not per batch) decides: a
# batch written but not in the log, and one in the log that Spark has not recorded. The spark
# path differs only in how files are written, so it keeps the point where a replay meets its
# commit. A crash in a later batch's write is the first case again (nothing of it in the log):
# tests/integration/test_exactly_once.py kills there, and tests/sources/test_kafka_ingest.py
# in a task. After the crash and the restart, the after-commit cases lose their Spark
# checkpoint (a new machine, or a lost volume) and go on from the table's progress.
@pytest.mark.parametrize(
    ("write_path", "crash_at"),
    [
        ("arrow", "before_commit:1"),
        ("arrow", "after_commit:1"),
        ("spark", "after_commit:1"),
    ],
    ids=["arrow-before-commit", "arrow-after-commit", "spark-after-commit"],
)
def test_kill_and_restart_is_exactly_once(kafka, tmp_path, write_path, crash_at):
    topic = kafka.create_topic(partitions=PARTITIONS)
    kafka.produce(topic, [str(i).encode() for i in range(MESSAGES)], partitions=PARTITIONS)
    table, checkpoint = tmp_path / "t", tmp_path / "cp"

    crashed = _run(kafka, topic, table, checkpoint, write_path, crash_at)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    restarted = _run(kafka, topic, table, checkpoint, write_path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    _assert_exactly_once(table, topic, MESSAGES)
    if not crash_at.startswith("after_commit"):
        return

    shutil.rmtree(checkpoint)  # the checkpoint is lost: the table's progress is all there is
    kafka.produce(topic, [str(i).encode() for i in range(MESSAGES, MESSAGES + 300)], partitions=PARTITIONS)
    again = _run(kafka, topic, table, tmp_path / "new-cp", write_path)
    assert again.returncode == 0, again.stderr[-3000:]
    _assert_exactly_once(table, topic, MESSAGES + 300)

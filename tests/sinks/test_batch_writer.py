"""``deltaflow.sinks.batch_writer``: the ``foreachBatch`` writer (step 0, then the sink's steps 1-5)."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltaflow.config.sink import SinkOptions
from deltaflow.sinks.batch_writer import SparkBatchWriter
from tests.fixtures.frames import df as _df
from tests.fixtures.frames import ids as _ids
from tests.fixtures.tables import data_files


def _table_files(root: Path) -> list[str]:
    return [p.name for p in data_files(root)]


def test_spark_path_writes_nothing_for_a_replay_and_stages_per_writer(spark, tmp_path):
    uri = str(tmp_path / "t")
    options = SinkOptions.build({"table_uri": uri, "pipeline_id": "bw", "write_path": "spark"})
    writer = SparkBatchWriter(options)
    writer(_df(spark, 0, 10).coalesce(1), 0)
    writer(_df(spark, 10, 10).coalesce(1), 1)
    files = _table_files(tmp_path / "t")
    assert files and all(name.startswith(("part-b000000-", "part-b000001-")) for name in files)

    writer(_df(spark, 100, 10), 1)  # Spark replays batch 1 (here with other rows: none may land)
    assert _table_files(tmp_path / "t") == files  # step 0: nothing written at all
    assert _ids(uri) == list(range(20))

    other = SparkBatchWriter(options)  # a second process (or a zombie) of the same pipeline
    other(_df(spark, 20, 5).coalesce(1), 2)
    staging = tmp_path / "t" / "_deltaflow" / "staging" / "bw"
    assert len([p for p in staging.iterdir() if p.is_dir()]) == 2  # one folder per writer
    assert _ids(uri) == list(range(25))
    assert DeltaTable(uri).transaction_version("bw") == 2


def test_arrow_path_through_foreach_batch_commits_each_batch_once(spark, tmp_path):
    uri = str(tmp_path / "t")
    options = SinkOptions.build({"table_uri": uri, "pipeline_id": "ab", "write_path": "arrow"})
    writer = SparkBatchWriter(options)
    for batch_id in (0, 1, 1, 2):  # batch 1 replayed
        writer(_df(spark, batch_id * 10, 10), batch_id)
    assert _ids(uri) == list(range(30))
    history = [h for h in DeltaTable(uri).history() if h.get("deltaflow.epoch") is not None]
    assert sorted(h["deltaflow.epoch"] for h in history) == [0, 1, 2]


def test_a_taken_over_writer_stops_before_it_skips_or_misreads_a_batch(spark, tmp_path):
    # Step 0 checks the fence before the replay check: the older writer's next batch is one
    # the newer writer committed (a replay to skip) or older than the table's txn (otherwise
    # read as a lost checkpoint); either way it stops as taken over, having written nothing.
    from deltaflow.delta import commit
    from deltaflow.errors import WriterFencedError

    uri = str(tmp_path / "t")
    base = SinkOptions.build({"table_uri": uri, "pipeline_id": "bw", "write_path": "spark"})
    SparkBatchWriter(base)(_df(spark, 0, 10).coalesce(1), 0)
    old = base.model_copy(update={"writer_epoch": commit.claim_writer(uri, {}, "bw").epoch})
    new = base.model_copy(update={"writer_epoch": commit.claim_writer(uri, {}, "bw").epoch})
    SparkBatchWriter(new)(_df(spark, 10, 10).coalesce(1), 1)
    SparkBatchWriter(new)(_df(spark, 20, 10).coalesce(1), 2)
    files = _table_files(tmp_path / "t")
    for batch_id in (2, 1):  # a replay of the newer writer's batch; a batch older than its txn
        with pytest.raises(WriterFencedError, match="writer epoch 2"):
            SparkBatchWriter(old)(_df(spark, 20, 10).coalesce(1), batch_id)
    assert _table_files(tmp_path / "t") == files
    assert _ids(uri) == list(range(30))


def _when_task_0_staged(spark, uri: str, act, marker: Path):
    """A batch of two tasks (ids 0-99 and 100-199) whose second task, before it ends, waits for
    the first task's staged file and calls ``act(path)`` once (``marker`` records that it did):
    something deleting files beside a running batch, at the moment it hurts."""
    staging = Path(uri) / "_deltaflow" / "staging"

    def hold(batches):
        import time

        from pyspark import TaskContext

        yield from batches
        if TaskContext.get().partitionId() != 1 or marker.exists():
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = [
                p
                for p in staging.rglob("part-00000-*.parquet")
                if "/_temporary/0/_temporary/" not in p.as_posix()  # committed by its task
            ]
            if done:
                marker.write_text(act(done[0]))
                return
            time.sleep(0.05)

    return spark.range(0, 200, 1, 2).mapInArrow(hold, "id LONG").selectExpr("id", "concat('n', id) AS name")


def _claimed(uri: str, pipeline_id: str) -> SinkOptions:
    from deltaflow.delta import commit

    base = SinkOptions.build({"table_uri": uri, "pipeline_id": pipeline_id, "write_path": "spark"})
    SparkBatchWriter(base)(_df(spark_session(), 1000, 1).coalesce(1), 0)
    return base.model_copy(update={"writer_epoch": commit.claim_writer(uri, {}, pipeline_id).epoch})


def spark_session():
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def test_vacuum_full_beside_a_running_batch_keeps_its_staged_files(spark, tmp_path):
    # deltaflow vacuum --full --retention-hours 0 --force --execute in a loop beside a stream
    # deleted the running batch's staged files; the batch then committed without their rows.
    import json

    from deltaflow import ops

    uri = str(tmp_path / "t")
    writer = SparkBatchWriter(_claimed(uri, "bw"))
    marker = tmp_path / "vacuumed"

    def vacuum(_: Path) -> str:
        result = ops.vacuum(uri, retention_hours=0, force=True, full=True, dry_run=False)
        return json.dumps({"deleted": result.staging_files, "kept": getattr(result, "kept_staging", 0)})

    writer(_when_task_0_staged(spark, uri, vacuum, marker), 1)
    assert _ids(uri) == [*range(200), 1000]
    assert DeltaTable(uri).transaction_version("bw") == 1
    vacuumed = json.loads(marker.read_text())
    assert vacuumed["deleted"] == [] and vacuumed["kept"] >= 1  # the staged files (.crc files too)


def test_a_batch_whose_staged_files_vanished_fails_and_is_written_again(spark, tmp_path):
    # Files deleted under the writer (another tool, an older vacuum) must fail the batch: its
    # commit would hold only the rows that are left, and Spark would record it as done.
    from deltaflow import errors

    uri = str(tmp_path / "t")
    writer = SparkBatchWriter(_claimed(uri, "bw"))
    marker = tmp_path / "deleted"

    def delete(path: Path) -> str:
        path.unlink()
        return str(path)

    batch = _when_task_0_staged(spark, uri, delete, marker)
    with pytest.raises(errors.TransientError, match=r"tasks wrote 200 row\(s\) .* hold 100") as failed:
        writer(batch, 1)
    assert marker.exists() and type(failed.value).__name__ == "WrittenFilesLostError"
    assert DeltaTable(uri).transaction_version("bw") == 0  # nothing of batch 1 committed
    assert not [f for f in _table_files(tmp_path / "t") if f.startswith("part-b000001-")]  # no orphans

    writer(batch, 1)  # Spark runs the batch again (the daemon restarts on a transient error)
    assert _ids(uri) == [*range(200), 1000]
    assert DeltaTable(uri).transaction_version("bw") == 1


def test_vacuum_full_between_the_move_and_the_commit_never_stops_the_stream(spark, tmp_path):
    # Review 29: the staged files are kept for a live claim, but once step 0 moved them into the
    # table they wait for their commit as never-referenced files of the table root (Spark's
    # mtime), which vacuum --full deletes. `deltaflow ingest` reads the whole batch again for its
    # dead letters in that window (write_files, dead letters, commit). The batch must land, or
    # fail transiently and land when written again; a terminal error stops the daemon.
    from deltaflow import ops
    from deltaflow.errors import TransientError

    uri = str(tmp_path / "t")
    writer = SparkBatchWriter(_claimed(uri, "bw"))
    batch = _df(spark, 0, 50).coalesce(1)
    pending = writer.write_files(batch, 1)
    assert pending is not None
    ops.vacuum(uri, retention_hours=0, force=True, full=True, dry_run=False)
    try:
        writer.commit(pending)
    except TransientError:
        writer(batch, 1)  # the daemon restarts the query, Spark runs the batch again
    assert _ids(uri) == [*range(50), 1000]
    assert DeltaTable(uri).transaction_version("bw") == 1


def test_vacuum_full_beside_a_running_arrow_batch_never_stops_the_stream(spark, tmp_path):
    # Review 29: the arrow way writes each task's files straight into the table root, where they
    # wait unreferenced until the whole batch is committed; vacuum --full (retention 0, forced)
    # run beside the batch, once its first task's file is there, deletes it.
    from deltaflow import ops
    from deltaflow.delta import commit
    from deltaflow.errors import TransientError

    uri = str(tmp_path / "t")
    base = SinkOptions.build({"table_uri": uri, "pipeline_id": "aw", "write_path": "arrow"})
    SparkBatchWriter(base)(_df(spark, 1000, 1).coalesce(1), 0)
    options = base.model_copy(update={"writer_epoch": commit.claim_writer(uri, {}, "aw").epoch})
    writer = SparkBatchWriter(options)
    marker = tmp_path / "vacuumed"
    root = Path(uri)

    def hold(batches):
        import time

        from pyspark import TaskContext

        yield from batches
        if TaskContext.get().partitionId() != 1 or marker.exists():
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if list(root.glob("part-b000001-p00000-*.parquet")):
                result = ops.vacuum(uri, retention_hours=0, force=True, full=True, dry_run=False)
                marker.write_text("\n".join(result.files))
                return
            time.sleep(0.05)

    batch = spark.range(0, 200, 1, 2).mapInArrow(hold, "id LONG").selectExpr("id", "concat('n', id) AS name")
    try:
        writer(batch, 1)
    except TransientError:
        writer(batch, 1)
    assert marker.exists()
    assert _ids(uri) == [*range(200), 1000]
    assert DeltaTable(uri).transaction_version("aw") == 1


_CONNECT_LOST_CHECKPOINT = """
import os, shutil, sys
import deltaflow
from pyspark.sql import SparkSession

root = sys.argv[1]
spark = SparkSession.builder.remote("local[2]").getOrCreate()
landing = os.path.join(root, "landing")
uri = os.path.join(root, "t")

def run():
    query = deltaflow.write_stream(
        spark.readStream.schema("id LONG, name STRING").json(landing),
        uri, pipeline_id="p1", trigger={"availableNow": True}, write_path="spark",
    )
    try:
        query.awaitTermination(180)
    except Exception as exc:  # Spark Connect raises the query's failure here
        return exc
    return query.exception()

assert run() is None
shutil.rmtree(os.path.join(uri, "_deltaflow", "checkpoints", "p1"))
with open(os.path.join(landing, "f1.json"), "w") as f:
    f.write('{"id": 1000, "name": "late"}\\n')
error = run()
spark.stop()
print("ERROR:", error)
"""


def test_a_lost_checkpoint_after_one_batch_over_spark_connect_is_refused(tmp_path, connect_server_turn):
    # Review 29: over Spark Connect a foreachBatch function's DataFrame has no SparkContext, so
    # the writer knew no query id, recorded no checkpoint mark and checked none: the new
    # checkpoint's batch 0 (every file, the new row 1000 too) was skipped as a replay, exit 0.
    import os
    import subprocess
    import sys

    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "f0.json").write_text("".join(f'{{"id": {i}, "name": "n{i}"}}\n' for i in range(10)))
    job = tmp_path / "job.py"
    job.write_text(_CONNECT_LOST_CHECKPOINT)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(job), str(tmp_path)], env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert DeltaTable(str(tmp_path / "t")).transaction_version("deltaflow-checkpoint:p1") is not None
    assert "CheckpointMismatchError" in done.stdout, done.stdout[-2000:]
    assert _ids(str(tmp_path / "t")) == list(range(10))

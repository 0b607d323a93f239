"""Auto-compaction: a running stream keeps its partitions' file count bounded, and no stream
commit fails or loses a row while compactions commit beside it."""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

import deltaflow
from deltaflow.metrics import metrics
from deltaflow.ops import compaction
from deltaflow.ops.compaction import AutoCompactor, CompactionPolicy
from tests.fixtures.tables import data_files


def _files_per_day(uri: str) -> dict[str, int]:
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    out: dict[str, int] = {}
    for a in adds:
        out[a["partition.day"]] = out.get(a["partition.day"], 0) + 1
    return out


def test_compactor_compacts_only_partitions_over_the_threshold(tmp_path):
    uri = str(tmp_path / "t")
    for b in range(6):
        day = "a" if b < 5 else "b"  # 5 small files in a, 1 in b
        write_deltalake(
            uri,
            pa.table({"id": [b], "day": [day]}),
            partition_by=["day"],
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction("pipe", b)]),
        )
    compactor = AutoCompactor(uri, {}, CompactionPolicy(min_files=5, target_bytes=1024**2), pipeline="pipe")
    compactor.after_commit([{"day": "a"}, {"day": "b"}])
    assert compactor.wait_idle(60)
    assert _files_per_day(uri) == {"a": 1, "b": 1}
    assert (compactor.compactions, compactor.failures) == (1, 0)
    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(6))
    assert table.transaction_version("pipe") == 5
    assert table.history(1)[0]["operation"] == "OPTIMIZE"
    # Below the threshold again: nothing to do.
    compactor.after_commit([{"day": "a"}])
    assert compactor.wait_idle(60) and compactor.compactions == 1
    compactor.close()


@pytest.fixture
def compactor_loads(monkeypatch) -> list[str]:
    """The tables the compactor's counts load (a compaction's own commit loads the table too:
    not listed)."""
    import inspect

    from deltaflow.delta import log as delta_log

    loads: list[str] = []
    real = delta_log.load

    def load(u, so):
        if inspect.stack()[1].function == "_compact_due":
            loads.append(u)
        return real(u, so)

    monkeypatch.setattr(delta_log, "load", load)
    return loads


def test_the_compactor_loads_the_table_only_when_a_partition_can_be_due(tmp_path, compactor_loads):
    # With hundreds of tables a batch, a load per table and commit was the commit phase's
    # background cost: it counts again only when the files committed since could reach min_files.
    uri = str(tmp_path / "t")
    counts = compactor_loads
    compactor = AutoCompactor(uri, {}, CompactionPolicy(min_files=4, target_bytes=1024**2))
    seen = []
    for b in range(7):
        write_deltalake(uri, pa.table({"id": [b]}), mode="append")
        compactor.after_commit([{}])
        assert compactor.wait_idle(60)
        seen.append((len(counts), compactor.compactions))
    # Counted at the first commit (1 small file), due at the 4th, counted afresh after the
    # compaction (2 files), due again at the 7th.
    assert seen == [(1, 0), (1, 0), (1, 0), (2, 1), (3, 1), (3, 1), (4, 2)]
    table = DeltaTable(uri)
    assert len(table.file_uris()) == 1
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(7))
    compactor.close()


def test_the_compactor_counts_from_the_table_its_commit_loaded(tmp_path, compactor_loads):
    # At a stream's first batch every table's compactor counts; it reads the table the sink
    # loaded for the commit (plus the commit's small files) instead of loading it again.
    uri = str(tmp_path / "t")
    loads = compactor_loads
    write_deltalake(uri, pa.table({"id": [0]}), mode="append")  # one small file already
    compactor = AutoCompactor(uri, {}, CompactionPolicy(min_files=3, target_bytes=1024**2))

    def commit(ids, *, small=True, between=False):
        loaded = DeltaTable(uri)  # what the sink's step 2 loads
        if between:  # another writer's commit after that load
            write_deltalake(uri, pa.table({"id": [-1]}), mode="append")
        write_deltalake(uri, pa.table({"id": ids}), mode="append")
        version = DeltaTable(uri).version()
        compactor.after_commit([{}], loaded=loaded, version=version, small=[{}] if small else [])
        assert compactor.wait_idle(60)

    commit([1])  # counted from the loaded table: 1 + this commit's 1 = 2 of 3
    assert (len(loads), compactor.compactions) == (0, 0)
    commit([2], small=False)  # a file the sink says is not small: still 2
    assert (len(loads), compactor.compactions) == (0, 0)
    commit([3])  # 3 small files: compacted, without a load
    assert (len(loads), compactor.compactions) == (0, 1)
    # (delta-rs bin-packs every file below the target: the one the sink called not small too.)
    assert len(DeltaTable(uri).file_uris()) == 1
    commit([4], between=True)  # counted afresh, but a commit came between: a load
    assert len(loads) == 1
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [-1, 0, 1, 2, 3, 4]
    compactor.close()


def test_the_scheduled_vacuum_deletes_replaced_files_whose_tombstones_a_checkpoint_dropped(tmp_path):
    # A checkpoint keeps no tombstone past the retention; the files they named are then in no
    # log entry at all, and a vacuum of tombstoned files only (delta-rs' lite) left them for good.
    import os

    from deltaflow.ops.checkpoint import checkpoint

    uri = str(tmp_path / "t")
    for b in range(3):
        write_deltalake(uri, pa.table({"id": [b]}), mode="append")
    old = time.time() - 2 * 3600  # written two hours ago: past the in-flight guard of vacuum --full
    for path in data_files(tmp_path / "t"):
        os.utime(path, (old, old))
    table = DeltaTable(uri)
    table.alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 0 seconds"})
    table.optimize.compact()  # 3 files replaced by 1
    checkpoint(uri)  # drops the tombstones: their retention is over
    assert not DeltaTable(uri).vacuum(retention_hours=0, enforce_retention_duration=False)  # lite: none
    compactor = AutoCompactor(
        uri, {}, CompactionPolicy(min_files=50, target_bytes=1024**2, vacuum_interval_s=0.2)
    )
    compactor.after_commit([{}])
    deadline = time.monotonic() + 60
    while len(data_files(tmp_path / "t")) > 1:
        assert time.monotonic() < deadline, data_files(tmp_path / "t")
        time.sleep(0.2)  # condition poll: the vacuum runs in the compactor's thread
    assert compactor.vacuums >= 1
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2]
    compactor.close()


def _checkpoints(uri: str) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (Path(uri) / "_delta_log").glob("*.checkpoint.parquet"))


def test_the_compactor_writes_a_log_checkpoint_every_ten_commits(tmp_path):
    # A load replays the commits since the last checkpoint, and a stream loads its table for
    # every commit: delta-rs' hook checkpoints every 100 commits, the compactor every 10.
    uri = str(tmp_path / "t")
    compactor = AutoCompactor(uri, {}, CompactionPolicy(min_files=1000, target_bytes=1024**2))
    for b in range(35):
        write_deltalake(uri, pa.table({"id": [b]}), mode="append")
        compactor.after_commit([{}], version=b)
        assert compactor.wait_idle(60)
    first = zlib.crc32(uri.encode()) % compaction.CHECKPOINT_EVERY  # staggered by the table's name
    assert _checkpoints(uri) == [first, first + 10, first + 20] + ([first + 30] if first + 30 < 35 else [])
    assert compactor.checkpoints == len(_checkpoints(uri))
    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(35))
    compactor.close()


def test_a_table_that_sets_its_checkpoint_interval_keeps_it(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": [0]}), configuration={"delta.checkpointInterval": "100"})
    compactor = AutoCompactor(uri, {}, CompactionPolicy(min_files=1000, target_bytes=1024**2))
    for b in range(1, 25):
        write_deltalake(uri, pa.table({"id": [b]}), mode="append")
        compactor.after_commit([{}], version=b)
        assert compactor.wait_idle(60)
    assert _checkpoints(uri) == []
    assert compactor.checkpoints == 0
    compactor.close()


def test_unpartitioned_table_is_compacted_as_a_whole(tmp_path):
    uri = str(tmp_path / "t")
    for b in range(3):
        write_deltalake(uri, pa.table({"id": [b]}), mode="append")
    compactor = AutoCompactor(uri, {}, CompactionPolicy(min_files=3, target_bytes=1024**2))
    compactor.after_commit([{}])
    assert compactor.wait_idle(60)
    assert len(DeltaTable(uri).file_uris()) == 1
    compactor.close()


def _scrape(name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_a_running_stream_stays_compacted_without_a_failed_commit(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    batches, rows = 24, 20
    for f in range(batches):
        lines = [json.dumps({"id": f * rows + i, "day": f"2026-11-{20 + i % 2}"}) for i in range(rows)]
        (landing / f"f{f:03d}.json").write_text("\n".join(lines) + "\n")
    uri = str(tmp_path / "t")
    labels = {"pipeline": "compacted", "table": uri}
    source = spark.readStream.schema("id LONG, day STRING").option("maxFilesPerTrigger", 1).json(str(landing))
    query = deltaflow.write_stream(
        source,
        uri,
        pipeline_id="compacted",
        checkpoint_location=str(tmp_path / "cp"),
        partition_columns=["day"],
        auto_compact_min_files=4,
        vacuum_interval_hours=0.0005,  # every 1.8 s; the retention below lets it delete at once
        # With a retention this short, a log checkpoint drops the tombstones at once, and vacuum
        # --full keeps unreferenced files younger than an hour (a writer's, in flight): the
        # table keeps delta-rs' interval of 100, so no checkpoint comes in these 24 batches.
        table_properties={
            "delta.deletedFileRetentionDuration": "interval 0 seconds",
            "delta.checkpointInterval": "100",
        },
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    (compactor,) = [c for c in compaction.compactors() if c.table_uri == uri]
    assert compactor.wait_idle(120)

    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(batches * rows))
    assert table.transaction_version("compacted") == batches - 1
    epochs = [h["deltaflow.epoch"] for h in table.history() if h.get("deltaflow.pipeline_id") == "compacted"]
    assert sorted(epochs) == list(range(batches))  # every batch committed once
    optimizes = [h for h in table.history() if h["operation"] == "OPTIMIZE"]
    assert len(optimizes) >= 2 * (batches // 4 - 1)
    # Without compaction: 48 files (one per day per batch). With it, fewer than 4 per day.
    assert all(n < 4 for n in _files_per_day(uri).values()), _files_per_day(uri)
    assert compactor.failures == 0
    assert _scrape("deltaflow_sink_commits_failed_total", **labels) == 0
    assert _scrape("deltaflow_compaction_runs_total", outcome="success", **labels) == compactor.compactions
    assert _scrape("deltaflow_table_files", **labels) > 0
    # The scheduled vacuum deletes the files compaction replaced: on disk = in the table.
    live = {Path(u.removeprefix("file://")) for u in DeltaTable(uri).file_uris()}
    deadline = time.monotonic() + 60
    while set(data_files(Path(uri))) != live:
        assert time.monotonic() < deadline, "the scheduled vacuum did not run within 60 s"
        time.sleep(0.5)  # condition poll: the vacuum runs in the compactor's thread
    assert compactor.vacuums >= 1
    assert _scrape("deltaflow_vacuum_files_deleted_total", **labels) >= 2 * (batches - 3)
    compactor.close()


def _one_row_files(spark, tmp_path, count: int):
    """A stream of ``count`` micro-batches of one row each (ids 0..count-1)."""
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in range(count):
        (landing / f"f{f}.json").write_text(json.dumps({"id": f}) + "\n")
    return spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(landing))


def test_auto_compact_can_be_turned_off(spark, tmp_path):
    source = _one_row_files(spark, tmp_path, 5)
    uri = str(tmp_path / "t")
    query = deltaflow.write_stream(
        source,
        uri,
        pipeline_id="plain",
        checkpoint_location=str(tmp_path / "cp"),
        auto_compact=False,
        auto_compact_min_files=2,
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert not [c for c in compaction.compactors() if c.table_uri == uri]
    assert len(DeltaTable(uri).file_uris()) == 5


def test_the_format_entry_point_compacts_in_its_commit_process(spark, tmp_path):
    source = _one_row_files(spark, tmp_path, 6)
    uri = str(tmp_path / "t")
    deltaflow.register(spark)
    query = (
        source.writeStream.format("deltaflow")
        .option("table_uri", uri)
        .option("pipeline_id", "fmt")
        .option("auto_compact_min_files", 3)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        query.processAllAvailable()
        deadline = time.monotonic() + 60
        while not [h for h in DeltaTable(uri).history() if h["operation"] == "OPTIMIZE"]:
            assert time.monotonic() < deadline, "no compaction within 60 s"
            time.sleep(0.2)
    finally:
        query.stop()
    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(6))
    assert table.transaction_version("fmt") == 5
    assert len(table.file_uris()) < 6


def test_a_count_after_a_compaction_does_not_read_a_table_loaded_before_it(tmp_path, monkeypatch):
    # A commit lands while the compactor compacts its partition: the sink's load predates the
    # compaction's commit. Counting from that load found the files just compacted away, and
    # compacted the partition again at once (a second rewrite of the hot partition).
    import threading

    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": [0]}), mode="append")
    compactor = AutoCompactor(uri, {}, CompactionPolicy(min_files=3, target_bytes=1024**2))
    started, go = threading.Event(), threading.Event()
    real = AutoCompactor._compact

    def held(self, key, small_files):  # the compaction runs while the stream commits
        started.set()
        assert go.wait(60)
        real(self, key, small_files)

    monkeypatch.setattr(AutoCompactor, "_compact", held)

    def commit(i):
        loaded = DeltaTable(uri)  # the sink's step 2
        write_deltalake(uri, pa.table({"id": [i]}), mode="append")
        compactor.after_commit([{}], loaded=loaded, version=DeltaTable(uri).version(), small=[{}])

    commit(1)
    commit(2)  # 3 small files: the compaction starts
    assert started.wait(60)
    commit(3)  # loaded before the compaction commits, committed before it
    go.set()
    assert compactor.wait_idle(60)
    assert compactor.compactions == 1
    table = DeltaTable(uri)
    assert [h["operation"] for h in table.history()].count("OPTIMIZE") == 1
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2, 3]
    compactor.close()


def test_the_files_gauge_counts_every_file_of_the_commit_counted_from(tmp_path):
    # A count from the sink's load adds the commit's files to the table's: all of them, not
    # only its small ones (the gauge read 1 for a table of 2 files).
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": [0]}), mode="append")
    compactor = AutoCompactor(uri, {}, CompactionPolicy(min_files=3, target_bytes=1024**2), pipeline="g")
    loaded = DeltaTable(uri)
    write_deltalake(uri, pa.table({"id": [1]}), mode="append")
    compactor.after_commit([{}], loaded=loaded, version=DeltaTable(uri).version(), small=[])
    assert compactor.wait_idle(60)
    assert _scrape("deltaflow_table_files", pipeline="g", table=uri) == len(DeltaTable(uri).file_uris()) == 2
    compactor.close()

"""``deltaflow.pipeline.watch_files``: Parquet files landing in a folder registered in place by a
Spark streaming query, each exactly once."""

from __future__ import annotations

import logging
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from deltaflow import ops
from deltaflow.config.pipeline import load_pipelines
from deltaflow.delta import commit
from deltaflow.io.faults import lose_commit_responses
from deltaflow.io.storage import filesystem
from deltaflow.ops.compaction import CompactionPolicy, compactors
from deltaflow.pipeline.runner import describe_source
from deltaflow.pipeline.watch_files import start_watch
from deltaflow.service.daemon import run_pipelines


def _land(folder, name: str, ids: range) -> None:
    """Write elsewhere, then rename into the folder: the file appears complete."""
    final = folder / name
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{final.name}.tmp"
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), tmp)
    os.replace(tmp, final)


def test_files_landing_in_the_table_are_registered_once_per_batch(spark, tmp_path, caplog):
    table = tmp_path / "events"
    checkpoint = str(tmp_path / "checkpoint")
    _land(table, "day=1/a.parquet", range(0, 10))
    _land(table, "day=12%3A30/b.parquet", range(10, 20))

    def run() -> None:
        query = start_watch(
            spark,
            table_uri=str(table),
            path=str(table),
            pipeline_id="landing",
            checkpoint_location=checkpoint,
            available_now=True,
        )
        query.awaitTermination()
        assert query.exception() is None

    run()
    delta = DeltaTable(str(table))
    assert delta.version() == 0
    assert delta.transaction_version("landing") == 0
    assert sorted(delta.to_pyarrow_table()["id"].to_pylist()) == list(range(20))

    # New files (one whose commit response is lost), and the log's checkpoint files: only the data counts.
    _land(table, "day=2/c.parquet", range(20, 30))
    with lose_commit_responses("add files", times=1) as lost:
        run()
    assert len(lost.lost) == 1
    _land(table, "day=3/d.parquet", range(30, 40))
    ops.checkpoint(str(table))  # _delta_log/...checkpoint.parquet: below the watched root, no data
    run()
    # Killed after the commit, before Spark recorded the batch: Spark replays batch 2 with the
    # same files, which are all in the table already.
    for name in ("2", ".2.crc"):
        os.remove(os.path.join(checkpoint, "commits", name))
    with caplog.at_level(logging.INFO, logger="deltaflow.pipeline.watch_files"):
        run()
    assert "pipeline 'landing' batch 2: 0 file(s) (0 rows)" in caplog.text  # replayed, skipped
    assert "1 already there" in caplog.text

    delta = DeltaTable(str(table))
    assert delta.version() == 2
    assert delta.transaction_version("landing") == 2
    assert sorted(delta.to_pyarrow_table()["id"].to_pylist()) == list(range(40))
    added = [e.added for e in commit.read_entries(str(table), {}, 0, delta.version())]
    assert added == [
        {"day=1/a.parquet", "day=12%3A30/b.parquet"},
        {"day=2/c.parquet"},
        {"day=3/d.parquet"},
    ]
    assert {a for a in pa.table(delta.get_add_actions(flatten=True))["partition.day"].to_pylist()} == {
        "1",
        "12:30",
        "2",
        "3",
    }


def test_a_yaml_parquet_files_pipeline_copies_files_landing_outside_the_table(spark, tmp_path):
    landing = tmp_path / "landing"
    table = tmp_path / "table"
    _land(landing, "region=eu west/a.parquet", range(0, 5))
    path = tmp_path / "p.yaml"
    path.write_text(
        f"""
pipelines:
  - id: landed
    source: {{type: parquet-files, path: "{landing}", copy: true, max_files_per_trigger: 1}}
    sinks:
      - table_uri: "{table}"
"""
    )
    specs = load_pipelines(path).pipelines
    # copy: true copies these files (outside the table) below it: not "registered in place"
    how = "copied below the table where outside it, then registered"
    assert describe_source(specs[0]) == f"parquet files landing in {landing} ({how})"
    in_place = specs[0].model_copy(update={"source": specs[0].source.model_copy(update={"copy_": False})})
    assert describe_source(in_place) == f"parquet files landing in {landing} (registered in place)"
    run_pipelines(spark, specs, available_now=True)
    _land(landing, "region=us/b.parquet", range(5, 10))
    _land(landing, "region=us/c.parquet", range(10, 15))
    summaries = run_pipelines(spark, specs, available_now=True)

    assert summaries["landed"].batches == 2  # one file per trigger
    assert (summaries["landed"].messages, summaries["landed"].unit) == (2, "file(s)")
    assert summaries["landed"].committed == {str(table): 10}  # rows registered, not files
    delta = DeltaTable(str(table))
    assert delta.version() == 2
    assert sorted(delta.to_pyarrow_table()["id"].to_pylist()) == list(range(15))
    assert (table / "region=eu west" / "a.parquet").exists()  # the copy
    assert (landing / "region=eu west" / "a.parquet").exists()  # the original stays


def test_a_watch_compacts_and_after_a_lost_checkpoint_registers_nothing_again(spark, tmp_path):
    table = tmp_path / "t"
    checkpoint = tmp_path / "checkpoint"
    for i in range(3):
        _land(table, f"day=1/f{i}.parquet", range(5 * i, 5 * i + 5))

    def run() -> None:
        query = start_watch(
            spark,
            table_uri=str(table),
            path=str(table),
            pipeline_id="compacting",
            checkpoint_location=str(checkpoint),
            available_now=True,
            max_files_per_trigger=1,
            compaction=CompactionPolicy(min_files=3, target_bytes=1024**2),
        )
        query.awaitTermination()
        assert query.exception() is None
        assert all(c.wait_idle(60) for c in compactors())

    run()
    delta = DeltaTable(str(table))
    assert delta.history(1)[0]["operation"] == "OPTIMIZE"  # after the third file
    assert len(delta.file_uris()) == 1
    # The checkpoint is lost: Spark lists every file again, the originals no longer active.
    shutil.rmtree(checkpoint)
    _land(table, "day=1/f3.parquet", range(15, 20))
    run()
    delta = DeltaTable(str(table))
    assert sorted(delta.to_pyarrow_table()["id"].to_pylist()) == list(range(20))
    assert len(delta.file_uris()) == 2  # the compacted file and f3: nothing registered again
    # The file the compaction wrote is replaced in turn: the log named it, it is not offered.
    delta.optimize.compact()
    run()
    delta = DeltaTable(str(table))
    assert sorted(delta.to_pyarrow_table()["id"].to_pylist()) == list(range(20))
    # Vacuum keeps the compacted originals (the user's files), deletes the table's own file.
    kept = ops.vacuum(str(table), retention_hours=0, force=True, dry_run=False)
    assert (len(kept.files), kept.kept_registered) == (1, 4)
    assert kept.files[0].startswith("day=1/part-")
    assert all((table / "day=1" / f"f{i}.parquet").exists() for i in range(4))


def test_files_landing_in_an_s3_prefix_are_registered_once_each(spark, s3, tmp_path):
    uri = s3.uri("watch")
    fs, root = filesystem(uri, s3.storage_options)
    checkpoint = tmp_path / "checkpoint"

    def land(name: str, ids: range) -> None:
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), f"{root}/{name}", filesystem=fs)

    def run() -> None:
        query = start_watch(
            spark,
            table_uri=uri,
            path=uri,
            pipeline_id="s3-watch",
            checkpoint_location=str(checkpoint),
            storage_options=s3.storage_options,
            available_now=True,
            max_files_per_trigger=2,
        )
        query.awaitTermination()
        assert query.exception() is None

    for i in range(3):
        land(f"day={i % 2}/f{i}.parquet", range(5 * i, 5 * i + 5))
    run()
    delta = DeltaTable(uri, storage_options=s3.storage_options)
    assert (delta.version(), delta.transaction_version("s3-watch")) == (1, 1)  # 2 files, then 1
    # The checkpoint is lost: only the file that landed since is registered.
    shutil.rmtree(checkpoint)
    land("day=1/f3.parquet", range(15, 20))
    run()
    delta = DeltaTable(uri, storage_options=s3.storage_options)
    assert sorted(delta.to_pyarrow_table()["id"].to_pylist()) == list(range(20))
    added = [e.added for e in commit.read_entries(uri, s3.storage_options, 0, delta.version())]
    # In path order, two per trigger.
    assert added == [{"day=0/f0.parquet", "day=0/f2.parquet"}, {"day=1/f1.parquet"}, {"day=1/f3.parquet"}]

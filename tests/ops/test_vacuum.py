"""``deltaflow.ops.vacuum``: dry runs, deletion, and the retention guard."""

from __future__ import annotations

import os
import time

import pytest
from deltalake import DeltaTable

from deltaflow import ops
from deltaflow.errors import ConfigError
from tests.fixtures.tables import ids as _ids
from tests.fixtures.tables import tombstoned_table as _tombstoned_table


def test_vacuum_dry_run_lists_exactly_the_removed_files_then_execute_deletes_them(tmp_path):
    table = tmp_path / "t"
    old, live = _tombstoned_table(table)
    orphan = table / "part-00000-orphan-of-a-failed-write.parquet"
    orphan.write_bytes(b"not referenced")
    staging = table / "_deltaflow" / "staging" / "p" / "b000003"
    staging.mkdir(parents=True)
    (staging / "part-0.parquet").write_bytes(b"left by a crash")
    fresh = staging / "part-1.parquet"
    fresh.write_bytes(b"a batch being written now")
    long_ago = time.time() - 3 * 3600
    os.utime(staging / "part-0.parquet", (long_ago, long_ago))
    os.utime(orphan, (long_ago, long_ago))

    dry = ops.vacuum(str(table), retention_hours=0, force=True)
    assert dry.dry_run and set(dry.files) == old and not dry.staging_files
    assert all((table / f).exists() for f in old)  # a dry run deletes nothing

    # One hour: the orphan and the crashed batch's staging file (3 h old), not the files the
    # overwrite removed a moment ago, nor the staging file of a batch in progress.
    full = ops.vacuum(str(table), retention_hours=1, force=True, full=True)
    assert full.files == [orphan.name]
    assert full.staging_files == ["_deltaflow/staging/p/b000003/part-0.parquet"]

    done = ops.vacuum(str(table), retention_hours=1, force=True, full=True, dry_run=False)
    assert (done.files, done.staging_files) == (full.files, full.staging_files)
    assert not orphan.exists() and not (staging / "part-0.parquet").exists() and fresh.exists()
    assert all((table / f).exists() for f in old)

    done = ops.vacuum(str(table), retention_hours=0, force=True, dry_run=False)
    assert set(done.files) == old
    assert not any((table / f).exists() for f in old)
    assert {os.path.basename(u) for u in DeltaTable(str(table)).file_uris()} == live
    assert _ids(table) == [10, 11]


def test_vacuum_refuses_a_retention_below_the_tables_minimum(tmp_path):
    table = tmp_path / "t"
    old, _ = _tombstoned_table(table)
    with pytest.raises(ConfigError, match="below the table's minimum of 168 h"):
        ops.vacuum(str(table), retention_hours=1, dry_run=False)
    assert all((table / f).exists() for f in old)
    ops.properties(str(table), set_={"delta.deletedFileRetentionDuration": "interval 2 days"})
    with pytest.raises(ConfigError, match="minimum of 48 h"):
        ops.vacuum(str(table), retention_hours=47)
    assert ops.vacuum(str(table)).retention_hours == 48  # the table's own minimum by default
    ops.properties(str(table), set_={"delta.deletedFileRetentionDuration": "interval 90 minutes"})
    assert ops.vacuum(str(table)).retention_hours == 2  # rounded up, never below
    with pytest.raises(ConfigError, match="minimum of 2 h"):
        ops.vacuum(str(table), retention_hours=1)


def test_vacuum_full_keeps_the_staged_files_of_a_writer_holding_a_live_claim(tmp_path):
    # A running write_path=spark batch stages its files under its writer's epoch; vacuum --full
    # with retention 0 forced deleted them, and the batch then committed without their rows.
    from deltaflow.delta import commit

    table = tmp_path / "t"
    _tombstoned_table(table)
    assert [commit.claim_writer(str(table), {}, "p").epoch for _ in range(2)] == [1, 2]
    staging = table / "_deltaflow" / "staging"
    live = staging / "p" / "e2" / "vm-101-aaaa" / "b000005" / "_temporary" / "0" / "task_0" / "part-0.parquet"
    taken_over = staging / "p" / "e1" / "vm-100-bbbb" / "b000004" / "part-0.parquet"
    unclaimed = staging / "p" / "vm-99-cccc" / "b000003" / "part-0.parquet"
    no_claim_visible = staging / "q" / "e3" / "vm-102-dddd" / "b000001" / "part-0.parquet"
    long_ago = time.time() - 3 * 3600
    for path in (live, taken_over, unclaimed, no_claim_visible):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"staged")
        os.utime(path, (long_ago, long_ago))

    dry = ops.vacuum(str(table), retention_hours=0, force=True, full=True)
    gone = sorted(str(p.relative_to(table)) for p in (taken_over, unclaimed))
    assert dry.staging_files == gone
    assert dry.kept_staging == 2

    done = ops.vacuum(str(table), retention_hours=0, force=True, full=True, dry_run=False)
    assert (done.staging_files, done.kept_staging) == (gone, 2)
    assert live.exists() and no_claim_visible.exists()  # the live claim's; q's claim is not in the log
    assert not taken_over.exists() and not unclaimed.exists()

    commit.claim_writer(str(table), {}, "p")  # the writer of epoch 2 was taken over in turn
    done = ops.vacuum(str(table), retention_hours=0, force=True, full=True, dry_run=False)
    assert done.staging_files == [str(live.relative_to(table))] and not live.exists()


def test_vacuum_full_keeps_files_a_writer_may_still_commit_in_a_table_written_within_the_hour(tmp_path):
    # The soak's vacuum --full --retention-hours 0 --force beside an arrow-path stream deleted a
    # batch's files after its writer had checked them, and the commit then referenced a missing
    # file. In a table committed to within the hour, never-referenced files younger than an hour
    # are a writer's files waiting for their commit: kept, whatever the forced retention.
    from click.testing import CliRunner

    from deltaflow.cli.main import cli

    table = tmp_path / "t"
    old, _live = _tombstoned_table(table)
    in_flight = table / "part-b000007-p00000-a0-0000-in-flight.snappy.parquet"
    in_flight.write_bytes(b"a batch's file, its commit on the way")
    orphan = table / "part-b000003-p00000-a0-0000-failed-long-ago.snappy.parquet"
    orphan.write_bytes(b"left by a crash two hours ago")
    long_ago = time.time() - 2 * 3600
    os.utime(orphan, (long_ago, long_ago))

    dry = ops.vacuum(str(table), retention_hours=0, force=True, full=True)
    assert set(dry.files) == {*old, orphan.name}
    assert dry.kept_in_flight == 1
    out = CliRunner().invoke(
        cli, ["vacuum", str(table), "--retention-hours", "0", "--force", "--full", "--execute"]
    )
    assert out.exit_code == 0, out.output
    assert "kept 1 never-referenced file(s) younger than an hour" in out.output
    assert in_flight.exists() and not orphan.exists()
    assert not any((table / f).exists() for f in old)
    assert _ids(table) == [10, 11]

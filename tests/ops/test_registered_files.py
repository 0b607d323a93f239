"""Files registered in place are the user's: vacuum keeps them (and, in such a table, the files
the log never referenced) unless told, and a path registered once is never registered again."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltaflow import ops
from deltaflow.cli.main import cli
from deltaflow.delta import registered
from deltaflow.delta.layout import REGISTERED_DIR


def _land(root: Path, name: str, ids: range) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
    return path


def _ids(uri: Path) -> list[int]:
    return sorted(DeltaTable(str(uri)).to_pyarrow_table()["id"].to_pylist())


@pytest.fixture(scope="module")
def compacted(tmp_path_factory) -> tuple[Path, list[Path], Path]:
    """Two files registered in place, compacted into one; then a file lands unregistered."""
    root = tmp_path_factory.mktemp("registered") / "t"
    originals = [_land(root, "day=a b/x.parquet", range(0, 5)), _land(root, "day=a b/y.parquet", range(5, 8))]
    ops.add_files(str(root), [str(root)])
    DeltaTable(str(root)).optimize.compact()
    landed = _land(root, "day=c/landed.parquet", range(100, 102))
    return root, originals, landed


def test_records_say_which_paths_were_registered(compacted):
    root, _, _ = compacted
    records = registered.load(str(root), {})
    assert records.committed == {"day=a b/x.parquet", "day=a b/y.parquet"}
    assert not records.pending
    assert len(os.listdir(root / REGISTERED_DIR)) == 2  # the record and its marker


def test_vacuum_keeps_registered_originals_unless_told(compacted):
    root, originals, landed = compacted
    # The originals are tombstoned by the compaction; delta-rs alone would delete them.
    assert sorted(DeltaTable(str(root)).vacuum(retention_hours=0, enforce_retention_duration=False)) == [
        "day=a b/x.parquet",
        "day=a b/y.parquet",
    ]
    dry = ops.vacuum(str(root), retention_hours=0, force=True, full=True)
    assert (dry.files, dry.kept_registered, dry.kept_unreferenced) == ([], 2, 1)
    done = ops.vacuum(str(root), retention_hours=0, force=True, dry_run=False, full=True)
    assert (done.files, done.kept_registered, done.kept_unreferenced) == ([], 2, 1)
    assert all(p.exists() for p in [*originals, landed])
    assert _ids(root) == list(range(8))

    # The CLI reports what it kept; --include-registered deletes as delta-rs does (the landed
    # file an hour old: a younger never-referenced file of a table written within the hour may
    # be a writer's, waiting for its commit, and is kept whatever the retention).
    out = CliRunner().invoke(cli, ["vacuum", str(root), "--retention-hours", "0", "--force", "--full"])
    assert out.exit_code == 0, out.output
    assert "kept 2 file(s) registered in place and 1 never-referenced file(s)" in out.output
    import os
    import time

    os.utime(landed, (time.time() - 3700, time.time() - 3700))
    out = CliRunner().invoke(
        cli,
        [
            "vacuum",
            str(root),
            "--retention-hours",
            "0",
            "--force",
            "--full",
            "--execute",
            "--include-registered",
        ],
    )
    assert out.exit_code == 0, out.output
    assert not any(p.exists() for p in [*originals, landed])
    assert _ids(root) == list(range(8))


def test_a_path_registered_once_is_not_registered_again(tmp_path):
    root = tmp_path / "t"
    _land(root, "a.parquet", range(0, 3))
    _land(root, "b.parquet", range(3, 6))
    ops.add_files(str(root), [str(root)])
    DeltaTable(str(root)).optimize.compact()  # a.parquet and b.parquet are no longer active
    _land(root, "c.parquet", range(6, 9))
    again = ops.add_files(str(root), [str(root)])
    # a and b are skipped although no longer active; so is the compacted file (active).
    assert (again.files_added, again.files_skipped) == (1, 3)
    assert {"a.parquet", "b.parquet"} <= set(again.skipped)
    assert _ids(root) == list(range(9))


def test_a_record_without_its_marker_counts_once_the_log_shows_its_commit(tmp_path):
    root = tmp_path / "t"
    _land(root, "a.parquet", range(0, 2))
    _land(root, "a2.parquet", range(2, 3))
    ops.add_files(str(root), [str(root)])
    # Killed after the commit, before the marker; then compacted before anything settled it.
    (marker,) = [n for n in os.listdir(root / REGISTERED_DIR) if n.endswith(".committed")]
    os.remove(root / REGISTERED_DIR / marker)
    DeltaTable(str(root)).optimize.compact()
    # Killed before its commit: a record whose path the table never took.
    crashed = registered.record(str(root), {}, ["b.parquet"], DeltaTable(str(root)).version())
    _land(root, "b.parquet", range(3, 6))
    assert len(registered.load(str(root), {}).pending) == 2
    kept = ops.vacuum(str(root), retention_hours=0, force=True, dry_run=False, full=True)
    assert (kept.files, kept.kept_registered, kept.kept_unreferenced) == ([], 3, 0)  # over-protects b

    result = ops.add_files(str(root), [str(root)])
    assert result.files_added == 1  # b; a was found in the log (the compacted file is active)
    assert {"a.parquet", "a2.parquet"} <= set(result.skipped)
    assert _ids(root) == list(range(6))
    records = registered.load(str(root), {})
    assert records.committed == {"a.parquet", "a2.parquet", "b.parquet"}
    assert list(records.pending) == [crashed]  # b's first record stays (vacuum keeps b anyway)

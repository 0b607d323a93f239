"""Table maintenance (deltaflow.ops.maintenance and its CLI commands) on real Delta tables."""

from __future__ import annotations

import json
import os
import random
import time

import polars as pl
import pyarrow as pa
import pytest
from click.testing import CliRunner
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deltaflow.cli import cli
from deltaflow.errors import ConfigError, TableNotFoundError, TerminalError
from deltaflow.ops import maintenance


def _small_file_table(path, batches: int = 12, rows: int = 50) -> None:
    """``batches`` appends like a stream's, each with its progress (txn ``pipe`` = batch)."""
    for b in range(batches):
        ids = range(b * rows, (b + 1) * rows)
        write_deltalake(
            str(path),
            pa.table(
                {"id": list(ids), "day": [f"2026-11-{20 + i % 2}" for i in ids], "v": [i * 0.5 for i in ids]}
            ),
            partition_by=["day"],
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction("pipe", b)]),
        )


def _ids(path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table()["id"].to_pylist())


def test_optimize_compacts_small_files_and_every_reader_sees_the_same_rows(tmp_path, duck):
    table = tmp_path / "t"
    _small_file_table(table)
    before = DeltaTable(str(table))
    assert len(before.file_uris()) == 24  # 12 appends x 2 partitions

    result = maintenance.optimize(str(table))
    assert (result.files_removed, result.files_added, result.partitions_optimized) == (24, 2, 2)
    assert result.bytes_removed > 0 and result.bytes_added > 0
    after = DeltaTable(str(table))
    assert len(after.file_uris()) == 2
    assert after.version() == before.version() + 1
    assert after.history(1)[0]["operation"] == "OPTIMIZE"
    expected = list(range(600))
    assert _ids(table) == expected
    assert sorted(pl.read_delta(str(table))["id"].to_list()) == expected
    got = duck.execute(f"SELECT id FROM delta_scan('{table}') ORDER BY id").fetchall()
    assert [r[0] for r in got] == expected
    assert after.transaction_version("pipe") == 11  # a stream's progress survives compaction
    # Idempotent: nothing left to compact.
    assert maintenance.optimize(str(table)).files_removed == 0


def test_optimize_where_compacts_only_the_selected_partition(tmp_path):
    table = tmp_path / "t"
    _small_file_table(table)
    result = maintenance.optimize(str(table), where="day = '2026-11-21'")
    assert (result.files_removed, result.files_added) == (12, 1)
    adds = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).to_pylist()
    per_day: dict[str, int] = {}
    for a in adds:
        per_day[a["partition.day"]] = per_day.get(a["partition.day"], 0) + 1
    assert per_day == {"2026-11-20": 12, "2026-11-21": 1}
    assert _ids(table) == list(range(600))


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("v = 1", "'v' in --where is not a partition column; partition columns: day"),
        ("day ~ 'x'", "cannot read"),
        ("day IN 'x'", "IN needs a list in parentheses"),
        ("day = 'x", "unbalanced quote"),
    ],
)
def test_optimize_where_errors_name_the_problem(tmp_path, where, message):
    table = tmp_path / "t"
    _small_file_table(table, batches=1)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        maintenance.optimize(str(table), where=where)


@pytest.mark.parametrize(
    ("where", "message"),
    [("day = 'x' AND", "cannot read the value"), ("day = x y", "cannot read the value")],
)
def test_partition_predicate_leftovers_are_refused(where, message):
    with pytest.raises(ConfigError, match=message):
        maintenance.parse_partition_predicate(where, ["day"])


def test_partition_predicate_parsing():
    assert maintenance.parse_partition_predicate("day == '2026-11-22'", ["day"]) == [
        ("day", "=", "2026-11-22")
    ]
    parsed = maintenance.parse_partition_predicate(
        "day = 'a and b' AND `day` IN ('x', 'it''s') and day != 3 AND day NOT IN ('q')", ["day"]
    )
    assert parsed == [
        ("day", "=", "a and b"),
        ("day", "in", ["x", "it's"]),
        ("day", "!=", "3"),
        ("day", "not in", ["q"]),
    ]


def _overlapping_files(path, low: int, high: int) -> int:
    adds = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    return sum(1 for a in adds if not (a["max.x"] < low or a["min.x"] > high))


def test_zorder_lets_a_range_predicate_skip_more_files(tmp_path):
    table = tmp_path / "t"
    rng = random.Random(7)
    for _ in range(8):
        n = 25_000
        write_deltalake(
            str(table),
            pa.table(
                {
                    "x": [rng.randrange(1_000_000) for _ in range(n)],
                    "y": [rng.randrange(1_000_000) for _ in range(n)],
                }
            ),
            mode="append",
        )
    low, high = 100_000, 150_000
    assert _overlapping_files(table, low, high) == 8  # random data: every file may hold the range
    result = maintenance.optimize(str(table), zorder=["x", "y"], target_size="256KB")
    assert result.mode == "zorder" and result.files_added > 8
    total = len(DeltaTable(str(table)).file_uris())
    overlapping = _overlapping_files(table, low, high)
    assert overlapping < total / 2, (overlapping, total)
    data = DeltaTable(str(table)).to_pyarrow_table()
    assert data.num_rows == 200_000
    with pytest.raises(ConfigError, match="'z' is not in the table"):
        maintenance.optimize(str(table), zorder=["z"])


def _tombstoned_table(path) -> tuple[set[str], set[str]]:
    """Version 0 and 1 appended, version 2 overwrites: returns (removed files, live files)."""
    write_deltalake(str(path), pa.table({"id": [1, 2]}), mode="append")
    write_deltalake(str(path), pa.table({"id": [3]}), mode="append")
    old = {os.path.basename(u) for u in DeltaTable(str(path)).file_uris()}
    write_deltalake(str(path), pa.table({"id": [10, 11]}), mode="overwrite")
    live = {os.path.basename(u) for u in DeltaTable(str(path)).file_uris()}
    return old, live


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

    dry = maintenance.vacuum(str(table), retention_hours=0, force=True)
    assert dry.dry_run and set(dry.files) == old and not dry.staging_files
    assert all((table / f).exists() for f in old)  # a dry run deletes nothing

    # One hour: the orphan and the crashed batch's staging file (3 h old), not the files the
    # overwrite removed a moment ago, nor the staging file of a batch in progress.
    full = maintenance.vacuum(str(table), retention_hours=1, force=True, full=True)
    assert full.files == [orphan.name]
    assert full.staging_files == ["_deltaflow/staging/p/b000003/part-0.parquet"]

    done = maintenance.vacuum(str(table), retention_hours=1, force=True, full=True, dry_run=False)
    assert (done.files, done.staging_files) == (full.files, full.staging_files)
    assert not orphan.exists() and not (staging / "part-0.parquet").exists() and fresh.exists()
    assert all((table / f).exists() for f in old)

    done = maintenance.vacuum(str(table), retention_hours=0, force=True, dry_run=False)
    assert set(done.files) == old
    assert not any((table / f).exists() for f in old)
    assert {os.path.basename(u) for u in DeltaTable(str(table)).file_uris()} == live
    assert _ids(table) == [10, 11]


def test_vacuum_refuses_a_retention_below_the_tables_minimum(tmp_path):
    table = tmp_path / "t"
    old, _ = _tombstoned_table(table)
    with pytest.raises(ConfigError, match="below the table's minimum of 168 h"):
        maintenance.vacuum(str(table), retention_hours=1, dry_run=False)
    assert all((table / f).exists() for f in old)
    maintenance.properties(str(table), set_={"delta.deletedFileRetentionDuration": "interval 2 days"})
    with pytest.raises(ConfigError, match="minimum of 48 h"):
        maintenance.vacuum(str(table), retention_hours=47)
    assert maintenance.vacuum(str(table)).retention_hours == 48  # the table's own minimum by default
    maintenance.properties(str(table), set_={"delta.deletedFileRetentionDuration": "interval 90 minutes"})
    assert maintenance.vacuum(str(table)).retention_hours == 2  # rounded up, never below
    with pytest.raises(ConfigError, match="minimum of 2 h"):
        maintenance.vacuum(str(table), retention_hours=1)


def test_restore_and_its_guard_against_vacuumed_files(tmp_path):
    table = tmp_path / "t"
    _tombstoned_table(table)  # versions 0, 1, 2
    result = maintenance.restore(str(table), version=1)
    assert (result.restored_to, result.version_before, result.version) == (1, 2, 3)
    assert _ids(table) == [1, 2, 3]

    write_deltalake(str(table), pa.table({"id": [99]}), mode="overwrite")  # version 4
    maintenance.vacuum(str(table), retention_hours=0, force=True, dry_run=False)  # commits too
    current = DeltaTable(str(table)).version()
    with pytest.raises(TerminalError, match=r"cannot restore .* to version 1: 2 of 2 data files"):
        maintenance.restore(str(table), version=1)
    assert DeltaTable(str(table)).version() == current  # nothing committed
    assert _ids(table) == [99]
    with pytest.raises(ConfigError, match="has no version 17"):
        maintenance.restore(str(table), version=17)
    with pytest.raises(ConfigError, match="exactly one of"):
        maintenance.restore(str(table))


def test_properties_set_show_and_the_errors(tmp_path):
    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": [1]}))
    props = maintenance.properties(
        str(table), set_={"delta.logRetentionDuration": "interval 10 days", "team": "ops"}
    )
    assert props["delta.logRetentionDuration"] == "interval 10 days" and props["team"] == "ops"
    assert maintenance.properties(str(table)) == props
    with pytest.raises(ConfigError, match="cannot set"):
        maintenance.properties(str(table), set_={"delta.noSuchProperty": "1"})
    with pytest.raises(ConfigError, match="cannot unset team: delta-rs"):
        maintenance.properties(str(table), unset=["team"])
    with pytest.raises(TableNotFoundError, match="no Delta table"):
        maintenance.properties(str(tmp_path / "missing"))


def test_describe_history_read_and_changes(tmp_path):
    table = tmp_path / "t"
    _small_file_table(table, batches=3, rows=10)
    info = maintenance.describe(str(table), small_file_size="1KB")
    files = info["files"]
    assert (files["count"], files["rows"], files["partitions"]) == (6, 30, 2)
    sizes = [os.path.getsize(u.removeprefix("file://")) for u in DeltaTable(str(table)).file_uris()]
    assert files["bytes"] == sum(sizes)
    assert files["small_files"] == sum(1 for s in sizes if s < 1024)
    assert sum(b["files"] for b in files["size_histogram"]) == 6
    assert info["partition_columns"] == ["day"] and info["version"] == 2
    assert [f["name"] for f in info["schema"]] == ["id", "day", "v"]
    assert info["schema"][0]["type"] == "long"

    entries = maintenance.history(str(table), limit=2)
    assert [e["version"] for e in entries] == [2, 1]
    assert entries[0]["operation"] == "WRITE" and entries[0]["timestamp"].startswith("20")

    now = maintenance.read(str(table), where="id >= 25 AND day = '2026-11-21'", columns=["id"])
    assert sorted(now["id"].to_pylist()) == [25, 27, 29]
    assert now.schema.field("id").type == pa.int64()
    past = maintenance.read(str(table), version=0)
    assert sorted(past["id"].to_pylist()) == list(range(10))
    assert maintenance.read(str(table), limit=4).num_rows == 4
    with pytest.raises(ConfigError, match="cannot read"):
        maintenance.read(str(table), where="no_such_column = 1")

    with pytest.raises(ConfigError, match="does not record changes"):
        maintenance.changes(str(table))
    maintenance.properties(str(table), set_={"delta.enableChangeDataFeed": "true"})
    start = DeltaTable(str(table)).version() + 1
    DeltaTable(str(table)).delete("id < 2")
    DeltaTable(str(table)).update(updates={"v": "100.0"}, predicate="id = 5")
    feed = maintenance.changes(str(table), from_version=start).to_pylist()
    kinds = sorted((r["_change_type"], r["id"]) for r in feed)
    assert kinds == [("delete", 0), ("delete", 1), ("update_postimage", 5), ("update_preimage", 5)]


def test_cli_commands_print_text_and_json_and_map_errors_to_exit_codes(tmp_path):
    table = tmp_path / "t"
    _small_file_table(table, batches=4, rows=10)
    runner = CliRunner()

    out = runner.invoke(cli, ["optimize", str(table), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["files_removed"] == 8

    out = runner.invoke(cli, ["describe", str(table)])
    assert out.exit_code == 0, out.output
    assert "files      2 (" in out.stdout and "day: string" in out.stdout

    out = runner.invoke(cli, ["history", str(table), "--limit", "1", "--json"])
    assert [e["operation"] for e in json.loads(out.stdout)] == ["OPTIMIZE"]

    out = runner.invoke(cli, ["vacuum", str(table), "--retention-hours", "0", "--force"])
    assert out.exit_code == 0 and out.stdout.count(".parquet") == 8
    assert "dry run: 8 file(s) would be deleted" in out.stderr

    out = runner.invoke(cli, ["read", str(table), "--where", "id = 7", "--json"])
    assert json.loads(out.stdout) == [{"id": 7, "day": "2026-11-21", "v": 3.5}]

    out = runner.invoke(cli, ["properties", str(table), "set", "team=data", "--json"])
    assert json.loads(out.stdout) == {"team": "data"}

    out = runner.invoke(cli, ["describe", str(table), "--storage-option", "not-a-pair"])
    assert out.exit_code == 2 and "'not-a-pair' must look like key=value" in out.output

    out = runner.invoke(cli, ["checkpoint", str(table)])
    assert out.exit_code == 0 and "checkpoint written at version" in out.stdout

    from deltaflow.cli import main

    for args in (
        ["vacuum", str(table), "--retention-hours", "1"],
        ["restore", str(table), "--version", "99"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2

"""``deltaflow add-files`` and ``deltaflow convert``: text, ``--json``, exit codes."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltaflow.cli import cli, main


def _files(root, n: int = 3) -> None:
    for i in range(n):
        folder = root / f"day=2026-11-2{i}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": list(range(i * 10, i * 10 + 10))}), folder / f"f{i}.parquet")


def test_add_files_dry_run_json_skips_and_exit_codes(tmp_path, capsys):
    table = tmp_path / "t"
    _files(table)
    runner = CliRunner()

    out = runner.invoke(cli, ["add-files", str(table), str(table), "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "day=2026-11-20/f0.parquet\t10 rows\t" in out.stdout and "day=2026-11-20" in out.stdout
    assert "dry run: 3 file(s) (30 rows" in out.stderr and "nothing was committed" in out.stderr
    assert not (table / "_delta_log").exists()

    out = runner.invoke(cli, ["add-files", str(table), f"{table}/day=*/*.parquet", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert (result["version"], result["files_added"], result["rows_added"], result["created"]) == (
        0,
        3,
        30,
        True,
    )
    assert result["files"][0]["partition_values"] == {"day": "2026-11-20"}

    out = runner.invoke(cli, ["add-files", str(table), str(table)])
    assert out.exit_code == 0, out.output
    assert "skipped (already in the table): day=2026-11-21/f1.parquet" in out.stderr
    assert "nothing to add" in out.stderr

    outside = tmp_path / "landing" / "day=2026-11-29"
    outside.mkdir(parents=True)
    pq.write_table(pa.table({"id": [99]}), outside / "late.parquet")
    with pytest.raises(SystemExit) as exit_info:
        main(["add-files", str(table), str(outside)])
    assert exit_info.value.code == 2
    assert "outside the table's root" in capsys.readouterr().err
    out = runner.invoke(cli, ["add-files", str(table), str(outside)], env={"DELTAFLOW_ADD_FILES_COPY": "1"})
    assert out.exit_code == 0, out.output
    assert "1 copied below its root" in out.stdout
    assert DeltaTable(str(table)).version() == 1

    out = runner.invoke(cli, ["add-files", "--help"])
    assert "DELTAFLOW_ADD_FILES_DRY_RUN" in out.stdout and "DELTAFLOW_ADD_FILES_THREADS" in out.stdout


def test_convert_in_place_and_refused_twice(tmp_path, capsys):
    lake = tmp_path / "lake"
    _files(lake)
    runner = CliRunner()
    out = runner.invoke(cli, ["convert", str(lake), "--partition-by", "day"])
    assert out.exit_code == 0, out.output
    assert "added 3 file(s) (30 rows" in out.stdout and "(created the table)" in out.stdout
    assert DeltaTable(str(lake)).metadata().partition_columns == ["day"]
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(lake), "--partition-by", "day"])
    assert exit_info.value.code == 2
    assert "already is a Delta table" in capsys.readouterr().err


def test_watch_takes_one_folder():
    # The query itself runs as a parquet-files pipeline (tests/pipeline/test_watch_files.py).
    out = CliRunner().invoke(cli, ["add-files", "t", "a", "b", "--watch"])
    assert out.exit_code == 2 and "--watch takes exactly one folder" in out.output
    out = CliRunner().invoke(cli, ["add-files", "t", "a", "--available-now"])
    assert out.exit_code == 2 and "--available-now goes with --watch" in out.output


def test_a_rerun_over_many_files_lists_ten_skipped_and_counts_the_rest(tmp_path):
    # A rerun over a folder already registered skips every file: ten are named, the rest
    # counted, in a few lines (the log has them at debug); ``deltaflow -v`` names every one.
    table = tmp_path / "t"
    folder = table / "batch"
    folder.mkdir(parents=True)
    for i in range(13):
        pq.write_table(pa.table({"id": [i]}), folder / f"f{i:02}.parquet")
    runner = CliRunner()
    assert runner.invoke(cli, ["add-files", str(table), str(table)]).exit_code == 0

    out = runner.invoke(cli, ["add-files", str(table), str(table)])
    assert out.exit_code == 0, out.output
    listed = [
        line for line in out.stderr.splitlines() if line.startswith("skipped (already in the table): batch/")
    ]
    assert len(listed) == 10
    assert "skipped (already in the table): 3 more (deltaflow -v lists every one)" in out.stderr
    assert "nothing to add" in out.stderr and "(13 file(s) skipped)" in out.stderr
    assert not [line for line in out.stderr.splitlines() if "is already in" in line]  # not logged at INFO

    out = runner.invoke(cli, ["-v", "add-files", str(table), str(table)])
    assert out.exit_code == 0, out.output
    named = {
        line.rsplit("/", 1)[-1] for line in out.stderr.splitlines() if line.startswith("skipped (already")
    }
    assert named == {f"f{i:02}.parquet" for i in range(13)}

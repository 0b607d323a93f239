"""``deltaflow.cli.tables``: the maintenance commands print text and JSON and map errors to exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from deltaflow.cli import cli
from tests.fixtures.tables import small_file_table as _small_file_table
from tests.fixtures.tables import vacuumed_table as _vacuumed_table


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


@pytest.mark.parametrize(
    "args",
    [
        ["read", "--version", "1"],
        ["read", "--version", "0", "--json"],
        ["changes", "--from-version", "0"],
        ["restore", "--version", "1"],
    ],
    ids=["read", "read-json", "changes", "restore"],
)
def test_a_vacuumed_version_is_a_terminal_error_with_exit_2_not_a_traceback(tmp_path, capsys, args):
    # read and changes ended in a raw traceback of delta-rs' "Object at location ... not found"
    # with exit 1, which the README defines as "may pass on retry".
    from deltaflow.cli import main

    table = tmp_path / "t"
    _vacuumed_table(table)
    with pytest.raises(SystemExit) as exit_info:
        main([args[0], str(table), *args[1:]])
    out = capsys.readouterr()
    assert exit_info.value.code == 2, out
    assert out.err.startswith(f"error: cannot {'restore' if args[0] == 'restore' else 'read'} "), out.err
    assert "data files of th" in out.err and "are gone (vacuumed?)" in out.err
    assert "Traceback" not in out.err and out.out == ""


def test_checkpoint_cleanup_says_how_many_log_files_it_removed(tmp_path):
    # It printed "checkpoint written at version 4" whether it removed 4 log files or none.
    import pyarrow as pa
    from deltalake import write_deltalake

    table = tmp_path / "t"
    retention = {"delta.logRetentionDuration": "interval 0 seconds"}  # every entry has expired
    write_deltalake(str(table), pa.table({"id": [0]}), configuration=retention)
    for i in range(1, 5):
        write_deltalake(str(table), pa.table({"id": [i]}), mode="append")
    runner = CliRunner()
    out = runner.invoke(cli, ["checkpoint", str(table), "--cleanup"])
    assert out.exit_code == 0, out.output
    assert out.stdout.strip() == (
        "checkpoint written at version 4; 4 expired log file(s) removed (older than "
        "delta.logRetentionDuration and before the checkpoint)"
    )
    assert sorted(p.name for p in (table / "_delta_log").iterdir() if p.name.endswith(".json")) == [
        "00000000000000000004.json"
    ]
    out = runner.invoke(cli, ["checkpoint", str(table), "--cleanup", "--json"])
    assert json.loads(out.stdout)["log_files_removed"] == 0  # nothing left to remove
    out = runner.invoke(cli, ["checkpoint", str(table)])
    assert out.stdout.strip() == "checkpoint written at version 4"  # no cleanup asked: not mentioned

"""``deltaflow.ops.restore``: an earlier version back, refused when its files are gone."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow import ops
from deltaflow.errors import ConfigError, TerminalError
from tests.fixtures.tables import ids as _ids
from tests.fixtures.tables import tombstoned_table as _tombstoned_table


def test_restore_and_its_guard_against_vacuumed_files(tmp_path):
    table = tmp_path / "t"
    _tombstoned_table(table)  # versions 0, 1, 2
    result = ops.restore(str(table), version=1)
    assert (result.restored_to, result.version_before, result.version) == (1, 2, 3)
    assert _ids(table) == [1, 2, 3]

    write_deltalake(str(table), pa.table({"id": [99]}), mode="overwrite")  # version 4
    ops.vacuum(str(table), retention_hours=0, force=True, dry_run=False)  # commits too
    current = DeltaTable(str(table)).version()
    with pytest.raises(TerminalError, match=r"cannot restore .* to version 1: 2 of 2 data files"):
        ops.restore(str(table), version=1)
    assert DeltaTable(str(table)).version() == current  # nothing committed
    assert _ids(table) == [99]
    with pytest.raises(ConfigError, match="has no version 17"):
        ops.restore(str(table), version=17)
    with pytest.raises(ConfigError, match="exactly one of"):
        ops.restore(str(table))


def _created_empty_then_filled(table) -> str:
    """Version 0 the empty CREATE, versions 1 and 2 appends; returns a time before all of them."""
    import datetime as dt

    before = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    DeltaTable.create(str(table), schema=pa.schema([("id", pa.int64())]))
    write_deltalake(str(table), pa.table({"id": [1, 2]}), mode="append")
    write_deltalake(str(table), pa.table({"id": [3]}), mode="append")
    return before


def test_restore_to_a_time_before_the_first_commit_is_refused_naming_the_earliest_time(tmp_path):
    # delta-rs takes a time before the table existed for version 0, the empty CREATE: the
    # restore said "restored ... to version 0" and emptied the table.
    table = tmp_path / "t"
    before = _created_empty_then_filled(table)
    earliest = DeltaTable(str(table)).history()[-1]["timestamp"]
    import datetime as dt

    named = dt.datetime.fromtimestamp(earliest / 1000, dt.UTC).isoformat(timespec="milliseconds")
    with pytest.raises(ConfigError) as refused:
        ops.restore(str(table), timestamp=before)
    assert str(refused.value) == (
        f"timestamp {before} is before the earliest version of {str(table)!r} (version 0, committed at "
        f"{named}): there is no version as of then (the table did not exist yet). Use a timestamp at "
        f"or after {named}"
    )
    assert DeltaTable(str(table)).version() == 2 and _ids(table) == [1, 2, 3]  # nothing committed
    with pytest.raises(ConfigError, match="before the earliest version"):
        ops.read(str(table), timestamp=before)  # time travel reads resolve times the same way

    assert ops.read(str(table), timestamp=named).num_rows == 0  # the earliest time named: version 0
    restored = ops.restore(str(table), timestamp=named)
    assert (restored.restored_to, restored.version) == (0, 3) and _ids(table) == []


def test_cli_restore_before_the_first_commit_exits_2_naming_the_earliest_time(tmp_path, capsys):
    from deltaflow.cli import main

    table = tmp_path / "t"
    before = _created_empty_then_filled(table)
    with pytest.raises(SystemExit) as exit_info:
        main(["restore", str(table), "--timestamp", before])
    out = capsys.readouterr()
    assert exit_info.value.code == 2, out
    assert "before the earliest version" in out.err and "Use a timestamp at or after" in out.err
    assert "restored" not in out.out and _ids(table) == [1, 2, 3]


def test_cli_restore_warns_that_running_pipelines_will_not_replay_the_removed_rows(tmp_path, capsys):
    # The README explained it; the command said only "restored ... to version 1".
    from deltaflow.cli import main

    table = tmp_path / "t"
    _tombstoned_table(table)  # versions 0, 1, 2
    main(["restore", str(table), "--version", "1", "--json"])
    out = capsys.readouterr()
    import json

    assert json.loads(out.out)["version"] == 3  # stdout stays JSON
    assert out.err.startswith(
        "warning: the rows added after version 1 (up to version 2) are gone from the table and will "
        "NOT be written again by the pipelines that wrote them: a restore does not roll back their "
        "progress (txn)"
    )
    assert "replay them from the source" in out.err
    main(["restore", str(table), "--version", "3"])  # already that content: nothing restored
    assert "warning" not in capsys.readouterr().err

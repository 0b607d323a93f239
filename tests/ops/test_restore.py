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

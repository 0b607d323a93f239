"""``deltaflow.ops.properties``: show, set and unset table properties."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltaflow import ops
from deltaflow.errors import ConfigError, TableNotFoundError


def test_properties_set_show_and_the_errors(tmp_path):
    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": [1]}))
    props = ops.properties(str(table), set_={"delta.logRetentionDuration": "interval 10 days", "team": "ops"})
    assert props["delta.logRetentionDuration"] == "interval 10 days" and props["team"] == "ops"
    assert ops.properties(str(table)) == props
    with pytest.raises(ConfigError, match="cannot set"):
        ops.properties(str(table), set_={"delta.noSuchProperty": "1"})
    with pytest.raises(ConfigError, match="cannot unset team: delta-rs"):
        ops.properties(str(table), unset=["team"])
    with pytest.raises(TableNotFoundError, match="no Delta table"):
        ops.properties(str(tmp_path / "missing"))

"""``deltaflow.ops.inspect``: history, describe, read and changes."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltaflow import ops
from deltaflow.errors import ConfigError, DataFilesGoneError
from tests.fixtures.tables import small_file_table as _small_file_table
from tests.fixtures.tables import vacuumed_table as _vacuumed_table


def test_describe_history_read_and_changes(tmp_path):
    table = tmp_path / "t"
    _small_file_table(table, batches=3, rows=10)
    info = ops.describe(str(table), small_file_size="1KB")
    files = info["files"]
    assert (files["count"], files["rows"], files["partitions"]) == (6, 30, 2)
    sizes = [os.path.getsize(u.removeprefix("file://")) for u in DeltaTable(str(table)).file_uris()]
    assert files["bytes"] == sum(sizes)
    assert files["small_files"] == sum(1 for s in sizes if s < 1024)
    assert sum(b["files"] for b in files["size_histogram"]) == 6
    assert info["partition_columns"] == ["day"] and info["version"] == 2
    assert [f["name"] for f in info["schema"]] == ["id", "day", "v"]
    assert info["schema"][0]["type"] == "long"

    entries = ops.history(str(table), limit=2)
    assert [e["version"] for e in entries] == [2, 1]
    assert entries[0]["operation"] == "WRITE" and entries[0]["timestamp"].startswith("20")

    now = ops.read(str(table), where="id >= 25 AND day = '2026-11-21'", columns=["id"])
    assert sorted(now["id"].to_pylist()) == [25, 27, 29]
    assert now.schema.field("id").type == pa.int64()
    past = ops.read(str(table), version=0)
    assert sorted(past["id"].to_pylist()) == list(range(10))
    assert ops.read(str(table), limit=4).num_rows == 4
    with pytest.raises(ConfigError, match="cannot read"):
        ops.read(str(table), where="no_such_column = 1")

    with pytest.raises(ConfigError, match="does not record changes"):
        ops.changes(str(table))
    ops.properties(str(table), set_={"delta.enableChangeDataFeed": "true"})
    start = DeltaTable(str(table)).version() + 1
    DeltaTable(str(table)).delete("id < 2")
    DeltaTable(str(table)).update(updates={"v": "100.0"}, predicate="id = 5")
    feed = ops.changes(str(table), from_version=start).to_pylist()
    kinds = sorted((r["_change_type"], r["id"]) for r in feed)
    assert kinds == [("delete", 0), ("delete", 1), ("update_postimage", 5), ("update_preimage", 5)]


def test_reading_a_vacuumed_version_or_its_changes_says_the_files_are_gone(tmp_path):
    # delta-rs failed deep in DataFusion with an object-store "not found" error (a raw traceback
    # and exit 1, which reads as "retry later"); restore already said what it was.
    table = tmp_path / "t"
    _vacuumed_table(table)
    with pytest.raises(DataFilesGoneError) as gone:
        ops.read(str(table), version=1)
    assert str(gone.value).startswith(
        f"cannot read version 1 of {str(table)!r}: 2 of 2 data files of that version are gone "
        "(vacuumed?), e.g. "
    )
    assert str(gone.value).endswith(". Read a newer version, or recover the files first")
    with pytest.raises(DataFilesGoneError, match=r"cannot read version 0 .* 1 of 1 data files"):
        ops.read(str(table), version=0, where="id > 1")
    assert sorted(ops.read(str(table), version=2)["id"].to_pylist()) == [10, 11]  # its files are there

    with pytest.raises(DataFilesGoneError) as gone:
        ops.changes(str(table), from_version=0)
    assert str(gone.value).startswith(
        f"cannot read the changes of {str(table)!r} from version 0 to 4: 2 of 3 data files of those versions "
        "are gone (vacuumed?), e.g. "
    )
    assert str(gone.value).endswith(". Read the changes from a later version, or recover the files first")

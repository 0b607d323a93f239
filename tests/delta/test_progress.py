"""Reading a pipeline's progress back from the log's txns."""

from __future__ import annotations

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deltaflow.delta import progress


def test_a_txn_is_read_once_per_table_object_and_version(tmp_path):
    uri = str(tmp_path / "t")
    rows = pa.table({"id": [1]})
    write_deltalake(uri, rows, commit_properties=CommitProperties(app_transactions=[Transaction("a", 1)]))
    table = DeltaTable(uri)
    reads = []
    lookup = table.transaction_version

    def counted(app_id):
        reads.append(app_id)
        return lookup(app_id)

    table.transaction_version = counted
    assert [progress.transaction_version(table, "a") for _ in range(3)] == [1, 1, 1]
    assert progress.transaction_version(table, "b") is None
    assert progress.transaction_version(table, "b") is None
    assert reads == ["a", "b"]

    # The table moves on: the same object at its new version reads the log again.
    write_deltalake(
        uri, rows, mode="append", commit_properties=CommitProperties(app_transactions=[Transaction("a", 2)])
    )
    table.update_incremental()
    assert progress.transaction_version(table, "a") == 2
    assert reads == ["a", "b", "a"]
    # Another object of the same table has its own reads.
    assert progress.transaction_version(DeltaTable(uri), "a") == 2

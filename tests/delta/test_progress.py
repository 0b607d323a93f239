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


def test_txns_carried_over_to_a_later_version_are_the_logs_without_a_lookup(tmp_path):
    """A kept table moved on by commits whose log entries were read: their txns update the
    lookups read at the version before, so none replays the log segment again."""
    uri = str(tmp_path / "t")
    rows = pa.table({"id": [1]})
    write_deltalake(uri, rows, commit_properties=CommitProperties(app_transactions=[Transaction("a", 1)]))
    table = DeltaTable(uri)
    assert [progress.transaction_version(table, a) for a in ("a", "b")] == [1, None]
    write_deltalake(
        uri,
        rows,
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction("a", 2), Transaction("c", 5)]),
    )
    table.update_incremental()
    assert not progress.carry_txns(table, 1, {"a": 2, "c": 5})  # not what the memo held
    assert progress.carry_txns(table, 0, {"a": 2, "c": 5})
    reads = []
    lookup = table.transaction_version
    table.transaction_version = lambda app_id: reads.append(app_id) or lookup(app_id)
    fresh = DeltaTable(uri)
    assert [progress.transaction_version(table, a) for a in "abc"] == [2, None, 5]
    assert [fresh.transaction_version(a) for a in "abc"] == [2, None, 5]
    assert reads == []
    assert progress.transaction_version(table, "d") is None and reads == ["d"]  # never read: looked up


def test_txns_are_not_carried_over_on_a_table_that_lets_them_expire(tmp_path):
    """Under delta.setTransactionRetentionDuration delta-rs' answer depends on the clock too."""
    uri = str(tmp_path / "t")
    rows = pa.table({"id": [1]})
    write_deltalake(uri, rows, configuration={progress.TXN_RETENTION: "interval 1 days"})
    table = DeltaTable(uri)
    assert progress.transaction_version(table, "a") is None
    write_deltalake(
        uri, rows, mode="append", commit_properties=CommitProperties(app_transactions=[Transaction("a", 2)])
    )
    table.update_incremental()
    assert not progress.carry_txns(table, 0, {"a": 2})
    assert progress.transaction_version(table, "a") == 2

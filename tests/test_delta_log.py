import time

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from deltaflow import delta_log
from deltaflow._parquet import PartitionedFileWriter
from deltaflow.exceptions import CommitError

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _files(root, ids, prefix):
    writer = PartitionedFileWriter(
        fs=pafs.LocalFileSystem(),
        root=str(root),
        schema=SCHEMA,
        partition_columns=[],
        compression="snappy",
        target_file_size=1 << 30,
        max_records_per_file=0,
        file_prefix=prefix,
    )
    batch = pa.RecordBatch.from_pydict({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA)
    return writer.write_batches([batch])


def _commit(uri, files, version, **kw):
    args = dict(
        schema=SCHEMA,
        partition_by=[],
        mode="append",
        app_id="pipe",
        txn_version=version,
        metadata={"deltaflow.epoch": version},
        storage_options={},
        max_retries=3,
        create_if_missing=True,
        properties={},
    )
    args.update(kw)
    return delta_log.commit_files(uri, files, **args)


def test_commit_records_txn_and_skips_a_replayed_version(tmp_path):
    uri = str(tmp_path / "t")
    first = _commit(uri, _files(tmp_path / "t", [1, 2], "a"), 0)
    assert first.committed and first.table_version == 0
    assert _commit(uri, _files(tmp_path / "t", [3], "b"), 1).committed
    replay = _commit(uri, _files(tmp_path / "t", [3], "c"), 1)
    assert not replay.committed
    table = DeltaTable(uri)
    assert table.version() == 1
    assert table.transaction_version("pipe") == 1
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]
    assert table.history(1)[0]["deltaflow.epoch"] == 1


def test_commit_failure_retries_with_backoff_then_raises(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the table's parent folder should be")
    uri = str(blocker / "t")
    started = time.monotonic()
    with pytest.raises(CommitError) as err:
        _commit(uri, [], 0, max_retries=2)
    elapsed = time.monotonic() - started
    assert err.value.attempts == 3
    assert err.value.table_uri == uri
    assert "nothing of this batch was committed" in str(err.value)
    assert elapsed >= 0.1 + 0.2  # backoff 100 ms then 200 ms


def test_create_table_adopts_a_table_created_meanwhile(tmp_path):
    uri = str(tmp_path / "t")
    first = delta_log.create_table(uri, SCHEMA, partition_by=[], properties={}, storage_options={})
    second = delta_log.create_table(uri, SCHEMA, partition_by=[], properties={}, storage_options={})
    assert first.metadata().id == second.metadata().id
    assert DeltaTable(uri).version() == 0


def test_indexed_columns_reads_the_table_property(tmp_path):
    uri = str(tmp_path / "t")
    table = delta_log.create_table(
        uri,
        SCHEMA,
        partition_by=[],
        properties={"delta.dataSkippingNumIndexedCols": "1"},
        storage_options={},
    )
    assert delta_log.indexed_columns(table) == 1
    assert delta_log.indexed_columns(None, {}) == 32

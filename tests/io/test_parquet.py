import datetime as dt
import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from deltaflow.io.parquet import (
    PartitionedFileWriter,
    escape_path_component,
    partition_dir,
    partition_value,
    stats_json,
)

UTC = dt.UTC


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("eu west", "eu west"),
        ("us:east", "us%3Aeast"),
        ("a/b", "a%2Fb"),
        ("100%", "100%25"),
        ("x=y", "x%3Dy"),
    ],
)
def test_partition_values_are_escaped_like_hive(value, escaped):
    assert escape_path_component(value) == escaped


def test_partition_dir_and_values():
    assert partition_dir(["d", "r"], ["2024-01-01", None]) == "d=2024-01-01/r=__HIVE_DEFAULT_PARTITION__"
    assert partition_value(True) == "true"
    assert partition_value(dt.date(2024, 2, 3)) == "2024-02-03"
    assert partition_value(7) == "7"
    assert partition_value(None) is None


def _write(tmp_path, table, **kw):
    path = tmp_path / "f.parquet"
    writer = pq.ParquetWriter(path, table.schema)
    writer.write_table(table, row_group_size=kw.pop("row_group_size", None))
    writer.close()
    return json.loads(stats_json(writer.writer.metadata, table.schema, kw.pop("indexed", 32)))


def test_stats_bound_timestamps_at_millisecond_precision(tmp_path):
    ts = pa.array(
        [dt.datetime(2024, 1, 1, 10, 0, 0, 123456, UTC), dt.datetime(2024, 1, 1, 10, 0, 0, 987001, UTC)],
        pa.timestamp("us", "UTC"),
    )
    stats = _write(tmp_path, pa.table({"ts": ts}))
    # min rounded down, max rounded up: still bounds of every value in the file
    assert stats["minValues"]["ts"] == "2024-01-01T10:00:00.123Z"
    assert stats["maxValues"]["ts"] == "2024-01-01T10:00:00.988Z"


def test_stats_cover_types_nulls_and_row_groups(tmp_path):
    table = pa.table(
        {
            "id": pa.array([5, 1, None, 9], pa.int64()),
            "name": ["b", "a", "d", None],
            "score": [1.5, -2.0, None, 3.25],
            "day": pa.array([dt.date(2024, 1, 2), dt.date(2024, 1, 1), None, None]),
            "flag": [True, False, None, True],
            "tags": pa.array([[1], [2], None, []], pa.list_(pa.int32())),
            "empty": pa.array([None, None, None, None], pa.string()),
        }
    )
    stats = _write(tmp_path, table, row_group_size=2)  # two row groups, merged
    assert stats["numRecords"] == 4
    assert stats["minValues"] == {"id": 1, "name": "a", "score": -2.0, "day": "2024-01-01"}
    assert stats["maxValues"] == {"id": 9, "name": "d", "score": 3.25, "day": "2024-01-02"}
    assert stats["nullCount"] == {"id": 1, "name": 1, "score": 1, "day": 2, "flag": 1, "empty": 4}


def test_stats_only_for_indexed_columns(tmp_path):
    stats = _write(tmp_path, pa.table({"a": [1], "b": [2], "c": [3]}), indexed=2)
    assert set(stats["minValues"]) == {"a", "b"}
    assert set(stats["nullCount"]) == {"a", "b"}


def _writer(tmp_path, schema, **kw):
    defaults = dict(
        fs=pafs.LocalFileSystem(),
        root=str(tmp_path),
        schema=schema,
        partition_columns=[],
        compression="zstd",
        target_file_size=128 * 1024 * 1024,
        max_records_per_file=0,
        file_prefix="part-t",
    )
    defaults.update(kw)
    return PartitionedFileWriter(**defaults)


def _batches(n, size=1000):
    for start in range(0, n, size):
        ids = pa.array(range(start, min(n, start + size)), pa.int64())
        region = pa.array([["eu west", "us:east", None][i % 3] for i in ids.to_pylist()], pa.string())
        yield pa.RecordBatch.from_arrays([ids, region, pc_str(ids)], names=["id", "region", "payload"])


def pc_str(ids):
    return pa.array([f"payload-{i:08d}" for i in ids.to_pylist()])


SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("payload", pa.string())])


def test_files_roll_at_max_records_and_sizes_match_disk(tmp_path):
    files = _writer(tmp_path, SCHEMA, max_records_per_file=2500).write_batches(_batches(10_000))
    assert [f.num_records for f in files] == [2500, 2500, 2500, 2500]
    for f in files:
        assert (tmp_path / f.path).stat().st_size == f.size
        assert pq.ParquetFile(tmp_path / f.path).metadata.num_rows == f.num_records
    ids = sorted(i for f in files for i in pq.read_table(tmp_path / f.path)["id"].to_pylist())
    assert ids == list(range(10_000))


def test_files_roll_at_target_size(tmp_path):
    writer = _writer(tmp_path, SCHEMA, target_file_size=64 * 1024, compression="none")
    # row groups are flushed at ROW_GROUP_ROWS; use small ones so the size check runs often
    import deltaflow.io.parquet as mod

    old = mod.ROW_GROUP_ROWS
    mod.ROW_GROUP_ROWS = 2000
    try:
        files = writer.write_batches(_batches(40_000))
    finally:
        mod.ROW_GROUP_ROWS = old
    assert len(files) > 5
    assert sum(f.num_records for f in files) == 40_000
    assert all(f.size >= 64 * 1024 for f in files[:-1])


def test_partitioned_files_hold_no_partition_column(tmp_path):
    files = _writer(tmp_path, SCHEMA, partition_columns=["region"]).write_batches(_batches(3000))
    by_value = {f.partition_values["region"]: f for f in files}
    assert set(by_value) == {"eu west", "us:east", None}
    assert by_value["us:east"].path.startswith("region=us%3Aeast/")
    assert by_value[None].path.startswith("region=__HIVE_DEFAULT_PARTITION__/")
    for value, f in by_value.items():
        table = pq.read_table(tmp_path / f.path)
        assert table.column_names == ["id", "payload"]
        assert table.num_rows == 1000
        assert {i % 3 for i in table["id"].to_pylist()} == {["eu west", "us:east", None].index(value)}
    assert json.loads(by_value["eu west"].stats)["minValues"]["id"] == 0


def test_failed_task_deletes_its_files(tmp_path):
    def broken():
        yield from _batches(2000)
        raise RuntimeError("task failed")

    with pytest.raises(RuntimeError):
        _writer(tmp_path, SCHEMA, max_records_per_file=500).write_batches(broken())
    assert list(tmp_path.rglob("*.parquet")) == []

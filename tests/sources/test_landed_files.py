"""The landed-files source's listing, without Spark: what a trigger offers."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from deltaflow import ops
from deltaflow.delta.leases import TableLease
from deltaflow.sources.landed_files import LandedFilesOptions, new_files


def _write(path, ids) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)


def test_a_watch_of_the_table_root_offers_nothing_while_a_compaction_holds_the_lease(tmp_path):
    table = tmp_path / "t"
    _write(table / "day=1" / "a.parquet", range(5))
    ops.add_files(str(table), [str(table / "day=1" / "a.parquet")])
    # A compaction's output, written and not committed yet, looks like a landed file.
    _write(table / "day=1" / "part-00001-compacted-c000.zstd.parquet", range(5))
    root = LandedFilesOptions(path=str(table), table_uri=str(table))
    outside = LandedFilesOptions(path=str(tmp_path / "landing"), table_uri=str(table))
    _write(tmp_path / "landing" / "b.parquet", range(5, 10))

    lease = TableLease(str(table), {})
    assert lease.try_acquire()
    try:
        assert new_files(root) == []  # the compaction's file is not taken
        assert new_files(outside) == [str(tmp_path / "landing" / "b.parquet")]  # no overlap: listed
    finally:
        lease.release()
    assert new_files(root) == [str(table / "day=1" / "part-00001-compacted-c000.zstd.parquet")]

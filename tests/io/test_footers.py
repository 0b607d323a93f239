"""``deltaflow.io.footers``: finding Parquet files and reading their Hive partition values."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from deltaflow.io.footers import find_files, hive_partitions, modification_time_ms


@pytest.mark.parametrize(
    ("relative", "expected"),
    [
        ("a.parquet", []),
        ("city=New York/a.parquet", [("city", "New York")]),
        ("t=12%3A30/d=2026-01-01/a.parquet", [("t", "12:30"), ("d", "2026-01-01")]),
        ("p=100%25/a.parquet", [("p", "100%")]),
        ("p=50%/a.parquet", [("p", "50%")]),  # not an escape: kept, as Spark keeps it
        ("p=__HIVE_DEFAULT_PARTITION__/a.parquet", [("p", None)]),
        ("raw/p=x/a.parquet", [("p", "x")]),
    ],
    ids=["none", "space", "colon-escaped", "percent", "lone-percent", "null", "plain-dir"],
)
def test_hive_partitions_are_unescaped_as_spark_does(relative, expected):
    assert hive_partitions(relative) == expected


def test_files_folders_and_globs_are_found_once_skipping_hidden_names(tmp_path):
    for rel in [
        "d=1/a.parquet",
        "d=1/b.parquet",
        "d=2/c.parquet",
        "d=2/notes.txt",
        "_SUCCESS",
        "_tmp/x.parquet",
    ]:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"x": [1]}), path)
    fs = pafs.LocalFileSystem()
    root = str(tmp_path)

    found, unmatched = find_files(
        fs, [root, f"{root}/d=*/a.parquet", f"{root}/d=2/c.parquet", f"{root}/none/*"]
    )

    assert [f.relative for f in found] == ["d=1/a.parquet", "d=1/b.parquet", "d=2/c.parquet"]
    assert unmatched == [f"{root}/none/*"]
    assert found[0].size == (tmp_path / "d=1/a.parquet").stat().st_size
    only, _ = find_files(fs, [f"{root}/d=2/c.parquet"])
    assert only[0].relative == "d=2/c.parquet"  # a file named directly keeps its col=value folders
    deep, _ = find_files(fs, [f"{root}/**/*.parquet"])
    assert len(deep) == 3
    inner, _ = find_files(fs, [f"{root}/d=1", f"{root}/d=2/*.parquet"])  # a partition folder itself
    assert [f.relative for f in inner] == ["d=1/a.parquet", "d=1/b.parquet", "d=2/c.parquet"]


def test_nanosecond_stats_are_exact_bounds_in_integers(tmp_path):
    """Min floors and max ceils to the millisecond in integer arithmetic (through a float,
    1.7e18 ns lost its last digits and the min came out above the true value)."""
    import json

    from deltaflow.io.parquet import stats_json

    values = [1_699_999_999_999_999_900, 1_700_000_000_000_000_001]  # .9999999 s and +1 ns
    path = tmp_path / "ns.parquet"
    pq.write_table(pa.table({"ts": pa.array(values, pa.timestamp("ns", tz="UTC"))}), path)
    metadata = pq.read_metadata(path)
    stats = json.loads(stats_json(metadata, metadata.schema.to_arrow_schema(), -1))
    assert stats["minValues"]["ts"] == "2023-11-14T22:13:19.999Z"
    assert stats["maxValues"]["ts"] == "2023-11-14T22:13:20.001Z"


def test_a_path_that_exists_is_taken_literally_before_as_a_glob(tmp_path):
    folder = tmp_path / "events[2024]"
    folder.mkdir()
    pq.write_table(pa.table({"x": [1]}), folder / "a.parquet")
    found, unmatched = find_files(pafs.LocalFileSystem(), [str(folder)])
    assert ([f.relative for f in found], unmatched) == (["a.parquet"], [])


@pytest.mark.parametrize("below_ms", [1, 300, 499, 501, 999_999])
def test_modification_time_is_the_files_nanoseconds_floored_to_milliseconds(tmp_path, below_ms):
    # Delta's modificationTime in whole ms, as st_mtime_ns // 10**6 gives it, also for times a
    # few ns below a millisecond boundary (a float of seconds rounds them up to the next one).
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"id": [1]}), path)
    ns = 1_795_548_534_946_000_000 - below_ms
    os.utime(path, ns=(ns, ns))
    info = pafs.LocalFileSystem().get_file_info(str(path))
    assert modification_time_ms(info) == ns // 10**6 == path.stat().st_mtime_ns // 10**6

"""Reading the Delta log: the Parquet bytes a row takes in a table's newest files."""

from __future__ import annotations

import statistics

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from deltaflow.delta import log as delta_log


def _ratios(uri):
    files = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    return {f["path"]: f["size_bytes"] / f["num_records"] for f in files}, files


def test_bytes_per_row_is_the_median_ratio_of_the_newest_files(tmp_path):
    uri = str(tmp_path / "t")
    assert delta_log.bytes_per_row(None) is None
    write_deltalake(uri, pa.table({"id": pa.array([], pa.int64()), "s": pa.array([], pa.string())}))
    assert delta_log.bytes_per_row(DeltaTable(uri)) is None  # no file counts rows yet

    for n in (10, 12, 14):  # a stream's small files
        write_deltalake(uri, pa.table({"id": list(range(n)), "s": ["x" * 50] * n}), mode="append")
    ratios, _ = _ratios(uri)
    assert delta_log.bytes_per_row(DeltaTable(uri)) == statistics.median(ratios.values())

    # A big file (a compaction's, another writer's) is one vote, not most of the rows.
    write_deltalake(uri, pa.table({"id": list(range(100_000)), "s": ["y"] * 100_000}), mode="append")
    ratios, files = _ratios(uri)
    big = max(files, key=lambda f: f["num_records"])
    assert ratios[big["path"]] < min(r for p, r in ratios.items() if p != big["path"]) / 5
    small = sorted(r for p, r in ratios.items() if p != big["path"])
    assert delta_log.bytes_per_row(DeltaTable(uri)) == statistics.median([*small, ratios[big["path"]]])
    assert delta_log.bytes_per_row(DeltaTable(uri)) >= small[0] / 2

    newest = max(files, key=lambda f: f["modification_time"])
    assert delta_log.bytes_per_row(DeltaTable(uri), files=1) == newest["size_bytes"] / newest["num_records"]


def test_rows_committed_since_counts_the_pipelines_commits_after_a_version(tmp_path):
    from deltalake import CommitProperties

    uri = str(tmp_path / "t")
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64())})

    def commit(pipeline: str, n: int) -> None:
        meta = {"deltaflow.pipeline_id": pipeline, "deltaflow.rows": n}
        write_deltalake(uri, rows, mode="append", commit_properties=CommitProperties(custom_metadata=meta))

    commit("a", 3)  # version 0
    commit("a", 5)
    commit("b", 7)  # another pipeline's
    commit("a", 11)
    assert delta_log.rows_committed_since(uri, {}, "a", 0) == 16
    assert delta_log.rows_committed_since(uri, {}, "a", -1) == 19
    assert delta_log.rows_committed_since(uri, {}, "a", 3) == 0
    assert delta_log.rows_committed_since(str(tmp_path / "none"), {}, "a", -1) == 0

"""Reading the Delta log: the Parquet bytes a row takes in a table's newest files."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from deltaflow.delta import log as delta_log


def test_bytes_per_row_is_size_over_rows_of_the_newest_files(tmp_path):
    uri = str(tmp_path / "t")
    assert delta_log.bytes_per_row(None) is None
    write_deltalake(uri, pa.table({"id": pa.array([], pa.int64()), "s": pa.array([], pa.string())}))
    assert delta_log.bytes_per_row(DeltaTable(uri)) is None  # no file counts rows yet

    write_deltalake(uri, pa.table({"id": list(range(10)), "s": ["x" * 200] * 10}), mode="append")
    write_deltalake(uri, pa.table({"id": list(range(1000)), "s": ["y"] * 1000}), mode="append")
    files = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    small, big = sorted(files, key=lambda f: f["num_records"])
    both = (small["size_bytes"] + big["size_bytes"]) / 1010
    assert delta_log.bytes_per_row(DeltaTable(uri)) == both
    newest = max(files, key=lambda f: f["modification_time"])
    assert delta_log.bytes_per_row(DeltaTable(uri), files=1) == newest["size_bytes"] / newest["num_records"]

"""``deltaflow.sources.delta``: a Delta table as a streaming source, on delta-rs (no jar)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.errors import DeltaSourceError
from deltaflow.service.daemon import run_pipelines
from tests.fixtures.pipelines import pipelines as _pipelines
from tests.fixtures.pipelines import rows as _rows


def _delta_pipeline(tmp_path: Path, source: str, pid: str) -> list:
    return _pipelines(
        tmp_path,
        f"""
        pipelines:
          - id: {pid}
            source: {source}
            sinks: [{{table_uri: "${{DIR}}/{pid}"}}]
        """,
    )


def test_delta_source_snapshot_then_new_commits_deletes_and_changes(spark, tmp_path):
    src = tmp_path / "bronze"
    part = ["a b", "d:e", "c"]
    write_deltalake(str(src), pa.table({"id": [0, 1, 2], "p": part}), partition_by=["p"])
    write_deltalake(str(src), pa.table({"id": [3, 4], "p": ["a b", "c"]}), partition_by=["p"], mode="append")
    specs = _delta_pipeline(tmp_path, f"{{type: delta, table_uri: '{src}'}}", "silver")

    run_pipelines(spark, specs, available_now=True)  # the snapshot (version 1) as one batch
    assert _rows(tmp_path / "silver", "id", "p") == [(0, "a b"), (1, "d:e"), (2, "c"), (3, "a b"), (4, "c")]

    write_deltalake(str(src), pa.table({"id": [5], "p": ["d:e"]}), partition_by=["p"], mode="append")
    DeltaTable(str(src)).optimize.compact()  # dataChange=false: no new rows
    run_pipelines(spark, specs, available_now=True)
    assert [r[0] for r in _rows(tmp_path / "silver", "id")] == [0, 1, 2, 3, 4, 5]

    # Deleting a whole partition removes files only: refused, then skipped with ignore_deletes.
    DeltaTable(str(src)).delete("p = 'c'")
    with pytest.raises(DeltaSourceError, match=r"deletes data.*Set ignore_deletes"):
        run_pipelines(spark, specs, available_now=True)
    ignoring = _delta_pipeline(
        tmp_path, f"{{type: delta, table_uri: '{src}', ignore_deletes: true}}", "silver"
    )
    run_pipelines(spark, ignoring, available_now=True)
    assert [r[0] for r in _rows(tmp_path / "silver", "id")] == [0, 1, 2, 3, 4, 5]

    # Rewriting rows: refused even with ignore_deletes; ignore_changes reads the new files again.
    DeltaTable(str(src)).update(updates={"id": "id + 100"}, predicate="id = 0")
    with pytest.raises(DeltaSourceError, match="rewrites files"):
        run_pipelines(spark, ignoring, available_now=True)
    changes = _delta_pipeline(
        tmp_path, f"{{type: delta, table_uri: '{src}', ignore_changes: true}}", "silver"
    )
    run_pipelines(spark, changes, available_now=True)
    ids = [r[0] for r in _rows(tmp_path / "silver", "id")]
    assert 100 in ids and ids.count(3) == 2  # the rewritten file's other row (3) came again


def test_delta_source_timestamp_partitions_and_a_column_added_upstream(spark, tmp_path):
    import datetime as dt

    src = tmp_path / "src"
    hour = dt.datetime(2026, 11, 22, 8, tzinfo=dt.UTC)
    write_deltalake(str(src), pa.table({"id": [1], "hour": [hour]}), partition_by=["hour"])
    specs = _pipelines(
        tmp_path,
        f"""
        pipelines:
          - id: ts
            source: {{type: delta, table_uri: "{src}"}}
            sinks: [{{table_uri: "${{DIR}}/t", schema_mode: merge}}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)  # the snapshot
    later = hour + dt.timedelta(hours=1)
    write_deltalake(str(src), pa.table({"id": [2], "hour": [later]}), partition_by=["hour"], mode="append")
    run_pipelines(spark, specs, available_now=True)  # a new commit: partition values from the log
    assert _rows(tmp_path / "t", "id", "hour") == [(1, hour), (2, later)]

    # A column added upstream while a query reads: that query stops (transient, the daemon restarts
    # it) rather than dropping the new column's values; a query started afterwards reads it.
    from deltaflow.errors import SchemaEvolvedError
    from deltaflow.sources.delta import DeltaStreamOptions, DeltaStreamReader, table_arrow_schema

    running = DeltaStreamReader(
        DeltaStreamOptions(table_uri=str(src)), table_arrow_schema(DeltaTable(str(src)))
    )
    write_deltalake(
        str(src),
        pa.table({"id": [3], "hour": [later], "note": ["new"]}),
        partition_by=["hour"],
        mode="append",
        schema_mode="merge",
    )
    with pytest.raises(SchemaEvolvedError, match="adds column\\(s\\) note; restarting the query"):
        running.partitions({"version": 1, "snapshot": 0}, {"version": 2, "snapshot": 0})
    run_pipelines(spark, specs, available_now=True)
    assert _rows(tmp_path / "t", "id", "note") == [(1, None), (2, None), (3, "new")]


def test_delta_source_from_a_version_and_its_change_feed(spark, tmp_path):
    src = tmp_path / "cdf"
    props = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(str(src), pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}), configuration=props)
    write_deltalake(str(src), pa.table({"id": [4], "v": ["d"]}), mode="append")
    DeltaTable(str(src)).update(updates={"v": "'B'"}, predicate="id = 2")
    DeltaTable(str(src)).delete("id = 3")

    # From version 1 on, following rewrites: each rewritten file's rows come again.
    source = f"{{type: delta, table_uri: '{src}', starting_version: 1, ignore_changes: true}}"
    run_pipelines(spark, _delta_pipeline(tmp_path, source, "plain"), available_now=True)
    assert _rows(tmp_path / "plain", "id", "v") == [
        (1, "a"),
        (1, "a"),
        (2, "B"),
        (2, "B"),
        (3, "c"),
        (4, "d"),
    ]

    feed = _delta_pipeline(
        tmp_path, f"{{type: delta, table_uri: '{src}', starting_version: 1, read_change_feed: true}}", "feed"
    )
    run_pipelines(spark, feed, available_now=True)
    got = _rows(tmp_path / "feed", "_commit_version", "_change_type", "id", "v")
    assert got == [
        (1, "insert", 4, "d"),
        (2, "update_postimage", 2, "B"),
        (2, "update_preimage", 2, "b"),
        (3, "delete", 3, "c"),
    ]


def test_starting_timestamp_picks_the_first_version_at_or_after_it(tmp_path):
    from deltaflow.sources.delta import _version_at

    for i in range(3):
        write_deltalake(str(tmp_path / "t"), pa.table({"id": [i]}), mode="append")
        time.sleep(0.01)  # distinct commit timestamps (milliseconds)
    table = DeltaTable(str(tmp_path / "t"))
    stamps = {h["version"]: h["timestamp"] for h in table.history()}
    import datetime as dt

    def iso(ms: int) -> str:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat()

    assert _version_at(table, iso(stamps[1])) == 1
    assert _version_at(table, iso(stamps[1] - 1)) == 1
    assert _version_at(table, iso(stamps[0] - 60_000)) == 0
    assert _version_at(table, iso(stamps[2] + 1)) == 3  # after the last commit: the next one
    with pytest.raises(Exception, match="is not an ISO-8601 time"):
        _version_at(table, "yesterday")

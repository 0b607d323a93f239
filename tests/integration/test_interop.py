"""Tables written by deltaflow read back by independent readers: delta-rs, Polars, DuckDB and
ClickHouse (chdb)."""

from __future__ import annotations

import datetime as dt
import glob
import re

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F  # noqa: N812

import deltaflow

ROWS = 3000
REGIONS = ["eu west", "us:east", "ap-south"]  # a space and a colon in partition values


@pytest.fixture(scope="module", params=["spark", "arrow"])
def table(request, spark, tmp_path_factory):
    """A partitioned table with a timestamp column, several files per partition, streamed
    through each write path (Spark's Parquet writer / Python workers with pyarrow)."""
    folder = tmp_path_factory.mktemp(f"interop-{request.param}")
    uri = str(folder / "events")
    df = (
        spark.range(ROWS)
        .withColumn(
            "region", F.element_at(F.array(*[F.lit(r) for r in REGIONS]), (F.col("id") % 3 + 1).cast("int"))
        )
        .withColumn("ts", F.timestamp_micros(F.lit(1_704_067_200_000_000) + F.col("id") * 1_000_001))
        .withColumn("amount", F.col("id") * 0.5)
        .withColumn(
            "note", F.when(F.col("id") % 10 == 0, F.lit(None)).otherwise(F.concat(F.lit("n"), F.col("id")))
        )
        .repartitionByRange(4, "id")
    )
    df.write.parquet(str(folder / "landing"))
    source = spark.readStream.schema(df.schema).parquet(str(folder / "landing"))
    query = deltaflow.write_stream(
        source,
        uri,
        pipeline_id="interop",
        partition_columns=["region"],
        max_records_per_file=250,
        write_path=request.param,
        trigger={"availableNow": True},
    )
    assert query.awaitTermination(300)
    return uri


def _expected_ids(predicate=lambda i: True):
    return [i for i in range(ROWS) if predicate(i)]


def _ts(i: int) -> dt.datetime:
    return dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=i * 1_000_001)


def test_deltalake_reads_every_row_and_partition_value(table):
    data = DeltaTable(table).to_pyarrow_table().sort_by("id")
    assert data["id"].to_pylist() == _expected_ids()
    assert data["region"].to_pylist() == [REGIONS[i % 3] for i in range(ROWS)]
    assert data["ts"].to_pylist()[:2] == [_ts(0), _ts(1)]
    assert data["ts"].to_pylist()[-1] == _ts(ROWS - 1)
    assert data["note"].null_count == ROWS // 10
    assert pa.types.is_timestamp(data.schema.field("ts").type)


def test_deltalake_partition_filter(table):
    data = DeltaTable(table).to_pyarrow_table(filters=[("region", "=", "us:east")])
    assert sorted(data["id"].to_pylist()) == _expected_ids(lambda i: i % 3 == 1)


def test_polars_reads_the_table_and_derives_partitions(table):
    df = pl.read_delta(table).sort("id")
    assert df["id"].to_list() == _expected_ids()
    assert df["region"].to_list() == [REGIONS[i % 3] for i in range(ROWS)]
    assert df["ts"][1] == _ts(1)
    lazy = pl.scan_delta(table).filter((pl.col("region") == "eu west") & (pl.col("id") >= 1500)).collect()
    assert sorted(lazy["id"].to_list()) == _expected_ids(lambda i: i % 3 == 0 and i >= 1500)


def test_duckdb_reads_the_table(duck, table):
    rows = duck.sql(
        f"SELECT region, count(*), min(id), max(ts) FROM delta_scan('{table}') GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("ap-south", 1000, 2),
        ("eu west", 1000, 0),
        ("us:east", 1000, 1),
    ]
    assert rows[1][3] == _ts(2997)
    assert duck.sql(
        f"SELECT count(*) FROM delta_scan('{table}') WHERE region = 'us:east' AND note IS NULL"
    ).fetchone() == (sum(1 for i in range(ROWS) if i % 3 == 1 and i % 10 == 0),)


def _files_scanned(duck, sql: str) -> tuple[int, int]:
    plan = "\n".join(row[1] for row in duck.sql("EXPLAIN ANALYZE " + sql).fetchall())
    match = re.search(r"Scanning Files:\s*(\d+)/(\d+)", plan)
    assert match, plan
    return int(match.group(1)), int(match.group(2))


def test_duckdb_skips_files_by_stats(duck, table):
    total = len(DeltaTable(table).file_uris())
    assert total >= 12
    scanned, listed = _files_scanned(duck, f"SELECT count(*) FROM delta_scan('{table}') WHERE id < 300")
    assert listed == total
    assert scanned < total / 2
    # DuckDB's delta extension does not push timestamp predicates down to file stats (the
    # same holds for tables written by delta-rs itself), so there the check is on the bounds.


def test_timestamp_stats_bound_every_value_of_their_file(table):
    from urllib.parse import unquote

    import pyarrow.parquet as pq

    delta = DeltaTable(table)
    root = delta.table_uri.removeprefix("file://")
    adds = pa.table(delta.get_add_actions(flatten=False)).to_pylist()
    assert len(adds) == len(delta.file_uris())
    for add in adds:
        values = pq.read_table(root + unquote(add["path"]), columns=["ts"])["ts"].to_pylist()
        lo, hi = add["min"]["ts"], add["max"]["ts"]
        assert lo <= min(values) and max(values) <= hi  # valid bounds for skipping
        assert min(values) - lo < dt.timedelta(milliseconds=1)  # and tight ones
        assert hi - max(values) < dt.timedelta(milliseconds=1)


# ---- Four independent readers agree on every shape of table deltaflow leaves behind ----------

SHAPES = ["as-written", "compacted", "schema-evolved", "merged", "checkpointed"]


@pytest.fixture(scope="module")
def shapes(table, spark, tmp_path_factory):
    """The streamed table, and copies of it after compaction, after an append that adds a column
    (schema mode ``merge``), after a MERGE that updates and inserts rows, and after 12 appends
    with a log checkpoint every 10 commits (Delta's default interval; delta-rs' is 100)."""
    import shutil

    from deltaflow.ops.dml import MergeClause, merge
    from deltaflow.ops.optimize import optimize

    folder = tmp_path_factory.mktemp("shapes")
    out = {"as-written": table}
    for name in SHAPES[1:]:
        out[name] = str(folder / name)
        shutil.copytree(table, out[name])
    assert optimize(out["compacted"]).files_removed > 1
    extra = (
        spark.range(ROWS, ROWS + 60)
        .withColumn(
            "region", F.element_at(F.array(*[F.lit(r) for r in REGIONS]), (F.col("id") % 3 + 1).cast("int"))
        )
        .withColumn("ts", F.timestamp_micros(F.lit(1_704_067_200_000_000) + F.col("id") * 1_000_001))
        .withColumn("amount", F.col("id") * 0.5)
        .withColumn("note", F.lit("late"))
        .withColumn("added", F.concat(F.lit("x"), F.col("id").cast("string")))
    )
    deltaflow.write(extra, out["schema-evolved"], schema_mode="merge", partition_columns=["region"])
    ids = list(range(0, 90, 3)) + list(range(ROWS + 100, ROWS + 130))
    source = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": [REGIONS[i % 3] for i in ids],
            "ts": pa.array([_ts(i) for i in ids], pa.timestamp("us", tz="UTC")),
            "amount": [-float(i) for i in ids],
            "note": ["merged"] * len(ids),
        }
    )
    merge(
        out["merged"],
        source,
        condition="target.id = source.id",
        target_alias="target",
        clauses=[
            MergeClause("matched_update", values={"amount": "source.amount", "note": "source.note"}),
            MergeClause("not_matched_insert_all"),
        ],
    )
    DeltaTable(out["checkpointed"]).alter.set_table_properties({"delta.checkpointInterval": "10"})
    for n in range(12):
        batch = [ROWS + 200 + 5 * n + k for k in range(5)]
        write_deltalake(
            out["checkpointed"],
            pa.table(
                {
                    "id": pa.array(batch, pa.int64()),
                    "region": [REGIONS[i % 3] for i in batch],
                    "ts": pa.array([_ts(i) for i in batch], pa.timestamp("us", tz="UTC")),
                    "amount": [i * 0.5 for i in batch],
                    "note": ["appended"] * len(batch),
                }
            ),
            mode="append",
        )
    assert glob.glob(f"{out['checkpointed']}/_delta_log/*.checkpoint.parquet")
    return out


def _normalised(data: pa.Table, columns: list[str]) -> list[tuple]:
    """Rows ordered by id, the columns in one order, timestamps as UTC instants."""
    rows = data.select(columns).sort_by("id").to_pylist()
    return [
        tuple(v.astimezone(dt.UTC) if isinstance(v, dt.datetime) else v for v in row.values()) for row in rows
    ]


@pytest.mark.parametrize("shape", SHAPES)
def test_delta_rs_polars_duckdb_and_clickhouse_read_the_same_rows(shapes, shape, duck):
    from tests.fixtures.readers import chdb_read

    uri = shapes[shape]
    reference = DeltaTable(uri).to_pyarrow_table()
    columns = reference.schema.names
    expected = _normalised(reference, columns)
    assert (
        len(expected)
        == {
            "as-written": ROWS,
            "compacted": ROWS,
            "schema-evolved": ROWS + 60,
            "merged": ROWS + 30,
            "checkpointed": ROWS + 60,
        }[shape]
    )
    if shape == "schema-evolved":
        assert "added" in columns and sum(r[columns.index("added")] is not None for r in expected) == 60
    if shape == "merged":
        assert expected[3][columns.index("note")] == "merged" and expected[3][columns.index("amount")] == -3.0
    duck.execute("SET TimeZone = 'UTC'")
    readers = {
        "polars": pl.read_delta(uri).to_arrow(),
        "duckdb": duck.sql(f"SELECT * FROM delta_scan('{uri}')").to_arrow_table(),
        "clickhouse": chdb_read(uri),
    }
    for reader, data in readers.items():
        assert sorted(data.schema.names) == sorted(columns), reader
        got = _normalised(data, columns)
        assert got == expected, (
            reader,
            next(((a, b) for a, b in zip(got, expected, strict=False) if a != b), None),
        )

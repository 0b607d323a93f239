"""``deltaflow.tables.DeltaTable``: delta-spark's Python API on delta-rs, checked against the
streaming chapter's ``upsertToDelta`` (``../shared/reference/003``, "Merge") and a pandas
reference, and each method against what delta-rs and DuckDB read."""

from __future__ import annotations

import datetime as dt
import random
import re
import shutil
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

from deltaflow.errors import ConfigError, TableNotFoundError
from deltaflow.tables import *  # noqa: F403 - the chapter's "from delta.tables import *"
from deltaflow.tables import DeltaTable

SILVER = pa.schema(
    [
        ("t_id", pa.int64()),
        ("transaction_date", pa.string()),
        ("item_count", pa.int64()),
        ("amount", pa.float64()),
    ]
)


@pytest.fixture
def retail_db(spark):
    """``retail_db`` under the session's warehouse directory, removed afterwards."""
    warehouse = urlparse(spark.conf.get("spark.sql.warehouse.dir")).path
    folder = Path(warehouse) / "retail_db.db"
    shutil.rmtree(folder, ignore_errors=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _changes(rng: random.Random, batch: int, keys: list[int]) -> list[tuple]:
    """One micro-batch of CDC records: distinct keys, inserts/updates/deletes."""
    chosen = rng.sample(keys, 12)
    rows = []
    for t_id in chosen:
        operation = rng.choice(["INSERT", "UPDATE", "UPDATE", "DELETE"])
        rows.append(
            (t_id, f"2023-04-{10 + batch:02d}", rng.randint(1, 9), round(rng.uniform(1, 100), 2), operation)
        )
    return rows


def _reference(batches: list[list[tuple]]) -> pd.DataFrame:
    """The merge of the chapter, batch by batch, in pandas: matched DELETE deletes, other matched
    rows update, unmatched rows insert (whatever their operation, as the clauses say)."""
    table: dict[int, tuple] = {}
    for rows in batches:
        for t_id, date, count, amount, operation in rows:
            if t_id in table and operation == "DELETE":
                del table[t_id]
            else:
                table[t_id] = (t_id, date, count, amount)
    frame = pd.DataFrame(sorted(table.values()), columns=SILVER.names)
    return frame.reset_index(drop=True)


def test_upsert_to_delta_in_foreach_batch_equals_a_pandas_reference(spark, tmp_path, retail_db):
    target = retail_db / "transactions_silver"
    write_deltalake(str(target), SILVER.empty_table())
    rng = random.Random(7)
    batches = [_changes(rng, b, list(range(30))) for b in range(6)]

    # The chapter's function with only the import changed (at the top of this module) and its
    # two typos fixed: the stray parenthesis after alias("dt") and Target_table/target_table,
    # which no Python runs.
    def upsertToDelta(microBatchDf, batchId):  # noqa: N802, N803
        target_table = "retail_db.transactions_silver"
        deltaTable = DeltaTable.forName(spark, target_table)  # noqa: N806
        (
            deltaTable.alias("dt")
            .merge(source=microBatchDf.alias("sdf"), condition="sdf.t_id = dt.t_id")
            .whenMatchedDelete(condition="sdf.operation='DELETE'")
            .whenMatchedUpdate(
                set={
                    "t_id": "sdf.t_id",
                    "transaction_date": "sdf.transaction_date",
                    "item_count": "sdf.item_count",
                    "amount": "sdf.amount",
                }
            )
            .whenNotMatchedInsert(
                values={
                    "t_id": "sdf.t_id",
                    "transaction_date": "sdf.transaction_date",
                    "item_count": "sdf.item_count",
                    "amount": "sdf.amount",
                }
            )
            .execute()
        )

    landing = tmp_path / "changes"
    schema = "t_id long, transaction_date string, item_count long, amount double, operation string"
    for b, rows in enumerate(batches):
        spark.createDataFrame(rows, schema).coalesce(1).write.mode("append").json(str(landing / f"b{b}"))
    changesStream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(landing / "*"))  # noqa: N806
    query = (
        changesStream.writeStream.format("delta")
        .queryName("Summaries Silver Pipeline")
        .foreachBatch(upsertToDelta)
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    got = RsTable(str(target)).to_pandas().sort_values("t_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, _reference(batches), check_dtype=False)
    assert len(RsTable(str(target)).history()) == 1 + 6  # one MERGE commit per micro-batch


def test_merge_evaluates_its_source_once(spark, tmp_path):
    from pyspark.sql import functions as F  # noqa: N812

    path = str(tmp_path / "once")
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64()), "r": [0.5]}))
    calls = spark.sparkContext.accumulator(0)

    @F.udf("double")
    def noisy(i):
        calls.add(1)
        return random.random()

    source = spark.range(100).withColumn("r", noisy("id"))
    metrics = (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "s.id = t.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
        .first()
    )
    assert calls.value == 100  # each source row computed once: delta-spark's two passes make 200
    assert (metrics["num_updated_rows"], metrics["num_inserted_rows"]) == (1, 99)
    assert RsTable(path).to_pyarrow_table().num_rows == 100


def test_the_rest_of_the_api(spark, tmp_path):
    from pyspark.sql import functions as F  # noqa: N812

    path = str(tmp_path / "api")
    for day in ("2021-11-18", "2021-11-19"):
        for i in range(3):
            rows = pa.table(
                {"date": [day] * 2, "id": pa.array([i * 2, i * 2 + 1], pa.int64()), "v": ["x", "y"]}
            )
            write_deltalake(path, rows, partition_by=["date"], mode="append")
    assert DeltaTable.isDeltaTable(spark, path)
    assert not DeltaTable.isDeltaTable(spark, str(tmp_path / "nothing"))
    with pytest.raises(TableNotFoundError):
        DeltaTable.forPath(spark, str(tmp_path / "nothing"))
    table = DeltaTable.forPath(spark, path)
    assert table.toDF().count() == 12
    assert table.alias("a").toDF().select("a.id").count() == 12

    table.update(condition="id = 1", set={"v": "'updated'"})
    table.update(condition=F.expr("id = 2"), set={"v": F.lit("by column")})
    with pytest.raises(ConfigError, match="as a SQL string"):
        table.update(condition=F.col("id") == 2, set={"v": F.lit("x")})
    table.delete("id = 0")
    values = {r["id"]: r["v"] for r in table.toDF().where("date = '2021-11-18'").collect()}
    assert values[1] == "updated" and values[2] == "by column" and 0 not in values

    history = table.history()
    assert [r["operation"] for r in history.orderBy("version").collect()][-3:] == [
        "UPDATE",
        "UPDATE",
        "DELETE",
    ]
    assert table.history(1).count() == 1
    detail = table.detail().first()
    assert detail["format"] == "delta" and detail["partitionColumns"] == ["date"]
    assert detail["numFiles"] == len(RsTable(path).file_uris())

    compacted = table.optimize().where("date = '2021-11-18'").executeCompaction().first()
    assert compacted["metrics"]["numFilesRemoved"] >= 2 and compacted["metrics"]["numFilesAdded"] == 1
    zordered = table.optimize().executeZOrderBy("id").first()
    assert zordered["metrics"]["numFilesAdded"] >= 1
    assert table.toDF().count() == 10

    version_before = RsTable(path).version()
    table.delete()
    assert table.toDF().count() == 0
    restored = table.restoreToVersion(version_before).first()
    assert restored["num_restored_files"] >= 1
    assert table.toDF().count() == 10
    table.restoreToTimestamp(dt.datetime.now(dt.UTC).isoformat())  # the latest version: no change
    assert table.toDF().count() == 10

    with pytest.raises(Exception, match="retention"):
        table.vacuum(0)
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        removed = table.vacuum(0).collect()
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert removed  # the files the optimizes and the delete replaced
    assert table.toDF().count() == 10  # what the table references is never vacuumed

    table.generate("symlink_format_manifest")
    manifests = sorted(Path(path, "_symlink_format_manifest").rglob("manifest"))
    listed = sorted(line for m in manifests for line in m.read_text().splitlines())
    assert [m.parent.name for m in manifests] == ["date=2021-11-18", "date=2021-11-19"]
    assert sorted(Path(p).name for p in listed) == sorted(Path(u).name for u in RsTable(path).file_uris())


def test_time_travel_before_the_first_commit_is_refused_naming_the_earliest_time(spark, tmp_path):
    # delta-spark refuses a time before the earliest version; delta-rs answers version 0 (here
    # the empty CREATE), and restoreToTimestamp emptied the table.
    path = str(tmp_path / "t")
    before = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    RsTable.create(path, schema=pa.schema([("id", pa.int64())]))
    write_deltalake(path, pa.table({"id": [1, 2]}), mode="append")
    first = RsTable(path).history()[-1]["timestamp"]
    named = dt.datetime.fromtimestamp(first / 1000, dt.UTC).isoformat(timespec="milliseconds")
    table = DeltaTable.forPath(spark, path)
    refused = rf"before the earliest version .*Use a timestamp at or after {re.escape(named)}"

    with pytest.raises(ConfigError, match=refused):
        table.restoreToTimestamp(before)
    assert RsTable(path).version() == 1 and table.toDF().count() == 2
    with pytest.raises(Exception, match=refused):
        spark.read.format("delta").option("timestampAsOf", before).load(path).count()
    assert spark.read.format("delta").option("timestampAsOf", named).load(path).count() == 0

"""``format("delta")`` served by deltaflow (no delta-spark jar): the streaming chapter's snippets
(``../shared/reference/003``, "Delta as Source", "Delta as Sink", "Delta Streaming Options",
"Idempotent Stream Writes"), verbatim except for paths, on Spark with nothing but deltaflow."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.errors import ConfigError
from tests.fixtures.readers import duckdb_delta

USER_EVENTS = pa.schema([("date", pa.string()), ("user_email", pa.string()), ("action", pa.string())])


def _events(date: str, n: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "date": [date] * n,
            "user_email": [f"u{i}@example.com" for i in range(start, start + n)],
            "action": ["click"] * n,
        },
        schema=USER_EVENTS,
    )


def _user_events(root: Path) -> str:
    """The chapter's ``user_events`` table, partitioned by ``date``, three commits."""
    path = str(root / "files" / "delta" / "user_events")
    for date in ("2023-04-17", "2023-04-18", "2023-04-19"):
        write_deltalake(path, _events(date, 3), partition_by=["date"], mode="append")
    return path


def _emails(path: str) -> list[tuple[str, str]]:
    rows = DeltaTable(path).to_pyarrow_table(columns=["date", "user_email"]).to_pylist()
    return sorted((r["date"], r["user_email"]) for r in rows)


@pytest.fixture
def checkpoint_root(spark, tmp_path):
    """The session's default checkpoint root (the chapter's snippets name no checkpoint)."""
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "checkpoints"))
    yield
    spark.conf.unset("spark.sql.streaming.checkpointLocation")


def test_delta_as_source_and_sink_with_ignore_deletes_across_restarts(spark, tmp_path):
    source = _user_events(tmp_path)
    sink = str(tmp_path / "delta_path")

    def run_chain() -> None:
        # "Delta as Source" (ignoreDeletes) chained into "Delta as Sink", as printed.
        streamingDeltaDF = (  # noqa: N806 - the chapter's name
            spark.readStream.format("delta").option("ignoreDeletes", "true").load(source)
        )
        query = (
            streamingDeltaDF.writeStream.format("delta")
            .outputMode("append")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start(sink)
        )
        query.processAllAvailable()
        query.stop()

    run_chain()
    assert _emails(sink) == _emails(source)
    partitions = DeltaTable(sink).metadata().partition_columns
    assert partitions == []  # the stream's sink is not partitioned unless told

    # GDPR: drop a whole date partition upstream (a commit that only removes files), add new rows.
    DeltaTable(source).delete("date = '2023-04-17'")
    write_deltalake(source, _events("2023-04-20", 2, start=10), partition_by=["date"], mode="append")
    run_chain()
    landed = _emails(sink)
    assert len(landed) == len(set(landed)) == 11  # 9 from the snapshot, 2 new; the delete skipped
    assert ("2023-04-20", "u11@example.com") in landed

    # The sink is a plain Delta table: DuckDB, Polars and delta-rs read the same rows.
    assert duckdb_delta().execute(f"SELECT count(*) FROM delta_scan('{sink}')").fetchone()[0] == 11
    assert pl.read_delta(sink).height == 11
    # Delta's own sink records txn(query id, batch id): so does deltaflow's.
    queries = {h.get("deltaflow.query_id") for h in DeltaTable(sink).history()} - {None}
    assert len(queries) == 1
    assert DeltaTable(sink).transaction_version(queries.pop()) == 1  # batches 0 and 1


def test_delta_streaming_options_of_the_chapter(spark, tmp_path, checkpoint_root):
    source = _user_events(tmp_path)
    DeltaTable(source).update(
        predicate="date = '2023-04-17' AND user_email = 'u1@example.com'", updates={"action": "'view'"}
    )
    # version 3 rewrote a file: a plain stream stops there, ignoreChanges reads its new file.

    def collect(df, name: str) -> list[dict]:
        query = df.writeStream.format("memory").queryName(name).start()
        query.processAllAvailable()
        query.stop()
        return spark.sql(f"SELECT * FROM {name}").collect()

    with pytest.raises(Exception, match="rewrites files"):
        collect(spark.readStream.format("delta").option("startingVersion", "1").load(source), "plain")
    changed = collect(
        spark.readStream.format("delta")
        .option("ignoreChanges", "true")
        .option("startingVersion", "1")
        .load(source),
        "changes",
    )
    assert len(changed) == 3 + 3 + 3  # versions 1 and 2, then the rewritten file of version 3 again
    skipped = collect(
        spark.readStream.format("delta")
        .option("skipChangeCommits", "true")
        .option("startingVersion", "1")
        .load(source),
        "skipped",
    )
    assert len(skipped) == 6

    # "startingVersion" as printed (the table has versions 0..3 here: 5 is beyond it, refused).
    with pytest.raises(Exception, match="beyond the table's latest version"):
        collect(spark.readStream.format("delta").option("startingVersion", "5").load(source), "v5")
    # "startingTimestamp" as printed, a date: every commit is later than 2023-04-18.
    since = collect(
        spark.readStream.format("delta")
        .option("ignoreChanges", "true")
        .option("startingTimestamp", "2023-04-18")
        .load(source),
        "since",
    )
    assert len(since) == 9 + 3
    latest = collect(
        spark.readStream.format("delta").option("startingVersion", "latest").load(source), "latest"
    )
    assert latest == []

    # maxFilesPerTrigger splits the snapshot and the commits at file granularity.
    sink = str(tmp_path / "limited")
    query = (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", "1")
        .option("skipChangeCommits", "true")
        .load(source)
        .writeStream.format("delta")
        .option("checkpointLocation", str(tmp_path / "limited_checkpoint"))
        .trigger(availableNow=True)
        .start(sink)
    )
    query.awaitTermination(120)
    writes = [h for h in DeltaTable(sink).history() if h.get("deltaflow.epoch") is not None]
    assert len(writes) == len(DeltaTable(source).file_uris())  # one file per micro-batch
    assert _emails(sink) == _emails(source)

    # withEventTimeOrder cannot be honoured: refused, naming it.
    with pytest.raises(Exception, match="withEventTimeOrder: not supported"):
        collect(spark.readStream.format("delta").option("withEventTimeOrder", "true").load(source), "eto")
    with pytest.raises(Exception, match=r"(?i)maxFilesPerTriger: unknown option"):
        collect(spark.readStream.format("delta").option("maxFilesPerTriger", "1").load(source), "typo")


def test_batch_reads_time_travel_and_change_feed(spark, tmp_path):
    path = str(tmp_path / "cdf")
    write_deltalake(
        path,
        pa.table({"id": [1, 2], "v": ["a", "b"]}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    write_deltalake(path, pa.table({"id": [3], "v": ["c"]}), mode="append")
    DeltaTable(path).delete("id = 1")
    assert spark.read.format("delta").load(path).count() == 2
    assert spark.read.format("delta").option("versionAsOf", 0).load(path).count() == 2
    assert spark.read.format("delta").option("versionAsOf", "1").load(path).count() == 3
    later = dt.datetime.now(dt.UTC).isoformat()
    assert spark.read.format("delta").option("timestampAsOf", later).load(path).count() == 2
    changes = (
        spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1).load(path)
    )
    got = sorted((r["id"], r["_change_type"], r["_commit_version"]) for r in changes.collect())
    assert got == [(1, "delete", 2), (3, "insert", 1)]
    with pytest.raises(Exception, match="startingVersion apply to batch reads of the Change Data Feed only"):
        spark.read.format("delta").option("startingVersion", 1).load(path).collect()


def test_time_travel_to_a_vacuumed_version_is_a_terminal_error_naming_the_files(spark, tmp_path):
    # The tasks failed on pyarrow's FileNotFoundError of the first vacuumed file: a raw Spark
    # job failure instead of what `deltaflow restore` says of the same version.
    from deltaflow.errors import DataFilesGoneError
    from deltaflow.service.daemon import classify_failure
    from tests.fixtures.tables import vacuumed_table

    path = str(tmp_path / "t")
    vacuumed_table(path)
    old = (DeltaTable(path).history()[-1]["timestamp"] + 1) / 1000  # in version 0's second
    for option, value in (
        ("versionAsOf", "1"),
        ("timestampAsOf", dt.datetime.fromtimestamp(old, dt.UTC).isoformat()),
    ):
        with pytest.raises(Exception) as refused:
            spark.read.format("delta").option(option, value).load(path).collect()
        text = str(refused.value)
        assert "deltaflow.errors.DataFilesGoneError: cannot read version " in text, text
        assert "data files of that version are gone (vacuumed?)" in text and "Read a newer version" in text
        assert isinstance(classify_failure(refused.value), DataFilesGoneError)  # terminal: never retried
    assert sorted(
        r["id"] for r in spark.read.format("delta").option("versionAsOf", 2).load(path).collect()
    ) == [10, 11]


def test_batch_writes_modes_partitions_idempotence_and_typos(spark, tmp_path):
    path = str(tmp_path / "written")
    df = spark.createDataFrame([(1, "2023-04-18"), (2, "2023-04-19")], "id int, date string")
    df.write.format("delta").partitionBy("date").save(path)  # default mode: the table is new
    assert DeltaTable(path).metadata().partition_columns == ["date"]
    with pytest.raises(Exception, match=r"already exists at .* 'errorifexists'"):
        df.write.format("delta").save(path)
    df.write.format("delta").mode("ignore").save(path)  # exists: nothing written
    assert DeltaTable(path).version() == 0

    for _ in range(2):  # the same (txnAppId, txnVersion) twice: the second is skipped
        df.write.format("delta").mode("append").option("txnAppId", "app").option("txnVersion", 7).save(path)
    assert DeltaTable(path).version() == 1
    assert DeltaTable(path).transaction_version("app") == 7
    # Appending without partitionBy keeps the table's partitioning, as delta-spark does.
    assert spark.read.format("delta").load(path).count() == 4

    wider = spark.createDataFrame([(3, "2023-04-20", "x")], "id int, date string, note string")
    with pytest.raises(Exception, match="note"):
        wider.write.format("delta").mode("append").save(path)
    wider.write.format("delta").mode("append").option("mergeSchema", "true").option(
        "userMetadata", "backfill #1"
    ).save(path)
    assert "note" in DeltaTable(path).schema().to_arrow().names
    assert DeltaTable(path).history(1)[0].get("userMetadata") == "backfill #1"

    df.write.format("delta").mode("overwrite").save(path)
    assert spark.read.format("delta").load(path).count() == 2

    # replaceWhere: only the selected partitions are replaced, in one commit; rows outside refused.
    day = spark.createDataFrame([(9, "2023-04-19")], "id int, date string")
    day.write.format("delta").mode("overwrite").option("replaceWhere", "date = '2023-04-19'").save(path)
    got = sorted((r["id"], r["date"]) for r in spark.read.format("delta").load(path).collect())
    assert got == [(1, "2023-04-18"), (9, "2023-04-19")]
    with pytest.raises(Exception, match="outside replace_where"):
        df.write.format("delta").mode("overwrite").option("replaceWhere", "date = '2023-04-19'").save(path)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 2  # nothing committed
    with pytest.raises(Exception, match=r"replaceWhere applies to .mode\('overwrite'\) only"):
        day.write.format("delta").mode("append").option("replaceWhere", "date = '2023-04-19'").save(path)

    # overwriteSchema: the data's schema replaces the table's (its partitioning stays).
    other_shape = spark.createDataFrame([("a", 1.5, "2023-04-20")], "name string, score double, date string")
    with pytest.raises(Exception, match="cannot change the partitioning"):
        other_shape.write.format("delta").mode("overwrite").option("overwriteSchema", "true").partitionBy(
            "name"
        ).save(path)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 2  # nothing committed, the log loads
    other_shape.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    assert DeltaTable(path).schema().to_arrow().names == ["name", "score", "date"]
    assert DeltaTable(path).metadata().partition_columns == ["date"]
    assert spark.read.format("delta").load(path).collect()[0]["score"] == 1.5

    with pytest.raises(Exception, match=r"(?i)txAppId: unknown option \(did you mean txnAppId\?\)"):
        df.write.format("delta").mode("append").option("txAppId", "a").option("txnVersion", 1).save(path)
    with pytest.raises(ConfigError, match="give both or neither"):
        from deltaflow.config.delta_compat import batch_write_options

        batch_write_options({"path": path, "txnAppId": "a"})

    # partitionBy before format("delta") works too.
    other = str(tmp_path / "partitioned_first")
    df.write.partitionBy("date").format("delta").mode("append").save(other)
    assert DeltaTable(other).metadata().partition_columns == ["date"]

    # Other formats are untouched by deltaflow's writer shim: partitionBy still reaches Spark.
    def partition_folders(folder: Path) -> list[str]:
        return sorted(p.name for p in folder.iterdir() if p.name.startswith("date="))

    expected = ["date=2023-04-18", "date=2023-04-19"]
    df.write.format("parquet").partitionBy("date").save(str(tmp_path / "p1"))
    df.write.partitionBy("date").parquet(str(tmp_path / "p2"))
    df.write.parquet(str(tmp_path / "p3"), partitionBy="date")
    df.write.partitionBy("date").format("json").save(str(tmp_path / "p4"))
    for name in ("p1", "p2", "p3", "p4"):
        assert partition_folders(tmp_path / name) == expected, name


_IDEMPOTENT_JOB = """
import os, signal, sys
import deltaflow
from pyspark.sql import functions as F

spark = deltaflow.spark_session("local[2]", **{"spark.sql.shuffle.partitions": "2"})
source, target_1, target_2, checkpoint, kill_at = sys.argv[1:6]
app_id = "two-tables"  # A unique string used as an application ID.

def writeToDeltaLakeTableIdempotent(batch_df, batch_id):
    # location 1
    (batch_df
     .write
     .format("delta")
     .mode("append")
     .option("txnVersion", batch_id)
     .option("txnAppId", app_id)
     .save(target_1)
    )
    if str(batch_id) == kill_at:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # between the two writes
    # location 2
    (batch_df
     .write
     .format("delta")
     .mode("append")
     .option("txnVersion", batch_id)
     .option("txnAppId", app_id)
     .save(target_2)
    )

(spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(source)
 .writeStream
 .format("delta")
 .queryName("Idempotent stream")
 .option("checkpointLocation", checkpoint)
 .foreachBatch(writeToDeltaLakeTableIdempotent)
 .trigger(availableNow=True)
 .start()
 .awaitTermination())
"""


def test_foreach_batch_into_two_tables_survives_a_kill_between_the_writes(tmp_path):
    """The chapter's idempotent ``foreachBatch`` (with ``.mode("append")``, which delta-spark needs
    as much as deltaflow: its default mode refuses an existing table) killed between its writes."""
    source = _user_events(tmp_path)
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(_IDEMPOTENT_JOB))
    targets = [str(tmp_path / "t1"), str(tmp_path / "t2")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    args = [sys.executable, str(job), source, *targets, str(tmp_path / "ck")]
    killed = subprocess.run(
        [*args, "1"], env=env, capture_output=True, text=True, start_new_session=True, timeout=300
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert DeltaTable(targets[0]).transaction_version("two-tables") == 1
    assert DeltaTable(targets[1]).transaction_version("two-tables") == 0
    done = subprocess.run(
        [*args, "-1"], env=env, capture_output=True, text=True, start_new_session=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for target in targets:
        assert _emails(target) == _emails(source)  # every row once, in both tables


def test_streaming_write_takes_partition_by_and_other_sinks_keep_it(spark, tmp_path):
    source = _user_events(tmp_path)
    sink = str(tmp_path / "by_date")
    query = (
        spark.readStream.format("delta")
        .load(source)
        .writeStream.format("delta")
        .partitionBy("date")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(sink)
    )
    query.awaitTermination(120)
    assert DeltaTable(sink).metadata().partition_columns == ["date"]
    assert _emails(sink) == _emails(source)
    # Other streaming sinks still get their partition columns.
    files = tmp_path / "files_sink"
    query = (
        spark.readStream.format("delta")
        .load(source)
        .writeStream.format("parquet")
        .partitionBy("date")
        .option("checkpointLocation", str(tmp_path / "ck_files"))
        .trigger(availableNow=True)
        .start(str(files))
    )
    query.awaitTermination(120)
    assert len([p for p in files.iterdir() if p.name.startswith("date=")]) == 3


def test_change_feed_stream_merge_schema_and_the_chapter_as_printed(spark, tmp_path, checkpoint_root):
    path = str(tmp_path / "cdf")
    write_deltalake(path, pa.table({"id": [1, 2]}), configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(path).delete("id = 1")
    query = (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(path)
        .writeStream.format("memory")
        .queryName("feed")
        .start()
    )
    query.processAllAvailable()
    query.stop()
    feed = sorted(
        (r["id"], r["_change_type"], r["_commit_version"]) for r in spark.sql("SELECT * FROM feed").collect()
    )
    assert feed == [(1, "delete", 1), (1, "insert", 0), (2, "insert", 0)]

    # "Delta as Sink" exactly as printed: no checkpoint option (the session's root holds it).
    streamingDeltaDF = spark.readStream.format("delta").load(path)  # noqa: N806
    sink = str(tmp_path / "delta_path")
    query = streamingDeltaDF.writeStream.format("delta").outputMode("append").start(sink)
    query.processAllAvailable()
    query.stop()
    assert sorted(r["id"] for r in DeltaTable(sink).to_pyarrow_table().to_pylist()) == [2]

    # mergeSchema on a stream adds the new column.
    wider = spark.readStream.format("delta").load(path).selectExpr("id", "'new' AS note")
    query = (
        wider.writeStream.format("delta")
        .option("mergeSchema", "true")
        .option("checkpointLocation", str(tmp_path / "wider_ck"))
        .start(sink)
    )
    query.processAllAvailable()
    query.stop()
    assert "note" in DeltaTable(sink).schema().to_arrow().names

    # The chapter's idempotent function as printed: its second write spells txAppId/txVersion,
    # which delta-spark ignores (losing the idempotence silently); deltaflow refuses them.
    def writeToDeltaLakeTableIdempotent(batch_df, batch_id):  # noqa: N802
        app_id = "printed"
        (
            batch_df.write.format("delta")
            .option("txnVersion", batch_id)
            .option("txnAppId", app_id)
            .save(str(tmp_path / "loc1"))
        )
        (
            batch_df.write.format("delta")
            .option("txVersion", batch_id)
            .option("txAppId", app_id)
            .save(str(tmp_path / "loc2"))
        )

    query = (
        spark.readStream.format("delta")
        .load(path)
        .writeStream.foreachBatch(writeToDeltaLakeTableIdempotent)
        .start()
    )
    with pytest.raises(Exception, match=r"(?i)txVersion: unknown option"):
        query.processAllAvailable()
    query.stop()
    assert DeltaTable(str(tmp_path / "loc1")).transaction_version("printed") == 0


def test_delta_spark_on_the_classpath_keeps_the_delta_name(spark, monkeypatch, caplog):
    """delta-spark cannot be installed here (no Maven): its presence is detected by a class it
    ships, so the test points the detection at a class this JVM has."""
    from deltaflow.pipeline import delta_format

    assert delta_format.delta_spark_present(spark) is False  # no delta-spark jar here
    monkeypatch.setattr(delta_format, "_DELTA_SPARK_CLASS", "org.apache.spark.sql.SparkSession")
    assert delta_format.delta_spark_present(spark) is True
    with caplog.at_level("INFO", logger="deltaflow.pipeline.delta_format"):
        assert delta_format.serve_delta(spark) is False
    assert "format('delta') stays delta-spark's" in caplog.text

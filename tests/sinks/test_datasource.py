"""The sink through Spark: batch writes, schema modes, auto-create, validation, streams."""

import datetime as dt
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.errors import PySparkException
from pyspark.sql import functions as F  # noqa: N812

import deltaflow
from deltaflow.delta import commit
from deltaflow.errors import ConfigError, SchemaMismatchError, TableNotFoundError, UnknownOptionError
from deltaflow.io.storage import filesystem
from tests.fixtures.frames import df as _df
from tests.fixtures.frames import ids as _ids
from tests.fixtures.frames import landing as _landing
from tests.fixtures.tables import data_files


def _adds(uri):
    return pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()


def _stream_all(source, uri, pipeline_id, checkpoint):
    """``source`` through the deltaflow format into ``uri`` until it has nothing more."""
    query = (
        source.writeStream.format("deltaflow")
        .option("table_uri", uri)
        .option("pipeline_id", pipeline_id)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def _parquet_files(path):
    return data_files(path)


def test_batch_append_then_overwrite(spark, tmp_path):
    uri = str(tmp_path / "t")
    assert deltaflow.write(_df(spark, 0, 100), uri) == 1  # version 0 = create, 1 = data
    assert deltaflow.write(_df(spark, 100, 50), uri, mode="append") == 2
    assert _ids(uri) == list(range(150))
    deltaflow.write(_df(spark, 500, 10), uri, mode="overwrite")
    table = DeltaTable(uri)
    assert _ids(uri) == list(range(500, 510))
    assert table.history(1)[0]["operationParameters"]["mode"] == "Overwrite"
    # time travel still sees the appended rows
    assert len(DeltaTable(uri, version=2).to_pyarrow_table()) == 150


def test_auto_create_uses_the_dataframe_schema_and_partitions(spark, tmp_path):
    uri = str(tmp_path / "t")
    df = _df(spark, 0, 20, day=F.lit(dt.date(2024, 5, 1)), ts=F.current_timestamp())
    deltaflow.write(df, uri, partition_columns="day", table_properties={"delta.appendOnly": "true"})
    table = DeltaTable(uri)
    assert table.metadata().partition_columns == ["day"]
    assert table.metadata().configuration["delta.appendOnly"] == "true"
    assert [f.name for f in table.schema().fields] == ["id", "name", "day", "ts"]
    assert all(p.parent.name == "day=2024-05-01" for p in _parquet_files(tmp_path / "t"))


def test_every_add_action_has_stats_and_timestamps_are_micros(spark, tmp_path):
    uri = str(tmp_path / "t")
    df = _df(spark, 0, 1000, ts=F.timestamp_seconds(F.col("id") * 60)).repartition(3)
    deltaflow.write(df, uri)
    adds = _adds(uri)
    assert len(adds) == 3
    assert sum(a["num_records"] for a in adds) == 1000
    for add in adds:
        assert add["min.id"] is not None and add["max.id"] is not None and add["null_count.name"] == 0
        assert add["min.ts"] is not None
    column = pq.ParquetFile(tmp_path / "t" / adds[0]["path"]).schema.column(2)
    assert column.physical_type == "INT64"
    assert "timeUnit=microseconds" in str(column.logical_type)


def test_max_records_per_file_rolls_files(spark, tmp_path):
    uri = str(tmp_path / "t")
    deltaflow.write(_df(spark, 0, 1000).coalesce(1), uri, max_records_per_file=300, compression="zstd")
    counts = sorted(a["num_records"] for a in _adds(uri))
    assert counts == [100, 300, 300, 300]
    assert all(p.name.endswith(".zstd.parquet") for p in _parquet_files(tmp_path / "t"))


def test_strict_schema_rejects_a_mismatch_and_writes_nothing(spark, tmp_path):
    uri = str(tmp_path / "t")
    deltaflow.write(_df(spark, 0, 10), uri)
    before = _parquet_files(tmp_path / "t")
    bad = _df(spark, 10, 10, extra=F.lit(1)).withColumn("name", F.lit(3))
    with pytest.raises(SchemaMismatchError) as err:
        deltaflow.write(bad, uri)
    message = str(err.value)
    assert "column 'extra' (integer) is in the data but not in the table" in message
    assert "column 'name' is string in the table but integer in the data" in message
    assert "nothing was written" in message
    assert _parquet_files(tmp_path / "t") == before
    assert DeltaTable(uri).version() == 1


def test_merge_schema_adds_new_nullable_columns(spark, tmp_path):
    uri = str(tmp_path / "t")
    deltaflow.write(_df(spark, 0, 5), uri)
    deltaflow.write(_df(spark, 5, 5, country=F.lit("DE")), uri, schema_mode="merge")
    rows = DeltaTable(uri).to_pyarrow_table().sort_by("id").to_pylist()
    assert [r["country"] for r in rows] == [None] * 5 + ["DE"] * 5
    field = DeltaTable(uri).schema().fields[-1]
    assert (field.name, field.nullable) == ("country", True)


def test_merge_schema_never_changes_a_type(spark, tmp_path):
    uri = str(tmp_path / "t")
    deltaflow.write(_df(spark, 0, 5), uri)
    with pytest.raises(SchemaMismatchError, match="column 'id' is long in the table but string"):
        deltaflow.write(
            _df(spark, 0, 5).withColumn("id", F.col("id").cast("string")), uri, schema_mode="merge"
        )


def test_missing_table_without_auto_create(spark, tmp_path):
    with pytest.raises(TableNotFoundError, match="auto_create_table is off"):
        deltaflow.write(_df(spark, 0, 5), str(tmp_path / "t"), auto_create_table=False)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"compresion": "zstd"}, UnknownOptionError, "did you mean 'compression'"),
        ({"partition_columns": "nope"}, ConfigError, "partition column 'nope' is not in the data's schema"),
        ({"partition_columns": "Name"}, ConfigError, "did you mean 'name'"),
        ({"partition_columns": "score"}, ConfigError, "partition column 'score' has type double"),
        ({"compression": "brotli"}, ConfigError, "compression: must be one of"),
    ],
    ids=["unknown-option", "missing-partition-column", "case", "float-partition", "bad-codec"],
)
def test_bad_options_fail_before_anything_is_written(spark, tmp_path, options, error, match):
    df = _df(spark, 0, 5, score=F.lit(1.5))
    with pytest.raises(error, match=match):
        deltaflow.write(df, str(tmp_path / "t"), **options)
    assert not (tmp_path / "t").exists()


def test_bad_uri_scheme(spark, tmp_path):
    with pytest.raises(ConfigError, match="unsupported URI scheme 'hdfs'"):
        deltaflow.write(_df(spark, 0, 5), "hdfs://namenode/t")


def test_partitioning_must_match_the_existing_table(spark, tmp_path):
    uri = str(tmp_path / "t")
    deltaflow.write(_df(spark, 0, 5), uri)
    with pytest.raises(ConfigError, match=r"partitioned by \[\], but partition_columns=\['name'\]"):
        deltaflow.write(_df(spark, 5, 5), uri, partition_columns="name")


def test_the_deltaflow_format_takes_an_existing_tables_partitioning_when_none_is_given(spark, tmp_path):
    uri = str(tmp_path / "t")
    deltaflow.write(_df(spark, 0, 4), uri, partition_columns="name")
    _df(spark, 4, 4).write.format("deltaflow").option("table_uri", uri).mode("append").save()
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "f.json").write_text("".join(f'{{"id": {i}, "name": "n{i}"}}\n' for i in range(8, 14)))
    source = spark.readStream.schema("id LONG, name STRING").json(str(landing))
    _stream_all(source, uri, "adopt", tmp_path / "cp")
    assert _ids(uri) == list(range(14))
    # Every file of the table under its name=... folder, with its partition value in the log.
    adds = _adds(uri)
    assert len(adds) >= 3 and all(a["path"].startswith(f"name={a['partition.name']}/") for a in adds)
    with pytest.raises(PySparkException, match=r"the data has no column\(s\) \['name'\]"):
        nameless = _df(spark, 20, 2).drop("name")
        nameless.write.format("deltaflow").option("table_uri", uri).mode("append").save()
    with pytest.raises(PySparkException, match=r"partitioned by \['name'\], but partition_columns=\[\]"):
        _df(spark, 20, 2).write.format("deltaflow").option("table_uri", uri).option(
            "partition_columns", ""
        ).mode("append").save()


def test_batch_write_with_txn_version_is_idempotent(spark, tmp_path):
    uri = str(tmp_path / "t")
    for _ in range(2):
        deltaflow.write(_df(spark, 0, 10), uri, pipeline_id="backfill", txn_version=7)
    assert _ids(uri) == list(range(10))
    assert DeltaTable(uri).transaction_version("backfill") == 7
    # the skipped attempt left no files behind
    assert len(_parquet_files(tmp_path / "t")) == len(DeltaTable(uri).file_uris())


def test_format_entry_point_validates_options_too(spark, tmp_path):
    with pytest.raises(PySparkException, match="unknown sink option"):
        _df(spark, 0, 5).write.format("deltaflow").option("table_uri", str(tmp_path / "t")).option(
            "bogus", "1"
        ).mode("append").save()


def test_stream_through_the_format_entry_point(spark, tmp_path):
    landing = _landing(tmp_path, 3, 50)
    uri = str(tmp_path / "t")
    deltaflow.register(spark)
    source = (
        spark.readStream.schema("id LONG, name STRING").option("maxFilesPerTrigger", 1).json(str(landing))
    )
    _stream_all(source, uri, "fmt", tmp_path / "cp")
    table = DeltaTable(uri)
    assert _ids(uri) == list(range(150))
    assert table.transaction_version("fmt") == 2
    history = [h for h in table.history() if h.get("deltaflow.pipeline_id") == "fmt"]
    assert sorted(h["deltaflow.epoch"] for h in history) == [0, 1, 2]


def test_stream_requires_a_pipeline_id(spark, tmp_path):
    landing = _landing(tmp_path, 1, 5)
    source = spark.readStream.schema("id LONG, name STRING").json(str(landing))
    query = (
        source.writeStream.format("deltaflow")
        .option("table_uri", str(tmp_path / "t"))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    with pytest.raises(PySparkException, match="pipeline_id is required for a streaming write"):
        query.awaitTermination(120)
    assert not (tmp_path / "t").exists()
    with pytest.raises(ConfigError, match="pipeline_id"):
        deltaflow.write_stream(source, str(tmp_path / "t"), pipeline_id="")


@pytest.mark.parametrize("write_path", ["spark", "arrow"])
def test_a_lost_checkpoint_stops_the_stream_instead_of_skipping_rows(spark, tmp_path, write_path):
    landing = _landing(tmp_path, 3, 10)
    uri = str(tmp_path / "t")
    source = (
        spark.readStream.schema("id LONG, name STRING").option("maxFilesPerTrigger", 1).json(str(landing))
    )
    first = deltaflow.write_stream(
        source,
        uri,
        pipeline_id="p",
        checkpoint_location=str(tmp_path / "cp1"),
        trigger={"availableNow": True},
        write_path=write_path,
    )
    assert first.awaitTermination(180)
    assert DeltaTable(uri).transaction_version("p") == 2
    (landing / "f003.json").write_text('{"id": 1000, "name": "late"}\n')
    again = deltaflow.write_stream(
        source,
        uri,
        pipeline_id="p",
        checkpoint_location=str(tmp_path / "cp2"),
        trigger={"availableNow": True},
        write_path=write_path,
    )
    with pytest.raises(PySparkException, match="has committed batches up to 2") as err:
        again.awaitTermination(180)
    assert "Restore the checkpoint" in str(err.value)
    assert _ids(uri) == list(range(30))
    assert len(_parquet_files(tmp_path / "t")) == len(DeltaTable(uri).file_uris())


@pytest.mark.parametrize(
    ("write_path", "committed"),
    [("arrow", 1), ("spark", 1), ("arrow", 2), ("arrow", 5)],
    ids=["arrow-1", "spark-1", "arrow-2", "arrow-5"],
)
def test_a_lost_checkpoint_after_any_number_of_batches_is_refused_never_skipped(
    spark, tmp_path, write_path, committed
):
    # The default checkpoint (<table>/_deltaflow/checkpoints/<pipeline_id>) is deleted after
    # `committed` batches, two files land, and the same write_stream starts again: its first
    # batch reads every file as batch 0. After one committed batch, batch 0 is what the table's
    # txn holds: only the checkpoint mark tells a lost checkpoint from a replay.
    import shutil

    landing = _landing(tmp_path, committed, 10)
    uri = str(tmp_path / "t")
    schema = "id LONG, name STRING"
    first = deltaflow.write_stream(
        spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(landing)),
        uri,
        pipeline_id="p1",
        trigger={"availableNow": True},
        write_path=write_path,
    )
    assert first.awaitTermination(180)
    table = DeltaTable(uri)
    assert table.transaction_version("p1") == committed - 1
    version = table.version()
    shutil.rmtree(tmp_path / "t" / "_deltaflow" / "checkpoints" / "p1")
    for f in (100, 101):
        (landing / f"f{f}.json").write_text(f'{{"id": {f * 10}, "name": "late"}}\n')
    again = deltaflow.write_stream(
        spark.readStream.schema(schema).json(str(landing)),
        uri,
        pipeline_id="p1",
        trigger={"availableNow": True},
        write_path=write_path,
    )
    with pytest.raises(PySparkException, match="CheckpointMismatchError") as err:
        again.awaitTermination(180)
    assert "Restore the checkpoint" in str(err.value)
    assert _ids(uri) == list(range(committed * 10))
    # Nothing was committed (the process holds its writer claim already: a restart claims
    # nothing again), and no file was left behind.
    assert DeltaTable(uri).version() == version
    assert len(_parquet_files(tmp_path / "t")) == len(DeltaTable(uri).file_uris())


def test_the_deltaflow_format_with_a_fresh_checkpoint_location_is_refused_after_one_batch(spark, tmp_path):
    landing = _landing(tmp_path, 1, 10)
    uri = str(tmp_path / "t")

    def start(checkpoint):
        return (
            spark.readStream.schema("id LONG, name STRING")
            .json(str(landing))
            .writeStream.format("deltaflow")
            .option("table_uri", uri)
            .option("pipeline_id", "p1")
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    assert start("cp1").awaitTermination(180) is not False
    assert DeltaTable(uri).transaction_version("p1") == 0
    (landing / "f100.json").write_text('{"id": 1000, "name": "late"}\n')
    again = start("cp2")
    with pytest.raises(PySparkException, match="another Spark checkpoint"):
        again.awaitTermination(180)
    assert _ids(uri) == list(range(10))
    # The same checkpoint still goes on: its next batch lands.
    assert start("cp1").awaitTermination(180) is not False
    assert _ids(uri) == [*range(10), 1000]


def test_spark_write_path_is_refused_by_the_format_entry_point(spark, tmp_path):
    with pytest.raises(PySparkException, match="write_path='spark' is only available through"):
        _df(spark, 0, 5).write.format("deltaflow").option("table_uri", str(tmp_path / "t")).option(
            "write_path", "spark"
        ).mode("append").save()


def test_stats_follow_the_tables_indexed_column_count(spark, tmp_path):
    uri = str(tmp_path / "t")
    deltaflow.write(
        _df(spark, 0, 10).coalesce(1), uri, table_properties={"delta.dataSkippingNumIndexedCols": "1"}
    )
    (add,) = _adds(uri)
    assert add["min.id"] == 0 and add["max.id"] == 9
    assert "min.name" not in add and "null_count.name" not in add


def test_spark_checkpoint_files_are_read_wherever_spark_keeps_them(spark, s3, tmp_path):
    from deltaflow.config.sink import SinkOptions
    from deltaflow.sinks.spark_checkpoint import _read_with_hadoop, read_checkpoint_file

    offsets = 'v1\n{"batchWatermarkMs":0}\n{"t":{"0":5}}\n'
    (tmp_path / "ckpt" / "offsets").mkdir(parents=True)
    (tmp_path / "ckpt" / "offsets" / "3").write_text(offsets)
    options = SinkOptions.build({"table_uri": str(tmp_path / "t")})
    # Local paths directly; other schemes through Spark's Hadoop filesystems in the driver ...
    assert read_checkpoint_file(f"file://{tmp_path}/ckpt", "offsets/3", options) == offsets
    assert _read_with_hadoop(f"file://{tmp_path}/ckpt/offsets/3") == offsets
    # ... and where Hadoop has no filesystem for the scheme (no S3 jars), through pyarrow's.
    assert _read_with_hadoop("s3://lake/ckpt/offsets/3") is None
    s3_options = SinkOptions.build({"table_uri": s3.uri(), "storage_options": s3.storage_options})
    fs, root = filesystem(s3.uri("ckpt"), s3.storage_options)
    with fs.open_output_stream(f"{root}/offsets/3") as out:
        out.write(offsets.encode())
    assert read_checkpoint_file(f"s3://{root}", "offsets/3", s3_options) == offsets


def test_a_taken_over_writer_stops_also_when_its_batch_is_a_replay_or_empty(tmp_path):
    # The fence is checked before every commit attempt; a writer whose batches the newer one
    # always committed first (a replay to skip) or that has no rows would otherwise never
    # attempt one, and run on beside the newer writer forever.
    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltaflow.config.sink import SinkOptions, for_stream
    from deltaflow.errors import WriterFencedError
    from deltaflow.sinks.datasource import _DeltaSink

    uri = str(tmp_path / "t")
    data = pa.table({"id": pa.array([1], pa.int64())})
    write_deltalake(uri, data)
    old = commit.claim_writer(uri, {}, "pipe")

    def sink(epoch):
        options = for_stream(SinkOptions(table_uri=uri, pipeline_id="pipe", writer_epoch=epoch))
        return _DeltaSink(options, data.schema, overwrite=False)

    sink(old.epoch).commit_batch([], 0)  # nothing to commit, still the writer: no error
    new = commit.claim_writer(uri, {}, "pipe")
    # The newer writer commits batch 1 (its txn) before the older one gets to it.
    txns = [Transaction("pipe", 1), Transaction(commit.fence_app_id("pipe"), new.epoch)]
    write_deltalake(uri, data, mode="append", commit_properties=CommitProperties(app_transactions=txns))
    version = DeltaTable(uri).version()
    for batch in (1, 2):  # a replay of what the newer one committed; a batch without rows
        with pytest.raises(WriterFencedError, match=f"writer epoch {new.epoch}"):
            sink(old.epoch).commit_batch([], batch)
    sink(new.epoch).commit_batch([], 2)  # the newer writer goes on
    assert DeltaTable(uri).version() == version  # nothing was committed by either


def test_a_writer_whose_claim_expired_from_the_txns_is_not_fenced(tmp_path):
    # Under delta.setTransactionRetentionDuration delta-rs stops showing txns older than it, the
    # writer's claim among them, while the writer idles (no commit refreshes it). No newer writer
    # is visible then: an idle batch goes on, and the next commit records the epoch again.
    import time

    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltaflow.config.sink import SinkOptions, for_stream
    from deltaflow.io.parquet import WrittenFile
    from deltaflow.sinks.datasource import DeltaCommitMessage, _DeltaSink

    uri = str(tmp_path / "t")
    data = pa.table({"id": pa.array([1], pa.int64())})
    write_deltalake(uri, data, configuration={"delta.setTransactionRetentionDuration": "interval 1 days"})
    fence = commit.fence_app_id("pipe")
    ten_days_ago = int(time.time() * 1000) - 10 * 86_400_000
    claim = CommitProperties(app_transactions=[Transaction(fence, 1, ten_days_ago)])
    write_deltalake(uri, data, mode="append", commit_properties=claim)
    assert DeltaTable(uri).transaction_version(fence) is None  # expired

    options = for_stream(SinkOptions(table_uri=uri, pipeline_id="pipe", writer_epoch=1))
    sink = _DeltaSink(options, data.schema, overwrite=False)
    sink.commit_batch([], 0)  # nothing to commit: no error
    path = tmp_path / "t" / "part-x.parquet"
    pq.write_table(data, path)
    stats = '{"numRecords": 1}'
    mtime = path.stat().st_mtime_ns // 10**6
    written = WrittenFile("part-x.parquet", path.stat().st_size, {}, 1, stats, mtime)
    sink.commit_batch([DeltaCommitMessage([written])], 1)
    assert DeltaTable(uri).transaction_version(fence) == 1  # recorded again


def test_a_batch_with_kafka_progress_loads_its_table_once_and_skips_its_replay(tmp_path, monkeypatch):
    # One ingest commits hundreds of tables a batch: step 2's load serves the commit's first
    # attempt, and a replay of the batch (its partitions' txns at the end offsets) is skipped.
    from deltalake import write_deltalake

    from deltaflow.config.sink import SinkOptions, for_stream
    from deltaflow.delta import log as delta_log
    from deltaflow.sinks.datasource import _DeltaSink

    uri = str(tmp_path / "t")
    data = pa.table({"id": pa.array([1, 2], pa.int64())})
    write_deltalake(uri, data.slice(0, 0))
    options = for_stream(SinkOptions(table_uri=uri, pipeline_id="pipe", kafka_offsets=True))
    sink = _DeltaSink(options, data.schema, overwrite=False)
    loads = []
    real = delta_log.load
    monkeypatch.setattr(delta_log, "load", lambda u, so: loads.append(u) or real(u, so))
    source = ({"orders": {"0": 2, "1": 5}}, {})
    sink.commit_batch([sink.write_task(iter(data.to_batches()), batch_id=0)], 0, source=source)
    assert len(loads) == 1
    table = DeltaTable(uri)
    assert table.version() == 1 and table.to_pyarrow_table().num_rows == 2
    assert [table.transaction_version(f"pipe-orders-{p}") for p in (0, 1)] == [1, 4]
    replay = sink.write_task(iter(data.to_batches()), batch_id=0)
    sink.commit_batch([replay], 0, source=source)
    assert DeltaTable(uri).version() == 1  # skipped, its new file deleted
    assert not (tmp_path / "t" / replay.files[0].path).exists()


def _kafka_sink(uri: str, *, auto_compact: bool = False):
    from deltaflow.config.sink import SinkOptions, for_stream
    from deltaflow.sinks.datasource import _DeltaSink

    options = for_stream(
        SinkOptions(table_uri=uri, pipeline_id="pipe", kafka_offsets=True, auto_compact=auto_compact)
    )
    return _DeltaSink(options, pa.schema([("id", pa.int64())]), overwrite=False)


def _batch(sink, batch_id: int, ids: list[int], end: int) -> None:
    data = pa.table({"id": pa.array(ids, pa.int64())})
    written = sink.write_task(iter(data.to_batches()), batch_id=batch_id)
    sink.commit_batch([written], batch_id, source=({"o": {"0": end}}, {}))


@pytest.mark.parametrize("auto_compact", [False, True], ids=["alone", "compacting"])
def test_a_stream_brings_the_table_of_its_last_commit_up_to_date_instead_of_loading_it(
    tmp_path, monkeypatch, auto_compact
):
    """Hundreds of tables a batch: after a sink's first commit, its next batches read only the
    commits since (a load replays every commit since the last checkpoint). Another writer's
    commit in between is seen: here a commit of batch 5's progress, which makes batch 5 a replay."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltaflow.delta import log as delta_log

    uri = str(tmp_path / "t")
    sink = _kafka_sink(uri, auto_compact=auto_compact)
    loads = []
    real = delta_log.load
    here = threading.current_thread()  # the commit's (the maintenance thread loads for its own)

    def load(u, so):
        if threading.current_thread() is here:
            loads.append(u)
        return real(u, so)

    monkeypatch.setattr(delta_log, "load", load)
    _batch(sink, 0, [1, 2], 2)  # makes the table
    _batch(sink, 1, [3], 3)  # loads it (compacting: that load goes to the compactor's first count)
    _batch(sink, 2, [4], 4)
    loaded_after_three = len(loads)
    _batch(sink, 3, [5], 5)
    _batch(sink, 4, [6], 6)
    assert len(loads) == loaded_after_three  # no load for the later batches
    # Another writer (an earlier process of the pipeline) committed batch 5 already.
    write_deltalake(
        uri,
        pa.table({"id": pa.array([7], pa.int64())}),
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction("pipe-o-0", 6)]),
    )
    _batch(sink, 5, [7], 7)  # a replay: skipped
    _batch(sink, 6, [8], 8)
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert DeltaTable(uri).transaction_version("pipe-o-0") == 7


def test_a_table_made_again_at_its_path_is_loaded_not_brought_up_to_date(tmp_path):
    """A table deleted and made again with more versions: delta-rs "updates" the kept table
    onto the new log without an error, into a view of neither log (measured; a later read of
    one aborted the process): it holds files of the old table, gone with it. The sink checks
    that its last commit is still in the log, and loads the table otherwise."""
    import shutil

    from deltalake import CommitProperties, Transaction, write_deltalake

    uri = str(tmp_path / "t")
    sink = _kafka_sink(uri)
    _batch(sink, 0, [1], 1)
    _batch(sink, 1, [2], 2)
    shutil.rmtree(uri)
    write_deltalake(  # another writer of the pipeline: batch 2 of the new table, as its version 0
        uri,
        pa.table({"id": pa.array([3], pa.int64())}),
        commit_properties=CommitProperties(app_transactions=[Transaction("pipe-o-0", 2)]),
    )
    for i in range(4):  # versions 1-4: more than the kept table's
        write_deltalake(uri, pa.table({"id": pa.array([100 + i], pa.int64())}), mode="append")
    kept = sink._kept
    # The view step 2 takes is the new table's, not a mix of both logs (whose files are gone).
    assert sorted(sink._load().file_uris()) == sorted(DeltaTable(uri).file_uris())
    sink._kept = kept
    _batch(sink, 2, [3], 3)  # a replay: skipped
    table = DeltaTable(uri)
    assert table.version() == 4
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [3, 100, 101, 102, 103]


def test_a_commit_whose_response_is_lost_is_found_in_the_log_and_its_table_kept(tmp_path, monkeypatch):
    """Batch 3's commit lands and its response is lost: the commit finds it in the log by its
    token (no second commit), and the sink keeps its table from that commit on, each row once."""
    from deltaflow.delta import log as delta_log
    from deltaflow.io.faults import lose_commit_responses

    uri = str(tmp_path / "t")
    sink = _kafka_sink(uri)
    for b in range(3):
        _batch(sink, b, [b + 1], b + 1)
    with lose_commit_responses("batch 3 of 'pipe'") as lost:
        _batch(sink, 3, [4], 4)
    assert lost.lost == ["batch 3 of 'pipe'"]
    assert DeltaTable(uri).version() == 3  # batches 0-3: one commit each
    loads = []
    real = delta_log.load
    monkeypatch.setattr(delta_log, "load", lambda u, so: loads.append(u) or real(u, so))
    _batch(sink, 4, [5], 5)
    _batch(sink, 5, [6], 6)
    assert loads == []  # the recovered commit's table was kept
    assert _kept_ids(uri) == [1, 2, 3, 4, 5, 6]
    assert DeltaTable(uri).transaction_version("pipe-o-0") == 5


def _remade_in_batch_three(uri: str, versions: int, value=lambda i: 100 + i):
    """A sink commits batches 0-2; then, in batch 3 between step 2's load and step 4's commit,
    the table is deleted and made again by another job with ``versions`` versions of one row
    each (``value(i)``); batch 3's files, written before, are kept. Returns the sink."""
    import shutil

    from deltalake import write_deltalake

    sink = _kafka_sink(uri)
    for b in range(3):
        _batch(sink, b, [b + 1], b + 1)
    check = sink._check

    def remake_then_check(table, files):  # step 3 runs after step 2's load
        saved = {f.path: Path(uri, f.path).read_bytes() for f in files}
        shutil.rmtree(uri)
        for i in range(versions):
            write_deltalake(uri, pa.table({"id": [value(i)]}), mode="append")
        for path, data in saved.items():
            Path(uri, path).parent.mkdir(parents=True, exist_ok=True)
            Path(uri, path).write_bytes(data)
        return check(table, files)

    sink._check = remake_then_check
    _batch(sink, 3, [4], 4)  # lands in the new table (as before kept tables)
    sink._check = check
    return sink


def test_a_table_made_again_while_a_batch_commits_is_not_kept_as_a_mix_of_both_logs(tmp_path):
    """Step 2 brings the kept table (old log, version 2) up to date; the table is made again
    with 3 versions before step 4; the commit lands in the new log at version 3 with the sink's
    token. Updating the kept table (old log 0..2) with it would give a view of both logs from
    then on: files of the old table (gone) and none of the new one's."""
    uri = str(tmp_path / "t")
    sink = _remade_in_batch_three(uri, versions=3)
    assert DeltaTable(uri).version() == 3
    assert _kept_ids(uri) == [4, 100, 101, 102]
    kept = sink._kept
    view = sink._load()
    sink._kept = kept
    # The view step 2 takes is the table's, not a mix of both logs.
    assert sorted(view.file_uris()) == sorted(DeltaTable(uri).file_uris())


def test_the_next_batches_after_a_table_made_again_mid_commit_keep_its_rows(tmp_path):
    """The same fault with as many versions as before; the sink then commits more batches."""
    uri = str(tmp_path / "t")
    sink = _remade_in_batch_three(uri, versions=4)  # batch 3 lands as version 4
    assert _kept_ids(uri) == [4, 100, 101, 102, 103]
    for b in range(4, 7):
        _batch(sink, b, [b + 1], b + 1)
    assert _kept_ids(uri) == [4, 5, 6, 7, 100, 101, 102, 103]


@pytest.mark.parametrize("kept", [False, True], ids=["loaded", "kept"])
def test_a_table_made_again_mid_commit_with_another_schema_fails_the_next_batch(tmp_path, kept):
    """The same fault, the new table with another schema (id a string). Loading it fails the
    next batch with a schema mismatch; a kept view of both logs would still show the old
    schema, and the sink would go on committing int64 files into a string table."""
    from deltaflow.errors import SchemaMismatchError

    uri = str(tmp_path / "t")
    sink = _remade_in_batch_three(uri, versions=3, value=lambda i: f"s{i}")
    assert DeltaTable(uri).schema().to_arrow().field("id").type == pa.string()
    if not kept:
        sink._kept = None  # a full load
    with pytest.raises(SchemaMismatchError):
        _batch(sink, 4, [5], 5)


def test_a_kept_tables_txns_come_from_the_log_entry_it_read_and_match_the_log(tmp_path, monkeypatch):
    """A kept table's next batch reads the log entry of its last commit: its txns answer the
    progress lookups, which no longer replay the log segment, and they are the log's. After a
    commit that delta-rs put after another writer's, and after another writer's commit since
    the sink's, they are looked up again (and seen)."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltaflow.delta.progress import transaction_version

    uri = str(tmp_path / "t")
    sink = _kafka_sink(uri)
    for b in range(3):
        _batch(sink, b, [b + 1], b + 1)
    lookups = []
    real_lookup = DeltaTable.transaction_version
    monkeypatch.setattr(
        DeltaTable, "transaction_version", lambda t, a: lookups.append(a) or real_lookup(t, a)
    )
    _batch(sink, 3, [4], 4)
    _batch(sink, 4, [5], 5)
    assert lookups == []

    other = CommitProperties(app_transactions=[Transaction("pipe-o-1", 9), Transaction("other", 3)])
    _before_the_next_commit(  # another writer commits first
        monkeypatch,
        lambda: write_deltalake(
            uri, pa.table({"id": pa.array([60], pa.int64())}), mode="append", commit_properties=other
        ),
    )
    before = DeltaTable(uri).version()
    _batch(sink, 5, [6], 6)
    theirs, ours = commit.read_entries(uri, {}, before + 1, before + 3)  # ours after theirs
    assert "other" in theirs.txns and ours.txns["pipe-o-0"] == 5
    _batch(sink, 6, [7], 7)
    assert lookups == ["pipe-o-0"]  # a table loaded again
    _batch(sink, 7, [8], 8)
    assert lookups == ["pipe-o-0"]

    # Another writer's commit after the sink's: looked up from delta-rs, and seen.
    ahead = CommitProperties(app_transactions=[Transaction("pipe-o-0", 9)])
    write_deltalake(uri, pa.table({"id": pa.array([90], pa.int64())}), mode="append", commit_properties=ahead)
    lookups.clear()
    _batch(sink, 8, [9], 9)  # a replay: that writer holds batch 8
    assert lookups == ["pipe-o-0"]
    _batch(sink, 9, [10], 11)
    _batch(sink, 10, [11], 12)
    assert _kept_ids(uri) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 60, 90]

    # What the next batch reads is the log's: the sink's partition without a lookup, txns it
    # never read (others') looked up.
    lookups.clear()
    table = sink._load()
    assert transaction_version(table, "pipe-o-0") == 11 and lookups == []
    apps = ["pipe-o-1", "other", "never"]
    assert [transaction_version(table, a) for a in apps] == [9, 3, None] and lookups == apps
    assert [real_lookup(DeltaTable(uri), a) for a in ["pipe-o-0", *apps]] == [11, 9, 3, None]


def test_txns_are_looked_up_again_after_the_table_stopped_letting_them_expire(tmp_path, monkeypatch):
    """An idle partition's txn is past the table's txn retention when the sink loads its base
    (delta-rs: None). While the batch commits, the user removes the property (as the sink's
    warning says); the commit is retried on a fresh load that sees the txn, and leaves it out.
    The next batch's kept table must not carry the base's None: its replay is skipped."""
    import json

    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltaflow.delta import progress

    uri = str(tmp_path / "t")
    old = CommitProperties(app_transactions=[Transaction("pipe-o-1", 41, 1000)])  # updated in 1970
    write_deltalake(
        uri,
        pa.table({"id": pa.array([0], pa.int64())}),
        configuration={progress.TXN_RETENTION: "interval 1 days"},
        commit_properties=old,
    )
    sink = _kafka_sink(uri)
    _batch(sink, 0, [1], 2)
    _batch(sink, 1, [2], 3)

    def unset_retention():  # as ALTER TABLE ... UNSET TBLPROPERTIES writes it
        log = tmp_path / "t" / "_delta_log"
        meta = next(a for a in map(json.loads, (log / f"{0:020d}.json").open()) if "metaData" in a)
        meta["metaData"]["configuration"] = {}
        info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "UNSET TBLPROPERTIES"}}
        version = DeltaTable(uri).version() + 1
        (log / f"{version:020d}.json").write_text(json.dumps(info) + "\n" + json.dumps(meta) + "\n")

    _before_the_next_commit(monkeypatch, unset_retention)
    end = {"o": {"0": 4, "1": 42}}  # partition 1 idle at 41
    batch_two = pa.table({"id": pa.array([3], pa.int64())})
    sink.commit_batch([sink.write_task(iter(batch_two.to_batches()), batch_id=2)], 2, source=(end, {}))
    assert sink._kept is not None
    assert progress.advancing_txns(DeltaTable(uri), "pipe", end, {}) == {}  # the log holds batch 2
    sink.commit_batch([sink.write_task(iter(batch_two.to_batches()), batch_id=2)], 2, source=(end, {}))
    assert _kept_ids(uri) == [0, 1, 2, 3]  # the replay skipped


def _before_the_next_commit(monkeypatch, action) -> None:
    """Run ``action`` (another writer) once, just before the next commit attempt reaches delta-rs."""
    real = DeltaTable.create_write_transaction

    def raced(table, *args, **kwargs):
        monkeypatch.setattr(DeltaTable, "create_write_transaction", real)
        action()
        return real(table, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", raced)


def _kept_ids(uri):
    return sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist())

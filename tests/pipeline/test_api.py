"""``deltaflow.pipeline.api``: ``write_stream`` and ``write`` (the Python entry points)."""

from __future__ import annotations

import pytest

import deltaflow
from deltaflow.errors import ConfigError
from tests.fixtures.frames import df as _df
from tests.fixtures.frames import ids as _ids
from tests.fixtures.frames import landing as _landing


def test_write_stream_defaults_checkpoint_inside_the_table(spark, tmp_path):
    landing = _landing(tmp_path, 2, 10)
    uri = str(tmp_path / "t")
    source = spark.readStream.schema("id LONG, name STRING").json(str(landing))
    query = deltaflow.write_stream(source, uri, pipeline_id="p1", trigger={"availableNow": True})
    assert query.awaitTermination(180)
    assert _ids(uri) == list(range(20))
    assert (tmp_path / "t" / "_deltaflow" / "checkpoints" / "p1" / "offsets").is_dir()


def test_writes_without_partition_columns_take_the_tables_partitioning(spark, tmp_path):
    # The README's Quick start: a stream partitioned by a column, then a backfill into the same
    # table without partition_columns (as delta-spark's append, and deltaflow ingest, take it).
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import functions as F  # noqa: N812

    landing = _landing(tmp_path, 2, 5)
    uri = str(tmp_path / "t")
    source = spark.readStream.schema("id LONG, name STRING").json(str(landing))
    source = source.withColumn("country", F.when(F.col("id") % 2 == 0, "fr").otherwise("de"))
    query = deltaflow.write_stream(
        source, uri, pipeline_id="events", partition_columns=["country"], trigger={"availableNow": True}
    )
    assert query.awaitTermination(180)
    backfill = _df(spark, 100, 4, country=F.lit("it"))
    deltaflow.write(backfill, uri, pipeline_id="backfill", txn_version=1)
    deltaflow.write(backfill, uri, pipeline_id="backfill", txn_version=1)  # skipped: a replay
    table = DeltaTable(uri)
    assert table.metadata().partition_columns == ["country"]
    assert _ids(uri) == [*range(10), 100, 101, 102, 103]
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert {a["partition.country"] for a in adds} == {"fr", "de", "it"}
    # A different partitioning given explicitly is still refused, with nothing written.
    with pytest.raises(ConfigError, match=r"partitioned by \['country'\]"):
        deltaflow.write(backfill, uri, partition_columns=["name"])
    assert _ids(uri) == [*range(10), 100, 101, 102, 103]


@pytest.mark.parametrize("write_path", ["spark", "arrow"])
def test_a_process_claims_its_pipeline_once_not_at_every_restart(spark, tmp_path, write_path):
    # Every start committed a writer claim to the table, also the daemon's restarts of a query
    # in the same process when the stream then had nothing to commit: a job restarting again
    # and again grew each table's log by one empty commit per restart.
    from deltalake import DeltaTable

    from deltaflow.delta import commit
    from deltaflow.pipeline import api

    landing = _landing(tmp_path, 2, 10)
    uri = str(tmp_path / "t")

    def run():
        source = spark.readStream.schema("id LONG, name STRING").json(str(landing))
        query = deltaflow.write_stream(
            source, uri, pipeline_id="p1", trigger={"availableNow": True}, write_path=write_path
        )
        assert query.awaitTermination(180)

    run()
    assert _ids(uri) == list(range(20))
    version = DeltaTable(uri).version()
    for _ in range(3):
        run()  # started again in the same process (as the daemon restarts it): nothing new
    assert DeltaTable(uri).version() == version  # nothing committed, no claim again
    claims = [e for e in commit.read_entries(uri, {}, 0, version) if commit.CLAIM_KEY in e.info]
    assert len(claims) == 1 and DeltaTable(uri).transaction_version(commit.fence_app_id("p1")) == 1

    # Another process (here: a forgotten claim) still takes the pipeline over at its start.
    api._CLAIMS.clear()
    run()
    assert DeltaTable(uri).version() == version + 1
    assert DeltaTable(uri).transaction_version(commit.fence_app_id("p1")) == 2


def test_write_stream_rejects_a_batch_dataframe_and_vice_versa(spark, tmp_path):
    with pytest.raises(ConfigError, match="needs a streaming DataFrame"):
        deltaflow.write_stream(_df(spark, 0, 1), str(tmp_path / "t"), pipeline_id="p")
    stream = spark.readStream.format("rate").load()
    with pytest.raises(ConfigError, match="needs a batch DataFrame"):
        deltaflow.write(stream, str(tmp_path / "t"))


def test_object_store_table_needs_an_explicit_checkpoint(spark, tmp_path):
    source = spark.readStream.format("rate").load()
    with pytest.raises(ConfigError, match="pass checkpoint_location="):
        deltaflow.write_stream(source, "s3://bucket/t", pipeline_id="p")


@pytest.mark.parametrize("span", [None, "interval 7 days"])
def test_a_table_that_lets_txns_expire_is_warned_about_when_a_stream_claims_it(tmp_path, caplog, span):
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from deltaflow.config.sink import SinkOptions
    from deltaflow.delta import commit
    from deltaflow.delta.progress import TXN_RETENTION
    from deltaflow.pipeline.api import _claim

    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": [1]}), configuration={TXN_RETENTION: span} if span else None)
    with caplog.at_level("WARNING", logger="deltaflow.delta.progress"):
        claimed = _claim(SinkOptions(table_uri=uri, pipeline_id="p"))
    assert claimed.writer_epoch == DeltaTable(uri).transaction_version(commit.fence_app_id("p")) == 1
    warned = [r.getMessage() for r in caplog.records if TXN_RETENTION in r.getMessage()]
    if span is None:
        assert warned == []
    else:
        (message,) = warned
        assert "'interval 7 days'" in message and "could be written twice" in message

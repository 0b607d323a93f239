"""Arroyo's Delta sink options run through Spark: time partitions, partition fields, shuffling."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltaflow.config.pipeline import SinkSpec
from deltaflow.config.sink import SinkOptions
from deltaflow.config.sql import parse_sql
from deltaflow.errors import ConfigError
from deltaflow.pipeline.runner import _event_time, _Sink
from deltaflow.service.daemon import run_pipelines

ROWS = 480
START = 1767225600  # 2026-01-01T00:00:00Z
#: Each of the generator's 4 tasks holds rows of all 4 hours and 8 countries.
SELECT = f"SELECT id, country, timestamp_seconds({START} + (id % 4) * 3600 + id) AS ts FROM events"
HOUR_02 = [("year", "=", "2026"), ("month", "=", "01"), ("day", "=", "01"), ("hour", "=", "02")]


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory, s3):
    """One SQL file, three pipelines from one generator: the same rows with and without
    shuffle_by_partition, and into S3 with Arroyo's ``storage.*`` keys."""
    root = tmp_path_factory.mktemp("arroyo")
    sink = "format = 'parquet', time_partition_pattern = '%Y/%m/%d/%H', partition_fields = 'country'"
    on_s3 = s3.uri("arroyo")
    sql = f"""
    CREATE TABLE events WITH (connector = 'generator', total_rows = {ROWS}, partitions = 4);
    CREATE TABLE shuffled WITH (connector = 'delta', path = '{root}/shuffled', {sink},
        'shuffle_by_partition.enabled' = true);
    CREATE TABLE unshuffled WITH (connector = 'delta', path = '{root}/unshuffled', {sink});
    CREATE TABLE on_s3 WITH (connector = 'delta', type = 'sink', path = '{on_s3}', format = 'parquet',
        'partitioning.time_pattern' = '%Y/%m/%d/%H', 'shuffle_by_partition.enabled' = true,
        'storage.aws_endpoint' = '{s3.endpoint}', 'storage.aws_access_key_id' = 'testing',
        'storage.aws_secret_access_key' = 'testing', 'storage.aws_region' = '{s3.region}',
        'storage.aws_allow_http' = 'true', checkpoint_location = '{root}/on_s3_checkpoint');
    INSERT INTO shuffled {SELECT};
    INSERT INTO unshuffled {SELECT};
    INSERT INTO on_s3 {SELECT};
    """
    run_pipelines(spark, parse_sql(sql, {}).pipelines, available_now=True)
    out = {name: DeltaTable(str(root / name)) for name in ("shuffled", "unshuffled")}
    out["on_s3"] = DeltaTable(on_s3, storage_options=s3.storage_options)
    return out


@pytest.mark.parametrize("name", ["shuffled", "unshuffled"])
def test_time_and_field_partitions_hold_every_row_once(tables, name):
    table = tables[name]
    assert table.metadata().partition_columns == ["year", "month", "day", "hour", "country"]
    rows = table.to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(ROWS))
    for r in rows:  # each row's partition values are its event time's, in UTC
        ts = r["ts"].astimezone(dt.UTC)
        assert (r["year"], r["month"], r["day"], r["hour"]) == (
            f"{ts:%Y}",
            f"{ts:%m}",
            f"{ts:%d}",
            f"{ts:%H}",
        )
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert {a["partition.hour"] for a in adds} == {"00", "01", "02", "03"}
    assert all(a["path"].startswith(f"year=2026/month=01/day=01/hour={a['partition.hour']}/") for a in adds)


def test_storage_keys_reach_s3(tables):
    """Arroyo's storage.* keys became the sink's storage_options: the table is in the bucket."""
    table = tables["on_s3"]
    assert table.metadata().partition_columns == ["year", "month", "day", "hour"]
    assert sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()) == list(range(ROWS))
    assert len(table.file_uris()) == 4  # shuffled: one file per hour


def test_a_reader_of_one_hour_reads_only_its_files(tables):
    table = tables["shuffled"]
    every = table.file_uris()
    hour = table.file_uris(file_pruning_predicate=HOUR_02)
    assert len(hour) == 8 and len(every) == 32  # 8 countries in hour 02; 4 hours x 8 countries in all
    assert all("/hour=02/" in uri for uri in hour)
    # delta-rs opens exactly those files for a read with the same filter.
    read = table.to_pyarrow_dataset(file_pruning_predicate=HOUR_02).to_table(columns=["id", "hour"])
    assert set(read.column("hour").to_pylist()) == {"02"}
    ids = read.column("id").to_pylist()
    assert sorted(ids) == [i for i in range(ROWS) if i % 4 == 2]


def test_shuffle_by_partition_writes_fewer_files(tables):
    shuffled = len(tables["shuffled"].file_uris())
    unshuffled = len(tables["unshuffled"].file_uris())
    partitions = len({tuple(sorted(a.items())) for a in tables["shuffled"].partitions()})
    print(f"files: shuffled {shuffled}, unshuffled {unshuffled}, partitions {partitions}")
    assert shuffled == partitions  # one file per partition and batch
    assert unshuffled > shuffled


def test_time_partitions_are_utc_and_the_event_time_must_be_clear(spark):
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        df = spark.sql("SELECT 1 AS id, TIMESTAMP'2026-03-08 06:30:00Z' AS ts, DATE'2026-02-03' AS d")
        sink = SinkSpec(table_uri="/t", time_partition_pattern="day=%F/%H")
        spec = parse_sql(
            "CREATE TABLE s WITH (connector='generator'); CREATE TABLE t WITH (connector='delta', path='/t',"
            " time_partition_pattern='day=%F/%H'); INSERT INTO t SELECT * FROM s",
            {},
        ).pipelines[0]
        column = _event_time(spec, "t", sink, df)
        assert column == "ts"
        rows = _Sink("t", SinkOptions(table_uri="/t"), None, sink.time_partition_columns, column).rows(df)
        assert rows.select("day", "hour").first() == ("2026-03-08", "06")  # not New York's 01
        # 02:30 UTC on 2026-03-08 is in New York's DST gap as a wall clock (02:00-03:00 does not
        # exist there): date_format made it hour 03. A NULL event time stays NULL.
        gap = spark.sql(
            "SELECT * FROM VALUES (TIMESTAMP'2026-03-08 02:30:00Z'), (TIMESTAMP'2026-11-01 01:30:00Z'),"
            " (CAST(NULL AS TIMESTAMP)) AS t(ts)"
        )
        hours = _Sink("t", SinkOptions(table_uri="/t"), None, sink.time_partition_columns, "ts").rows(gap)
        assert [tuple(r) for r in hours.select("day", "hour").collect()] == [
            ("2026-03-08", "02"),
            ("2026-11-01", "01"),
            (None, None),
        ]
        by_date = SinkSpec(table_uri="/t", time_partition_pattern="%F/%H", event_time_column="D")
        found = _event_time(spec, "t", by_date, df)
        first = _Sink("t", SinkOptions(table_uri="/t"), None, by_date.time_partition_columns, found).rows(df)
        assert first.select("date", "hour").first() == ("2026-02-03", "00")
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    two = spark.sql("SELECT TIMESTAMP'2026-01-01 00:00:00' AS a, TIMESTAMP'2026-01-01 00:00:00' AS b")
    with pytest.raises(
        ConfigError, match=r"the rows have 2 TIMESTAMP columns \(a, b\): set event_time_column"
    ):
        _event_time(spec, "t", sink, two)
    with pytest.raises(ConfigError, match="event_time_column 'id': the rows have id as int, not a TIMESTAMP"):
        _event_time(
            spec, "t", SinkSpec(table_uri="/t", time_partition_pattern="%H", event_time_column="id"), df
        )
    clash = spark.sql("SELECT TIMESTAMP'2026-01-01 00:00:00' AS ts, 1 AS hour")
    with pytest.raises(ConfigError, match=r"makes the column\(s\) hour, which the rows already have"):
        _event_time(spec, "t", sink, clash)

"""The SQL form of pipelines: parsing into pipelines, errors, and a run through Spark."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltaflow.cli import cli
from deltaflow.config.pipeline import FilesSourceSpec, KafkaSourceSpec
from deltaflow.config.sql import ARROYO_SINK_KEYS, parse_sql
from deltaflow.errors import PipelineConfigError
from deltaflow.service.daemon import run_pipelines
from tests.fixtures.frames import settled

SQL = """
-- a comment; with a semicolon
CREATE TABLE clicks (id BIGINT, page TEXT, amount DOUBLE PRECISION, ts TIMESTAMPTZ) WITH (
    connector = 'kafka', bootstrap_servers = '${BROKER}', topic = 'clicks', format = 'json',
    max_messages_per_batch = 5000
);
CREATE TABLE pages WITH (
    connector = 'delta', path = '/lake/pages', format = 'parquet', partition_fields = ['day', 'site'],
    pipeline_id = 'page-views', trigger_interval = '10 seconds', compression = 'zstd'
);
/* several pipelines may read one source */
CREATE TABLE big WITH (connector = 'delta', path = '/lake/big');
INSERT INTO pages SELECT id, page, to_date(ts) AS day, 'a;b' AS site FROM clicks WHERE page <> '';
INSERT INTO big SELECT * FROM clicks WHERE amount > 100
"""


def test_statements_become_pipelines():
    file = parse_sql(SQL, {"BROKER": "127.0.0.1:9092"})
    pages, big = file.pipelines
    assert pages.pipeline_id == "page-views" and big.pipeline_id == "clicks-to-big"
    assert isinstance(pages.source, KafkaSourceSpec)
    assert pages.source.bootstrap_servers == "127.0.0.1:9092"
    assert pages.source.schema_ == "id BIGINT, page STRING, amount DOUBLE, ts TIMESTAMP"
    assert pages.source.max_messages_per_batch == 5000
    assert pages.source_name == "clicks"
    assert pages.query == "SELECT id, page, to_date(ts) AS day, 'a;b' AS site FROM clicks WHERE page <> ''"
    assert pages.trigger_interval == 10.0
    sink = pages.sinks[0]
    assert (sink.name, sink.table_uri, sink.partition_columns, sink.compression) == (
        "pages",
        "/lake/pages",
        ("day", "site"),
        "zstd",
    )
    assert big.sinks[0].table_uri == "/lake/big"


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        (
            "SELECT 1",
            "statement 1: expected CREATE TABLE ... WITH (...) or INSERT INTO ... SELECT, got 'SELECT 1'",
        ),
        ("CREATE TABLE t (a INT)", "statement 1: CREATE TABLE t needs WITH (connector = '...', ...)"),
        ("CREATE TABLE t WITH (connector = 'jdbc')", "connector must be one of delta, files, filesystem,"),
        ("CREATE TABLE t WITH (connector = 'delta', path = '/t')", "no INSERT INTO ... SELECT statement"),
        ("INSERT INTO t SELECT * FROM s", "INSERT INTO t: no CREATE TABLE t above"),
        (
            "CREATE TABLE s WITH (connector='generator'); CREATE TABLE r WITH (connector='generator');"
            "CREATE TABLE t WITH (connector='delta', path='/t'); INSERT INTO t SELECT * FROM s JOIN r",
            "must read exactly one declared table (found: s, r)",
        ),
        (
            "CREATE TABLE s WITH (connector='generator'); CREATE TABLE t WITH (connector='delta', pth='/t');"
            "INSERT INTO t SELECT * FROM s",
            "statement 2: table t: unknown option 'pth' for the delta connector (did you mean 'path'?); "
            "it knows: auto_compact, auto_compact_min_files,",
        ),
        (
            "CREATE TABLE s WITH (connector='generator', rows_per_sec=5); "
            "CREATE TABLE t WITH (connector='delta', path='/t'); INSERT INTO t SELECT * FROM s",
            "statement 1: table s: unknown option 'rows_per_sec' for the generator connector (did you mean "
            "'rows_per_second'?); it knows: event_time_field, fields, partitions, path, rows_per_batch,",
        ),
    ],
)
def test_problems_are_reported(sql, problem):
    with pytest.raises(PipelineConfigError) as info:
        parse_sql(sql, {})
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_comments_and_quoted_text_do_not_confuse_the_parser():
    file = parse_sql(
        "CREATE TABLE clicks WITH (connector = 'generator');"
        "CREATE TABLE views WITH (connector = 'delta', path = '/v');"
        "INSERT INTO views SELECT id/* a comment */FROM clicks WHERE page <> 'views' -- views; clicks\n",
        {},
    )
    (spec,) = file.pipelines
    assert spec.source_name == "clicks"
    assert spec.query == "SELECT id FROM clicks WHERE page <> 'views'"


def test_a_sql_file_runs_through_spark(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.csv").write_text("city,temp\nOslo,3\nRome,21\nOslo,5\nLima,19\n")
    settled(landing / "a.csv")
    sql = f"""
    CREATE TABLE readings (city STRING, temp INT)
        WITH (connector = 'files', path = '{landing}', format = 'csv');
    CREATE TABLE warm WITH (connector = 'delta', path = '{tmp_path}/warm');
    CREATE TABLE per_city WITH (connector = 'delta', path = '{tmp_path}/per_city');
    INSERT INTO warm SELECT city, temp FROM readings WHERE temp > 10;
    INSERT INTO per_city SELECT city, count(*) AS n, max(temp) AS hottest FROM readings GROUP BY city;
    """
    path = tmp_path / "p.sql"
    path.write_text(sql)
    result = CliRunner().invoke(cli, ["sql", str(path), "--validate"])
    assert result.exit_code == 0, result.output
    assert "readings-to-warm: csv files in" in result.output

    file = parse_sql(sql, {})
    assert isinstance(file.pipelines[0].source, FilesSourceSpec)
    run_pipelines(spark, file.pipelines, available_now=True)
    warm = DeltaTable(str(tmp_path / "warm")).to_pyarrow_table().to_pylist()
    assert sorted((r["city"], r["temp"]) for r in warm) == [("Lima", 19), ("Rome", 21)]
    per_city = DeltaTable(str(tmp_path / "per_city")).to_pyarrow_table().to_pylist()
    assert sorted((r["city"], r["n"], r["hottest"]) for r in per_city) == [
        ("Lima", 1, 19),
        ("Oslo", 2, 5),
        ("Rome", 1, 21),
    ]


ARROYO = """
CREATE TABLE events (id BIGINT, country TEXT, ts TIMESTAMP) WITH (
    connector = 'kafka', bootstrap_servers = 'b:9092', topic = 'events', format = 'json',
    event_time_field = 'ts'
);
CREATE TABLE lake WITH (
    connector = 'delta', type = 'sink', path = 's3://lake/events', format = 'parquet',
    time_partition_pattern = '%Y/%m/%d/%H', partition_fields = 'country',
    'shuffle_by_partition.enabled' = true, rollover_seconds = 60, target_file_size = 134217728,
    inactivity_rollover_seconds = 30, max_parts = 1000, target_part_size = 5242880,
    parquet_compression = 'zstd', parquet_row_group_size = 100000, 'filename.prefix' = 'ev',
    'filename.strategy' = 'uuid', 'storage.aws_region' = 'eu-west-1',
    'storage.aws_endpoint' = 'http://127.0.0.1:9000', checkpoint_location = '/ck/events'
);
INSERT INTO lake SELECT id, country, ts FROM events;
"""


def test_arroyo_delta_sink_options_are_translated():
    file = parse_sql(ARROYO, {})
    (spec,) = file.pipelines
    sink = spec.sinks[0]
    assert sink.table_uri == "s3://lake/events"
    assert sink.time_partition_pattern == "%Y/%m/%d/%H"
    assert [c.name for c in sink.time_partition_columns] == ["year", "month", "day", "hour"]
    assert sink.event_time_column == "ts"  # the source's event_time_field
    assert sink.partition_columns == ("country",)
    assert sink.shuffle_by_partition is True
    assert spec.trigger_interval == 60.0  # rollover_seconds: one micro-batch (and commit) a minute
    assert sink.target_file_size_mb == 128
    assert sink.compression == "zstd"
    assert dict(sink.storage_options) == {
        "aws_region": "eu-west-1",
        "aws_endpoint_url": "http://127.0.0.1:9000",
    }
    # Time columns first, then Arroyo's partition fields: <time>/<fields>, as Arroyo writes.
    options = sink.sink_options(spec.pipeline_id, "/ck")
    assert options.partition_columns == ("year", "month", "day", "hour", "country")
    for key in ("inactivity_rollover_seconds", "max_parts", "target_part_size", "parquet_row_group_size"):
        assert any(n.startswith(f"lake: {key} = ") and "has no effect" in n for n in file.notes), key
    assert any("filename.prefix = 'ev' has no effect: deltaflow names data files" in n for n in file.notes)


def test_arroyo_newer_dotted_names():
    file = parse_sql(
        "CREATE TABLE s WITH (connector = 'generator');"
        "CREATE TABLE t WITH (connector = 'delta', path = '/t', format = 'parquet',"
        " 'partitioning.time_pattern' = 'dt=%Y-%m-%d', 'partitioning.fields' = [country, page],"
        " 'rolling_policy.interval' = '2 min', 'rolling_policy.file_size' = '64MB',"
        " 'rolling_policy.inactivity_interval' = '30s', 'multipart.max_parts' = 100,"
        " 'multipart.target_part_size' = '8MB', event_time_field = 'event_time');"
        "INSERT INTO t SELECT * FROM s",
        {},
    )
    (spec,) = file.pipelines
    sink = spec.sinks[0]
    assert [(c.name, c.parts) for c in sink.time_partition_columns] == [
        ("dt", (("field", "year"), ("text", "-"), ("field", "month"), ("text", "-"), ("field", "day")))
    ]
    assert sink.partition_columns == ("country", "page")
    assert sink.event_time_column == "event_time"
    assert (spec.trigger_interval, sink.target_file_size_mb) == (120.0, 64)
    assert len(file.notes) == 3


def test_an_arroyo_key_and_deltaflow_key_for_one_setting_must_agree():
    base = "CREATE TABLE s WITH (connector='generator'); INSERT INTO t SELECT * FROM s;"
    same = "CREATE TABLE t WITH (connector='delta', path='/t', rollover_seconds=60, trigger_interval='1 min',"
    file = parse_sql(same + " partition_fields=[a, b], partition_columns='a,b');" + base, {})
    assert file.pipelines[0].trigger_interval == 60.0
    with pytest.raises(PipelineConfigError, match="trigger_interval is set twice"):
        parse_sql(same.replace("'1 min'", "'2 min'") + " format='parquet');" + base, {})


def test_every_arroyo_key_is_known():
    """Each of Arroyo's keys parses (no 'unknown option'), with a value of the right kind."""
    values = {
        "format": "'parquet'",
        "partition_fields": "'page'",
        "partitioning.fields": "[page]",
        "time_partition_pattern": "'%Y'",
        "partitioning.time_pattern": "'%Y'",
        "shuffle_by_partition": "true, partition_columns = 'page'",
        "shuffle_by_partition.enabled": "true, partition_columns = 'page'",
        "event_time_field": "'event_time', time_partition_pattern = '%Y'",
        "rollover_seconds": "5",
        "rolling_policy.interval": "'5s'",
        "target_file_size": "1048576",
        "rolling_policy.file_size": "'1MB'",
        "parquet_compression": "'uncompressed'",
        "filename.suffix": "'.parquet'",
    }
    for key in ARROYO_SINK_KEYS:
        value = values.get(key, "1" if "filename" not in key else "'uuid'")
        file = parse_sql(
            "CREATE TABLE s WITH (connector='generator');"
            f"CREATE TABLE t WITH (connector='delta', path='/t', '{key}' = {value});"
            "INSERT INTO t SELECT * FROM s",
            {},
        )
        assert file.pipelines[0].sinks[0].table_uri == "/t", key


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ("time_partition_pattern = '%Y/%Q'", "%Q is not supported; use %Y, %m, %d, %H, %M, %S, %j, %F"),
        ("time_partition_pattern = '%Y/static'", "segment 'static' has no time directive"),
        ("time_partition_pattern = '%H/%H'", "two segments make the column 'hour'; name them Hive style"),
        (
            "time_partition_pattern = '%Y', partition_fields = 'year'",
            "time_partition_pattern makes the column(s) year, also in partition_columns",
        ),
        ("format = 'json'", "format 'json': a Delta table's data files are Parquet"),
        ("rollover_seconds = 0", "rollover_seconds = 0: must be a positive duration"),
        ("rollover_seconds = 'soon'", "rollover_seconds = 'soon': must be a duration"),
        ("target_file_size = 'big'", "target_file_size = 'big': 'big' is not a size"),
        ("'filename.strategy' = 'random'", "must be one of serial, uuid, uuidv7, ulid"),
        ("max_parts = 0", "max_parts = 0: must be a positive number"),
        ("inactivity_rollover_seconds = 'x'", "must be a positive duration"),
        (
            "shuffle_by_partition = true",
            "shuffle_by_partition needs partition_columns or time_partition_pattern",
        ),
        ("shuffle_by_partition = 'maybe'", "shuffle_by_partition"),
        ("event_time_field = 'ts'", "event_time_column is the column time_partition_pattern formats"),
        (
            "time_partition_pattern = '%Y', write_mode = 'merge', key_columns = 'id', sequence_by = 'id'",
            "time_partition_pattern applies to append and overwrite sinks, not merge",
        ),
        ("'storage.aws_secret_access_key' = 'ab\\'cd'", "a quote inside a string is written twice"),
    ],
)
def test_bad_arroyo_values_are_refused(options, problem):
    with pytest.raises(PipelineConfigError) as info:
        parse_sql(
            "CREATE TABLE s WITH (connector='generator');"
            f"CREATE TABLE t WITH (connector='delta', path='/t', {options});"
            "INSERT INTO t SELECT * FROM s",
            {},
        )
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_validate_prints_the_arroyo_notes(tmp_path):
    path = tmp_path / "p.sql"
    path.write_text(ARROYO)
    result = CliRunner().invoke(cli, ["sql", str(path), "--validate"])
    assert result.exit_code == 0, result.output
    assert "  arroyo lake: max_parts = 1000 has no effect: uploads are written by pyarrow" in result.output

"""The SQL form of pipelines: parsing into pipelines, errors, and a run through Spark."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltaflow.cli import cli
from deltaflow.config.pipeline import FilesSourceSpec, KafkaSourceSpec
from deltaflow.config.sql import parse_sql
from deltaflow.errors import PipelineConfigError
from deltaflow.service.daemon import run_pipelines

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
            "pipelines[0].sinks[0].pth: unknown key",
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

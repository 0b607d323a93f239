"""``deltaflow run`` and ``sql``: the closing lines say what was committed, in the source's unit.

The commands run in this process on the session's Spark (their ``spark.stop()`` made harmless).
"""

from __future__ import annotations

import os
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

import deltaflow
from deltaflow.cli.main import cli
from tests.fixtures.frames import settled


@pytest.fixture
def session(spark, monkeypatch):
    """The session the commands start (and stop) is the test process's own."""
    monkeypatch.setattr(deltaflow, "spark_session", lambda *args, **conf: spark)
    monkeypatch.setattr(spark, "stop", lambda: None)
    return spark


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    return result.output


def _yaml(tmp_path, text: str):
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _land(folder, name: str, ids: range) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{name}.tmp"
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), tmp)
    os.replace(tmp, folder / name)


def test_run_of_a_files_pipeline_reports_the_rows_committed_and_the_files_read(session, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_text("".join(f'{{"id": {i}}}\n' for i in range(6)))
    (landing / "b.json").write_text("".join(f'{{"id": {i}}}\n' for i in range(6, 15)))
    settled(landing / "a.json", landing / "b.json")
    table = tmp_path / "t"
    path = _yaml(
        tmp_path,
        f"""
        pipelines:
          - id: ingest
            source: {{type: files, path: "{landing}", format: json, max_files_per_trigger: 1}}
            sinks: [{{table_uri: "{table}"}}]
        """,
    )
    out = _invoke("run", path, "--once")
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 15
    assert f"ingest: 15 row(s) committed to {table} (2 file(s) read in 2 batch(es))" in out, out


def test_run_of_a_parquet_files_pipeline_reports_the_rows_registered(session, tmp_path):
    landing = tmp_path / "landing"
    _land(landing, "a.parquet", range(0, 5))
    _land(landing, "b.parquet", range(5, 15))
    table = tmp_path / "t"
    path = _yaml(
        tmp_path,
        f"""
        pipelines:
          - id: landed
            source: {{type: parquet-files, path: "{landing}", copy: true, max_files_per_trigger: 1}}
            sinks: [{{table_uri: "{table}"}}]
        """,
    )
    out = _invoke("run", path, "--once")
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 15
    assert f"landed: 15 row(s) committed to {table} (2 file(s) read in 2 batch(es))" in out, out


def test_sql_reports_the_rows_written_not_the_rows_read(session, tmp_path):
    table = tmp_path / "pages"
    path = tmp_path / "p.sql"
    path.write_text(
        f"""
        CREATE TABLE clicks WITH (connector = 'generator', total_rows = 30, rows_per_second = 100000);
        CREATE TABLE pages WITH (connector = 'delta', path = '{table}');
        INSERT INTO pages SELECT id FROM clicks WHERE id % 10 <> 3;
        """
    )
    out = _invoke("sql", str(path), "--once")
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 27
    assert "27 row(s) committed to" in out and f"{table} (30 row(s) read in " in out, out


def test_a_run_of_kafka_pipelines_with_nothing_new_starts_nothing_and_claims_nothing(
    session, kafka, tmp_path, monkeypatch
):
    """A scheduled ``run --available-now`` of idle topics: no Spark, no claim commit per run."""
    import json

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(10)], partitions=2)
    table = tmp_path / "t"
    path = _yaml(
        tmp_path,
        f"""
        pipelines:
          - id: clicks
            engine: auto
            source: {{type: kafka, bootstrap_servers: "{kafka.bootstrap}", topic: {topic}, schema: "id INT"}}
            sinks: [{{table_uri: "{table}"}}]
        """,
    )
    assert "clicks: 10 row(s) committed" in _invoke("run", path, "--available-now")
    version = DeltaTable(str(table)).version()
    started = []
    monkeypatch.setattr(deltaflow, "spark_session", lambda *args, **conf: started.append(1) or session)
    result = CliRunner().invoke(cli, ["run", path, "--available-now"])
    assert result.exit_code == 0, result.output
    assert "clicks: 0 row(s) committed (nothing to read: 1 table(s) up to date)" in result.output
    assert "nothing to run: every table of 1 pipeline(s) holds every message" in result.output
    assert not started and DeltaTable(str(table)).version() == version
    kafka.produce(topic, [json.dumps({"id": 10}).encode()], partitions=1)  # something new: it runs
    assert "clicks: 1 row(s) committed" in _invoke("run", path, "--available-now")
    assert started


def test_a_run_starts_only_the_pipelines_that_have_something_to_read(session, kafka, tmp_path):
    """Of two Kafka pipelines, the idle one is not started: its table gets no claim commit."""
    import json

    topics = [kafka.create_topic(partitions=1) for _ in range(2)]
    for topic in topics:
        kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(5)], partitions=1)
    tables = [tmp_path / "idle", tmp_path / "busy"]
    path = _yaml(
        tmp_path,
        "pipelines:\n"
        + "".join(
            f"""
          - id: {name}
            engine: arrow
            source: {{type: kafka, bootstrap_servers: "{kafka.bootstrap}", topic: {topic}, schema: "id INT"}}
            sinks: [{{table_uri: "{table}"}}]
        """
            for name, topic, table in zip(("idle", "busy"), topics, tables, strict=True)
        ),
    )
    out = _invoke("run", path, "--available-now")
    assert "idle: 5 row(s) committed" in out and "busy: 5 row(s) committed" in out, out
    idle_version = DeltaTable(str(tables[0])).version()
    kafka.produce(topics[1], [json.dumps({"id": 5}).encode()], partitions=1)
    out = _invoke("run", path, "--available-now")
    assert "idle: 0 row(s) committed (nothing to read: 1 table(s) up to date)" in out, out
    assert "busy: 1 row(s) committed" in out, out
    assert DeltaTable(str(tables[0])).version() == idle_version
    assert DeltaTable(str(tables[1])).to_pyarrow_table().num_rows == 6

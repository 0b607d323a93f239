"""Stopping a service as systemd, a container init and Ctrl-C do: a signal to every process of
it (the driver, its JVM, Spark's Python workers), mid-batch. CLI processes against the broker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from tests.fixtures.service import NOT_CLEAN, ROOT, Service

MESSAGES = 100_000


def _messages(first: int, count: int) -> list[bytes]:
    return [json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(first, first + count)]


def _ids(table: Path) -> list[int]:
    return sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["id"])["id"].to_pylist())


def _ingest(kafka, topic: str, table: Path, *extra: str) -> list[str]:
    return ["ingest", topic, str(table), "--kafka", kafka.bootstrap, "--app_id", "svc", *extra]


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_process_group_stops_ingest_cleanly_and_loses_nothing(kafka, tmp_path, number):
    topic = kafka.create_topic(partitions=4)
    kafka.produce(topic, _messages(0, MESSAGES), partitions=4, batched=True)
    table = tmp_path / "t"
    service = Service(
        _ingest(kafka, topic, table, "--allowed_latency", "1", "--max_messages_per_batch", "10000")
    )
    service.wait_for("committed batch 1 of")  # mid-run: more batches wait
    service.signal_all(number)
    code, output = service.finish()
    assert code == 0, output[-5000:]
    assert f"stopped by {signal.Signals(number).name}" in output
    assert not [line for line in output.splitlines() if any(word in line for word in NOT_CLEAN)], output[
        -5000:
    ]
    landed = _ids(table)
    assert landed == sorted(set(landed)) and 0 < len(landed) < MESSAGES
    if number == signal.SIGTERM:  # the next start takes the rest, nothing twice
        _finish_run(_ingest(kafka, topic, table, "--ends_at_latest_offsets"))
        assert _ids(table) == list(range(MESSAGES))


def test_a_stop_with_json_logs_keeps_every_line_json_and_leaves_no_process(kafka, tmp_path):
    """With --log-format json a relay process sits between the service and its stderr; it gets
    the group's signal too, keeps relaying the clean stop's records and ends with the others."""
    topic = kafka.create_topic(partitions=4)
    kafka.produce(topic, _messages(0, MESSAGES), partitions=4, batched=True)
    table = tmp_path / "t"
    args = _ingest(kafka, topic, table, "--allowed_latency", "1", "--max_messages_per_batch", "10000")
    service = Service(["--log-format", "json", *args])
    service.wait_for("committed batch 1 of")
    service.signal_all(signal.SIGTERM)
    code, output = service.finish()  # no process of the service left: the relay neither
    assert code == 0, output[-5000:]
    # stdout (the result line) and stderr (records) share the pipe here.
    records = [json.loads(line) for line in output.splitlines() if not line.startswith("ingested ")]
    assert all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)
    assert any(r["msg"] == "stopped by SIGTERM" for r in records)
    assert not [r for r in records if r["level"] in ("ERROR", "FATAL") or "exc" in r or "exception" in r]
    landed = _ids(table)
    assert landed == sorted(set(landed)) and 0 < len(landed) < MESSAGES


def test_run_stops_every_pipeline_cleanly_on_a_signal_to_its_group(kafka, tmp_path):
    topics = [kafka.create_topic(partitions=2) for _ in range(2)]
    for topic in topics:
        kafka.produce(topic, _messages(0, MESSAGES // 2), partitions=2, batched=True)
    pipelines = {
        "pipelines": [
            {
                "id": f"p{i}",
                "engine": "arrow",
                "source": {
                    "type": "kafka",
                    "bootstrap_servers": kafka.bootstrap,
                    "topic": topic,
                    "schema": "id LONG, name STRING",
                    "max_messages_per_batch": 5000,
                },
                "sinks": [{"table_uri": str(tmp_path / f"t{i}")}],
            }
            for i, topic in enumerate(topics)
        ]
    }
    spec = tmp_path / "pipelines.yml"
    spec.write_text(json.dumps(pipelines))  # JSON is YAML
    service = Service(["run", str(spec)])
    service.wait_for("committed batch 1 of", count=2)
    # Every pipeline on the Arrow engine: the JVM only plans, with its quick compiler.
    (java,) = service.children_named("java")
    assert "-XX:TieredStopAtLevel=1" in java.cmdline()
    service.signal_all(signal.SIGTERM)
    code, output = service.finish()
    assert code == 0, output[-5000:]
    assert not [line for line in output.splitlines() if any(word in line for word in NOT_CLEAN)], output[
        -5000:
    ]
    for i in range(2):
        landed = _ids(tmp_path / f"t{i}")
        assert landed == sorted(set(landed)) and landed


def _stop_mid_run(service: Service, ids: Callable[[], list[int]], total: int, timeout: float = 240) -> None:
    """Wait until ``ids()`` (those landed) holds some but not all of ``total`` rows, then
    SIGTERM to the group: exit 0, nothing unclean printed, no row twice."""
    deadline = time.monotonic() + timeout
    while (landed := len(_or_none(ids))) == 0:
        assert service.process.poll() is None and time.monotonic() < deadline, service.tail()
        time.sleep(0.2)  # condition poll on the table
    assert landed < total, "every row landed before the stop: give the test more input"
    service.signal_all(signal.SIGTERM)
    code, output = service.finish()
    assert code == 0, output[-5000:]
    assert "stopped by SIGTERM" in output
    unclean = [line for line in output.splitlines() if any(word in line for word in NOT_CLEAN)]
    assert not unclean, "\n".join(unclean[:30]) + "\n---\n" + output[-3000:]
    landed = ids()
    assert landed == sorted(set(landed)), "a row landed twice"


def _or_none(ids: Callable[[], list[int]]) -> list[int]:
    try:
        return ids()
    except TableNotFoundError:  # not made yet
        return []


def _finish_run(args: list[str]) -> None:
    """``deltaflow ARGS`` to its end (a job: ``--available-now`` or ``-e`` among them): exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", "deltaflow.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_sql_stops_cleanly_on_a_signal_to_its_group(kafka, tmp_path):
    # 6 batches: the stop comes once the first landed, far from the last; the rest is the next
    # start's (each batch costs that run ~0.7 s).
    topic, messages = kafka.create_topic(partitions=2), 6_000
    kafka.produce(topic, _messages(0, messages), partitions=2, batched=True)
    table = tmp_path / "t"
    spec = tmp_path / "job.sql"
    spec.write_text(
        f"CREATE TABLE src (id BIGINT, name TEXT) WITH (connector = 'kafka', bootstrap_servers = "
        f"'{kafka.bootstrap}', topic = '{topic}', format = 'json', max_messages_per_batch = 1000);\n"
        f"CREATE TABLE dst WITH (connector = 'delta', path = '{table}', pipeline_id = 'sqlstop');\n"
        "INSERT INTO dst SELECT id, name FROM src;\n"
    )
    _stop_mid_run(Service(["sql", str(spec)]), lambda: _ids(table), messages)
    _finish_run(["sql", str(spec), "--available-now"])  # the next start takes the rest, nothing twice
    assert _ids(table) == list(range(messages))


def test_a_landed_files_watch_stops_cleanly_on_a_signal_to_its_group(tmp_path):
    landing, table = tmp_path / "landing", tmp_path / "t"
    landing.mkdir()
    files, per_file = 24, 100  # 12 batches of 2 files: the stop comes once the first landed
    for f in range(files):
        lines = (json.dumps({"id": i, "name": f"n{i}"}) for i in range(f * per_file, (f + 1) * per_file))
        (landing / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    spec = tmp_path / "files.yml"
    spec.write_text(
        json.dumps(
            {
                "pipelines": [
                    {
                        "id": "watch",
                        "source": {
                            "type": "files",
                            "path": str(landing),
                            "schema": "id LONG, name STRING",
                            "max_files_per_trigger": 2,
                            "min_file_age": 0,
                        },
                        "sinks": [{"table_uri": str(table)}],
                    }
                ]
            }
        )
    )
    _stop_mid_run(Service(["run", str(spec)]), lambda: _ids(table), files * per_file)
    _finish_run(["run", str(spec), "--available-now"])
    assert _ids(table) == list(range(files * per_file))


def test_postgres_cdc_stops_cleanly_on_a_signal_to_its_group(postgres, tmp_path):
    conn = postgres.connect()
    conn.execute("CREATE TABLE stop_cdc (id int PRIMARY KEY, name text)")
    conn.execute("CREATE PUBLICATION stop_pub FOR TABLE stop_cdc")
    changes = 2000
    table, mirror = tmp_path / "events", tmp_path / "mirror"
    spec = tmp_path / "cdc.yml"
    source = {"type": "postgres-cdc", "host": postgres.host, "port": postgres.port, "user": postgres.user}
    source |= {"database": postgres.dbname, "publication": "stop_pub", "slot": "stop_slot"}
    source |= {"snapshot": "never", "max_changes_per_batch": 200}
    sinks = [{"table_uri": str(table)}]
    sinks += [{"table_uri": str(mirror), "write_mode": "merge", "stream": "public.stop_cdc"}]
    spec.write_text(json.dumps({"pipelines": [{"id": "cdcstop", "source": source, "sinks": sinks}]}))
    service = Service(["run", str(spec)])
    try:
        service.wait_for("created replication slot", timeout=240)
        for first in range(0, changes, 50):  # small transactions: many batches
            conn.execute(
                "INSERT INTO stop_cdc SELECT i, 'n' || i FROM generate_series(%s::int, %s::int) i",
                (first, first + 49),
            )
    except BaseException:
        service.process.kill()
        raise

    def inserted() -> list[int]:
        data = DeltaTable(str(table)).to_pyarrow_table(columns=["data"])["data"].to_pylist()
        return sorted(json.loads(row)["id"] for row in data)

    _stop_mid_run(service, inserted, changes)
    _finish_run(["run", str(spec), "--available-now"])
    assert inserted() == list(range(changes))
    mirrored = DeltaTable(str(mirror)).to_pyarrow_table(columns=["id"])["id"].to_pylist()
    assert sorted(mirrored) == list(range(changes))

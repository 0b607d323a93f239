"""``deltaflow.cli.main``: one spelling, an environment variable for every flag, shown in --help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pyarrow as pa
import pytest
from click.testing import CliRunner
from deltalake import write_deltalake

from deltaflow.cli import cli


def _options():
    for name, command in sorted(cli.commands.items()):
        for param in command.params:
            if isinstance(param, click.Option):
                yield pytest.param(name, param, id=f"{name}-{param.name}")


@pytest.mark.parametrize(("command", "option"), list(_options()))
def test_every_flag_has_an_environment_variable_shown_in_help(command, option):
    ctx = click.Context(
        cli.commands[command], info_name=command, parent=click.Context(cli, auto_envvar_prefix="DELTAFLOW")
    )
    record = option.get_help_record(ctx)
    assert record is not None
    assert "env var: " in record[1]
    long_names = [o for o in option.opts if o.startswith("--")]
    # One spelling: the first long name uses hyphens (underscore spellings are aliases).
    assert long_names and "_" not in long_names[0]


def test_an_auto_environment_variable_sets_its_flag(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipelines:\n  - id: p\n    source: {type: generator}\n    sinks: [{table_uri: "
        + str(tmp_path / "t")
        + "}]\n"
    )
    plain = CliRunner().invoke(cli, ["validate", str(path)])
    shown = CliRunner().invoke(cli, ["validate", str(path)], env={"DELTAFLOW_VALIDATE_SHOW": "1"})
    assert plain.exit_code == shown.exit_code == 0, shown.output
    assert "pipelines:" not in plain.output
    assert "pipelines:" in shown.output  # --show printed the resolved file


def test_kafka_delta_ingest_spellings_stay_aliases():
    ingest = cli.commands["ingest"]
    names = {o for p in ingest.params for o in [*p.opts, *p.secondary_opts]}
    for flag in ("--app_id", "--allowed_latency", "--max_messages_per_batch", "--dlq_table_location"):
        assert flag in names
        assert flag.replace("_", "-") in names


def test_a_flag_value_option_reads_its_environment_variable():
    result = CliRunner().invoke(
        cli, ["ingest", "t", "/tmp/x", "--avro", "schema.avsc"], env={"DELTAFLOW_INGEST_VALUE_FORMAT": "raw"}
    )
    assert result.exit_code == 2
    assert "--avro and --raw exclude each other" in result.output


# --log-format json: every line on stderr is a JSON record, of deltaflow, Spark's JVM, its workers.

ROOT = Path(__file__).resolve().parents[2]
#: Given to the runs below as a Kafka password: it must appear nowhere in their output.
SECRET = "hunter2-never-printed"


def _run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("DELTAFLOW_LOG_", "KAFKA_DELTA_INGEST_"))
    }
    return subprocess.run(
        [sys.executable, "-m", "deltaflow.cli", *args],
        cwd=ROOT,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _records(stderr: str) -> list[dict[str, object]]:
    """Every line of ``stderr`` as a JSON record (a line that is not one fails the test)."""
    records = []
    for line in stderr.splitlines():
        record = json.loads(line)
        assert isinstance(record, dict), line
        assert {"ts", "level", "logger", "msg"} <= record.keys(), line
        records.append(record)
    assert records
    return records


def _jvm(records: list[dict[str, object]]) -> list[dict[str, object]]:
    """Spark's JVM records: its layout names the logger by the class's simple name."""
    return [r for r in records if "." not in str(r["logger"]) and str(r["logger"])[:1].isupper()]


def _ingest_messages(kafka, count: int, *, bad: int = 0) -> str:
    topic = kafka.create_topic(partitions=2)
    values = [json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(count)]
    kafka.produce(topic, values + [b"not json"] * bad, partitions=2)
    return topic


def test_json_logs_of_ingest_are_json_lines_with_spark_s_records_and_no_secret(kafka, tmp_path):
    topic = _ingest_messages(kafka, 20, bad=1)
    table = tmp_path / "t"
    args = ["ingest", topic, str(table), "--kafka", kafka.bootstrap, "--app_id", "jl", "-e"]
    done = _run(["--log-format", "json", *args, "--kafka_setting", f"sasl.password={SECRET}"])
    assert done.returncode == 0, done.stderr[-5000:]
    assert done.stdout == f"ingested 21 message(s) in 1 batch(es) into {table}\n"  # the JVM's prints not
    records = _records(done.stderr)
    # Spark's JVM logs in its structured layout: records with their context (MDC).
    assert any(isinstance(r.get("context"), dict) for r in _jvm(records)), done.stderr
    committed = [r for r in records if str(r["msg"]).startswith("committed batch 0 of 'jl'")]
    assert [(r["pipeline"], r["batch"], r["table"]) for r in committed] == [("jl", 0, str(table))]
    dead = [r for r in records if r["logger"] == "deltaflow.pipeline.dead_letters"]
    assert [(r["level"], r["pipeline"], r["batch"]) for r in dead] == [("WARN", "jl", 0)]
    assert SECRET not in done.stdout + done.stderr


def test_json_logs_by_environment_variable_with_dead_letters_committed(kafka, tmp_path):
    topic = _ingest_messages(kafka, 20, bad=2)
    table, dlq = tmp_path / "t", tmp_path / "dlq"
    args = ["ingest", topic, str(table), "--kafka", kafka.bootstrap, "--app_id", "je", "-e"]
    scram = json.dumps({"username": "deltaflow", "password": SECRET})
    env = {"DELTAFLOW_LOG_FORMAT": "json", "KAFKA_DELTA_INGEST_SCRAM_JSON": scram}
    done = _run(["-v", *args, "--dlq_table_location", str(dlq)], env)
    assert done.returncode == 0, done.stderr[-5000:]
    records = _records(done.stderr)
    assert _jvm(records)
    committed = {
        (r["pipeline"], r["batch"], r["table"])
        for r in records
        if str(r["msg"]).startswith("committed batch")
    }
    assert committed == {("je", 0, str(table)), ("je-dlq", 0, str(dlq))}
    assert SECRET not in done.stdout + done.stderr


def test_json_logs_of_a_failed_batch_carry_the_exceptions(kafka, tmp_path):
    topic = _ingest_messages(kafka, 5)
    table = tmp_path / "t"
    args = ["ingest", topic, str(table), "--kafka", kafka.bootstrap, "--app_id", "jx", "-e"]
    # A Spark SQL transform that raises in the tasks: the batch, then the query, fails.
    done = _run(["--log-format", "json", "-v", *args, "-t", "check: sql: assert_true(id < 0)"])
    assert done.returncode == 2, done.stderr[-5000:]
    records = _records(done.stderr)
    # Spark's records of the failed tasks carry the Java exception as JSON.
    assert any(isinstance(r.get("exception"), dict) for r in _jvm(records)), done.stderr
    failed = [r for r in records if r["logger"] == "deltaflow.service.daemon" and r["level"] == "ERROR"]
    # The daemon's line, then (a failure deltaflow does not know) its whole text, once.
    assert [r["pipeline"] for r in failed] == ["jx", "jx"]
    assert str(failed[0]["msg"]).startswith("query 'jx' failed and will not be restarted: ")
    assert str(failed[1]["msg"]).startswith("query 'jx' failed, as Spark reported it:\n")
    assert "assert_true" in str(failed[1]["msg"])
    # The CLI's last word (Spark's JVM may still log beside it while it stops).
    [last] = [r for r in records if r["logger"] == "deltaflow.cli.main"]
    assert last["level"] == "ERROR"
    assert str(last["msg"]).startswith("error: the streaming query failed")
    assert str(last["exc"]).startswith("Traceback (most recent call last):")  # -v: the traceback


def test_json_logs_of_commands_without_spark(tmp_path):
    missing = str(tmp_path / "missing")
    text = _run(["vacuum", missing], timeout=120)
    assert (text.returncode, text.stderr) == (2, f"error: no Delta table at '{missing}'\n")  # as ever
    done = _run(["--log-format", "json", "vacuum", missing], timeout=120)
    assert done.returncode == 2
    [record] = _records(done.stderr)
    assert (record["level"], record["msg"], record["table"]) == ("ERROR", text.stderr.strip(), missing)
    assert "exc" not in record  # a traceback with --verbose only, as in text
    verbose = _run(["--log-format", "json", "-v", "vacuum", missing], timeout=120)
    assert str(_records(verbose.stderr)[-1]["exc"]).startswith("Traceback")
    # -v in text: the traceback, then the same last line and exit code as without it.
    verbose = _run(["-v", "vacuum", missing], timeout=120)
    assert verbose.returncode == 2, verbose.stderr
    assert "Traceback (most recent call last):" in verbose.stderr
    assert verbose.stderr.endswith(text.stderr)
    # A usage error: before any command ran, still a record.
    usage = _run(["--log-format", "json", "no-such-command"], timeout=120)
    assert usage.returncode == 2
    assert [r["msg"] for r in _records(usage.stderr)] == ["error: No such command 'no-such-command'."]
    # A command's notes on stderr are records; its results on stdout stay as they are.
    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": [1, 2]}))
    plain = _run(["vacuum", str(table)], timeout=120)
    dry = _run(["--log-format", "json", "vacuum", str(table)], timeout=120)
    assert dry.returncode == plain.returncode == 0, dry.stderr
    assert dry.stdout == plain.stdout
    notes = [r for r in _records(dry.stderr) if r["logger"] == "deltaflow.cli.output"]
    assert [(r["level"], r["msg"]) for r in notes] == [("INFO", plain.stderr.splitlines()[-1])]


#: Runs the CLI with the relay's drain bound raised, so that a drain that waits it out shows.
_DRAIN_BOUND = """
import sys
from deltaflow.io import logs
logs.RELAY_DRAIN_S = 60.0
from deltaflow.cli.main import main
main(sys.argv[1:])
"""


def test_json_logs_of_a_spark_command_end_with_the_process(tmp_path):
    """Spark's JVM holds the relay's pipe until it ends, and pyspark's gateway ends when the
    process does: the exit must end the JVM first, not wait out the relay's drain bound."""
    import time
    from datetime import datetime

    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(5)))
    spec = tmp_path / "files.yml"
    source = {"type": "files", "path": str(landing), "schema": "id LONG", "min_file_age": 0}
    spec.write_text(
        json.dumps(
            {"pipelines": [{"id": "ends", "source": source, "sinks": [{"table_uri": str(tmp_path / "t")}]}]}
        )
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("DELTAFLOW_LOG_")}
    args = ["--log-format", "json", "run", str(spec), "--available-now"]
    done = subprocess.run(
        [sys.executable, "-c", _DRAIN_BOUND, *args],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=600,
    )
    ended = time.time()
    assert done.returncode == 0, done.stderr[-5000:]
    last = _records(done.stderr)[-1]
    logged = datetime.fromisoformat(str(last["ts"]).replace("Z", "+00:00")).timestamp()
    assert ended - logged < 30, (ended - logged, last)  # not the 60 s bound

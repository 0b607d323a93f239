"""``deltaflow.service.daemon``: which failures are retried, and the restart loop on real Spark queries."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from deltaflow.errors import (
    CheckpointMismatchError,
    CommitError,
    ConfigError,
    EngineUnavailableError,
    JobGaveUpError,
    KafkaAccessError,
    KafkaDataLossError,
    KafkaUnavailableError,
    LeaseHeldError,
    PipelineConfigError,
    QueryFailedError,
    SchemaMismatchError,
    TransientError,
)
from deltaflow.service.daemon import classify_failure, run_pipelines, run_until_stopped
from tests.fixtures.frames import settled


def _worker_failure(exception_line: str, where: str = "latestOffset") -> RuntimeError:
    """A failure as Spark reports a Python worker's exception: traceback text in a message."""
    return RuntimeError(
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
        f"[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform "
        f"{where}: Traceback (most recent call last):\n"
        '  File "/x/deltaflow/sources/kafka.py", line 1, in latestOffset\n'
        "    raise boom\n"
        f"{exception_line}\n"
        " SQLSTATE: 38000"
    )


def _connect_unavailable() -> Exception:
    """What pyspark's Spark Connect client raises once its retries on a stopped server ran out."""
    import grpc
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    return SparkConnectGrpcException(
        message="<_MultiThreadedRendezvous of RPC that terminated with:\n"
        "\tstatus = StatusCode.UNAVAILABLE\n"
        '\tdetails = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: '
        'Failed to connect to remote host: Connection refused"\n>',
        grpc_status_code=grpc.StatusCode.UNAVAILABLE,
    )


def _chained(outer: Exception, cause: Exception) -> Exception:
    try:
        raise outer from cause
    except Exception as exc:  # noqa: BLE001
        return exc


@pytest.mark.parametrize(
    ("error", "expected", "reason"),
    [
        pytest.param(CommitError("commit failed"), CommitError, "commit failed", id="deltaflow-transient"),
        pytest.param(ConfigError("bad"), ConfigError, "bad", id="deltaflow-terminal"),
        pytest.param(
            KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure")),
            KafkaUnavailableError,
            "_TRANSPORT",
            id="kafka-on-driver",
        ),
        pytest.param(
            _worker_failure(
                "deltaflow.errors.KafkaUnavailableError: reading the latest offsets from k:9092: "
                "_TRANSPORT: Failed to get metadata: Local: Broker transport failure; the Kafka "
                "cluster may be down or unreachable, retrying later may work"
            ),
            KafkaUnavailableError,
            "reading the latest offsets from k:9092: _TRANSPORT: Failed to get metadata",
            id="kafka-in-worker",
        ),
        pytest.param(
            _worker_failure(
                "deltaflow.errors.KafkaUnavailableError: reading t[0] offsets 0-5: _ALL_BROKERS_DOWN: x"
            ),
            KafkaUnavailableError,
            "_ALL_BROKERS_DOWN",
            id="all-brokers-down",
        ),
        pytest.param(
            _worker_failure(
                "deltaflow.errors.TransientError: no progress reading t[0] at offset 5 (range ends "
                "at 9) for 60 s; is the broker up?",
                where="read",
            ),
            TransientError,
            "no progress reading t[0] at offset 5 (range ends at 9) for 60 s; is the broker up?",
            id="stalled-read-in-worker",
        ),
        pytest.param(
            _worker_failure("deltaflow.errors.CommitError: commit to /t failed after 4 attempt(s)"),
            CommitError,
            "commit to /t failed after 4 attempt(s)",
            id="commit-conflict-in-worker",
        ),
        pytest.param(
            _worker_failure(
                "deltaflow.errors.SchemaMismatchError: schema of the data does not match the Delta "
                "table '/t':\n  - column 'a' is x"
            ),
            SchemaMismatchError,
            "schema of the data does not match the Delta table '/t':\n  - column 'a' is x",
            id="schema-mismatch-in-worker",
        ),
        pytest.param(
            _worker_failure("deltaflow.errors.CheckpointMismatchError: txn 7 > batch 3"),
            CheckpointMismatchError,
            "txn 7 > batch 3",
            id="checkpoint-mismatch-in-worker",
        ),
        pytest.param(
            _worker_failure("deltaflow.errors.ConfigError: Kafka topic 't' does not exist"),
            ConfigError,
            "Kafka topic 't' does not exist",
            id="config-error-in-worker",
        ),
        pytest.param(
            _worker_failure(
                "deltaflow.errors.KafkaAccessError: reading t[0] offsets 0-5: Kafka refused the "
                "client (SASL_AUTHENTICATION_FAILED: x); check the Kafka settings"
            ),
            KafkaAccessError,
            "SASL_AUTHENTICATION_FAILED",
            id="kafka-authentication",
        ),
        pytest.param(
            _worker_failure("ZeroDivisionError: division by zero"),
            QueryFailedError,
            "retrying cannot help: ZeroDivisionError: division by zero",
            id="unknown-error",
        ),
        pytest.param(
            _chained(RuntimeError("sampling failed"), KafkaException(KafkaError(KafkaError._TIMED_OUT))),
            KafkaUnavailableError,
            "sampling failed: _TIMED_OUT",
            id="kafka-as-python-cause",
        ),
        pytest.param(
            _chained(RuntimeError("sampling failed"), KafkaException(KafkaError(KafkaError._INVALID_ARG))),
            KafkaAccessError,
            "sampling failed: Kafka refused the client (_INVALID_ARG",
            id="kafka-setting-as-python-cause",
        ),
        pytest.param(
            # Only a deltaflow class name decides; words in the text never do.
            _worker_failure('cimpl.KafkaException: KafkaError{code=_TRANSPORT,val=-195,str="down"}'),
            QueryFailedError,
            "retrying cannot help: cimpl.KafkaException",
            id="raw-kafka-text-is-not-matched",
        ),
        pytest.param(
            _worker_failure("deltaflow.errors.LeaseHeldError: the lease is held by h:1"),
            LeaseHeldError,
            "the lease is held by h:1",
            id="lease-held-in-worker",
        ),
        pytest.param(
            # pyspark's Spark Connect client gave up on a server that stopped: transient (exit 1).
            _connect_unavailable(),
            EngineUnavailableError,
            "the Spark Connect server stopped answering (UNAVAILABLE: failed to connect to all addresses",
            id="spark-connect-server-gone",
        ),
        pytest.param(
            # A deltaflow message is read back whole: its remedy often comes last.
            _worker_failure(
                "deltaflow.errors.KafkaDataLossError: Kafka topic 't' partition 0: "
                + "its offsets went back; " * 25
                + "set fail_on_data_loss false (the Spark option failOnDataLoss)"
            ),
            KafkaDataLossError,
            "its offsets went back; set fail_on_data_loss false (the Spark option failOnDataLoss)",
            id="long-deltaflow-message-in-worker",
        ),
        pytest.param(
            _worker_failure("deltaflow.errors.PipelineConfigError: p.yaml: 1 problem(s):"),
            PipelineConfigError,
            "p.yaml: 1 problem(s):",
            id="pipeline-config-in-worker",
        ),
    ],
)
def test_classify_failure(error, expected, reason):
    failure = classify_failure(error)
    assert type(failure) is expected
    assert reason in str(failure)


def test_a_signal_ends_the_backoff_wait():
    calls = []

    def start_query():
        calls.append(time.monotonic())
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # recorded by run_until_stopped's handler
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    summary = run_until_stopped(start_query, name="t", max_backoff_s=30)
    assert (summary.signal, summary.restarts, len(calls)) == (signal.SIGTERM, 1, 2)
    assert 1.0 <= calls[1] - calls[0] < 2.0  # the first backoff step
    # The second step (2 s, so 3 s in all) was cut short by the signal: the rest is slack for a
    # loaded machine.
    assert time.monotonic() - started < 2.9
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_a_job_gives_up_after_its_bound_without_progress(caplog):
    # A broker that never comes up: a job (--ends_at_latest_offsets, --available-now) stops with
    # the transient code and says why, instead of restarting without end.
    calls = []

    def start_query():
        calls.append(time.monotonic())
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    started = time.monotonic()
    with pytest.raises(JobGaveUpError) as caught:
        run_until_stopped(start_query, name="job", give_up_after_s=2.5)
    assert isinstance(caught.value, TransientError)
    # Failed at 0, restarted after 1 s, failed; the next wait (2 s) would pass the bound.
    assert len(calls) == 2 and time.monotonic() - started < 2.5
    message = str(caught.value)
    assert re.search(
        r"'job' gave up after \d+ s without progress and 1 restart\(s\) \(--give_up_after 2\.5 s\)", message
    )
    assert "_TRANSPORT" in message  # the last failure, named
    assert any("query 'job' stops: " in r.getMessage() for r in caplog.records if r.levelname == "ERROR")


def test_a_bad_max_backoff_is_refused():
    with pytest.raises(ConfigError, match=r"max_backoff_s must be at least 1\.0 s, got 0\.5"):
        run_until_stopped(lambda: pytest.fail("started"), name="t", max_backoff_s=0.5)


def _file_stream(spark, tmp_path, rows, on_batch, *, available_now=True):
    landing = tmp_path / "landing"
    landing.mkdir(exist_ok=True)
    (landing / "a.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(rows)))

    def start():
        writer = (
            spark.readStream.schema("id LONG")
            .json(str(landing))
            .writeStream.foreachBatch(on_batch)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
        )
        return writer.trigger(availableNow=True).start() if available_now else writer.start()

    return start


def test_transient_failures_restart_the_query_and_the_counts_add_up(spark, tmp_path, caplog):
    seen = []
    starts = []

    def on_batch(df, batch_id):
        if len(seen) == 0 and not starts[-1]:
            seen.append("failed")
            raise TransientError("the broker is gone")  # reaches the driver as text
        seen.append(df.count())

    start = _file_stream(spark, tmp_path, 7, on_batch)

    def start_query():
        if not starts:
            starts.append(True)
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))  # before the query exists
        starts.append(False)
        return start()

    reported = []
    summary = run_until_stopped(
        start_query, name="flaky", on_progress=lambda done, left, rate: reported.append((done, left))
    )
    assert reported and reported[-1] == (7, 0)  # the file source reports no lag
    assert seen == ["failed", 7]
    assert (summary.messages, summary.batches, summary.restarts, summary.signal) == (7, 1, 2, None)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("query 'flaky' failed, restarting in 1 s" in w and "_TRANSPORT" in w for w in warnings)
    assert any("restarting in 2 s" in w and "the broker is gone" in w for w in warnings)


def test_a_long_first_batch_that_fails_once_is_restarted_not_given_up(spark, tmp_path):
    # The bound counts from the first failure after the last progress, not from the start: a
    # first batch longer than the bound that fails once (to restart with evolved columns, a
    # conflict storm at its commit) is restarted, and the job ends well.
    seen = []

    def on_batch(df, batch_id):
        if not seen:
            seen.append("slow")
            time.sleep(3)
            raise TransientError("columns were added: restart")
        seen.append(df.count())

    summary = run_until_stopped(_file_stream(spark, tmp_path, 4, on_batch), name="long", give_up_after_s=2)
    assert seen == ["slow", 4]
    assert (summary.messages, summary.restarts) == (4, 1)


@pytest.mark.parametrize(
    ("raised", "expected", "message"),
    [
        pytest.param(
            SchemaMismatchError("/t", ["column 'a' is x"]),
            SchemaMismatchError,
            "schema of the data does not match the Delta table '/t':\n  - column 'a' is x",
            id="schema-mismatch",
        ),
        pytest.param(ValueError("not a number"), QueryFailedError, "ValueError: not a number", id="unknown"),
    ],
)
def test_terminal_failures_are_raised(spark, tmp_path, caplog, raised, expected, message):
    def on_batch(df, batch_id):
        raise raised

    with caplog.at_level(logging.DEBUG, logger="deltaflow.service.daemon"), pytest.raises(expected) as info:
        run_until_stopped(_file_stream(spark, tmp_path, 3, on_batch), name="bad")
    assert message in str(info.value)
    # The whole text once: at ERROR for a failure deltaflow does not know, else at DEBUG (-v).
    (whole,) = [r for r in caplog.records if "as Spark reported it" in r.getMessage()]
    assert whole.levelno == (logging.ERROR if expected is QueryFailedError else logging.DEBUG)
    assert "Traceback" in whole.getMessage() and "on_batch" in whole.getMessage()


def test_sigterm_stops_the_query(spark, tmp_path):
    def on_batch(df, batch_id):
        df.count()  # Spark counts input rows only when the batch's DataFrame is read
        if batch_id == 0:
            (tmp_path / "landing" / "b.json").write_text('{"id": 5}\n')  # makes batch 1
        else:
            os.kill(os.getpid(), signal.SIGTERM)  # the daemon's handler only records it

    summary = run_until_stopped(_file_stream(spark, tmp_path, 5, on_batch, available_now=False), name="sig")
    assert (summary.signal, summary.restarts) == (signal.SIGTERM, 0)
    # Batch 1 was abandoned by the stop (not counted) or finished first (counted).
    assert (summary.messages, summary.batches) in {(5, 1), (6, 2)}
    assert not spark.streams.active


def test_the_summary_counts_the_rows_committed_per_table_not_the_rows_read(spark, tmp_path, caplog):
    from tests.fixtures.pipelines import pipelines

    specs = pipelines(
        tmp_path,
        """
        pipelines:
          - id: checked
            source: {type: generator, total_rows: 30, rows_per_batch: 10, rows_per_second: 100000}
            expectations: [{name: no_threes, expr: "id % 10 <> 3", action: drop}]
            dead_letter: {table_uri: "${DIR}/rejected"}
            sinks:
              - {name: all, table_uri: "${DIR}/all"}
              - {name: big, table_uri: "${DIR}/big", when: "id >= 20"}
        """,
    )
    summary = run_pipelines(spark, specs, available_now=True)["checked"]
    assert (summary.messages, summary.unit, summary.batches) == (30, "row(s)", 3)
    assert summary.committed_unit == "row(s)"
    assert summary.committed == {
        str(tmp_path / "rejected"): 3,
        str(tmp_path / "all"): 27,
        str(tmp_path / "big"): 9,
    }
    # Run again: nothing new is read or committed (the counts are of this run only).
    again = run_pipelines(spark, specs, available_now=True)["checked"]
    assert (again.messages, sum(again.committed.values())) == (0, 0)


def test_progress_lines_name_the_unit_of_the_source_and_the_rows_committed(spark, tmp_path, caplog):
    import logging

    from tests.fixtures.pipelines import pipelines

    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_text("".join(f'{{"id": {i}}}\n' for i in range(4)))
    (landing / "b.json").write_text("".join(f'{{"id": {i}}}\n' for i in range(4, 7)))
    settled(landing / "a.json", landing / "b.json")
    specs = pipelines(
        tmp_path,
        """
        pipelines:
          - id: files
            source: {type: files, path: "${DIR}/landing", format: json, max_files_per_trigger: 1}
            sinks: [{table_uri: "${DIR}/files"}]
          - id: gen
            source: {type: generator, total_rows: 20, rows_per_batch: 10, rows_per_second: 100000}
            sinks: [{table_uri: "${DIR}/gen"}]
        """,
    )
    with caplog.at_level(logging.INFO, logger="deltaflow.service.daemon"):
        run_pipelines(spark, specs, available_now=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "deltaflow.service.daemon"]
    assert not [line for line in lines if "message(s)" in line], lines
    # Batches finished between two polls are reported in one line.
    files = r"query 'files': \d file\(s\) in \d batch\(es\); 2 file\(s\) in 2 batch\(es\) in all, 7 row\(s\) "
    gen = r"query 'gen': \d+ row\(s\) in \d batch\(es\); 20 row\(s\) in 2 batch\(es\) in all, 20 row\(s\) "
    # Neither source reports a lag: no "behind" (a CDC source's is in bytes of WAL, with no time
    # estimate; a Kafka source's in messages).
    assert any(re.match(files + "committed$", line) for line in lines), lines
    assert any(re.match(gen + "committed$", line) for line in lines), lines


_SLOW_STOP = """
import sys, time
from deltaflow.service.daemon import run_until_stopped

class SlowStop:  # a query whose stop takes {stop_s} s (a big batch's commit)
    lastProgress = None
    recentProgress = []
    def awaitTermination(self, seconds):
        print("running", flush=True)  # the daemon's handlers are in place
        time.sleep(seconds)
        return False
    def exception(self):
        return None
    def stop(self):
        time.sleep({stop_s})

summary = run_until_stopped(SlowStop, name="slow", stop_timeout_s={timeout_s})
print("clean stop, signal", summary.signal, flush=True)
"""


@pytest.mark.parametrize(
    "second_after, stop_s, timeout_s, code, said",
    [
        (None, 1, 60, 0, "clean stop, signal 15"),  # one signal: the stop ends by itself
        (0.2, 1, 60, 0, "clean stop, signal 15"),  # repeated at once (a forwarding wrapper): the same stop
        (2.5, 30, 60, 3, "stopping at once (a second SIGTERM)"),  # an operator's second signal
        (None, 30, 1, 3, "stopping at once (the stop still running after 1 s)"),  # --stop-timeout
    ],
    ids=["once", "forwarded", "second", "timeout"],
)
def test_a_second_signal_or_the_stop_timeout_stops_at_once(second_after, stop_s, timeout_s, code, said):
    import signal
    import subprocess
    import sys
    import time

    script = _SLOW_STOP.format(stop_s=stop_s, timeout_s=timeout_s)
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "running"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    if second_after is not None:
        time.sleep(second_after)  # the second signal's moment is what is tested
        process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == code and said in output, output
    assert time.monotonic() - started < stop_s + 5


class _IdleQuery:
    """A query's progress as Spark reports an idle one: after batch 0, a report every interval
    with the next batch id and no rows (here while messages wait: a source that reads nothing)."""

    def __init__(self) -> None:
        self.recentProgress: list[dict] = []

    @property
    def lastProgress(self) -> dict | None:  # noqa: N802 - pyspark's name
        return self.recentProgress[-1] if self.recentProgress else None

    def report(self, second: int, batch: int, rows: int, waiting: int) -> None:
        end, latest = {"t": {"0": 100}}, {"t": {"0": 100 + waiting}}
        self.recentProgress.append(
            {
                "runId": "r1",
                "batchId": batch,
                "timestamp": f"2026-01-01T00:00:{second:02d}.000Z",
                "numInputRows": rows,
                "sources": [{"description": "kafka", "endOffset": end, "latestOffset": latest}],
            }
        )


def test_every_idle_progress_report_reaches_the_status_board(monkeypatch):
    """Spark repeats the batch id in every idle report: each one still is a completed trigger
    (/healthz's --stall-timeout) and a trigger that read nothing (--stall-triggers)."""
    from deltaflow.service import daemon
    from deltaflow.service.status import StatusBoard

    board = StatusBoard()
    board.stall_triggers = 3
    monkeypatch.setattr(daemon, "board", board)
    board.register("idle", source="kafka t")
    board.set_state("idle", "running")
    query, tally = _IdleQuery(), daemon._Tally("idle")
    query.report(0, 0, rows=10, waiting=0)
    tally.update(query)
    for second in (10, 20, 30):  # three idle triggers in a row while 5 messages wait
        query.report(second, 1, rows=0, waiting=5)
        tally.update(query)
    ok, body = board.health()
    assert not ok, body
    assert body["pipelines"][0]["reason"] == "3 trigger(s) in a row read nothing while 5 message(s) waited"


def test_a_stop_cut_short_is_an_error_record_with_json_logs():
    import subprocess
    import sys

    # Standard error relayed as the CLI relays it: a bare line would come out as a stray WARN.
    relayed = "from deltaflow.io import logs\nlogs.relay_stderr()\n"
    script = relayed + _SLOW_STOP.format(stop_s=30, timeout_s=1)
    env = {**os.environ, "DELTAFLOW_LOG_FORMAT": "json"}
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "running"
    process.send_signal(signal.SIGTERM)
    _, errors = process.communicate(timeout=60)
    assert process.returncode == 3, errors
    last = json.loads(errors.splitlines()[-1])
    assert (last["level"], last["logger"]) == ("ERROR", "deltaflow.service.daemon"), last
    assert last["msg"].startswith("stopping at once (the stop still running after 1 s)"), last


def test_spark_s_own_record_of_a_failure_is_off_while_watched_and_an_unknown_failure_is_logged_whole(
    spark, tmp_path, caplog
):
    from deltaflow.pipeline.interrupts import QUERY_FAILURE_LOGGERS

    log4j = spark.sparkContext._jvm.org.apache.logging.log4j

    def level() -> str:
        return str(log4j.LogManager.getLogger(QUERY_FAILURE_LOGGERS[0]).getLevel().toString())

    before, seen = level(), []

    def on_batch(df, batch_id):
        seen.append(level())
        raise ValueError("not a number")

    with caplog.at_level(logging.DEBUG, logger="deltaflow.service.daemon"), pytest.raises(QueryFailedError):
        run_until_stopped(_file_stream(spark, tmp_path, 3, on_batch), name="unknown")
    assert seen == ["OFF"] and level() == before != "OFF"  # as it was once the daemon is done
    spark.sparkContext.setLogLevel("ERROR")  # and no level of its own left behind
    try:
        assert level() == "ERROR"
    finally:
        spark.sparkContext.setLogLevel("WARN")
    for name in QUERY_FAILURE_LOGGERS:  # Spark's classes of that name (renamed in Spark 4)
        spark.sparkContext._jvm.java.lang.Class.forName(name)
    whole = [r for r in caplog.records if "as Spark reported it" in r.getMessage()]
    assert len(whole) == 1 and whole[0].levelno == logging.ERROR
    assert "ValueError: not a number" in whole[0].getMessage() and "on_batch" in whole[0].getMessage()

"""deltaflow's records: JSON, their context, the relay of standard error, and those of
processes without logging (Spark's Python workers)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest

from deltaflow.io import logs
from deltaflow.io.logs import JsonFormatter

SCRIPT = """
import logging, sys
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.WARNING, format="user: %(message)s")
from deltaflow.io import logs
logs.configure_worker()
logs.configure_worker()  # twice: still one handler
logging.getLogger("deltaflow.sources.kafka").info("planned")
logging.getLogger("deltaflow.sources.kafka").debug("detail")
logging.getLogger("other").warning("theirs")
"""


@pytest.mark.parametrize(
    ("level", "setup", "lines"),
    [
        ("INFO", "bare", ["INFO deltaflow.sources.kafka: planned", "theirs"]),
        (
            "DEBUG",
            "bare",
            ["INFO deltaflow.sources.kafka: planned", "DEBUG deltaflow.sources.kafka: detail", "theirs"],
        ),
        (None, "bare", ["theirs"]),  # not started by the CLI: nothing configured
        ("INFO", "configured", ["user: theirs"]),  # the process's own logging is left alone
    ],
)
def test_a_worker_logs_at_the_cli_level_only_when_the_cli_set_it(level, setup, lines):
    env = {k: v for k, v in os.environ.items() if k not in ("DELTAFLOW_LOG_LEVEL", "DELTAFLOW_LOG_FORMAT")}
    if level:
        env["DELTAFLOW_LOG_LEVEL"] = level
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, setup], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    got = [line.split(" ", 2)[-1] if line[:4].isdigit() else line for line in done.stderr.splitlines()]
    assert got == lines


def test_a_stop_interrupting_a_batch_function_is_not_logged_as_an_error():
    from deltaflow.io.logs import StopInterruptFilter

    def record(error: BaseException | None) -> logging.LogRecord:
        exc_info = (type(error), error, None) if error is not None else None
        return logging.LogRecord(
            "py4j.clientserver", logging.ERROR, __file__, 1, "proxy failed", None, exc_info
        )

    stop = StopInterruptFilter()
    assert not stop.filter(record(RuntimeError("... : java.lang.InterruptedException\n\tat java.base/...")))
    assert stop.filter(record(RuntimeError("java.io.IOException: disk full")))
    assert stop.filter(record(None))


def test_records_alike_pass_once_a_window_and_the_next_counts_the_ones_held_back():
    now = [100.0]
    repeats = logs.RepeatFilter(60.0, key=lambda m: m.split(" #")[0], clock=lambda: now[0])

    def passes(msg: str, *args: object) -> str | None:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, msg, args, None)
        return record.getMessage() if repeats.filter(record) else None

    assert passes("refused %s #%d", "b:1", 1) == "refused b:1 #1"
    for i in range(2, 42):  # the same failure, again and again, within the window
        now[0] += 1.0
        assert passes("refused %s #%d", "b:1", i) is None
    assert passes("refused %s #%d", "b:2", 0) == "refused b:2 #0"  # another failure: its own
    now[0] = 160.0  # the window of the first has passed
    assert passes("refused %s #%d", "b:1", 99) == "refused b:1 #99 (40 more like it in the last 60 s)"
    now[0] += 1.0
    assert passes("refused %s #%d", "b:1", 100) is None
    now[0] += 60.0
    assert passes("refused %s #%d", "b:1", 101) == "refused b:1 #101 (1 more like it in the last 61 s)"
    now[0] += 60.0
    assert passes("refused %s #%d", "b:1", 102) == "refused b:1 #102"  # none held back


def _record(msg="committed %s", args=("x",), level=logging.INFO, exc_info=None, **extra):
    record = logging.LogRecord("deltaflow.sinks.datasource", level, __file__, 1, msg, args, exc_info)
    record.__dict__.update(extra)
    return record


def _json(record):
    line = JsonFormatter().format(record)
    assert "\n" not in line  # one record, one line
    return json.loads(line)


def test_a_json_record_has_the_fields_spark_records_have():
    entry = _json(_record(level=logging.WARNING))
    assert entry.keys() == {"ts", "level", "logger", "msg"}
    assert entry["level"] == "WARN"  # log4j's name, as Spark's JVM records
    assert entry["logger"] == "deltaflow.sinks.datasource"
    assert entry["msg"] == "committed x"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["ts"])
    stamp = datetime.fromisoformat(entry["ts"].replace("Z", "+00:00"))
    assert abs(stamp - datetime.now(UTC)) < timedelta(minutes=1)  # UTC, not local time


def test_a_json_record_carries_the_traceback_of_its_exception():
    try:
        raise ValueError("bad value\nsecond line")
    except ValueError:
        entry = _json(_record("failed", (), logging.ERROR, exc_info=sys.exc_info()))
    assert entry["msg"] == "failed"
    assert entry["exc"].startswith("Traceback (most recent call last):")
    assert entry["exc"].endswith("ValueError: bad value\nsecond line")


def test_the_context_gives_records_pipeline_batch_and_table_and_extra_wins():
    with logs.context(pipeline="p1", batch=3):
        with logs.context(table="/lake/t"):
            inner = _json(_record())
            chosen = _json(_record(table="/lake/other", batch=None))
        outer = _json(_record())
    after = _json(_record())
    assert (inner["pipeline"], inner["batch"], inner["table"]) == ("p1", 3, "/lake/t")
    assert (chosen["batch"], chosen["table"]) == (3, "/lake/other")  # None keeps the context's
    assert "table" not in outer and outer["batch"] == 3
    assert not {"pipeline", "batch", "table"} & after.keys()


def test_the_context_is_the_calling_thread_s():
    seen = []
    with logs.context(pipeline="p1"):
        thread = threading.Thread(target=lambda: seen.append(_json(_record())))
        thread.start()
        thread.join()
    assert "pipeline" not in seen[0]


def test_a_json_record_leaves_other_extra_fields_out():
    entry = _json(_record(password="hunter2", options={"sasl.password": "hunter2"}))
    assert "hunter2" not in json.dumps(entry)


@pytest.mark.parametrize(
    ("line", "wrapped"),
    [
        pytest.param(b'{"ts":"t","level":"WARN","msg":"m","logger":"Utils"}\n', False, id="a-json-record"),
        pytest.param(b"WARNING: Using incubator modules: jdk.incubator.vector\n", True, id="text"),
        pytest.param(b"5\n", True, id="json-but-no-object"),
        pytest.param(b'{"msg": "cut sh\n', True, id="a-record-cut-short"),
        pytest.param(b"\xff\xfe not utf-8\r\n", True, id="bytes"),
    ],
)
def test_the_relay_passes_json_records_and_wraps_every_other_line(line, wrapped):
    out = logs.json_line(line)
    assert out.endswith(b"\n") and out.count(b"\n") == 1
    entry = json.loads(out)
    if wrapped:
        assert entry["logger"] == logs.STDERR_LOGGER and entry["level"] == "WARN"
        assert entry["msg"] == line.rstrip(b"\r\n").decode("utf-8", "replace")
    else:
        assert out == line


def test_the_relay_drops_empty_lines():
    assert logs.json_line(b"\n") == logs.json_line(b"  \r\n") == b""


RELAYED = """
import logging, os, signal, subprocess, sys, time
from deltaflow.io import logs
relay = logs.relay_stderr()
relay.send_signal(signal.SIGTERM)  # a stop signal to the whole group: the relay stays
logs.configure_json(logging.INFO)
logging.getLogger("deltaflow.x").info("a record")
print("a print", file=sys.stderr, flush=True)
os.write(2, b"a write to the descriptor\\n")
subprocess.run(["sh", "-c", "echo a child process >&2"], check=True)
"""


def test_relayed_standard_error_is_json_lines_of_every_writer():
    done = subprocess.run(
        [sys.executable, "-c", RELAYED], capture_output=True, text=True, timeout=60, check=True
    )
    entries = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(e["logger"], e["msg"]) for e in entries] == [
        ("deltaflow.x", "a record"),
        ("stderr", "a print"),
        ("stderr", "a write to the descriptor"),
        ("stderr", "a child process"),
    ]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_worker_logs_in_the_exported_format(log_format):
    env = {**os.environ, "DELTAFLOW_LOG_LEVEL": "INFO", "DELTAFLOW_LOG_FORMAT": log_format}
    command = [sys.executable, "-c", SCRIPT, "bare"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=True)
    lines = done.stderr.splitlines()
    if log_format == "text":
        assert [line.split(" ", 2)[-1] for line in lines] == [
            "INFO deltaflow.sources.kafka: planned",
            "theirs",
        ]
    else:
        entries = [json.loads(line) for line in lines]
        assert [(e["level"], e["logger"], e["msg"]) for e in entries] == [
            ("INFO", "deltaflow.sources.kafka", "planned"),
            ("WARN", "other", "theirs"),  # another library's warning: JSON too
        ]


def test_py4j_retried_sends_are_dropped_and_failed_ones_kept(caplog):
    from deltaflow.io.logs import Py4JRetryFilter

    root = logging.getLogger()
    retry = Py4JRetryFilter()
    root.addFilter(retry)
    try:
        with caplog.at_level(logging.INFO):
            try:
                raise ConnectionResetError("the JVM closed it")
            except ConnectionResetError:
                logging.info("Exception while sending command.", exc_info=True)  # retried: dropped
                logging.exception("Exception while sending command.")  # the retry failed: kept
            logging.info("something else")
    finally:
        root.removeFilter(retry)
    kept = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "root"]
    assert kept == [("ERROR", "Exception while sending command."), ("INFO", "something else")]

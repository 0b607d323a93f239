"""deltaflow's records from processes without logging (Spark's Python workers)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
    env = {k: v for k, v in os.environ.items() if k != "DELTAFLOW_LOG_LEVEL"}
    if level:
        env["DELTAFLOW_LOG_LEVEL"] = level
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, setup], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    got = [line.split(" ", 2)[-1] if line[:4].isdigit() else line for line in done.stderr.splitlines()]
    assert got == lines


def test_a_stop_interrupting_a_batch_function_is_not_logged_as_an_error():
    import logging

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

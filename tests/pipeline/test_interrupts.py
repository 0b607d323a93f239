"""``pipeline.interrupts``: a batch function interrupted by its query's stop."""

from __future__ import annotations

import json
import logging
import re

import pytest

from deltaflow.errors import BatchInterruptedError
from deltaflow.io.logs import JsonFormatter
from deltaflow.pipeline.interrupts import STOP_LOG_LEVELS, stoppable, stopping

#: Spark's own test of an interrupted Python batch function (StreamExecution.PROXY_ERROR).
SPARK_PATTERN = re.compile(
    r"py4j\.protocol\.Py4JJavaError: An error occurred while calling(.|\r\n|\r|\n)*"
    r"(java\.lang\.InterruptedException|java\.io\.InterruptedIOException|"
    r"java\.nio\.channels\.ClosedByInterruptException)"
)


def test_an_interrupted_batch_raises_a_short_error_spark_takes_for_a_stop():
    def batch(_frame, _batch_id):
        raise RuntimeError(
            "An error occurred while calling o81.collect.\n: java.lang.InterruptedException"
            + "\n\tat x" * 5000
        )

    with pytest.raises(BatchInterruptedError) as raised:
        stoppable(batch)(None, 7)
    text = str(raised.value)
    assert len(text) < 400 and "batch 7" in text
    assert SPARK_PATTERN.search(text)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_other_errors_of_a_batch_pass_unchanged():
    error = ValueError("a schema mismatch")

    def batch(_frame, _batch_id):
        raise error

    with pytest.raises(ValueError) as raised:
        stoppable(batch)(None, 1)
    assert raised.value is error
    calls = []
    stoppable(lambda frame, batch_id: calls.append((frame, batch_id)))("f", 2)
    assert calls == [("f", 2)]


def test_an_error_that_only_quotes_the_interrupt_is_rewritten_only_during_a_stop():
    quoted = RuntimeError("the source failed: upstream said java.lang.InterruptedException")

    def batch(_frame, _batch_id):
        raise quoted

    with pytest.raises(RuntimeError) as raised:  # a terminal error stays terminal
        stoppable(batch)(None, 3)
    assert raised.value is quoted
    stopping.set()  # the daemon received a stop signal
    try:
        with pytest.raises(BatchInterruptedError):
            stoppable(batch)(None, 3)
    finally:
        stopping.clear()


def test_the_records_of_a_batch_function_carry_its_pipeline_and_batch():
    seen = []

    def batch(_frame, _batch_id):
        record = logging.LogRecord("deltaflow.x", logging.INFO, __file__, 1, "m", None, None)
        seen.append(json.loads(JsonFormatter().format(record)))

    stoppable(batch, pipeline="p")(None, 4)
    assert (seen[0]["pipeline"], seen[0]["batch"]) == ("p", 4)


def _stop_levels(spark) -> dict[str, str]:
    """The effective level of each logger a stop quiets."""
    manager = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager
    return {name: str(manager.getLogger(name).getLevel()) for name in STOP_LOG_LEVELS}


def _configured(spark) -> set[str]:
    """The loggers a stop quiets that have a level of their own (a configuration)."""
    context = spark.sparkContext._jvm.org.apache.logging.log4j.core.LoggerContext.getContext(False)
    loggers = context.getConfiguration().getLoggers()
    return {name for name in STOP_LOG_LEVELS if loggers.containsKey(name)}


def test_the_log_levels_a_stop_quiets_are_restored_after_it(spark):
    from deltaflow.pipeline.interrupts import quiet_stop_logs, restore_stop_logs

    levels, configured = _stop_levels(spark), _configured(spark)
    quiet_stop_logs()
    quiet_stop_logs()  # a second query's stop keeps the levels from before the first
    assert _stop_levels(spark) == STOP_LOG_LEVELS
    restore_stop_logs()
    assert _stop_levels(spark) == levels
    # Those without a level of their own before have none after: setLogLevel reaches them.
    assert _configured(spark) == configured


def test_every_stop_of_a_process_quiets_and_restores_even_from_several_threads_at_once(spark):
    """A process runs several daemons (tests, an embedding program), and a daemon of several
    queries quiets from each query's watcher thread at once: each stop quiets, the first caller
    records the levels from before, and the restore leaves no level of their own behind."""
    import threading

    from deltaflow.pipeline.interrupts import quiet_stop_logs, restore_stop_logs

    before, configured = _stop_levels(spark), _configured(spark)
    for _ in range(2):
        start = threading.Barrier(4)

        def watcher(start: threading.Barrier) -> None:
            start.wait()
            quiet_stop_logs()

        threads = [threading.Thread(target=watcher, args=(start,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert _stop_levels(spark) == STOP_LOG_LEVELS
        restore_stop_logs()
        assert (_stop_levels(spark), _configured(spark)) == (before, configured)


def test_a_session_stops_with_the_executor_logger_quiet_then_put_back(spark):
    """stop_session: the local executor's logger at ERROR while the session stops (a heartbeat
    the stop cuts logs a WARN with a Java trace), as before once it has."""
    from deltaflow.pipeline.session import SESSION_STOP_LOG_LEVELS, stop_session

    manager = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager
    name = "org.apache.spark.executor.Executor"
    assert name in SESSION_STOP_LOG_LEVELS
    before = str(manager.getLogger(name).getLevel())
    seen = []

    class Session:  # the shared session must live on: its stop, as this process's JVM sees it
        def stop(self) -> None:
            seen.append(str(manager.getLogger(name).getLevel()))

    stop_session(Session())
    assert seen == ["ERROR"]
    assert str(manager.getLogger(name).getLevel()) == before


def test_the_levels_come_back_only_once_the_running_tasks_ended(spark):
    """The restore waits for the tasks a stop left running: restoring under a dying task let its
    failure's Java trace through (seen in CI, a files pipeline stopped mid-write)."""
    import threading
    import time

    from deltaflow.pipeline.interrupts import _running_tasks, quiet_stop_logs, restore_stop_logs

    def job() -> None:
        spark.sparkContext.parallelize(range(2), 2).foreach(lambda _: time.sleep(4))

    thread = threading.Thread(target=job)
    thread.start()
    sc = spark.sparkContext._jsc.sc()
    deadline = time.monotonic() + 60
    while not _running_tasks(sc):  # launched: the listener bus may not know it yet
        assert time.monotonic() < deadline
        time.sleep(0.05)  # condition poll on the scheduler
    quiet_stop_logs()
    restore_stop_logs()
    assert _running_tasks(sc) == 0
    thread.join()

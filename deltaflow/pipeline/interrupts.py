"""A ``foreachBatch`` function that a query's stop interrupts ends the way Spark expects.

``query.stop()`` interrupts the query's thread. A Python batch function then inside a call into
the JVM gets a ``Py4JJavaError`` holding ``java.lang.InterruptedException``, and Spark decides
whether the query failed or was stopped by matching the error text the function raised against
a pattern (``StreamExecution.PROXY_ERROR``: the Py4J error's words, then the exception name).
That pattern recurses once per character of the text: the text of an interrupted batch (a
Python traceback holding a Java trace, tens of kilobytes) overflows the query thread's stack,
and the stop ends with a ``StackOverflowError`` and a thousand-line trace instead of quietly.

:func:`stoppable` wraps a batch function: an interruption leaves it as a short
:class:`~deltaflow.errors.BatchInterruptedError` whose text still has both parts of the
pattern, so Spark sees a stopped query: when the Java exception of a Py4J call is the interrupt
itself, or when the daemon received a stop signal (:data:`stopping`). Every other error passes
unchanged (its text is logged at DEBUG when rewritten). Being the one wrapper of every batch
function, it also gives the records logged during a batch their pipeline and batch id
(:func:`deltaflow.io.logs.context`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from deltaflow.errors import BatchInterruptedError
from deltaflow.io import logs
from deltaflow.pipeline import jvm_logs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "INTERRUPTED",
    "QUERY_FAILURE_LOGGERS",
    "query_failures_unlogged",
    "quiet_stop_logs",
    "restore_stop_logs",
    "stoppable",
    "stopping",
]

logger = logging.getLogger(__name__)

#: The Java exception a stop's interrupt surfaces as in Python.
INTERRUPTED = "java.lang.InterruptedException"
#: A Py4J error whose Java exception is the interrupt itself (not a message that mentions it).
_INTERRUPTED_CALL = re.compile(
    r"An error occurred while calling [^\n]*\n: java\.lang\.InterruptedException\b"
)
#: Set by the daemon once a stop signal arrived: an interrupt then is the stop's.
stopping = threading.Event()
#: Spark's JVM loggers whose lines during a stop are the stop's own, and their level from then
#: on. A stop that interrupts a batch writing Parquet through Spark (a Spark-engine sink) makes
#: the file writer log "Aborting job" at ERROR with the interrupt's Java trace (the batch is
#: abandoned uncommitted, as any interrupted batch), the task's write callback (Spark's
#: ``Utils``) log "Aborting task" with the same trace, and the scheduler log each task the stop
#: killed at WARN. A stop that interrupts the driver while it stores a broadcast (a batch's plan)
#: makes ``TorrentBroadcast`` log "Store broadcast ... fail" at ERROR. A local executor whose
#: heartbeat the driver leaves unanswered for its timeout (10 s) logs a WARN with the RPC
#: timeout's Java trace: seen once in CI, 10 s into a stop, while the daemon stopped or in the
#: session's stop after it (``pipeline.session.stop_session``). Their real failures reach
#: deltaflow as the batch's error anyway.
STOP_LOG_LEVELS = {
    "org.apache.spark.sql.execution.datasources.FileFormatWriter": "OFF",
    "org.apache.spark.util.Utils": "OFF",
    "org.apache.spark.scheduler.TaskSetManager": "ERROR",
    "org.apache.spark.scheduler.DAGScheduler": "ERROR",
    "org.apache.spark.storage.BlockManager": "ERROR",
    "org.apache.spark.broadcast.TorrentBroadcast": "OFF",
    "org.apache.spark.executor.Executor": "ERROR",
}
#: How long :func:`restore_stop_logs` waits for the tasks the stop killed to end: a Spark stopped
#: while one still runs logs ``ERROR TaskSchedulerImpl: Exception in statusUpdate`` (its result
#: arrives after the scheduler's threads were shut down).
TASKS_END_S = 10.0
_TASKS_POLL_S = 0.05


#: Spark's JVM loggers of a query's failure: "Query ... terminated with error" at ERROR, with
#: the Java trace and the Python worker's traceback, for every failure. The daemon reports each
#: failure itself: one line when it restarts the query, the whole text when it stops for good
#: with a failure deltaflow does not know (``deltaflow.service.daemon``).
QUERY_FAILURE_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.runtime.AsyncProgressTrackingMicroBatchExecution",
)


#: How many callers are inside :func:`query_failures_unlogged` (threads of one process), and
#: what the first one replaced.
_unlogged: dict[str, Any] = {"depth": 0, "replaced": None}
_unlogged_lock = threading.Lock()


@contextmanager
def query_failures_unlogged() -> Iterator[None]:
    """While the daemon watches its queries: :data:`QUERY_FAILURE_LOGGERS` off in this
    process's JVM (none over Spark Connect, whose server logs on its own), then as they were
    once the last caller is done (:mod:`deltaflow.pipeline.jvm_logs`)."""
    with _unlogged_lock:
        if _unlogged["replaced"] is None:  # the first caller, or the first with a JVM
            _unlogged["replaced"] = jvm_logs.set_levels(dict.fromkeys(QUERY_FAILURE_LOGGERS, "OFF"))
        _unlogged["depth"] += 1
    try:
        yield
    finally:
        with _unlogged_lock:
            _unlogged["depth"] -= 1
            if _unlogged["depth"] == 0:
                jvm_logs.put_back(_unlogged["replaced"])
                _unlogged["replaced"] = None


#: What :func:`quiet_stop_logs` replaced, for :func:`restore_stop_logs`; the lock makes the
#: first of the stop's watcher threads (one per query) the one that records the levels before.
_stop_quieted: dict[str, jvm_logs.Levels | None] = {}
_stop_lock = threading.Lock()


def quiet_stop_logs() -> None:
    """Before the daemon stops its queries: :data:`STOP_LOG_LEVELS` in this process's JVM (none
    over Spark Connect, whose server logs on its own), until :func:`restore_stop_logs`."""
    with _stop_lock:
        if "replaced" not in _stop_quieted:  # the first of the stop's queries: what was before
            _stop_quieted["replaced"] = jvm_logs.set_levels(STOP_LOG_LEVELS)


def restore_stop_logs() -> None:
    """Once the daemon's queries have stopped, and the tasks the stop killed have ended: the
    loggers :func:`quiet_stop_logs` set, as they were (a process that runs on, a test or an
    embedding program, logs a later failure again)."""
    with _stop_lock:
        replaced = _stop_quieted.pop("replaced", None)
        if replaced is None:
            return
        _wait_for_tasks_to_end()
        jvm_logs.put_back(replaced)


def _wait_for_tasks_to_end() -> None:
    """Until no task runs on any executor (the ones a stop killed end within moments), at most
    :data:`TASKS_END_S`."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return
    deadline = time.monotonic() + TASKS_END_S
    while time.monotonic() < deadline:
        if not _running_tasks(context._jsc.sc()):
            return
        time.sleep(_TASKS_POLL_S)  # condition poll on the scheduler's view
    logger.debug("tasks still running %.0f s after the stop", TASKS_END_S)


def _running_tasks(sc: Any) -> int:
    """Tasks running now in the JVM SparkContext ``sc``: the scheduler's own count (its root
    pool's), which a task enters at launch and leaves once its end reached the scheduler. The
    status tracker's count comes from the listener bus and lags: a task launched moments before
    the stop is not in it yet (seen: 1 of 2 running tasks), and a stop that trusted it restored
    the loggers under a dying task."""
    from py4j.protocol import Py4JError

    try:
        return int(sc.taskScheduler().rootPool().runningTasks())
    except Py4JError:  # not a scheduler with a root pool: the tracker's view
        return sum(e.numRunningTasks() for e in sc.statusTracker().getExecutorInfos())


def stoppable(
    function: Callable[[DataFrame, int], None], *, pipeline: str | None = None
) -> Callable[[DataFrame, int], None]:
    """``function`` (a ``foreachBatch`` function) raising a short, recognisable error when the
    query's stop interrupts it; its records carry ``pipeline`` and the batch id."""

    def batch(frame: DataFrame, batch_id: int) -> None:
        try:
            with logs.context(pipeline=pipeline, batch=batch_id):
                function(frame, batch_id)
        except Exception as exc:
            if not _interrupted(exc):
                raise
            logger.debug("batch %d was interrupted: %s", batch_id, exc)
            # Spark's words first, the exception's name after (StreamExecution.PROXY_ERROR).
            raise BatchInterruptedError(
                f"py4j.protocol.Py4JJavaError: An error occurred while calling the JVM in batch "
                f"{batch_id}: {INTERRUPTED} (the query is stopping; the batch commits whole or "
                "runs again at the next start)"
            ) from None

    return batch


def _interrupted(error: BaseException) -> bool:
    """Whether ``error`` is a stop's interrupt: a Py4J call that ended with the interrupt
    itself, or any error naming it once the daemon received a stop signal. Any other error
    keeps its own class and text (a terminal error that merely quotes the name stays terminal)."""
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - a Py4J error whose JVM side cannot be reached any more
        return False
    return bool(_INTERRUPTED_CALL.search(text)) or (stopping.is_set() and INTERRUPTED in text)

"""Keep a streaming query running: restart it after transient failures, stop on SIGTERM/SIGINT.

:func:`run_until_stopped` is the loop behind ``deltaflow ingest``:

1. Start the query (``start_query()``).
2. Poll ``query.awaitTermination(POLL_S)`` in the main thread and count progress.
3. On SIGTERM or SIGINT stop the query and return. The handlers only record the signal: a
   py4j call made from inside a handler would break the call the main thread is in. A second
   signal, or a stop that takes longer than ``stop_timeout_s``, ends the process at once with
   :data:`EXIT_STOPPED_AT_ONCE` (the running batch committed whole or replays: nothing lost).
   The JVM and Spark's Python workers ignore those signals (a whole process group receives
   them from systemd or Ctrl-C): the driver alone stops them, in order
   (:mod:`deltaflow.pipeline.worker_daemon`).
4. When the query fails, :func:`classify_failure` decides. Transient (the broker is gone, a
   Kafka error, a Delta commit conflict that outlived its retries, any deltaflow
   :class:`~deltaflow.errors.TransientError`): log a warning, wait (1 s, doubling up to
   ``max_backoff_s``; back to 1 s once a restarted query has ingested something) and go to
   step 1. Terminal (anything else): raise it as a :class:`~deltaflow.errors.TerminalError`.
5. When the query ends on its own (``availableNow``), return.

A job (a query that ends on its own) may be given ``give_up_after_s``: when its restarts have
read nothing for that long (a broker that never comes up, a store that stays down, a failure
taken for transient that keeps coming back), it stops with
:class:`~deltaflow.errors.JobGaveUpError` (transient: exit code 1) and says why, instead of
restarting without end. A service (no bound) restarts for as long as it runs.

Restarting is safe: the query resumes from its Spark checkpoint, and the Kafka source never
reads an offset the Delta table already holds, so no message is lost or written twice.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from deltaflow import errors
from deltaflow.errors import (
    ConfigError,
    DeltaflowError,
    EngineUnavailableError,
    JobGaveUpError,
    QueryFailedError,
    TerminalError,
    TransientError,
    brief,
)
from deltaflow.io import logs
from deltaflow.metrics import metrics, progress_messages, progress_rates, progress_report, source_lags
from deltaflow.pipeline.interrupts import (
    query_failures_unlogged,
    quiet_stop_logs,
    restore_stop_logs,
    stopping,
)
from deltaflow.service.status import board

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from deltaflow.config.pipeline import PipelineSpec

__all__ = [
    "KAFKA_UNITS",
    "RunSummary",
    "SourceUnits",
    "classify_failure",
    "run_all",
    "run_pipelines",
    "run_until_stopped",
]

logger = logging.getLogger(__name__)

#: Seconds per awaitTermination() call: the longest a stop signal waits to be acted on.
POLL_S = 1
#: The first wait before a restart; it doubles after each failed restart.
INITIAL_BACKOFF_S = 1.0
#: How long a clean stop waits for a running auto-compaction to commit.
COMPACTION_STOP_TIMEOUT_S = 60.0
#: How long a clean stop may take before the process stops at once (``--stop-timeout``).
DEFAULT_STOP_TIMEOUT_S = 60.0
#: The exit code of a stop that did not wait for the running batch (a second signal, or the
#: stop timeout): nothing is lost (the batch's commit landed whole or the batch runs again).
EXIT_STOPPED_AT_ONCE = 3
#: A stop signal this soon after the first is the same stop, not a second one: a wrapper that
#: forwards signals (``uv run``, an entrypoint script's ``trap``) repeats a signal the whole
#: process group received.
REPEAT_GRACE_S = 2.0
#: Default cap of the wait between restarts: long enough not to hammer a broker that is down,
#: short enough that ingestion resumes soon after it returns.
DEFAULT_MAX_BACKOFF_S = 30.0
#: The backoff wait sleeps in slices this long, checking for a stop signal after each.
BACKOFF_SLICE_S = 0.2
#: Characters of a failure quoted in log lines and error messages.
REASON_CHARS = 500
#: Characters of a deltaflow error's own message read back from a failure's text (a worker's
#: error): written to be read whole, its remedy often comes last.
MESSAGE_CHARS = 4000

_TRACEBACK = "Traceback (most recent call last):"
#: The line of a Python traceback that names the exception: ``module.Class: message``.
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*: ")
#: A deltaflow error raised in a Python worker (or in a driver callback Spark called) reaches
#: the daemon as traceback text only: its qualified class name is what survives the JVM.
_DELTAFLOW_ERROR = re.compile(r"deltaflow\.errors\.(\w+): ")


@dataclass(frozen=True)
class RunSummary:
    """What :func:`run_until_stopped` did, summed over every incarnation of the query.

    Attributes:
        messages: What the source's stream delivered to the micro-batches that completed, in
            ``unit`` (Spark's input rows: messages, rows, changes, or the files a files source
            takes, whose rows are read inside the batch).
        batches: Micro-batches that completed with at least one input row.
        restarts: Times the query was started again after a transient failure.
        signal: The signal that stopped the loop, or ``None`` when the query ended on its own.
        unit: What ``messages`` counts, e.g. ``file(s)``.
        committed: Per table, what the sinks committed in this run, in ``committed_unit`` (as
            they reported it through :meth:`~deltaflow.metrics.Metrics.batch_committed`; a
            replayed batch found committed counts nothing). Empty when the commits ran in
            another process (a Spark Python worker).
        committed_unit: What ``committed`` counts: ``row(s)``, or ``change(s)`` of a CDC source.
    """

    messages: int
    batches: int
    restarts: int
    signal: int | None
    unit: str = "message(s)"
    committed: Mapping[str, int] = field(default_factory=dict)
    committed_unit: str = "row(s)"


def classify_failure(error: BaseException) -> DeltaflowError:
    """The deltaflow error a failed query stands for: a transient or a terminal one.

    Decided by type alone. ``error`` is a deltaflow error raised in this process, or Spark's
    ``StreamingQueryException`` whose text holds the traceback of a Python worker or callback:
    then the class is the one of :mod:`deltaflow.errors` the traceback names (every error
    deltaflow raises lives there; connectors turn their clients' exceptions into them where
    they are raised, e.g. Kafka's into :class:`~deltaflow.errors.KafkaUnavailableError`).

    Returns:
        That error (or a rebuilt instance of its class): a :class:`TransientError` restarts the
        query, a :class:`TerminalError` stops it. Anything else is a
        :class:`QueryFailedError` (terminal): deltaflow does not know it to be transient.
    """
    from confluent_kafka import KafkaException

    for exc in _python_chain(error):
        if isinstance(exc, (TransientError, TerminalError)):
            return exc
        if isinstance(exc, KafkaException):
            from deltaflow.sources.kafka import kafka_failure

            return kafka_failure(exc, brief(error) if exc is not error else "a Kafka request")
        if _server_restarted(exc):
            return EngineUnavailableError(
                "the Spark Connect server restarted: the job's session and its query were lost with "
                "the old server; run the job again (it resumes from its checkpoint)"
            )
        if _server_unavailable(exc):
            details = re.search(r'details = "([^"]*)"', str(exc))
            return EngineUnavailableError(
                "the Spark Connect server stopped answering (UNAVAILABLE"
                f"{': ' + details.group(1) if details else ''}): it was stopped or restarts; "
                "once it runs again (deltaflow engine status), run the job again: retrying later may work"
            )
    text = _failure_text(error)
    named = _DELTAFLOW_ERROR.findall(text)
    if named:
        # The last one named is the outermost (Python prints chained causes first).
        cls = getattr(errors, named[-1], None)
        if isinstance(cls, type) and issubclass(cls, (TransientError, TerminalError)):
            return _rebuilt(cls, _reason(text, f"deltaflow.errors.{named[-1]}: ", limit=MESSAGE_CHARS))
    return QueryFailedError(
        f"the streaming query failed and retrying cannot help: {_reason(text)}",
        error_type=type(error).__name__,
    )


def run_until_stopped(
    start_query: Callable[[], StreamingQuery],
    *,
    name: str,
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
    poll_s: int = POLL_S,
    on_progress: Callable[[int, int, float], None] | None = None,
    units: SourceUnits | None = None,
    give_up_after_s: float | None = None,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
) -> RunSummary:
    """Run the query ``start_query()`` starts until it ends, a signal stops it, or it fails for good.

    Call it from the main thread: it handles SIGTERM and SIGINT while it runs (elsewhere a
    signal cannot be caught and only the query's own end or failure stops the loop).

    Args:
        start_query: Starts the query; called again for every restart (it must resume from
            the same checkpoint).
        name: The query's name in log lines (the pipeline id).
        max_backoff_s: The longest wait between two restarts.
        poll_s: Seconds per ``awaitTermination`` call (and the longest a signal waits).
        on_progress: Called after each new progress report with the messages ingested so far,
            the messages behind the newest offsets, and the processing rate (rows/s).
        units: What the query's input rows are and what its sinks commit [default: messages,
            rows].
        give_up_after_s: For a job: stop after this long without progress through restarts
            (``None``: restart for as long as it runs).
        stop_timeout_s: After a stop signal, the longest the clean stop may take before the
            process ends at once (exit code :data:`EXIT_STOPPED_AT_ONCE`).

    Returns:
        Messages and batches ingested over all restarts, restarts, and the stopping signal.

    Raises:
        JobGaveUpError: ``give_up_after_s`` passed without progress (transient).
        TerminalError: the query failed in a way retrying cannot fix (a configuration error,
            a schema mismatch, a checkpoint mismatch, a failure deltaflow does not know).
    """
    if max_backoff_s < INITIAL_BACKOFF_S:
        raise ConfigError(
            f"max_backoff_s must be at least {INITIAL_BACKOFF_S} s, got {max_backoff_s}",
            max_backoff_s=max_backoff_s,
        )
    tally = _Tally(name, on_progress, units or KAFKA_UNITS)
    try:
        with (
            _stop_signals(stop_timeout_s) as received,
            logs.context(pipeline=name),
            query_failures_unlogged(),
        ):
            return _loop(start_query, received, tally, name, poll_s, max_backoff_s, give_up_after_s)
    except Exception as exc:
        board.set_state(name, "failed", error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        # A compaction in progress may finish (its commit never conflicts with the stream's).
        from deltaflow.ops.compaction import close_all

        close_all(COMPACTION_STOP_TIMEOUT_S)


#: Recorded instead of a signal number when another pipeline failed for good.
OTHER_FAILED = 0


def run_all(
    starters: Mapping[str, Callable[[], StreamingQuery]],
    *,
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
    poll_s: int = POLL_S,
    units: Mapping[str, SourceUnits] | None = None,
    give_up_after_s: float | None = None,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
) -> dict[str, RunSummary]:
    """Run several queries in one application, each as :func:`run_until_stopped` runs one.

    Each query is watched (and restarted after transient failures) by its own thread; the
    calling (main) thread handles SIGTERM/SIGINT, which stop them all. When one query fails for
    good, the others are stopped cleanly (their current batch committed whole or not at all)
    and its error is raised.

    ``units``: per query, what its input rows are and what its sinks commit [default: messages,
    rows]. ``give_up_after_s``: as for :func:`run_until_stopped`, per query; ``stop_timeout_s``:
    as for :func:`run_until_stopped`, for all.

    Returns:
        Each query's summary by name.

    Raises:
        TerminalError: the first query that failed for good.
    """
    results: dict[str, RunSummary] = {}
    errors: dict[str, BaseException] = {}
    try:
        with _stop_signals(stop_timeout_s) as received, query_failures_unlogged():

            def watch(name: str, start: Callable[[], StreamingQuery]) -> None:
                try:
                    tally = _Tally(name, units=(units or {}).get(name, KAFKA_UNITS))
                    with logs.context(pipeline=name):
                        results[name] = _loop(
                            start, received, tally, name, poll_s, max_backoff_s, give_up_after_s
                        )
                except BaseException as exc:  # noqa: BLE001 - re-raised by the main thread
                    board.set_state(name, "failed", error=f"{type(exc).__name__}: {exc}")
                    errors[name] = exc
                    received.append(OTHER_FAILED)

            threads = [
                threading.Thread(target=watch, args=(name, start), name=f"deltaflow-{name}", daemon=True)
                for name, start in starters.items()
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(BACKOFF_SLICE_S)  # short joins: signal handlers run in between
    finally:
        from deltaflow.ops.compaction import close_all

        close_all(COMPACTION_STOP_TIMEOUT_S)
    if errors:
        name = next(iter(errors))  # the first to fail (dicts keep insertion order)
        others = [n for n in starters if n != name]
        if others:
            logger.error("pipeline %r failed; stopped the others: %s", name, ", ".join(others))
        raise errors[name]
    return results


def _loop(
    start_query: Callable[[], StreamingQuery],
    received: list[int],
    tally: _Tally,
    name: str,
    poll_s: int,
    max_backoff_s: float,
    give_up_after_s: float | None = None,
) -> RunSummary:
    restarts = 0
    backoff = INITIAL_BACKOFF_S
    stalled_since: float | None = None  # the first failure since the query last read something
    while True:
        failure: TransientError | None
        board.set_state(name, "restarting" if restarts else "starting")
        try:
            query = start_query()
        except Exception as exc:  # noqa: BLE001 - classified: transient ones are retried
            failure = _transient_or_raise(exc, name)
        else:
            if restarts:
                logger.info("query %r restarted (restart %d)", name, restarts)
            board.set_state(name, "running")
            before = tally.messages
            try:
                failure = _watch(query, received, tally, poll_s, name)
            except Exception as exc:
                if not _connect_server_lost(exc):
                    raise
                failure = _transient_or_raise(exc, name)  # any call to a gone Connect server
            if failure is None:
                board.set_state(name, "stopped")
                return tally.summary(restarts, received[0] if received else None)
            if tally.messages > before:
                backoff = INITIAL_BACKOFF_S  # it recovered once: a new outage starts over
                stalled_since = None
        if isinstance(failure, EngineUnavailableError):
            # The query and this job's session lived on a Spark Connect server that stopped
            # answering: nothing here can restart them. The job ends (exit 1: a service manager
            # restarts it, with a session of its own once the server runs again), and its
            # exit's calls to the server fail at once instead of retrying.
            from deltaflow.pipeline.session import engine_gone

            engine_gone()
            logger.error("query %r stops: %s", name, failure)
            board.set_state(name, "failed", error=f"{type(failure).__name__}: {failure}")
            raise failure
        now = time.monotonic()
        # The bound counts from the first failure after the last progress: a long first batch
        # that fails once (e.g. to restart with evolved columns) is not a stall.
        stalled_since = now if stalled_since is None else stalled_since
        stalled = now - stalled_since
        # (A signal received meanwhile stops it cleanly instead, in the wait below.)
        if (
            give_up_after_s is not None
            and not received
            and stalled + min(backoff, max_backoff_s) > give_up_after_s
        ):
            gave_up = JobGaveUpError(
                f"{name!r} gave up after {stalled:.0f} s without progress and {restarts} "
                f"restart(s) (--give_up_after {give_up_after_s:g} s); the last failure: {failure}",
                pipeline_id=name,
                restarts=restarts,
            )
            logger.error("query %r stops: %s", name, gave_up)
            board.set_state(name, "failed", error=f"{type(gave_up).__name__}: {gave_up}")
            raise gave_up from failure
        board.set_state(name, "restarting", error=f"{type(failure).__name__}: {failure}")
        logger.warning(
            "query %r failed, restarting in %.0f s (transient: retrying may help): %s",
            name,
            backoff,
            failure,
        )
        if not _wait(backoff, received):
            logger.info("received signal %d while waiting to restart %r: stopping", received[0], name)
            board.set_state(name, "stopped")
            return tally.summary(restarts, received[0])
        restarts += 1
        backoff = min(backoff * 2, max_backoff_s)


def _watch(
    query: StreamingQuery, received: list[int], tally: _Tally, poll_s: int, name: str
) -> TransientError | None:
    """Poll ``query`` until it stops (``None``) or fails transiently (the error)."""
    from pyspark.errors import StreamingQueryException

    while True:
        if received:
            if received[0] == OTHER_FAILED:
                logger.info("another query failed: stopping query %r", name)
            else:
                logger.info("received signal %d: stopping query %r", received[0], name)
            board.set_state(name, "stopping")  # /readyz answers 503 from here on
            quiet_stop_logs()
            query.stop()  # the current batch is abandoned uncommitted or was committed whole
            tally.update(query)
            return None
        error: BaseException | None = None
        try:
            done = query.awaitTermination(poll_s)
        except StreamingQueryException as exc:
            done, error = True, exc
        tally.update(query)
        if done:
            error = error or query.exception()
            if error is None:
                logger.info("query %r ended", name)
                return None
            return _transient_or_raise(error, name)


def _transient_or_raise(error: BaseException, name: str) -> TransientError:
    failure = classify_failure(error)
    # (Spark's own record of the failure is off while the daemon watches: query_failures_unlogged.)
    if isinstance(failure, TransientError):
        if logger.isEnabledFor(logging.DEBUG):  # the whole text takes calls into the JVM
            logger.debug("query %r failed (transient), as Spark reported it:\n%s", name, _failure_text(error))
        return failure
    logger.error("query %r failed and will not be restarted: %s", name, failure)
    # A failure deltaflow does not know: all it says; a known one's message says what to do.
    level = logging.ERROR if isinstance(failure, QueryFailedError) else logging.DEBUG
    if logger.isEnabledFor(level):
        logger.log(level, "query %r failed, as Spark reported it:\n%s", name, _failure_text(error))
    board.set_state(name, "failed", error=f"{type(failure).__name__}: {failure}")
    raise failure from error


def _wait(seconds: float, received: list[int]) -> bool:
    """Sleep ``seconds`` unless a signal arrives (then ``False``), in short slices."""
    deadline = time.monotonic() + seconds
    while not received:
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(BACKOFF_SLICE_S, left))
    return False


@contextmanager
def _stop_signals(stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> Iterator[list[int]]:
    """Record SIGTERM/SIGINT in the yielded list (main thread only); restore the handlers after.

    A second signal (:data:`REPEAT_GRACE_S` or more after the first) ends the process at once,
    and so does a stop still running ``stop_timeout_s`` after the first (a watchdog thread; 0:
    no bound): exit code :data:`EXIT_STOPPED_AT_ONCE`.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        try:
            yield received
        finally:
            restore_stop_logs()
        return
    first: list[float] = []  # when the first stop signal came

    def _record(signum: int, _frame: FrameType | None) -> None:
        if first:
            if time.monotonic() - first[0] >= REPEAT_GRACE_S:
                _stop_at_once(f"a second {signal.Signals(signum).name}")
            return  # the same stop, forwarded again
        first.append(time.monotonic())
        stopping.set()  # a batch function the stop interrupts says so briefly (interrupts)
        received.append(signum)  # nothing else: see the module docstring, step 3

    done = threading.Event()

    def _watchdog() -> None:
        while not done.wait(BACKOFF_SLICE_S):
            if first:
                if not done.wait(stop_timeout_s):
                    _stop_at_once(f"the stop still running after {stop_timeout_s:g} s")
                return

    previous = {sig: signal.signal(sig, _record) for sig in (signal.SIGTERM, signal.SIGINT)}
    if stop_timeout_s > 0:  # 0: no bound (as Spark's stopTimeout)
        threading.Thread(target=_watchdog, name="deltaflow-stop-watchdog", daemon=True).start()
    try:
        yield received
    finally:
        done.set()
        stopping.clear()
        restore_stop_logs()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_at_once(why: str) -> None:
    """End the process now (from a signal handler or the watchdog: no logging locks, no py4j).
    The JVM and its Python workers end with it (their input closes)."""
    text = (
        f"stopping at once ({why}): the running batch is cut; its commit landed whole or the "
        f"batch runs again at the next start (exit code {EXIT_STOPPED_AT_ONCE})"
    )
    # With JSON logs a record of its own (the relay would wrap a bare line as a stray WARN).
    json_logs = logs.exported_format() == "json"
    os.write(2, logs.record_line("ERROR", __name__, text) if json_logs else f"deltaflow: {text}\n".encode())
    os._exit(EXIT_STOPPED_AT_ONCE)


@dataclass(frozen=True)
class SourceUnits:
    """What a query's input rows are (``file(s)`` of a files source), what its sinks commit
    (``row(s)``, ``change(s)``) and what its lag counts (``message(s)`` behind the newest
    offsets, ``byte(s) of WAL``; "": the source reports none), as log lines and summaries name
    them."""

    read: str
    committed: str = "row(s)"
    behind: str = "message(s)"


#: A Kafka query's units (``deltaflow ingest``).
KAFKA_UNITS = SourceUnits("message(s)")


class _Tally:
    """Counts completed micro-batches over every run of a query, each batch once, and what the
    sinks of the query's pipeline committed meanwhile."""

    def __init__(
        self,
        name: str,
        on_progress: Callable[[int, int, float], None] | None = None,
        units: SourceUnits = KAFKA_UNITS,
    ) -> None:
        self.name = name
        self.units = units
        #: What the process had committed for the pipeline before: the summary is of this run.
        self._committed_before = metrics.rows_committed(name)
        self._on_progress = on_progress
        self._reported = ""  # timestamp of the newest progress report given to the board
        self.messages = 0
        self.batches = 0
        self._counted: dict[str, int] = {}  # runId -> last batchId counted
        self._last_seen: tuple[Any, Any, Any] | None = None

    def update(self, query: StreamingQuery) -> None:
        newest = query.lastProgress
        last = progress_report(newest) if newest is not None else None
        # An idle query repeats its batch id in every report: the timestamp tells them apart (each
        # is a completed trigger for /healthz, and one that read nothing for --stall-triggers).
        if last is None:
            return
        seen = (last["runId"], last["batchId"], last["timestamp"])
        if seen == self._last_seen:
            return  # nothing new: skip fetching (and parsing) the whole recent history
        metrics.progress_reported(self.name, last, unit=self.units.read, behind=self.units.behind)
        self._last_seen = seen
        new_batches = new_messages = 0
        for progress in map(progress_report, query.recentProgress):
            stamp = str(progress.get("timestamp", ""))
            if stamp > self._reported:  # every report once, even those between two polls
                self._reported = stamp
                board.progress(self.name, progress)
                metrics.restarts_reported(self.name, progress)
            rows = progress_messages(progress)
            run, batch = str(progress["runId"]), int(progress["batchId"])
            # Idle triggers report the next batch id with no rows: count only batches with rows.
            if rows and batch > self._counted.get(run, -1):
                self._counted[run] = batch
                new_batches += 1
                new_messages += rows
        lag = sum(sum(source_lags(source).values()) for source in last.get("sources") or [])
        rate = progress_rates(last)[1]
        if new_batches:
            self.batches += new_batches
            self.messages += new_messages
            read, committed, behind = self.units.read, self.units.committed, self.units.behind
            # A time estimate only where the lag counts what the rate does (not WAL bytes).
            eta = f" (~{lag / rate:.0f} s at {rate:,.0f}/s)" if lag and rate and behind == read else ""
            # Over Spark Connect the commits are counted in the server's workers, not here.
            total = sum(self.committed().values())
            done = f", {total} {committed} committed" if metrics.counts_commits else ""
            logger.info(
                "query %r: %d %s in %d batch(es); %d %s in %d batch(es) in all%s%s",
                self.name,
                new_messages,
                read,
                new_batches,
                self.messages,
                read,
                self.batches,
                done,
                f"; {lag} {behind} behind the newest position{eta}" if behind else "",
            )
        if self._on_progress is not None:
            self._on_progress(self.messages, lag, rate)

    def committed(self) -> dict[str, int]:
        """Per table, what the pipeline's sinks committed since this tally began (a table a
        pipeline of the same id wrote earlier in the process, and this run did not, is left out)."""
        before = self._committed_before
        now = metrics.rows_committed(self.name)
        return {t: n - before.get(t, 0) for t, n in now.items() if n != before.get(t, 0)}

    def summary(self, restarts: int, signum: int | None) -> RunSummary:
        return RunSummary(
            self.messages,
            self.batches,
            restarts,
            signum,
            unit=self.units.read,
            committed=self.committed(),
            committed_unit=self.units.committed,
        )


def _connect_server_lost(error: BaseException) -> bool:
    """Whether ``error`` or one of its causes is the Spark Connect server gone or restarted
    (then :func:`classify_failure` makes it an :class:`EngineUnavailableError`)."""
    return any(_server_unavailable(e) or _server_restarted(e) for e in _python_chain(error))


def _server_unavailable(error: BaseException) -> bool:
    """Whether ``error`` is pyspark's Spark Connect client giving up on a server that does not
    answer (gRPC ``UNAVAILABLE``, after its own retries): not the query's fault."""
    status = getattr(error, "getGrpcStatusCode", None)
    return callable(status) and getattr(status(), "name", None) == "UNAVAILABLE"


#: pyspark's Spark Connect client meeting a server that restarted within the wait: the server
#: says the session changed, and the client, closed by it, says it has no session.
_SESSION_LOST = frozenset({"INVALID_HANDLE.SESSION_CHANGED", "NO_ACTIVE_SESSION"})


def _server_restarted(error: BaseException) -> bool:
    """Whether ``error`` is pyspark's Spark Connect client finding its server restarted: the
    session (and the query in it) lived in the old server."""
    condition = getattr(error, "getCondition", None)
    return callable(condition) and condition() in _SESSION_LOST


def _python_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and its Python causes, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _failure_text(error: BaseException) -> str:
    """Everything a failure says about itself: message, Python causes, JVM causes."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__module__}.{type(current).__qualname__}: {current}")
        cause = getattr(current, "_cause", None)  # pyspark's captured JVM exception
        for _ in range(20):  # a JVM cause chain, bounded
            if cause is None:
                break
            try:
                parts.append(str(cause.toString()))
                cause = cause.getCause()
            except Exception:  # noqa: BLE001 - the JVM may be gone; the text so far suffices
                break
        if _replaced_rpc_error(current):
            break
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def _replaced_rpc_error(error: BaseException) -> bool:
    """Whether ``error``'s context is the gRPC error pyspark's Spark Connect client replaced
    (``raise ... from None``) with ``error``, the server's exception. Its text only repeats the
    server's message, cut to the size of a gRPC status (about 4 KB): a reason read from it (after
    the last ``deltaflow.errors.X:`` of the text) would end mid-sentence."""
    context = error.__context__
    return (
        error.__cause__ is None
        and error.__suppress_context__
        and context is not None
        and type(context).__module__.split(".")[0] == "grpc"
    )


def _reason(text: str, after: str = "", *, limit: int = REASON_CHARS) -> str:
    """A short reason (at most ``limit`` characters): the message after ``after`` or the
    exception line of a Python traceback."""
    if after:
        text = text[text.rfind(after) + len(after) :]
    elif (tb := text.rfind(_TRACEBACK)) >= 0:
        # The worker's own exception, e.g. "cimpl.KafkaException: KafkaError{code=_TRANSPORT,...}".
        for line in text[tb:].splitlines()[1:]:
            if _EXCEPTION_LINE.match(line):
                text = line
                break
    lines: list[str] = []
    for line in text.strip().splitlines():
        if line.lstrip().startswith(("at ", "JVM stacktrace", "SQLSTATE", _TRACEBACK)) or (
            lines and not line.strip()
        ):
            break
        lines.append(line)
    reason = "\n".join(lines).strip()
    return reason if len(reason) <= limit else reason[:limit] + " …"


def _rebuilt(cls: type[DeltaflowError], message: str) -> DeltaflowError:
    """An instance of ``cls`` from its message alone (its own ``__init__`` may want more)."""
    err = cls.__new__(cls)
    DeltaflowError.__init__(err, message)
    return err


def run_pipelines(
    spark: SparkSession,
    pipelines: Sequence[PipelineSpec],
    *,
    available_now: bool = False,
    on_start: Callable[[str], None] | None = None,
    give_up_after_s: float | None = None,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
) -> Mapping[str, RunSummary]:
    """Run ``pipelines`` in this Spark application until stopped, or until all available input
    is committed (``available_now``). Transient failures restart a pipeline with backoff (with
    ``available_now``, for at most ``give_up_after_s`` without progress).

    Raises:
        TerminalError: a pipeline failed for good (the others were stopped cleanly first).
    """
    from deltaflow.pipeline.runner import describe_source, source_units, start_pipeline

    units = {spec.pipeline_id: SourceUnits(*source_units(spec)) for spec in pipelines}
    for spec in pipelines:
        board.register(
            spec.pipeline_id,
            table_uri=spec.sinks[0].table_uri,
            source=describe_source(spec),
            unit=units[spec.pipeline_id].read,
            committed_unit=units[spec.pipeline_id].committed,
        )

    def starter(spec: PipelineSpec) -> Callable[[], StreamingQuery]:
        def start() -> StreamingQuery:
            if on_start is not None:
                on_start(spec.pipeline_id)
            return start_pipeline(
                spark,
                spec,
                available_now=available_now,
                on_engine=lambda engine: board.set_engine(spec.pipeline_id, engine),
            )

        return start

    # Over Spark Connect the sinks commit in the server's Python workers, whose counts never
    # reach this process: the summary reads them from the tables' logs instead.
    before = _versions(pipelines) if is_remote(spark) else None
    summaries = run_all(
        {spec.pipeline_id: starter(spec) for spec in pipelines},
        units=units,
        give_up_after_s=give_up_after_s if available_now else None,
        stop_timeout_s=stop_timeout_s,
    )
    if before is None:
        return summaries
    specs = {spec.pipeline_id: spec for spec in pipelines}
    return {name: replace(s, committed=_logged(specs[name], before[name])) for name, s in summaries.items()}


def is_remote(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client's session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _versions(pipelines: Sequence[PipelineSpec]) -> dict[str, dict[str, int]]:
    """Each pipeline's tables (:func:`_tables`) and their versions now (-1: no table yet)."""
    from deltaflow.delta.log import load, side_by_side

    wanted = [(spec.pipeline_id, uri, so) for spec in pipelines for uri, so in _tables(spec).items()]

    def version(item: tuple[str, str, Mapping[str, str]]) -> int:
        table = load(item[1], item[2])
        return table.version() if table is not None else -1

    out: dict[str, dict[str, int]] = {spec.pipeline_id: {} for spec in pipelines}
    # Side by side: a pipeline of a table per topic has hundreds.
    for (pipeline, uri, _), found in zip(wanted, side_by_side(version, wanted, name="versions"), strict=True):
        out[pipeline][uri] = found
    return out


def _tables(spec: PipelineSpec) -> dict[str, Mapping[str, str]]:
    """The tables ``spec`` commits to as itself (its sinks and its dead-letter table, as a
    local run's summary counts them), with their storage options."""
    from deltaflow.config.locations import normalize_uri
    from deltaflow.config.table_template import has_placeholders

    sinks = [*spec.sinks, *([spec.dead_letter] if spec.dead_letter is not None else [])]
    out = {normalize_uri(s.table_uri): s.storage_options for s in sinks if not has_placeholders(s.table_uri)}
    templated = [s for s in sinks if has_placeholders(s.table_uri)]
    if templated:  # a table per topic: those of the topics that match now
        from deltaflow.pipeline.ingest import topic_tables

        try:
            uris = topic_tables(spec.ingest_config())
        except Exception:  # only the summary: the run itself says why
            logger.debug("could not list the tables of %s", spec.pipeline_id, exc_info=True)
            uris = []
        out.update({uri: templated[0].storage_options for uri in uris})
    return out


def _logged(spec: PipelineSpec, before: Mapping[str, int]) -> dict[str, int]:
    from deltaflow.delta.log import rows_committed_since

    storage = _tables(spec)  # again: tables of topics that matched meanwhile count from -1
    counts = {
        uri: rows_committed_since(uri, options, spec.pipeline_id, before.get(uri, -1))
        for uri, options in storage.items()
    }
    return {uri: rows for uri, rows in counts.items() if rows}

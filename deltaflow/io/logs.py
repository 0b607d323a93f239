"""deltaflow's log records: text or JSON, their context, and those of Spark's Python workers.

A Spark Python data source plans its batches in a Python worker the JVM starts, not in the
process that started the query: that worker has no logging configured, so the sources' records
(why a batch started, where a source starts) would be dropped. The CLI exports its level in the
environment, which the JVM and its Python workers inherit; a source calls
:func:`configure_worker` when Spark builds it, and the worker then writes deltaflow's records to
its standard error (the CLI's, in local mode) in the CLI's format. A library user's own logging
is never touched: without the variable, or when the process already has handlers, nothing is
configured.

With ``--log-format json`` (:data:`FORMAT_ENV`, exported like the level) every record is one
JSON object per line (:class:`JsonFormatter`): ``ts``, ``level``, ``logger``, ``msg``, ``exc``
when there is an exception, and ``pipeline``, ``batch``, ``table`` where the code knows them
(:func:`context`, or ``extra=``). The CLI also passes its standard error, which Spark's JVM and
its Python workers inherit, through a :func:`relay` that writes JSON lines as they are and
wraps any other line (the JVM's own warnings, a native library's output) into a record.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import BinaryIO, Literal

__all__ = [
    "CONTEXT_FIELDS",
    "FORMAT",
    "FORMATS",
    "FORMAT_ENV",
    "LEVEL_ENV",
    "STDERR_LOGGER",
    "JsonFormatter",
    "LogFormat",
    "Py4JRetryFilter",
    "RepeatFilter",
    "StopInterruptFilter",
    "configure_json",
    "configure_worker",
    "context",
    "export_format",
    "export_level",
    "exported_format",
    "json_line",
    "record_line",
    "relay",
    "relay_stderr",
]

#: The level the CLI gives Spark's Python workers (``INFO``, ``DEBUG``, ...).
LEVEL_ENV = "DELTAFLOW_LOG_LEVEL"
#: The CLI's record format.
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: ``--log-format``: ``text`` (:data:`FORMAT`) or ``json`` (:class:`JsonFormatter`).
LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
#: The format the CLI gives Spark's JVM and its Python workers (and reads as ``--log-format``).
FORMAT_ENV = "DELTAFLOW_LOG_FORMAT"
#: What a JSON record may carry besides its message, where the code knows it.
CONTEXT_FIELDS = ("pipeline", "batch", "table")
#: The logger of a line on standard error that is not a JSON record (the JVM's own warnings, a
#: native library's output, a Python traceback printed outside logging).
STDERR_LOGGER = "stderr"

#: Python's level names that log4j spells otherwise: one vocabulary with Spark's JVM records.
_LEVELS = {"WARNING": "WARN", "CRITICAL": "FATAL"}
_context: ContextVar[Mapping[str, object]] = ContextVar("deltaflow_log_context", default=MappingProxyType({}))


def export_level(level: int) -> None:
    """Give processes started from now on (Spark's JVM, its Python workers) this level."""
    os.environ[LEVEL_ENV] = logging.getLevelName(level)


def export_format(log_format: LogFormat) -> None:
    """Give processes started from now on (Spark's JVM, its Python workers) this format."""
    os.environ[FORMAT_ENV] = log_format


def exported_format() -> LogFormat:
    """The format the CLI exported (``text`` when none was)."""
    return "json" if os.environ.get(FORMAT_ENV, "").strip().lower() == "json" else "text"


@contextlib.contextmanager
def context(
    *, pipeline: str | None = None, batch: int | None = None, table: str | None = None
) -> Iterator[None]:
    """Records logged inside (by this thread or task, not by threads it starts) carry these
    fields in JSON; a field given as None keeps the value of the enclosing context."""
    given = {"pipeline": pipeline, "batch": batch, "table": table}
    token = _context.set({**_context.get(), **{k: v for k, v in given.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``ts`` (ISO 8601, UTC, milliseconds), ``level``
    (log4j's names, as Spark's JVM records: ``WARN``, not ``WARNING``), ``logger``, ``msg``
    (the text a text record shows), then ``pipeline``, ``batch`` and ``table`` from
    ``extra=`` or the :func:`context`, ``exc`` (the traceback) and ``stack`` when present.

    Only these fields: any other ``extra=`` stays out, so nothing reaches the output that the
    text format would not show (secrets are masked in the message, as there).
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": _timestamp(record.created),
            "level": _LEVELS.get(record.levelname, record.levelname),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        known = _context.get()
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            value = known.get(name) if value is None else value
            if value is not None:
                entry[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


def _timestamp(seconds: float) -> str:
    """``2026-01-31T12:00:00.123Z``: the format of Spark's JSON records (UTC, milliseconds)."""
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))}.{int(seconds % 1 * 1000):03d}Z"


def configure_json(level: int) -> None:
    """Every logger's records to standard error as JSON at ``level`` (the CLI's logging with
    ``--log-format json``; nothing when the process has handlers already, as
    :func:`logging.basicConfig`). Python's warnings and the uncaught exceptions of threads
    become records too, instead of text."""
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level, handlers=[handler])
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:  # as threading's own hook: a thread may end so
        return
    name = args.thread.name if args.thread is not None else "?"
    error = args.exc_value
    exc_info = (args.exc_type, error, args.exc_traceback) if error is not None else None
    logging.getLogger("threading").error("uncaught exception in thread %s", name, exc_info=exc_info)


def configure_worker() -> None:
    """In a process without logging handlers, and with :data:`LEVEL_ENV` set: deltaflow's
    records to standard error at that level (once per process), in the exported format; with
    JSON, other loggers' warnings too (as JSON, not as Python's bare last-resort lines)."""
    level = os.environ.get(LEVEL_ENV)
    log = logging.getLogger("deltaflow")
    root = logging.getLogger()
    if not level or log.handlers or root.handlers:
        return
    handler = logging.StreamHandler()
    if exported_format() == "json":
        handler.setFormatter(JsonFormatter())
        root.addHandler(handler)  # the root keeps its level: others' records from WARNING
        logging.captureWarnings(True)
    else:
        handler.setFormatter(logging.Formatter(FORMAT))
        log.addHandler(handler)
    try:
        log.setLevel(level)
    except ValueError:  # not a level name: the CLI's default
        log.setLevel(logging.INFO)


def json_line(line: bytes) -> bytes:
    """One line of standard error as one line of JSON: a JSON object as it is, anything else as
    the ``msg`` of a :data:`STDERR_LOGGER` record at ``WARN`` (its writer bypassed logging:
    worth a look, rarely an error); an empty line as nothing."""
    text = line.rstrip(b"\r\n")
    if not text.strip():
        return b""
    try:
        if isinstance(json.loads(text), dict):
            return text + b"\n"
    except ValueError:  # not JSON (UnicodeDecodeError included)
        pass
    return record_line("WARN", STDERR_LOGGER, text.decode("utf-8", "replace"))


def record_line(level: str, logger: str, msg: str) -> bytes:
    """One JSON record, built without :mod:`logging` (its locks): for a signal handler, or a
    process about to end at once, that writes straight to the file descriptor."""
    entry = {"ts": _timestamp(time.time()), "level": level, "logger": logger, "msg": msg}
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def relay(source: BinaryIO | None = None, target: BinaryIO | None = None) -> None:
    """Copy ``source``'s lines (standard input) to ``target`` (standard error) as
    :func:`json_line` makes them, until the end of input: the last writer closed it."""
    source = source or sys.stdin.buffer
    target = target or sys.stderr.buffer
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):  # the reader went away
        for line in source:
            out = json_line(line)
            if out:
                target.write(out)
                target.flush()


def relay_stderr() -> subprocess.Popen[bytes] | None:
    """From now on, this process's standard error (file descriptor 2, inherited by Spark's JVM
    and through it by its Python workers) goes through a :func:`relay` process to the standard
    error it had: deltaflow's JSON records pass as they are, every other line is wrapped (the
    JVM's start-up warnings, Spark's prints before and beside log4j, a native library's lines).

    The relay ignores SIGTERM and SIGINT, as the JVM does (a stop signal to the whole process
    group must not cut the output of the clean stop short); it ends when every process holding
    the pipe has closed it. Returns the relay; if it cannot start, None: standard error stays as
    it is (logged).
    """
    read, write = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", "from deltaflow.io.logs import relay; relay()"],
            stdin=read,
            stdout=subprocess.DEVNULL,
            # Before exec, so that no signal can end it while it starts (the CLI calls this
            # before it starts any thread: preexec_fn is unsafe beside threads).
            preexec_fn=_ignore_stop_signals,
        )
    except OSError as exc:
        os.close(read)
        os.close(write)
        logging.getLogger(__name__).warning("standard error is not relayed as JSON: %s", exc)
        return None
    sys.stderr.flush()
    original = os.dup(2)
    os.dup2(write, 2)
    os.close(write)
    os.close(read)
    _relays.append(process)  # kept: a Popen dropped while its process runs warns
    atexit.register(_drain_relay, process, original)
    return process


#: At exit, how long the CLI waits for its relay to write the last lines (the JVM and Spark's
#: workers, which hold the pipe too, have ended by then; one that has not is not waited for).
RELAY_DRAIN_S = 5.0


def _drain_relay(process: subprocess.Popen[bytes], original: int) -> None:
    """At exit: give standard error back its own file (closing this process's end of the pipe)
    and wait, bounded, for the relay to write what it holds, so that the process's last
    lines come before its exit (a shell's next prompt, a service manager's exit record)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        os.dup2(original, 2)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(RELAY_DRAIN_S)


#: The relays this process started (one, from the CLI).
_relays: list[subprocess.Popen[bytes]] = []


def _ignore_stop_signals() -> None:
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, signal.SIG_IGN)


class Py4JRetryFilter(logging.Filter):
    """Drops py4j's INFO record of a call it sends again: py4j logs "Exception while sending
    command." with the first attempt's traceback on the root logger when a connection the JVM
    closed (a stop closes its callback connections) fails, then retries on a new one. The
    retry's outcome is what counts: a retry that fails too is logged at ERROR, and kept.
    Installed on the root logger by the CLI."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.name == "root"
            and record.levelno == logging.INFO
            and record.msg == "Exception while sending command."
        )


class RepeatFilter(logging.Filter):
    """Lets through the first of records alike, then at most one per ``window_s`` seconds, which
    says how many it held back.

    For a native library that logs the same failure many times a second (librdkafka retries a
    broker that refuses connections every ~50 ms, and logs every attempt): an outage should
    read as one line, then one every minute that says it goes on. Records are alike when
    ``key(message)`` is equal (default: the message). Keeps at most :attr:`MAX_KEYS` keys.
    """

    MAX_KEYS = 1_000

    def __init__(
        self,
        window_s: float,
        key: Callable[[str], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._window_s = window_s
        self._key = key or (lambda message: message)
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}  # key -> (when last let through, held since)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        key = self._key(message)
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self._window_s:
                self._seen[key] = (last[0], last[1] + 1)
                return False
            if len(self._seen) >= self.MAX_KEYS:
                self._seen.clear()
            self._seen[key] = (now, 0)
        if last is not None and last[1]:
            record.msg = f"{message} ({last[1]} more like it in the last {now - last[0]:.0f} s)"
            record.args = ()
        return True


class StopInterruptFilter(logging.Filter):
    """Drops py4j's record of a ``foreachBatch`` call that a query's stop interrupted.

    ``query.stop()`` interrupts the query's thread; a Python batch function then inside a call
    into the JVM gets ``java.lang.InterruptedException``, and py4j logs that at ERROR with a
    thousand-line Java trace although the stop is clean (the batch commits whole or not at
    all). The error itself still reaches the JVM, which ends the query as stopped; only the
    record goes. Installed on the ``py4j.clientserver`` logger by the CLI.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or "java.lang.InterruptedException" not in str(error)

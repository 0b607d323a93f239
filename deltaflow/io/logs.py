"""deltaflow's log records from Spark's Python workers.

A Spark Python data source plans its batches in a Python worker the JVM starts, not in the
process that started the query: that worker has no logging configured, so the sources' records
(why a batch started, where a source starts) would be dropped. The CLI exports its level in the
environment, which the JVM and its Python workers inherit; a source calls
:func:`configure_worker` when Spark builds it, and the worker then writes deltaflow's records to
its standard error (the CLI's, in local mode) in the CLI's format. A library user's own logging
is never touched: without the variable, or when the process already has handlers, nothing is
configured.
"""

from __future__ import annotations

import logging
import os

__all__ = ["FORMAT", "LEVEL_ENV", "StopInterruptFilter", "configure_worker", "export_level"]

#: The level the CLI gives Spark's Python workers (``INFO``, ``DEBUG``, ...).
LEVEL_ENV = "DELTAFLOW_LOG_LEVEL"
#: The CLI's record format.
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def export_level(level: int) -> None:
    """Give processes started from now on (Spark's JVM, its Python workers) this level."""
    os.environ[LEVEL_ENV] = logging.getLevelName(level)


def configure_worker() -> None:
    """In a process without logging handlers, and with :data:`LEVEL_ENV` set: deltaflow's
    records to standard error at that level (once per process)."""
    level = os.environ.get(LEVEL_ENV)
    log = logging.getLogger("deltaflow")
    if not level or log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    log.addHandler(handler)
    try:
        log.setLevel(level)
    except ValueError:  # not a level name: the CLI's default
        log.setLevel(logging.INFO)


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

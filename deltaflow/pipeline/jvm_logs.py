"""Spark's JVM loggers at another level for a while, then as they were.

Stops and failures make Spark's JVM log lines that are deltaflow's to report (the stop's
interrupts, a query's failure, a local executor's heartbeat cut by the session's stop). The
daemon and the session set those loggers for the while it takes, then put each back as it was:
a level of its own restored, or none at all (it follows its parents again, and a later
``setLogLevel`` reaches it). Restoring the *effective* level instead would give the logger a
level of its own and cut it off from ``setLogLevel`` for the rest of the process.

Only a JVM in this process is touched: over Spark Connect there is none (the server logs on its
own), and every function here does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["Levels", "levels_for_a_while", "put_back", "set_levels"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Levels:
    """What :func:`set_levels` replaced: each logger's own level before, ``None`` where it had
    none (it took its parent's)."""

    log4j: Any  # the JVM's org.apache.logging.log4j package, through Py4J
    before: Mapping[str, Any]


def set_levels(levels: Mapping[str, str]) -> Levels | None:
    """Set each logger of ``levels`` (name -> log4j level name: ``OFF``, ``ERROR``...) in this
    process's JVM; what to :func:`put_back` (``None``: no JVM here, nothing set). Best effort, as
    a log level is: a JVM that fails the calls (gone with the process's end) is passed over, and
    what was set before the failure is in the result, so the stop or failure around it goes on."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if jvm is None or not levels:
        return None
    log4j = jvm.org.apache.logging.log4j
    before: dict[str, Any] = {}
    try:
        own = log4j.core.LoggerContext.getContext(False).getConfiguration().getLoggers()
        for name, level in levels.items():
            before[name] = own.get(name).getLevel() if own.containsKey(name) else None
            log4j.core.config.Configurator.setLevel(name, getattr(log4j.Level, level))
    except Exception:  # Py4J's errors, or the gateway closed with the process's end
        logger.debug("Spark's log levels not set: %s", list(levels), exc_info=True)
    return Levels(log4j, before)


def put_back(replaced: Levels | None) -> None:
    """The loggers :func:`set_levels` set, as they were: a level of their own restored, or their
    configuration removed. A JVM already gone (the process's end) is passed over."""
    if replaced is None:
        return
    log4j = replaced.log4j
    try:
        context = log4j.core.LoggerContext.getContext(False)
        for name, level in replaced.before.items():
            if level is not None:
                log4j.core.config.Configurator.setLevel(name, level)
            else:
                context.getConfiguration().removeLogger(name)
        context.updateLoggers()
    except Exception:  # Py4J's errors, or the gateway closed with the process's end
        logger.debug("Spark's log levels not put back: %s", list(replaced.before), exc_info=True)


@contextmanager
def levels_for_a_while(levels: Mapping[str, str]) -> Iterator[None]:
    """:func:`set_levels` for the ``with`` block, then :func:`put_back`."""
    replaced = set_levels(levels)
    try:
        yield
    finally:
        put_back(replaced)

"""Crash and lost-response injection for the exactly-once tests.

When the environment variable ``DELTAFLOW_TEST_CRASH_AT`` is ``"<point>:<batch_id>"`` (or
``"<point>:<batch_id>:<text>"``: only in the sink whose table URI ends with ``text``, for sinks
that commit side by side) and the sink reaches ``point`` for that batch, the whole pipeline is
killed with SIGKILL: the process
group named by ``DELTAFLOW_TEST_KILL_PGID`` (the driver and its JVM) and the group of the
current Python worker. Nothing runs when the variables are unset, which is always the case
outside the test suite.

Points, in the order a micro-batch reaches them:

* ``write``: an executor task has written its files (before returning its commit message).
* ``before_commit``: the driver holds every file of the batch, nothing is in the Delta log.
* ``after_commit``: the Delta commit landed; Spark has not recorded the batch as done.
* ``between_tables``: ingest of many topics, whose tables of a batch commit side by side: the
  table named (``between_tables:<batch_id>:<text>``) committed first and alone, the others not.

:func:`lose_commit_responses` makes commits of this process land and then raise as if their
response had been lost (a reset after the store acted): for tables on local disk, where no HTTP
proxy can sit between deltaflow and the store (:class:`deltaflow.testing.FaultyHttpProxy` does
the same for object stores).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "CRASH_POINTS",
    "LostResponses",
    "crash_target",
    "lose_commit_responses",
    "maybe_crash",
    "maybe_lose_response",
]

CRASH_POINTS = ("write", "before_commit", "after_commit", "between_tables")

_ENV_AT = "DELTAFLOW_TEST_CRASH_AT"
_ENV_PGID = "DELTAFLOW_TEST_KILL_PGID"


def crash_target(point: str, batch_id: int | None) -> str | None:
    """The table text of a crash the test asked for at ``point`` of ``batch_id`` (``""``: any
    table), or ``None`` when it asked for none there."""
    wanted = os.environ.get(_ENV_AT)
    if not wanted or batch_id is None:
        return None
    want_point, _, rest = wanted.partition(":")
    want_batch, _, want_table = rest.partition(":")
    return want_table if want_point == point and want_batch == str(batch_id) else None


def maybe_crash(point: str, batch_id: int | None, table_uri: str = "") -> None:
    """Kill the pipeline if the test asked for a crash at ``point`` of ``batch_id`` (in the sink
    of ``table_uri``, when the request names a table)."""
    wanted = os.environ.get(_ENV_AT)
    if not wanted or batch_id is None:
        return
    want_point, _, rest = wanted.partition(":")
    want_batch, _, want_table = rest.partition(":")
    if want_point != point or want_batch != str(batch_id):
        return
    if want_table and not table_uri.rstrip("/").endswith(want_table):
        return
    pgid = os.environ.get(_ENV_PGID)
    if pgid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pgid), signal.SIGKILL)
    os.killpg(os.getpgrp(), signal.SIGKILL)


@dataclass
class LostResponses:
    """A :func:`lose_commit_responses` rule: commits whose description matches ``pattern``."""

    pattern: re.Pattern[str]
    left: int
    #: The descriptions of the commits whose response was lost.
    lost: list[str]


_rules: list[LostResponses] = []
_lock = threading.Lock()


@contextlib.contextmanager
def lose_commit_responses(pattern: str = "", times: int = 1) -> Iterator[LostResponses]:
    """Within the block, the next ``times`` commits (``-1``: all) whose description (``what``, e.g.
    ``"batch 3 of 'orders'"``) matches ``pattern`` land, then raise a connection reset."""
    rule = LostResponses(re.compile(pattern), times, [])
    with _lock:
        _rules.append(rule)
    try:
        yield rule
    finally:
        with _lock:
            _rules.remove(rule)


def maybe_lose_response(what: str) -> None:
    """Called right after a commit landed: raise as if its response was lost, if a rule says so."""
    if not _rules:
        return
    with _lock:
        for rule in _rules:
            if rule.left != 0 and rule.pattern.search(what):
                rule.left -= 1 if rule.left > 0 else 0
                rule.lost.append(what)
                break
        else:
            return
    raise ConnectionResetError(104, f"Connection reset by peer (injected after {what} landed)")

"""Crash injection for the exactly-once tests.

When the environment variable ``DELTAFLOW_TEST_CRASH_AT`` is ``"<point>:<batch_id>"`` and the
sink reaches ``point`` for that batch, the whole pipeline is killed with SIGKILL: the process
group named by ``DELTAFLOW_TEST_KILL_PGID`` (the driver and its JVM) and the group of the
current Python worker. Nothing runs when the variables are unset, which is always the case
outside the test suite.

Points, in the order a micro-batch reaches them:

* ``write``: an executor task has written its files (before returning its commit message).
* ``before_commit``: the driver holds every file of the batch, nothing is in the Delta log.
* ``after_commit``: the Delta commit landed; Spark has not recorded the batch as done.
"""

from __future__ import annotations

import contextlib
import os
import signal

__all__ = ["CRASH_POINTS", "maybe_crash"]

CRASH_POINTS = ("write", "before_commit", "after_commit")

_ENV_AT = "DELTAFLOW_TEST_CRASH_AT"
_ENV_PGID = "DELTAFLOW_TEST_KILL_PGID"


def maybe_crash(point: str, batch_id: int | None) -> None:
    """Kill the pipeline if the test asked for a crash at ``point`` of ``batch_id``."""
    wanted = os.environ.get(_ENV_AT)
    if not wanted or batch_id is None:
        return
    want_point, _, want_batch = wanted.partition(":")
    if want_point != point or want_batch != str(batch_id):
        return
    pgid = os.environ.get(_ENV_PGID)
    if pgid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pgid), signal.SIGKILL)
    os.killpg(os.getpgrp(), signal.SIGKILL)

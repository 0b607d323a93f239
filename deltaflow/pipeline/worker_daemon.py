"""Spark's Python worker daemon, unmoved by a stop signal sent to the whole process group.

systemd (``KillMode=control-group``, its default), a container init that forwards signals to
the group (tini ``-g``, dumb-init) and Ctrl-C signal every process of a service at once: the
driver, its JVM and the Python processes Spark starts. pyspark's daemon (``pyspark.daemon``)
exits on SIGTERM and takes its task workers with it, and each task worker restores the default
SIGTERM and SIGINT actions: a task dies mid-batch and the query fails before the driver could
stop it, so the stop ends "failed" with a Java trace although no data was harmed.

The driver starts its JVM with SIGTERM and SIGINT ignored (:func:`deltaflow.pipeline.session.
spark_session`, local masters), so the JVM and the processes it starts inherit that; this
module runs ``pyspark.daemon`` unchanged except that its calls to set a SIGTERM or SIGINT
handler leave those signals ignored. It is ``spark.python.daemon.module`` (tasks' workers), and
the workers' interpreter wrapper (``session.worker_python``) starts it wherever Spark asks for
``-m pyspark.daemon`` (the data sources' daemons: planning, commits). The driver alone reacts
to the signal: it stops its queries (the running batch commits whole or not at all) and Spark.
A daemon ends as pyspark's does when Spark closes its standard input; its workers end when
their sockets close. A SIGKILL still ends everything.

Known limit: the workers Spark starts without a daemon (a streaming source's planner) ignore
SIGTERM too, so a query's stop no longer kills one that is blocked in a call: it ends when the
call returns (the Kafka source's calls time out), or with the JVM.
"""

from __future__ import annotations

import signal
from types import ModuleType
from typing import Any

__all__ = ["main"]

#: The signals a process-group stop sends that the driver alone answers.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


class _KeepStopSignalsIgnored(ModuleType):
    """The ``signal`` module as ``pyspark.daemon`` sees it: setting a handler of a stop signal
    keeps the signal's current disposition (ignored, inherited from the JVM) instead."""

    def __init__(self) -> None:
        super().__init__("signal")
        # Everything of the module but its ``signal`` function, which the method below replaces
        # (an instance attribute of that name would hide the method).
        self.__dict__.update({k: v for k, v in signal.__dict__.items() if k != "signal"})

    def signal(self, signalnum: int, handler: Any) -> Any:
        if signalnum in STOP_SIGNALS and signal.getsignal(signalnum) == signal.SIG_IGN:
            return signal.SIG_IGN
        return signal.signal(signalnum, handler)


def main() -> None:
    """Run pyspark's daemon (what ``python -m pyspark.daemon`` runs)."""
    import pyspark.daemon as daemon

    daemon.signal = _KeepStopSignalsIgnored()  # type: ignore[attr-defined]
    daemon.manager()


if __name__ == "__main__":
    main()

"""Spark's Python streaming source runner, silent when its query's stop closes its socket.

A Python streaming data source (Kafka, PostgreSQL CDC, landed files) is planned by a Python
process the JVM starts without a daemon: pyspark's ``python_streaming_source_runner``. It
answers the JVM's calls over a socket until the query stops and the JVM closes that socket.
The runner then fails to read the next call (``EOFError``), tries to report that failure to
the closed socket, and its last flush raises ``BrokenPipeError`` whenever the JVM's end is
already gone. Nothing catches that one, so the interpreter prints both tracebacks into the
service's log at every clean stop, or not, depending on a race (seen in CI: a PostgreSQL CDC
pipeline stopped by SIGTERM).

:func:`run` runs pyspark's runner unchanged and ends it as pyspark means to (exit status -1)
when only the JVM's closed socket failed. Every other outcome passes unchanged: a source's own
error still reaches the JVM through the open socket. The workers' interpreter wrapper
(``session.worker_python``) starts this module wherever Spark asks for pyspark's runner.
"""

from __future__ import annotations

from typing import IO

__all__ = ["main", "run"]

#: The errors of writing to, or reading from, a socket whose other end the JVM closed.
_CLOSED_BY_THE_JVM = (BrokenPipeError, ConnectionResetError, EOFError)


def run(sock_file: IO[bytes]) -> None:
    """Serve the JVM over ``sock_file`` as pyspark's runner does; a socket the JVM closed ends
    it quietly (``SystemExit(-1)``, pyspark's own status for an ended runner)."""
    from pyspark.sql.streaming import python_streaming_source_runner as runner

    try:
        runner.main(sock_file, sock_file)
    except _CLOSED_BY_THE_JVM:
        raise SystemExit(-1) from None


def main() -> None:
    """What ``python -m pyspark.sql.streaming.python_streaming_source_runner`` runs."""
    from pyspark.worker_util import get_sock_file_to_executor

    try:
        with get_sock_file_to_executor(timeout=None) as sock_file:
            run(sock_file)
    except _CLOSED_BY_THE_JVM:  # the socket's close flushes into the closed socket once more
        raise SystemExit(-1) from None


if __name__ == "__main__":
    main()

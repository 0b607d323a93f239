"""``pipeline.source_runner``: a streaming source's planner whose socket the JVM closed."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from deltaflow.pipeline.session import worker_python
from deltaflow.pipeline.source_runner import run


def _closed_by_the_jvm() -> socket.socket:
    """A runner's end of a socket whose other end (the JVM's, at a query's stop) is closed."""
    ours, jvm = socket.socketpair()
    jvm.close()
    return ours


def _close(sock_file: IO[bytes]) -> None:
    """Close as ``get_sock_file_to_executor`` does; its flush meets the closed socket again."""
    with contextlib.suppress(BrokenPipeError):
        sock_file.close()


def test_pysparks_runner_raises_a_broken_pipe_when_the_jvm_closed_its_socket():
    """What the module answers: pyspark's own runner, as the JVM leaves it at a stop."""
    from pyspark.sql.streaming import python_streaming_source_runner as runner

    sock_file = _closed_by_the_jvm().makefile("rwb", 65536)
    with pytest.raises(BrokenPipeError):
        runner.main(sock_file, sock_file)
    _close(sock_file)


def test_a_socket_the_jvm_closed_ends_the_runner_quietly(capfd):
    sock_file = _closed_by_the_jvm().makefile("rwb", 65536)
    with pytest.raises(SystemExit) as ended:
        run(sock_file)
    _close(sock_file)
    assert ended.value.code == -1  # pyspark's own status for a runner that ended
    assert capfd.readouterr().err == ""


def _runner_whose_socket_the_jvm_closes(command: list[str], path: Path) -> tuple[int, str]:
    """Start ``command`` as Spark starts a source's planner (a Unix socket to connect back to),
    take its pid as the JVM does, close the socket as a query's stop does: its status, stderr."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    env = {**os.environ, "PYTHON_WORKER_FACTORY_SOCK_PATH": str(path)}
    env.pop("PYTHON_WORKER_FACTORY_SECRET", None)
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    server.settimeout(60)
    connection, _ = server.accept()
    assert len(connection.recv(4)) == 4  # the runner's pid, its first words
    connection.close()
    server.close()
    _, err = process.communicate(timeout=60)
    return process.returncode, err


def test_the_workers_wrapper_runs_this_runner_for_pysparks_and_the_stop_prints_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    script = worker_python(sys.executable)
    assert script != sys.executable
    module = ["-m", "pyspark.sql.streaming.python_streaming_source_runner"]
    status, err = _runner_whose_socket_the_jvm_closes([script, *module], tmp_path / "wrapped.sock")
    assert (status, err) == (255, "")
    # pyspark's runner itself, started without the wrapper: the tracebacks of every stop.
    status, err = _runner_whose_socket_the_jvm_closes([sys.executable, *module], tmp_path / "bare.sock")
    assert "Traceback" in err and "BrokenPipeError" in err

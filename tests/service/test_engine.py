"""``deltaflow engine`` and ``--remote``: a real Spark Connect server started from the pyspark
wheel (pyspark's ``start-connect-server.sh``) on a port of its own, and the CLI as a user runs it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltaflow import __version__
from deltaflow.testing import _free_port
from tests.fixtures.service import alive

DELTAFLOW = [sys.executable, "-m", "deltaflow.cli"]


def _cli(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DELTAFLOW, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


def _start(
    folder: Path,
    *extra: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    return _cli(
        "engine", "start", "--dir", str(folder), "--port", str(port or _free_port()), "--master",
        "local[2]", "--driver-memory", "1g", *extra, env=env, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("engine")
    port = _free_port()
    # As docs/DEPLOYMENT.md has it: the shell exported SPARK_REMOTE for its jobs, and (re)starts
    # the engine from there (spark-submit refuses a remote beside a master).
    started = _start(folder, port=port, env={**os.environ, "SPARK_REMOTE": f"sc://127.0.0.1:{port}"})
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        url = started.stdout.strip().splitlines()[-1]  # the URL is the last line
        assert url.startswith("sc://127.0.0.1:"), started.stdout
        yield folder, url
    finally:
        stopped = _cli("engine", "stop", "--dir", str(folder))
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped the engine" in stopped.stderr
        assert _cli("engine", "status", "--dir", str(folder)).returncode == 1


def _run(url: str, folder: Path, pipelines: str) -> subprocess.CompletedProcess[str]:
    """``deltaflow run FILE --once --remote URL`` of a pipeline file holding ``pipelines``: exit 0."""
    path = folder / "p.yaml"
    path.write_text(textwrap.dedent(pipelines))
    done = _cli("run", str(path), "--once", "--remote", url)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _engine_processes(folder: Path) -> int:
    """The engine JVM's own child processes: its Python worker daemons (a daemon forks the task
    workers, whose number follows the tasks run at once)."""
    import psutil

    pid = json.loads((folder / "engine.json").read_text())["pid"]
    return len(psutil.Process(pid).children())


def _kill_engine(pid: int) -> None:
    """SIGKILL to the engine JVM and every process under it. A Python worker may end by itself
    between the listing and its signal (CI saw one): that one is gone already."""
    import psutil

    engine = psutil.Process(pid)
    tree = [engine, *engine.children(recursive=True)]
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    # A signal is sent, not done: the JVM holds its port until it has ended (CI saw a restart
    # on the same port refused as taken).
    deadline = time.monotonic() + 60
    while any(alive(p) for p in tree):
        assert time.monotonic() < deadline, [p for p in tree if alive(p)]
        time.sleep(0.1)


def _ids(table: Path) -> list[int]:
    return sorted(DeltaTable(str(table)).to_pyarrow_table().column("id").to_pylist())


def test_an_engine_reports_its_status(engine):
    folder, url = engine
    done = _cli("engine", "status", "--dir", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["running"] and info["url"] == url and info["rss_bytes"] > 0


def test_the_demo_runs_through_the_engine(engine, tmp_path):
    _, url = engine
    done = _cli("demo", "--workdir", str(tmp_path / "demo"), "--events", "3000", "--remote", url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exactly once: OK (3,000 messages" in done.stdout, done.stdout[-3000:]
    # It says where Spark runs (it said "embedded, local[*]" over --remote too).
    assert f"starting Spark (on the Spark Connect server {url})" in done.stdout, done.stdout[-3000:]


def test_ingest_through_the_engine_lands_every_message_once(engine, kafka, tmp_path):
    folder, url = engine
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(400)], partitions=2)
    table = tmp_path / "t"
    job = ["ingest", topic, str(table), "--kafka", kafka.bootstrap, "--app_id", "e1", "-e", "--remote", url]
    done = _cli(*job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ingested 400 message(s)" in done.stdout, done.stdout
    # Progress lines leave out the commits, which the server's workers count, not the client.
    progress = [line for line in done.stderr.splitlines() if "query 'e1': " in line]
    assert progress and not [line for line in progress if "committed" in line], progress
    checked = f"the Spark Connect server's Python workers run deltaflow {__version__}"
    assert checked in done.stderr
    processes = []
    for run in range(2):  # the job's next runs
        kafka.produce(
            topic,
            [json.dumps({"id": i}).encode() for i in range(400 + 50 * run, 450 + 50 * run)],
            partitions=2,
        )
        done = _cli(*job)
        assert done.returncode == 0, done.stderr[-3000:]
        assert checked not in done.stderr  # checked in the job's session before: no probe job
        processes.append(_engine_processes(folder))
    assert _ids(table) == list(range(500))
    # Each run takes the job's session again: the server's Python worker daemons are reused,
    # not started anew (the server keeps them per session, and does not end them with it).
    assert processes[1] == processes[0], processes


def test_a_pipeline_with_two_sinks_sql_and_maintenance_through_the_engine(engine, tmp_path):
    _, url = engine
    done = _run(
        url,
        tmp_path,
        f"""
        pipelines:
          - id: gen
            source: {{type: generator, total_rows: 500, rows_per_second: 100000}}
            sinks:
              - {{table_uri: "{tmp_path / "a"}"}}
              - {{table_uri: "{tmp_path / "b"}", when: "id % 2 = 0"}}
        """,
    )
    # The sinks committed in the server's workers: the summary reads their commits from the logs.
    assert (
        f"500 row(s) committed to {tmp_path / 'a'}, 250 row(s) committed to {tmp_path / 'b'}" in done.stdout
    )
    assert _ids(tmp_path / "a") == list(range(500))
    assert _ids(tmp_path / "b") == list(range(0, 500, 2))
    script = tmp_path / "p.sql"
    script.write_text(
        f"""
        CREATE TABLE clicks WITH (connector = 'generator', total_rows = 30, rows_per_second = 100000);
        CREATE TABLE pages WITH (connector = 'delta', path = '{tmp_path / "pages"}');
        INSERT INTO pages SELECT id FROM clicks WHERE id % 10 <> 3;
        """
    )
    done = _cli("sql", str(script), "--once", "--remote", url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "27 row(s) committed to" in done.stdout, done.stdout
    assert _ids(tmp_path / "pages") == [i for i in range(30) if i % 10 != 3]
    # Table maintenance runs in the client (delta-rs): the same command line with --remote.
    for command in (["optimize", str(tmp_path / "a")], ["vacuum", str(tmp_path / "a")]):
        done = _cli("--remote", url, *command)
        assert done.returncode == 0, done.stderr[-3000:]
    assert _ids(tmp_path / "a") == list(range(500))


def test_a_client_killed_mid_run_and_restarted_leaves_one_writer(engine, kafka, tmp_path):
    """SIGKILL of a client: its query runs on in the server. The restarted client's query
    replaces it (Spark stops the older run of the checkpoint), and once the new client is
    stopped no query of the pipeline runs any more."""
    _, url = engine
    topic = kafka.create_topic(partitions=2)
    table = tmp_path / "t"
    service = ["ingest", topic, str(table), "--kafka", kafka.bootstrap, "--app_id", "k1"]
    service += ["--allowed_latency", "1", "--remote", url]

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*DELTAFLOW, *service],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def rows_reach(n: int, timeout_s: float = 120) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if table.exists() and (table / "_delta_log").exists() and len(_ids(table)) >= n:
                return
            time.sleep(0.5)
        raise AssertionError(f"{len(_ids(table)) if table.exists() else 0} rows, not {n}")

    first = start()
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(200)], partitions=2)
    rows_reach(200)
    first.kill()  # SIGKILL: no stop reaches the server
    first.communicate()
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(200, 300)], partitions=2)
    second = start()
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(second.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.time() + 120
    while not any("ingesting " in line for line in said):  # its query started
        assert second.poll() is None and time.time() < deadline, "".join(said)[-3000:]
        time.sleep(0.2)
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(300, 400)], partitions=2)
    rows_reach(400)
    os.killpg(second.pid, signal.SIGTERM)
    second.wait(timeout=120)
    reader.join(timeout=30)
    err = "".join(said)
    assert second.returncode == 0, err[-3000:]
    # The restarted client took the job's session again and stopped the query left running.
    assert "that a previous client left running" in err, err[-3000:]
    assert " ERROR " not in err and "Traceback" not in err, err[-3000:]
    version = DeltaTable(str(table)).version()
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(400, 420)], partitions=2)
    time.sleep(8)  # several 1-s batches: a query still running would commit these
    assert DeltaTable(str(table)).version() == version
    assert _ids(table) == list(range(400))


@pytest.mark.parametrize("stop", [None, signal.SIGTERM], ids=["waited-out", "stopped-meanwhile"])
def test_a_job_whose_engine_goes_away_mid_run_says_so_within_its_wait(kafka, tmp_path, stop):
    """pyspark retried a server that stopped answering for ten minutes, silently, and again at
    exit: the job warns, gives up after DELTAFLOW_ENGINE_WAIT_S and exits 1 (transient). A stop
    signal meanwhile ends the retries (it waited them out: 60 s by default)."""

    folder = tmp_path / "engine"
    started = _start(folder)
    assert started.returncode == 0, started.stdout + started.stderr
    url = started.stdout.strip().splitlines()[-1]
    pid = json.loads((folder / "engine.json").read_text())["pid"]
    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(50)], partitions=1)
    table = tmp_path / "t"
    wait = "60" if stop else "5"
    job = subprocess.Popen(
        [*DELTAFLOW, "ingest", topic, str(table), "--kafka", kafka.bootstrap, "--allowed_latency", "1",
         "--remote", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "DELTAFLOW_ENGINE_WAIT_S": wait},
    )  # fmt: skip
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(job.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    warned = f"the Spark Connect server {url} does not answer: retrying for up to {wait} s"
    try:
        deadline = time.time() + 120
        while not (table / "_delta_log").exists() or len(_ids(table)) < 50:
            assert job.poll() is None and time.time() < deadline, "".join(said)[-3000:]
            time.sleep(0.5)
        _kill_engine(pid)  # nothing answers at its port any more
        gone = time.monotonic()
        if stop:
            while not any(warned in line for line in said):  # retrying
                assert job.poll() is None and time.monotonic() - gone < 60, "".join(said)[-3000:]
                time.sleep(0.2)
            os.killpg(job.pid, stop)
            gone = time.monotonic()
        job.wait(timeout=120)
        took = time.monotonic() - gone
        reader.join(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    err = "".join(said)
    assert job.returncode == 1, err[-3000:]
    # 5 s of retries, then the exit (pyspark's default: 10+ min); after a stop, its last wait.
    assert took < (20 if stop else 60), f"{took:.0f} s"
    assert warned in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the Spark Connect server stopped answering (UNAVAILABLE"), err[-3000:]
    assert "Traceback" not in err and "RETRIES_EXCEEDED" not in err, err[-3000:]
    assert _ids(table) == list(range(50))


@pytest.mark.parametrize(
    ("module", "stub", "said"),
    [
        (
            "deltaflow",
            "raise ImportError('not installed here')\n",
            "its Python workers cannot import deltaflow",
        ),
        ("deltaflow", "__version__ = '0.0.1'\n", "its Python workers have deltaflow 0.0.1"),
    ],
)
def test_a_server_without_this_deltaflow_is_refused_before_anything_runs(tmp_path, module, stub, said):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / f"{module}.py").write_text(stub)  # found before the installed one
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{hidden}:$PYTHONPATH" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    done = _start(tmp_path / "engine", "--conf", f"spark.pyspark.python={python}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr and f"cannot run this deltaflow {__version__}" in done.stderr, done.stderr
    assert f"Install deltaflow=={__version__}" in done.stderr
    # The server that could not serve was stopped again.
    assert _cli("engine", "status", "--dir", str(tmp_path / "engine")).returncode == 1


def test_a_remote_runs_summary_counts_its_dead_letters(engine, tmp_path):
    """The dead-letter table is one of the pipeline's tables: a local run's summary names it,
    and so does a remote one (from its log)."""
    _, url = engine
    done = _run(
        url,
        tmp_path,
        f"""
        pipelines:
          - id: dl
            source: {{type: generator, total_rows: 100, rows_per_second: 100000}}
            expectations: [{{name: even, expr: "id % 2 = 0", action: drop}}]
            dead_letter: {{table_uri: "{tmp_path / "rejected"}"}}
            sinks: [{{table_uri: "{tmp_path / "kept"}"}}]
        """,
    )
    assert f"50 row(s) committed to {tmp_path / 'rejected'}" in done.stdout, done.stdout
    assert f"50 row(s) committed to {tmp_path / 'kept'}" in done.stdout, done.stdout
    assert _ids(tmp_path / "kept") == list(range(0, 100, 2))
    assert DeltaTable(str(tmp_path / "rejected")).to_pyarrow_table().num_rows == 50


def test_a_remote_runs_summary_counts_a_table_per_topic(engine, kafka, tmp_path):
    _, url = engine
    prefix = f"tpl{time.time_ns()}"
    for name, count in (("x", 30), ("y", 20)):
        topic = kafka.create_topic(partitions=1, name=f"{prefix}.{name}")
        kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(count)], partitions=1)
    done = _run(
        url,
        tmp_path,
        f"""
        pipelines:
          - id: tpl
            engine: arrow
            source: {{type: kafka, bootstrap_servers: "{kafka.bootstrap}",
                      topic_pattern: '{prefix}\\.(.*)', schema: "id INT"}}
            sinks: [{{table_uri: "{tmp_path}/{{1}}"}}]
        """,
    )
    assert f"30 row(s) committed to {tmp_path / 'x'}" in done.stdout, done.stdout
    assert f"20 row(s) committed to {tmp_path / 'y'}" in done.stdout, done.stdout
    assert _ids(tmp_path / "x") == list(range(30)) and _ids(tmp_path / "y") == list(range(20))


def test_a_remote_jobs_terminal_error_is_said_whole(engine, kafka, tmp_path):
    """A deltaflow error raised on the server (a re-created topic: terminal) reaches the client
    whole, its remedy included: not as the copy in the gRPC status the server cuts at ~4 KB."""
    _, url = engine
    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(30)], partitions=1)
    table = tmp_path / "t"
    job = ["ingest", topic, str(table), "--kafka", kafka.bootstrap, "--app_id", "gone", "-e", "--remote", url]
    done = _cli(*job)
    assert done.returncode == 0, done.stderr[-3000:]
    kafka.recreate_topic(topic, partitions=1)
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(30, 40)], partitions=1)
    done = _cli(*job)
    assert done.returncode == 2, done.stderr[-3000:]
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith(f"error: Kafka topic {topic!r} partition 0: the pipeline's next offset"), said
    assert said.endswith("the Spark option failOnDataLoss)"), said
    assert _ids(table) == list(range(30))


def test_relative_paths_are_the_clients_not_the_servers(engine, tmp_path):
    """The server was started from another folder: a pipeline file's relative paths (a files
    source, a sink) still name the client's folders."""
    _, url = engine
    (tmp_path / "land").mkdir()
    (tmp_path / "land" / "a.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(30)))
    (tmp_path / "p.yaml").write_text(
        textwrap.dedent(
            """
            pipelines:
              - id: rel
                source: {type: files, path: land, format: json, schema: "id BIGINT", min_file_age: 0}
                sinks: [{table_uri: out}]
            """
        )
    )
    assert Path.cwd() != tmp_path  # the engine's folder (the fixture started it from here)
    done = _cli("run", "p.yaml", "--once", "--remote", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"30 row(s) committed to {tmp_path / 'out'}" in done.stdout, done.stdout
    assert _ids(tmp_path / "out") == list(range(30))


def test_a_start_on_a_taken_port_is_refused_at_once(engine, tmp_path):
    """Another process on the port (the fixture's engine, or anything listening) would get the
    start's and the jobs' sessions: refused before a server starts, naming the port."""
    import socket

    _, url = engine
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        for port in (other.getsockname()[1], int(url.rsplit(":", 1)[1])):
            done = _start(tmp_path / f"e{port}", port=port, timeout=60)  # before: waited forever
            assert done.returncode == 2, done.stdout + done.stderr
            assert f"cannot start an engine on sc://127.0.0.1:{port}: the port is taken" in done.stderr
            assert _cli("engine", "status", "--dir", str(tmp_path / f"e{port}")).returncode == 1
    assert _cli("engine", "status", "--dir", str(engine[0])).returncode == 0


def test_a_pid_that_another_process_took_is_not_the_engine(tmp_path):
    """After a reboot (or once the JVM died) the state file's pid may be another java process:
    not reported as the engine, never stopped or killed as it, and no obstacle to a start."""
    import psutil

    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    (tmp_path / "Idle.java").write_text(
        "public class Idle { public static void main(String[] a) throws Exception { Thread.sleep(600000); } }"
    )
    other = subprocess.Popen([str(java), str(tmp_path / "Idle.java")])
    try:
        assert "java" in psutil.Process(other.pid).name()
        folder = tmp_path / "engine"
        folder.mkdir()
        stale = {"url": "sc://127.0.0.1:1", "pid": other.pid, "port": 1, "started": 0.0}
        (folder / "engine.json").write_text(json.dumps({**stale, "log": "x.out", "master": "local[1]"}))
        pid_file = folder / "spark-deltaflow-org.apache.spark.sql.connect.service.SparkConnectServer-1.pid"
        pid_file.write_text(f"{other.pid}\n")  # Spark's own pid file, as stale
        status = _cli("engine", "status", "--dir", str(folder))
        assert status.returncode == 1 and "not running" in status.stdout, status.stdout
        stopped = _cli("engine", "stop", "--dir", str(folder), timeout=30)
        assert stopped.returncode == 0 and "no engine was running" in stopped.stderr, stopped.stderr
        assert other.poll() is None  # not killed
        (folder / "engine.json").write_text(json.dumps({**stale, "log": "x.out", "master": "local[1]"}))
        started = _cli(
            "engine", "start", "--dir", str(folder), "--port", str(_free_port()), "--master", "local[1]",
            "--driver-memory", "512m", "--idle-stop", "0.5",
        )  # fmt: skip
        try:
            assert started.returncode == 0, started.stdout + started.stderr
            # --idle-stop below a second, as start accepts it: its watcher stops the idle engine
            # (before, the watcher refused the value and the engine ran on).
            deadline = time.time() + 60
            while (folder / "engine.json").exists():  # a stop removes it
                assert time.time() < deadline, "the idle engine was not stopped"
                time.sleep(0.5)
            assert _cli("engine", "status", "--dir", str(folder)).returncode == 1
        finally:
            assert _cli("engine", "stop", "--dir", str(folder)).returncode == 0
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_job_whose_engine_restarts_within_its_wait_says_so_without_a_traceback(kafka, tmp_path):
    """An engine that comes back within DELTAFLOW_ENGINE_WAIT_S (a service manager restarting
    it) answers the job's retried call with INVALID_HANDLE.SESSION_CHANGED; pyspark then closes
    the client and raises NO_ACTIVE_SESSION, which escaped the daemon as a raw traceback. The job
    must end as for an engine gone: exit 1, one error line."""

    folder = tmp_path / "engine"
    started = _start(folder)
    assert started.returncode == 0, started.stdout + started.stderr
    url = started.stdout.strip().splitlines()[-1]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    pid = json.loads((folder / "engine.json").read_text())["pid"]
    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(50)], partitions=1)
    table = tmp_path / "t"
    job = subprocess.Popen(
        [*DELTAFLOW, "ingest", topic, str(table), "--kafka", kafka.bootstrap, "--allowed_latency", "1",
         "--remote", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "DELTAFLOW_ENGINE_WAIT_S": "120"},
    )  # fmt: skip
    again = tmp_path / "engine2"
    try:
        deadline = time.time() + 180
        while not (table / "_delta_log").exists() or len(_ids(table)) < 50:
            assert job.poll() is None and time.time() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.5)
        _kill_engine(pid)
        restarted = _start(again, port=port)  # back on the same address within the wait
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        _, err = job.communicate(timeout=150)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        _cli("engine", "stop", "--dir", str(again))
    assert job.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    said = err.strip().splitlines()[-1]
    assert said.startswith("error: the Spark Connect server restarted"), err[-3000:]
    assert _ids(table) == list(range(50))

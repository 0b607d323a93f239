"""A resident local Spark engine: a Spark Connect server started from the installed pyspark.

``deltaflow engine start`` runs pyspark's own ``sbin/start-connect-server.sh`` (Spark's
daemon script: a JVM in its own session, its pid in a file, its log beside it) with
deltaflow's session defaults, its Python workers on this interpreter, and the JVM class
archive when one exists. It returns once the server accepts sessions and its Python workers
import this deltaflow (:func:`deltaflow.pipeline.session.check_server`): jobs given
``--remote <url>`` then start no JVM and find warm workers. ``stop`` runs pyspark's
``stop-connect-server.sh``.

Everything about one engine lives in its folder (``--dir``, default
``$DELTAFLOW_ENGINE_DIR`` or ``~/.deltaflow/engine``): Spark's pid file and log, and
``engine.json`` (its URL, pid and settings). With ``idle_stop_s``, a small watcher process
stops the server once no client has been connected for that long.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deltaflow.errors import ConfigError, EngineMismatchError

__all__ = ["EngineSettings", "EngineState", "default_dir", "start", "state", "stop", "watch_idle"]

logger = logging.getLogger(__name__)

#: Spark's name for the server's main class (its daemon script names the pid file after it).
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: The ident Spark's daemon script puts in the pid and log file names.
IDENT = "deltaflow"
STATE_FILE = "engine.json"
#: How long a start waits for the server to accept sessions.
START_TIMEOUT_S = 180.0
#: How often the idle watcher looks for connected clients.
IDLE_POLL_S = 5.0
#: Variables that make pyspark (and spark-submit) a Spark Connect *client*: never handed to the
#: server, which is started with a master (spark-submit refuses both) and whose Python workers
#: must not connect anywhere else. A shell that exported SPARK_REMOTE for its jobs (as
#: docs/DEPLOYMENT.md shows) still starts an engine.
CLIENT_VARIABLES = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE")
#: Two readings of one process's start time differ by less than this (psutil rounds).
SAME_START_S = 1.0


def default_dir() -> Path:
    return Path(os.environ.get("DELTAFLOW_ENGINE_DIR") or Path.home() / ".deltaflow" / "engine")


@dataclass(frozen=True)
class EngineSettings:
    """How to start an engine.

    Args:
        folder: The engine's folder (pid file, log, state).
        host: The address the server binds (127.0.0.1: this machine only).
        port: Its port (15002 is Spark Connect's default).
        master: The Spark master the server's driver uses.
        driver_memory: The server JVM's heap.
        idle_stop_s: Stop the server once no client was connected for this long (0: never).
        conf: More Spark settings; they win over deltaflow's defaults.
    """

    folder: Path
    host: str = "127.0.0.1"
    port: int = 15002
    master: str = "local[*]"
    driver_memory: str = "2g"
    idle_stop_s: float = 0.0
    conf: Mapping[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"


@dataclass(frozen=True)
class EngineState:
    """A started engine, as ``engine.json`` records it."""

    url: str
    pid: int
    port: int
    started: float
    log: str
    master: str
    #: The server JVM's start time (psutil's ``create_time``): a pid reused by another process
    #: (after a reboot, or once the JVM died) is not this engine. ``None`` in older state files.
    created: float | None = None

    def alive(self) -> bool:
        """Whether this engine's JVM runs: the pid is a Spark Connect server started when the
        state says (never a process that got the pid later: ``stop`` would kill it)."""
        return _is_server(self.pid, self.created)


def _is_server(pid: int, created: float | None = None) -> bool:
    """Whether ``pid`` is a Spark Connect server's JVM (started at ``created``, when given)."""
    import psutil

    try:
        process = psutil.Process(pid)
        if created is not None and abs(process.create_time() - created) > SAME_START_S:
            return False
        return "java" in process.name() and SERVER_CLASS in " ".join(process.cmdline())
    except psutil.Error:
        return False


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _environment(settings: EngineSettings) -> dict[str, str]:
    from deltaflow.pipeline.session import worker_python

    folder = settings.folder
    # The workers' interpreter, also in the environment: Spark's data source planners read it there.
    python = settings.conf.get("spark.pyspark.python") or worker_python(sys.executable)
    return {
        **{k: v for k, v in os.environ.items() if k not in CLIENT_VARIABLES},
        "SPARK_HOME": str(_spark_home()),
        "SPARK_PID_DIR": str(folder),
        "SPARK_LOG_DIR": str(folder),
        "SPARK_IDENT_STRING": IDENT,
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def _server_conf(settings: EngineSettings) -> dict[str, str]:
    from deltaflow.pipeline.class_cache import class_cache
    from deltaflow.pipeline.session import default_conf

    conf = default_conf(settings.master)
    for key in ("spark.pyspark.driver.python", "spark.driver.memory"):
        conf.pop(key, None)
    conf["spark.pyspark.python"] = _environment(settings)["PYSPARK_PYTHON"]
    conf["spark.connect.grpc.binding.address"] = settings.host
    conf["spark.connect.grpc.binding.port"] = str(settings.port)
    # Each job keeps its own session between runs (warm workers: pipeline.session); a week idle
    # before the server ends one (Spark's default is an hour).
    conf["spark.connect.session.manager.defaultSessionTimeout"] = "7d"
    cache = class_cache(conf)
    if cache is not None and not cache.writes:  # map an archive local runs made; never write one
        conf["spark.driver.extraJavaOptions"] = " ".join(
            [*cache.java_options(), conf.get("spark.driver.extraJavaOptions", "")]
        ).strip()
    conf.update(settings.conf)
    return conf


def state(folder: Path) -> EngineState | None:
    """The engine recorded in ``folder`` (``None``: none was started there)."""
    try:
        return EngineState(**json.loads((folder / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def start(settings: EngineSettings, *, echo: Callable[[str], None] = logger.info) -> EngineState:
    """Start the engine and wait until it accepts sessions and its workers run this deltaflow.

    Raises:
        ConfigError: an engine of this folder runs already, or the server did not start
            (the message ends with its log's last lines).
        EngineMismatchError: its Python workers cannot import this deltaflow.
    """
    folder = settings.folder
    folder.mkdir(parents=True, exist_ok=True)
    running = state(folder)
    if running is not None and running.alive():
        raise ConfigError(
            f"an engine already runs from {folder} at {running.url} (pid {running.pid}); "
            "stop it first (deltaflow engine stop) or give another --dir",
            url=running.url,
        )
    _check_port_free(settings)
    stale = _pid(folder)
    if stale is not None and not _is_server(stale):
        # Spark's daemon script would refuse to start while another java process holds that pid
        # (and its stop script would kill that process).
        _pid_file(folder).unlink(missing_ok=True)
    script = _spark_home() / "sbin" / "start-connect-server.sh"
    args = ["bash", str(script), "--master", settings.master, "--driver-memory", settings.driver_memory]
    for key, value in _server_conf(settings).items():
        args += ["--conf", f"{key}={value}"]
    echo(f"starting a Spark Connect server on {settings.url} (master {settings.master}, log in {folder})")
    began = time.time()
    # Its own session: a stop signal to the group of the shell that started it does not reach it.
    done = subprocess.run(
        args, env=_environment(settings), capture_output=True, text=True, start_new_session=True, check=False
    )
    log = _log_file(folder)
    pid = _pid(folder)
    if done.returncode != 0 or pid is None:
        raise ConfigError(
            f"the Spark Connect server did not start: {(done.stdout + done.stderr).strip()[-2000:]}",
            log=str(log),
        )
    engine = EngineState(settings.url, pid, settings.port, began, str(log), settings.master, _created(pid))
    (folder / STATE_FILE).write_text(json.dumps(asdict(engine)))
    try:
        _wait_ready(engine, settings)
    except BaseException:
        stop(folder)
        raise
    if settings.idle_stop_s > 0:
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deltaflow.cli",
                "engine",
                "watch",
                "--dir",
                str(folder),
                "--idle-stop",
                str(settings.idle_stop_s),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    echo(f"the engine accepts sessions after {time.time() - began:.1f} s")
    return engine


def _check_port_free(settings: EngineSettings) -> None:
    """Raise :class:`ConfigError` when another process listens on the engine's port: the server
    would fail to bind it, and the sessions of the start (and of every job) would go to that
    process instead (another engine answers them; anything else never does)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET) as probe:
        # As the server binds: a port whose last connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((settings.host, settings.port))
        except OSError as exc:
            raise ConfigError(
                f"cannot start an engine on {settings.url}: the port is taken ({exc.strerror}); "
                "give another --port, or stop what listens there",
                url=settings.url,
            ) from None


def _listening(engine: EngineState) -> bool:
    """Whether the engine's own JVM listens on its port (not merely someone on the port)."""
    import psutil

    try:
        connections = psutil.Process(engine.pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == engine.port for c in connections)


def _created(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _wait_ready(engine: EngineState, settings: EngineSettings) -> None:
    deadline = time.time() + START_TIMEOUT_S
    while not _listening(engine):
        if not engine.alive():
            raise ConfigError(f"the Spark Connect server exited while starting:\n{_tail(Path(engine.log))}")
        if time.time() > deadline:
            raise ConfigError(
                f"the Spark Connect server did not listen on {engine.url} within "
                f"{START_TIMEOUT_S:.0f} s:\n{_tail(Path(engine.log))}"
            )
        time.sleep(0.2)
    from pyspark.sql import SparkSession

    from deltaflow.pipeline.session import check_server

    spark = SparkSession.builder.remote(engine.url).create()
    try:
        check_server(spark, engine.url)  # and its Python worker is warm for the first job
    except EngineMismatchError:
        raise
    finally:
        spark.stop()


def stop(folder: Path, timeout_s: float = 60.0) -> EngineState | None:
    """Stop the engine of ``folder`` through pyspark's ``stop-connect-server.sh``; the engine
    that was stopped (``None``: none ran)."""
    engine = state(folder)
    if engine is None or not engine.alive():
        (folder / STATE_FILE).unlink(missing_ok=True)
        return None
    script = _spark_home() / "sbin" / "stop-connect-server.sh"
    subprocess.run(
        ["bash", str(script)], env=_environment(EngineSettings(folder)), capture_output=True, check=False
    )
    deadline = time.time() + timeout_s
    while engine.alive() and time.time() < deadline:
        time.sleep(0.2)
    if engine.alive():
        import psutil

        logger.warning("the engine (pid %d) did not stop within %.0f s: killing it", engine.pid, timeout_s)
        psutil.Process(engine.pid).kill()
    (folder / STATE_FILE).unlink(missing_ok=True)
    return engine


def clients(engine: EngineState) -> int:
    """Clients connected to the engine now."""
    import psutil

    try:
        connections = psutil.Process(engine.pid).net_connections(kind="tcp")
    except psutil.Error:
        return 0
    return sum(1 for c in connections if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == engine.port)


def watch_idle(folder: Path, idle_stop_s: float) -> None:
    """Stop the engine of ``folder`` once no client was connected for ``idle_stop_s``; return
    when it is gone."""
    last_busy = time.time()
    while (engine := state(folder)) is not None and engine.alive():
        if clients(engine):
            last_busy = time.time()
        elif time.time() - last_busy >= idle_stop_s:
            logger.info("no client for %.0f s: stopping the engine %s", idle_stop_s, engine.url)
            stop(folder)
            return
        time.sleep(IDLE_POLL_S)


def describe(engine: EngineState) -> dict[str, Any]:
    """``status``: the engine's URL, pid, uptime, memory and connected clients."""
    import psutil

    info: dict[str, Any] = {**asdict(engine), "running": engine.alive()}
    if info["running"]:
        process = psutil.Process(engine.pid)
        info["uptime_s"] = round(time.time() - engine.started, 1)
        info["rss_bytes"] = process.memory_info().rss + sum(
            c.memory_info().rss for c in process.children(recursive=True)
        )
        info["clients"] = clients(engine)
    return info


def _pid_file(folder: Path) -> Path:
    return folder / f"spark-{IDENT}-{SERVER_CLASS}-1.pid"


def _pid(folder: Path) -> int | None:
    try:
        return int(_pid_file(folder).read_text().strip())
    except (OSError, ValueError):
        return None


def _log_file(folder: Path) -> Path:
    logs = sorted(folder.glob(f"spark-{IDENT}-{SERVER_CLASS}-1-*.out"), key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else folder / f"spark-{IDENT}-{SERVER_CLASS}-1.out"


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {log})"

"""A SparkSession with defaults that suit streaming into Delta tables."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from deltaflow.errors import ConfigError, EngineUnavailableError
from deltaflow.io import logs
from deltaflow.pipeline import jvm_logs
from deltaflow.pipeline.class_cache import JAVA_OPTION_VARIABLES, class_cache

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

__all__ = [
    "DEFAULT_MASTER",
    "LEAN_JVM",
    "QUICK_JVM",
    "JvmProfile",
    "default_conf",
    "spark_defaults",
    "spark_session",
    "start_query",
    "stop_session",
    "worker_python",
]

logger = logging.getLogger(__name__)

#: The embedded default: every core of this machine, in one JVM.
DEFAULT_MASTER = "local[*]"
#: The Python worker daemon local sessions run (``spark.python.daemon.module``).
WORKER_DAEMON = "deltaflow.pipeline.worker_daemon"
#: What the workers' wrapper runs for pyspark's streaming source runner (a source's planner).
SOURCE_RUNNER = "deltaflow.pipeline.source_runner"
#: ``spark_session(jvm=...)``: the JVM's defaults; its quick compiler only (``quick``, for a
#: driver JVM that only plans and schedules); and also the serial garbage collector (``lean``,
#: for such a run that ends by itself: a job).
JvmProfile = Literal["full", "quick", "lean"]
QUICK_JVM = ("-XX:TieredStopAtLevel=1",)
LEAN_JVM = (*QUICK_JVM, "-XX:+UseSerialGC")
#: Sessions a job tries on a Spark Connect server before it takes one of its own (the server
#: refuses a session id it has closed).
SESSION_GENERATIONS = 8
#: Seconds to wait for a TCP connection to a Spark Connect server before saying it does not answer.
CONNECT_PROBE_S = 10.0
#: How long a job retries a Spark Connect server that stopped answering before it gives up
#: (exit 1: a service manager restarts it), seconds; ``DELTAFLOW_ENGINE_WAIT_S`` overrides it.
ENGINE_WAIT_S = 60.0
#: Spark 4's structured logging: the JVM's log4j records as JSON (``--log-format json``).
STRUCTURED_LOGGING = "spark.log.structuredLogging.enabled"
#: The log4j2 configuration Spark itself loads when structured logging is on (in
#: spark-common-utils: its console appender with ``SparkLayout.json``, a JsonTemplateLayout).
SPARK_JSON_LOG4J = "org/apache/spark/log4j2-json-layout.properties"


def default_conf(master: str) -> dict[str, str]:
    """The configuration deltaflow applies unless the caller sets a key itself."""
    cores = os.cpu_count() or 2
    return {
        # Stats and partition values are in UTC; Spark must agree.
        "spark.sql.session.timeZone": "UTC",
        # INT96 timestamps carry no min/max statistics: no data skipping (DELTA_NOTES).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # 200 shuffle partitions make 200 tiny files per batch on a laptop.
        "spark.sql.shuffle.partitions": str(cores if master.startswith("local") else cores * 2),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Python workers are costly to start (~2 s cold): keep them between tasks.
        "spark.python.worker.reuse": "true",
        # Workers must run the interpreter that has deltaflow installed.
        "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.memory": "2g",
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    }


def spark_session(
    master: str | None = None, *, jvm: JvmProfile = "full", job: str | None = None, **conf: Any
) -> SparkSession:
    """Get or create a SparkSession for deltaflow, with the ``deltaflow`` format registered.

    A driver JVM this call starts maps a class-data sharing archive
    (:mod:`deltaflow.pipeline.class_cache`): it starts seconds sooner from the second run on.

    Args:
        master: Any Spark master URL; defaults to ``$DELTAFLOW_SPARK_MASTER`` or ``local[*]``.
        jvm: ``full`` (the JVM's defaults), ``quick``: only the JVM's quick compiler (C1), or
            ``lean``: that and the serial garbage collector. The JVM then starts and warms up
            with about half the CPU, but rows that go through Spark SQL move at about half the
            speed (BENCHMARKS.md). For runs whose rows stay in Arrow (the Arrow ingest engine),
            where the JVM only plans and schedules; ``lean`` for such runs that end by
            themselves (the serial collector saves CPU at start but its pauses lengthen a
            long-running stream's micro-batches). Applies only to a JVM this call starts.
        job: On a Spark Connect server (``SPARK_REMOTE``): what the session is for (e.g. the
            pipeline ids). Each run of the same job takes the same server session: warm Python
            workers, and the queries a client that died left running are found.
        **conf: Spark settings (``**{"spark.executor.memory": "4g"}``); they win over the
            defaults of :func:`default_conf`.

    Raises:
        ConfigError: when no Java runtime can be found.
    """
    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        return _connect_session(remote, master, conf, job)
    if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        raise ConfigError(
            "Spark needs a Java 17+ runtime and none was found: install one "
            "(Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    from pyspark.sql import SparkSession

    master = master or os.environ.get("DELTAFLOW_SPARK_MASTER")
    # Under spark-submit (or a pyspark shell) the JVM exists already, started with its --master
    # and --conf: those win unless a master is named here.
    submitted = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
    if master is None and not submitted:
        master = DEFAULT_MASTER
    # Some Python workers (data source planning and commits) read the interpreter from the
    # JVM's environment rather than from spark.pyspark.python.
    local = (master or "").startswith("local")
    if "PYSPARK_PYTHON" not in os.environ and local and not submitted and "spark.pyspark.python" not in conf:
        os.environ["PYSPARK_PYTHON"] = worker_python(sys.executable)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = default_conf(master or "")
    if submitted:  # spark-submit's own settings (executor Python, memory) are the user's
        for key in ("spark.pyspark.python", "spark.pyspark.driver.python", "spark.driver.memory"):
            settings.pop(key)
    settings.update({k: str(v) for k, v in conf.items()})
    json_logs = logs.exported_format() == "json"
    if json_logs:
        settings.setdefault(STRUCTURED_LOGGING, "true")
    from pyspark import SparkContext

    # Only a JVM this call starts takes deltaflow's JVM flags (pyspark keeps the first JVM of
    # the process after a stop: DESIGN.md, "The driver JVM deltaflow starts").
    started_here = not submitted and SparkContext._gateway is None
    cache = class_cache(settings) if started_here else None
    # spark-defaults.conf's options (a --conf would replace them), then the caller's.
    defaults = spark_defaults()
    options = [
        defaults.get("spark.driver.extraJavaOptions", ""),
        settings.get("spark.driver.extraJavaOptions", ""),
    ]
    # Spark puts spark.driver.defaultJavaOptions on the same command line.
    others = [
        defaults.get("spark.driver.defaultJavaOptions", ""),
        settings.get("spark.driver.defaultJavaOptions", ""),
    ]
    ours = [
        *(cache.java_options() if cache else ()),
        *(_lean([*options, *others]) if started_here and jvm == "lean" else ()),
        *(QUICK_JVM if started_here and jvm == "quick" else ()),
        *(_json_log4j([*options, *others]) if started_here and json_logs and _structured(settings) else ()),
    ]
    if ours:
        # Ours first: the JVM takes the last of a repeated flag.
        settings["spark.driver.extraJavaOptions"] = " ".join([*ours, *filter(None, options)])
    # A stop signal sent to the whole process group (systemd, a container init, Ctrl-C) must
    # reach the driver alone: the JVM and the Python processes it starts keep running until
    # the driver has stopped its queries (deltaflow.pipeline.worker_daemon).
    shielded = started_here and local
    if shielded:
        settings.setdefault("spark.python.daemon.module", WORKER_DAEMON)
    builder = SparkSession.builder.appName(settings.pop("spark.app.name", "deltaflow"))
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _jvm_launch(ignore_stop_signals=shielded, stdout_to_stderr=started_here and json_logs):
        spark = builder.getOrCreate()
    if cache is not None and cache.writes:
        atexit.register(cache.finish, getattr(spark.sparkContext._gateway, "proc", None))
    if started_here and json_logs:
        atexit.register(_end_jvm, getattr(spark.sparkContext._gateway, "proc", None))
    spark.sparkContext.setLogLevel(os.environ.get("DELTAFLOW_SPARK_LOG_LEVEL", "WARN"))
    if started_here and json_logs:
        _structured_logging_as_configured(spark)
    if shielded:
        # A query's stop interrupts its thread, also inside the chmod Hadoop runs for each
        # checkpoint file it writes: Hadoop then logs a WARN with a Java trace for a clean stop.
        # For the session's life: nothing to put back.
        jvm_logs.set_levels({"org.apache.hadoop.util.Shell": "ERROR"})
    if started_here:
        # This interpreter, or the wrapper of it (also when a parent process chose it).
        wrapper = _wrapper_or_none(sys.executable)
        skip_static_source_lookup(spark, {sys.executable, *([str(wrapper)] if wrapper else [])})
    from deltaflow.pipeline.api import register

    register(spark)
    logger.info("Spark %s session on %s", spark.version, spark.sparkContext.master)
    return spark


#: Spark's JVM loggers while a session of this process stops. A local session stops its
#: executor without waiting for it, then the driver's heartbeat receiver, which drops a heartbeat
#: it has not answered yet: the executor's stop then waits the heartbeat's timeout out (10 s)
#: and logs a WARN with the timeout's Java trace (seen in CI, under a stop signal).
SESSION_STOP_LOG_LEVELS = {"org.apache.spark.executor.Executor": "ERROR"}


def stop_session(spark: SparkSession) -> None:
    """``spark.stop()``, with :data:`SESSION_STOP_LOG_LEVELS` for its while (nothing to set
    over Spark Connect: the server's executors are its own)."""
    with jvm_logs.levels_for_a_while(SESSION_STOP_LOG_LEVELS):
        spark.stop()


#: At exit with JSON logs, the longest the interpreter waits for its JVM to end once its input is
#: closed (a JVM that has stopped its SparkContext ends in well under a second).
JVM_EXIT_WAIT_S = 10.0


def _end_jvm(jvm: subprocess.Popen[bytes] | None) -> None:
    """At exit, with JSON logs: close the JVM's input (pyspark's gateway exits at its end) and
    wait for it, bounded. The JVM and Spark's Python workers hold the CLI's standard error
    relay open until they end; registered after the relay's drain, this runs first, so that
    their last lines reach the relay and the drain does not wait out its bound for a JVM that
    would only end once this process has (``deltaflow.io.logs._drain_relay``)."""
    if jvm is None:
        return
    try:
        if jvm.stdin is not None:
            jvm.stdin.close()
        jvm.wait(timeout=JVM_EXIT_WAIT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("the JVM did not end at exit: %s", exc)


#: The files log4j2 finds on the class path by itself (Spark's conf folder is on it).
_LOG4J2_FILES = ("log4j2.properties", "log4j2.yaml", "log4j2.yml", "log4j2.json", "log4j2.jsn", "log4j2.xml")


def _structured(settings: dict[str, str]) -> bool:
    return settings.get(STRUCTURED_LOGGING, "").strip().lower() == "true"


def _json_log4j(options: Sequence[str]) -> tuple[str, ...]:
    """The Java option that makes the driver JVM log with Spark's JSON layout from its first
    line, unless the user configured log4j2 (options, variables, a ``log4j2.*`` file in
    Spark's conf folder): theirs stays.

    ``spark.log.structuredLogging.enabled`` alone does not reach this JVM: spark-submit turns
    structured logging off for shells, and pyspark's gateway is one (``pyspark-shell``), so
    Spark would load its text profile. Naming the profile Spark loads for structured logging
    keeps Spark's own layout (:data:`SPARK_JSON_LOG4J`); executors on a cluster read the
    setting itself.
    """
    from pyspark.find_spark_home import _find_spark_home

    texts = [*options, *(os.environ.get(name, "") for name in JAVA_OPTION_VARIABLES)]
    folder = Path(os.environ.get("SPARK_CONF_DIR") or Path(_find_spark_home(), "conf"))
    theirs = (
        any("log4j.configurationFile" in t or "log4j2.configurationFile" in t for t in texts)
        or bool(os.environ.get("LOG4J_CONFIGURATION_FILE"))
        or any((folder / name).is_file() for name in _LOG4J2_FILES)
    )
    if theirs:
        logger.info("Spark logs with the log4j2 configuration given (not Spark's JSON layout)")
        return ()
    return (f"-Dlog4j2.configurationFile={SPARK_JSON_LOG4J}",)


def _structured_logging_as_configured(spark: SparkSession) -> None:
    """Spark's structured logging on or off in the driver JVM as the session's setting says
    (what spark-submit does for applications that are not shells): with it on, Spark's records
    carry their context (query and batch ids, ...) in ``context``."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        jvm.org.apache.spark.util.Utils.resetStructuredLogging(spark.sparkContext._jsc.sc().conf())
    except Exception as exc:  # noqa: BLE001 - another Spark: its records keep no context
        logger.debug("Spark's structured logging left as it was: %s", exc)


@contextlib.contextmanager
def _jvm_launch(*, ignore_stop_signals: bool, stdout_to_stderr: bool) -> Iterator[None]:
    """While pyspark launches its JVM:

    * ``ignore_stop_signals``: the JVM starts with SIGTERM and SIGINT ignored (pyspark itself
      ignores SIGINT there). HotSpot leaves a signal ignored at its start ignored, and the
      processes it starts inherit that. The driver's own handlers are untouched.
    * ``stdout_to_stderr``: the JVM's standard output is this process's standard error (JSON
      logs: what the JVM prints, it prints beside its records, not into the command's output).
    """
    if not ignore_stop_signals and not stdout_to_stderr:
        yield
        return
    try:
        stderr: int | None = sys.stderr.fileno()
    except (OSError, ValueError):  # a replaced sys.stderr (tests): the JVM's stdout stays
        stderr = None
    import pyspark.java_gateway as gateway

    names = vars(gateway)  # pyspark's module calls Popen by this name

    def preexec(before: Callable[[], Any] | None) -> Callable[[], None]:
        def run() -> None:
            if before is not None:
                before()
            for number in (signal.SIGTERM, signal.SIGINT):
                signal.signal(number, signal.SIG_IGN)

        return run

    with _LAUNCH_LOCK:  # one swap at a time: sessions created at once restore it in order
        launch = names["Popen"]

        def popen(*args: Any, **kwargs: Any) -> Any:
            if ignore_stop_signals:
                kwargs["preexec_fn"] = preexec(kwargs.get("preexec_fn"))
            if stdout_to_stderr and stderr is not None:
                kwargs.setdefault("stdout", stderr)
            return launch(*args, **kwargs)

        names["Popen"] = popen
        try:
            yield
        finally:
            names["Popen"] = launch


#: Held while pyspark's JVM launch is wrapped (:func:`_jvm_launch`).
_LAUNCH_LOCK = threading.Lock()


#: A JVM option choosing a garbage collector: the JVM refuses to start with two different ones.
_GC_CHOICE = re.compile(r"-XX:\+Use\w*GC\b")


def _lean(options: Sequence[str]) -> tuple[str, ...]:
    """:data:`LEAN_JVM`, without its collector when the user's options choose one (or may: a
    ``PYSPARK_SUBMIT_ARGS`` can name another properties file than the one read here)."""
    chosen = [*options, *(os.environ.get(name, "") for name in JAVA_OPTION_VARIABLES)]
    if os.environ.get("PYSPARK_SUBMIT_ARGS") or any(_GC_CHOICE.search(text) for text in chosen):
        return tuple(flag for flag in LEAN_JVM if not _GC_CHOICE.search(flag))
    return LEAN_JVM


#: deltaflow's modules for pyspark's search (Spark Connect and ``spark-pipelines`` sessions).
_OWN_MODULES = "pyspark_deltaflow"


def skip_static_source_lookup(spark: SparkSession, interpreters: Collection[str]) -> bool:
    """Spare Spark its search for pip-installed Python data sources when there is none but
    deltaflow's own (whose sources :func:`deltaflow.register` adds right after).

    The first time a session touches a Python data source, Spark starts a Python process that
    imports every top-level module named ``pyspark_*`` on its path and registers their
    ``DefaultSource`` (measured: 1.4 s of every deltaflow start, and over a CPU-second). When
    this interpreter finds no such module and Spark would run one of ``interpreters`` (this
    one, or the wrapper :func:`worker_python` made of it) for the search, the result is known to
    be empty: it is handed to Spark's ``DataSourceManager`` instead. Anything else (another
    interpreter or virtual environment, such a module present, a Spark without that field)
    leaves Spark to search as usual. Returns whether the search was spared.
    """
    from pkgutil import iter_modules

    # The interpreter Spark starts for the search, from the environment the JVM inherited. Paths
    # are compared as given: a virtual environment's python links to its base interpreter,
    # whose modules differ.
    python = os.environ.get("PYSPARK_DRIVER_PYTHON") or os.environ.get("PYSPARK_PYTHON") or "python3"
    found = shutil.which(python)
    if found is None or os.path.abspath(found) not in {os.path.abspath(p) for p in interpreters}:
        return False
    # Spark's search runs ``python -m``: the working directory is first on its path. deltaflow's
    # own modules (``pyspark_deltaflow*``) do not count: register() adds their sources anyway.
    found_modules = (m.name for m in iter_modules([os.getcwd(), *sys.path]))
    if any(n.startswith("pyspark_") and not n.startswith(_OWN_MODULES) for n in found_modules):
        return False
    try:
        jvm = spark._jvm
        assert jvm is not None
        manager = getattr(
            getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$"), "MODULE$"
        )
        if manager.dataSourceBuilders().isDefined():
            return False
        empty = getattr(getattr(jvm.scala.collection.immutable, "Map$"), "MODULE$").empty()
        getattr(manager, "dataSourceBuilders_$eq")(jvm.scala.Some(empty))
    except Exception as exc:  # noqa: BLE001 - a Spark without this field: it searches as usual
        logger.debug("Spark searches for static Python data sources itself: %s", exc)
        return False
    return True


def spark_defaults() -> dict[str, str]:
    """The settings of the ``spark-defaults.conf`` spark-submit reads (Java properties: ``key
    value``, ``key=value`` or ``key: value`` per line; ``#``/``!`` comments)."""
    from pyspark.find_spark_home import _find_spark_home

    folder = os.environ.get("SPARK_CONF_DIR") or os.path.join(_find_spark_home(), "conf")
    try:
        text = Path(folder, "spark-defaults.conf").read_text()
    except (OSError, UnicodeDecodeError):
        return {}
    settings = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        # The key ends at the first "=", ":" or blank; the value may hold any of them.
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)", line)
        if match:
            settings[match.group(1)] = match.group(2).strip()
    return settings


_WORKER_SCRIPT = """#!/bin/sh
# Written by deltaflow (deltaflow/session.py: worker_python). Spark starts Python workers
# with its pyspark.zip first on PYTHONPATH; this installation's pyspark holds the same code,
# compiled once. Dropping the archive saves compiling pyspark again in every worker process.
case "$PYTHONPATH" in
"{prefix}"|"{prefix}":*)
    PYTHONPATH="${{PYTHONPATH#"{prefix}"}}"
    PYTHONPATH="${{PYTHONPATH#:}}"
    export PYTHONPATH ;;
esac
# Every worker daemon (the data sources' too, which spark.python.daemon.module does not
# choose) is pyspark's, with the stop signals a whole process group gets kept ignored.
if [ "$1" = "-m" ] && [ "$2" = "pyspark.daemon" ]; then
    shift 2
    set -- -m {daemon} "$@"
fi
# A streaming source's planner ends without a traceback when its query's stop closes its socket.
if [ "$1" = "-m" ] && [ "$2" = "pyspark.sql.streaming.python_streaming_source_runner" ]; then
    shift 2
    set -- -m {runner} "$@"
fi
exec "{python}" "$@"
"""


def _wrapper_or_none(executable: str) -> Path | None:
    try:
        wrapper = _wrapper(executable)
    except (OSError, ImportError, ValueError):
        return None
    return wrapper[0] if wrapper else None


def _wrapper(executable: str) -> tuple[Path, str] | None:
    """Where :func:`worker_python`'s script for ``executable`` lives and what it says (None: no
    wrapper is safe here). Nothing is written or run."""
    import py4j
    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    package = Path(pyspark.__file__).parent
    home = Path(_find_spark_home())
    lib = home / "python" / "lib"
    archives = sorted(lib.glob("py4j-*-src.zip"))
    if home.resolve() != package.resolve() or len(archives) != 1 or ".zip" in str(py4j.__file__):
        return None
    prefix = f"{lib / 'pyspark.zip'}:{archives[0]}"
    if any(c in prefix + executable for c in '"$`\\\n'):
        return None
    text = _WORKER_SCRIPT.format(prefix=prefix, python=executable, daemon=WORKER_DAEMON, runner=SOURCE_RUNNER)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deltaflow"
    return cache / f"python-worker-{hashlib.sha256(text.encode()).hexdigest()[:16]}.sh", text


def worker_python(executable: str) -> str:
    """The interpreter to give Spark's local Python workers: ``executable`` behind a wrapper.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's) first on every Python
    worker's ``PYTHONPATH``. With pyspark installed from PyPI that archive is this very
    installation's code, but Python compiles modules imported from a zip each time a process
    starts (no ``.pyc`` cache): about 0.5 s more for every process Spark starts (each streaming
    query's source planner, the worker daemon, data source lookups), measured in BENCHMARKS.md.
    The wrapper, a two-line shell script in the user's cache directory, removes exactly those
    two archives from the front of ``PYTHONPATH`` and runs ``executable``.

    Returns ``executable`` itself whenever that is not known to be safe: ``SPARK_HOME`` names
    another Spark than the installed pyspark, py4j is not installed beside it, a path needs
    shell quoting, or the script cannot be written or run.
    """
    try:
        wrapper = _wrapper(executable)
        if wrapper is None:
            return executable
        script, text = wrapper
        cache = script.parent
        if not script.exists():
            cache.mkdir(parents=True, exist_ok=True)
            partial = script.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(text)
            partial.chmod(0o755)
            partial.replace(script)
        subprocess.run([str(script), "-c", "pass"], check=True, timeout=30, capture_output=True)
    except (OSError, ImportError, subprocess.SubprocessError, ValueError) as exc:
        logger.info("Python workers run %s directly (no import wrapper: %s)", executable, exc)
        return executable
    return str(script)


def default_parallelism(spark: SparkSession) -> int:
    """The cores Spark's tasks share (its default parallelism; the machine's cores where the
    session has no ``SparkContext``, as over Spark Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect: no SparkContext
        return os.cpu_count() or 1


def _connect_session(
    remote: str, master: str | None, conf: dict[str, Any], job: str | None = None
) -> SparkSession:
    """A Spark Connect session on ``remote``, with deltaflow's sources registered there (the
    server's master and JVM are its own: a master named here is not used).

    With ``job``, the session is the job's own on that server (its id derived from the job and
    the user) and outlives the client: the next run of the job takes it again, with its Python
    workers warm and the queries it left running (a client that died) in sight. The server
    keeps Python worker daemons per session and does not end them with the session, so a new
    session per run would add processes to a resident engine at every run.
    """
    from pyspark.sql import SparkSession

    if master:
        logger.warning(
            "Spark master %s not used: the work runs on the Spark Connect server %s", master, remote
        )

    wait_s = engine_wait_s()  # a bad DELTAFLOW_ENGINE_WAIT_S is refused before any call
    check_reachable(remote)
    settings = {k: v for k, v in default_conf("").items() if k.startswith("spark.sql.")}
    # A client that died leaves its query running in the server: the restarted client's start
    # of the same checkpoint stops that run (Spark's default, stated here for this session).
    settings["spark.sql.streaming.stopActiveRunOnRestart"] = "true"
    settings.update({k: str(v) for k, v in conf.items()})
    spark = None
    # A session the server ended (idle past its timeout) cannot be taken again: the job's next.
    for generation in range(SESSION_GENERATIONS if job is not None else 1):
        url = remote if job is None else _with_session_id(remote, f"{job}#{generation}")
        builder = SparkSession.builder.remote(url)
        for key, value in settings.items():
            builder = builder.config(key, value)
        try:
            spark = builder.getOrCreate()
        except Exception as exc:
            if job is None or "SESSION_CLOSED" not in str(exc):
                raise
            logger.info("the server closed session %d of job %r: taking the next", generation, job)
            continue
        break
    if spark is None:  # every generation closed: a session of its own
        return _connect_session(remote, None, conf, None)
    if job is not None:
        spark.release_session_on_close = False  # type: ignore[attr-defined]
    # pyspark warns "[RETRIES_EXCEEDED]" as it gives up; the job's error says what happened.
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")
    spark.client.set_retry_policies([engine_retries(remote, wait_s)])
    check_server(spark, remote)
    from deltaflow.metrics import metrics

    metrics.counts_commits = False  # the sinks commit in the server's Python workers
    from deltaflow.pipeline.api import register

    register(spark)
    logger.info("Spark %s session on the Spark Connect server %s", spark.version, remote)
    return spark


def engine_wait_s() -> float:
    """How long a job retries a Spark Connect server that stopped answering, in seconds:
    ``DELTAFLOW_ENGINE_WAIT_S``, else :data:`ENGINE_WAIT_S`."""
    text = os.environ.get("DELTAFLOW_ENGINE_WAIT_S")
    if not text:
        return ENGINE_WAIT_S
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"DELTAFLOW_ENGINE_WAIT_S must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:  # inf/nan: no bound to count waits up to
        raise ConfigError(f"DELTAFLOW_ENGINE_WAIT_S must be 0 or more seconds, got {text!r}")
    return value


_ENGINE_GONE = threading.Event()


def engine_gone() -> None:
    """The job gave up on its Spark Connect server: its later calls (pyspark's at exit) fail
    at once instead of retrying."""
    _ENGINE_GONE.set()


def engine_retries(remote: str, wait_s: float | None = None) -> Any:
    """pyspark's retry policy for calls to ``remote``, bounded to ``wait_s`` (default
    :func:`engine_wait_s`) and saying so. pyspark's own policy retries a server that stopped
    answering for over ten minutes without a word: a job whose engine went away mid-run sat
    silent that long, and so did its exit (pyspark's atexit handler calls the server too)."""
    import grpc  # type: ignore[import-untyped]
    from pyspark.sql.connect.client.retries import DefaultPolicy

    from deltaflow.pipeline.interrupts import stopping

    bound = engine_wait_s() if wait_s is None else wait_s
    # Waits of 0.5, 1, 2, 4 s, then 5 s each, until they add up to the bound.
    retries, total, step = 0, 0.0, 0.5
    while total < bound and step < 5.0:
        total += step
        retries += 1
        step = min(step * 2, 5.0)
    if total < bound:  # then 5 s each (counted, not looped: a large bound must not spin)
        retries += math.ceil((bound - total) / step)

    class EngineRetries(DefaultPolicy):
        def __init__(self) -> None:
            super().__init__(
                max_retries=retries,
                backoff_multiplier=2.0,
                initial_backoff=500,
                max_backoff=5000,
                max_server_retry_delay=int(max(bound, 0.5) * 1000),
            )
            self._said = -math.inf

        def can_retry(self, e: BaseException) -> bool:
            # Not after the job gave up on the engine, nor once it was asked to stop: a stop
            # signal would otherwise wait out the retries of a server that is gone.
            retry = bool(super().can_retry(e)) and not _ENGINE_GONE.is_set() and not stopping.is_set()
            code = e.code() if isinstance(e, grpc.RpcError) else None
            if retry and code == grpc.StatusCode.UNAVAILABLE and time.monotonic() - self._said >= 15:
                self._said = time.monotonic()
                logger.warning(
                    "the Spark Connect server %s does not answer: retrying for up to %.0f s "
                    "(DELTAFLOW_ENGINE_WAIT_S)",
                    remote,
                    bound,
                )
            return retry

    return EngineRetries()


def check_reachable(remote: str) -> None:
    """Raise :class:`~deltaflow.errors.EngineUnavailableError` unless something accepts a TCP
    connection at ``remote``'s host and port. pyspark's client retries its calls to a server
    that is not there for more than ten minutes without a word (its default retry policy): a
    job pointed at a stopped engine would hang silently instead of failing."""
    import socket

    from pyspark.sql.connect.client import DefaultChannelBuilder

    if not remote.startswith("sc://"):  # SPARK_REMOTE=local[...]: pyspark starts that server itself
        return
    builder = DefaultChannelBuilder(remote)
    host, port = builder.host.strip("[]"), int(builder.endpoint.rsplit(":", 1)[1])
    try:
        socket.create_connection((host, port), timeout=CONNECT_PROBE_S).close()
    except OSError as exc:
        raise EngineUnavailableError(
            f"no Spark Connect server answers at sc://{builder.endpoint} ({exc.strerror or exc}): "
            f"start one (deltaflow engine start --port {port}, as docs/DEPLOYMENT.md has it) or point "
            "--remote (SPARK_REMOTE) at a running one; retrying later may work",
            endpoint=builder.endpoint,
        ) from None


def start_query(stream: DataStreamWriter, spark: SparkSession, name: str) -> StreamingQuery:
    """``stream.start()``, once a query of the same ``name`` still running in this session is
    stopped: on a Spark Connect server, the one a client of the same job left when it died
    (its session outlives it). Called after the claim, so that query could not commit again."""
    for query in spark.streams.active:
        if query.name == name:
            logger.warning("stopping query %r (%s) that a previous client left running", name, query.id)
            query.stop()
    return stream.start()


def _with_session_id(remote: str, job: str) -> str:
    """``remote`` naming the job's own session (Spark Connect's ``session_id`` parameter)."""
    import getpass
    import uuid

    session = uuid.uuid5(uuid.NAMESPACE_URL, f"deltaflow:{getpass.getuser()}:{job}")
    base = remote if "/;" in remote else f"{remote.rstrip('/')}/"
    return f"{base};session_id={session}"


def check_server(spark: SparkSession, remote: str) -> None:
    """Raise :class:`~deltaflow.errors.EngineMismatchError` unless the Spark Connect server's
    Python workers import this very deltaflow version (its sources and batch functions run
    there): before anything is registered, claimed or written."""
    from pyspark.errors import PythonException

    from deltaflow import __version__
    from deltaflow.errors import EngineMismatchError

    # A job keeps its server session across runs (the session ends with the server): a check
    # that passed in it is not run again (a job's next runs skip its Python worker and job).
    if _checked_in_session(spark) == __version__:
        logger.debug("the server's workers run deltaflow %s (checked in this session before)", __version__)
        return
    try:
        found = server_version(spark)
    except PythonException as exc:  # a worker that cannot run Python's side at all (no pyarrow)
        found, where = None, f"its Python workers cannot run deltaflow's check ({_raised(exc)})"
    else:
        if found == __version__:
            try:
                spark.conf.set(CHECKED_CONF, __version__)
            except Exception:  # a server that forbids the setting: it checks at every run
                logger.debug("could not record the check in the server session", exc_info=True)
            logger.info("the Spark Connect server's Python workers run deltaflow %s", __version__)
            return
        where = (
            "its Python workers cannot import deltaflow"
            if found is None
            else f"its Python workers have deltaflow {found}"
        )
    raise EngineMismatchError(
        f"the Spark Connect server {remote} cannot run this deltaflow {__version__}: {where}. "
        f"Install deltaflow=={__version__} in the Python the server starts for its workers "
        "(PYSPARK_PYTHON in the server's environment), restart the server, and run again; "
        "nothing was written",
        remote=remote,
        expected=__version__,
        found=found,
    )


#: Session setting that records the deltaflow version the server's workers were found to run.
CHECKED_CONF = "spark.deltaflow.checkedVersion"


def _checked_in_session(spark: SparkSession) -> str | None:
    """The version a check of this server session found before (``None``: never checked)."""
    try:
        found = spark.conf.get(CHECKED_CONF, None)
    except Exception:  # noqa: BLE001 - an unreadable setting is no check: probe
        return None
    return str(found) if found else None


def _raised(error: BaseException) -> str:
    """The exception line of a Python worker's traceback (``ImportError: ...``) in ``error``."""
    import re

    from deltaflow.errors import brief

    lines = re.findall(r"^[A-Za-z_][\w.]*(?:Error|Exception)\b.*$", str(error), re.MULTILINE)
    return lines[-1].split(" SQLSTATE")[0].strip() if lines else brief(error)


def server_version(spark: SparkSession) -> str | None:
    """The deltaflow version a Spark session's Python workers import (``None``: none)."""

    def probe(batches: Iterator[Any]) -> Iterator[Any]:  # runs in a server worker: no deltaflow here
        import importlib.metadata

        import pyarrow as pa

        for _ in batches:
            pass
        try:
            import deltaflow

            version = getattr(deltaflow, "__version__", None) or importlib.metadata.version("deltaflow")
        except ImportError:
            version = ""
        yield pa.record_batch([pa.array([version])], names=["version"])

    rows = spark.range(1, numPartitions=1).mapInArrow(probe, "version string").collect()
    found = rows[0]["version"] if rows else ""
    return found or None

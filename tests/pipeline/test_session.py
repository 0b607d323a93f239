"""The Spark session factory: defaults, and the interpreter its local Python workers run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pyspark
import pytest

from deltaflow.pipeline.session import default_conf, worker_python

PACKAGE = Path(pyspark.__file__).parent
ROOT = Path(__file__).resolve().parents[2]
LIB = PACKAGE / "python" / "lib"


def _run(script: str, pythonpath: str) -> list[str]:
    code = "import os, pyspark; print(os.environ.get('PYTHONPATH', '')); print(pyspark.__file__)"
    env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run([script, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_worker_wrapper_drops_exactly_sparks_own_archives(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    script = worker_python(sys.executable)
    assert script != sys.executable and Path(script).parent == tmp_path / "deltaflow"
    (py4j_zip,) = LIB.glob("py4j-*-src.zip")
    spark_path = f"{LIB / 'pyspark.zip'}:{py4j_zip}"

    # What Spark gives a worker: its archives first, then its jar and the user's entries.
    path, module = _run(script, f"{spark_path}:/opt/extra:/opt/more")
    assert path == "/opt/extra:/opt/more"
    assert Path(module).parent == PACKAGE  # compiled site-packages code, not the zip
    (path, module) = _run(script, spark_path)
    assert path == "" and Path(module).parent == PACKAGE
    # Anything else is left as it is.
    other = f"/opt/extra:{spark_path}"
    assert _run(script, other)[0] == other
    assert _run(script, f"{spark_path}x")[0] == f"{spark_path}x"  # a prefix of another name

    assert worker_python(sys.executable) == script  # written once, reused


def test_no_wrapper_for_another_spark_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark-4.3.0-bin-hadoop3"))
    assert worker_python(sys.executable) == sys.executable
    assert not (tmp_path / "deltaflow").exists()


def test_no_wrapper_where_it_cannot_run(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache directory should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    assert worker_python(sys.executable) == sys.executable


def test_local_python_workers_import_pyspark_from_site_packages(spark):
    def where(_rows):
        import os as os_
        import sys as sys_

        import pyspark as pyspark_

        yield pyspark_.__file__, os_.environ.get("PYTHONPATH", ""), sys_.executable

    ((module, path, executable),) = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert Path(module).parent == PACKAGE, module
    assert "pyspark.zip" not in path
    assert Path(executable).resolve() == Path(sys.executable).resolve()
    assert default_conf("local[2]")["spark.pyspark.python"] == os.environ["PYSPARK_PYTHON"]


def _static_builders(spark) -> str:
    datasources = spark._jvm.org.apache.spark.sql.execution.datasources
    return str(getattr(getattr(datasources, "DataSourceManager$"), "MODULE$").dataSourceBuilders())


def test_no_search_for_static_data_sources_when_there_are_none(spark):
    """Spark's search for ``pyspark_*`` modules (a Python process at every start) was answered
    in-process: there are none on this interpreter's path."""
    assert _static_builders(spark) == "Some(Map())"
    assert "event_type" in spark.readStream.format("deltaflow-generator").load().columns  # ours are there


def test_a_pip_installed_static_data_source_is_still_found(tmp_path):
    """With a ``pyspark_*`` module on the path, Spark searches as usual and registers it."""
    (tmp_path / "pyspark_dfprobe.py").write_text(
        textwrap.dedent(
            """
            from pyspark.sql.datasource import DataSource, DataSourceReader

            class _Reader(DataSourceReader):
                def read(self, partition):
                    yield (42,)

            class DefaultSource(DataSource):
                @classmethod
                def name(cls):
                    return "dfprobe"

                def schema(self):
                    return "x INT"

                def reader(self, schema):
                    return _Reader()
            """
        )
    )
    code = textwrap.dedent(
        """
        import deltaflow
        spark = deltaflow.spark_session("local[1]")
        print(spark.read.format("dfprobe").load().collect()[0].x)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["42"]


def test_the_lean_jvm_leaves_a_collector_the_user_chose(monkeypatch):
    """Two different collectors stop the JVM from starting: the user's choice wins."""
    from deltaflow.pipeline.session import LEAN_JVM, _lean

    for name in ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS"):
        monkeypatch.delenv(name, raising=False)
    assert _lean(["", "-Dx=1"]) == LEAN_JVM == ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
    assert _lean(["-XX:+UseG1GC -Xlog:gc", ""]) == ("-XX:TieredStopAtLevel=1",)
    assert _lean(["", "-XX:+UseParallelGC"]) == ("-XX:TieredStopAtLevel=1",)
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-XX:+UseZGC")
    assert _lean(["", ""]) == ("-XX:TieredStopAtLevel=1",)


def test_json_logs_use_spark_s_json_layout_unless_log4j2_is_configured(tmp_path, monkeypatch):
    """Spark's own JSON profile from the JVM's first line; a log4j2 configuration of the user's
    (an option, a variable, a file in Spark's conf folder) stays theirs."""
    from deltaflow.pipeline.session import SPARK_JSON_LOG4J, _json_log4j

    for name in ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("LOG4J_CONFIGURATION_FILE", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    (tmp_path / "log4j2.properties.template").write_text("")  # Spark's distributions ship one
    assert _json_log4j(["", "-Dx=1"]) == (f"-Dlog4j2.configurationFile={SPARK_JSON_LOG4J}",)
    assert _json_log4j(["-Dlog4j.configurationFile=mine.xml", ""]) == ()
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Dlog4j2.configurationFile=mine.xml")
    assert _json_log4j(["", ""]) == ()
    monkeypatch.delenv("JAVA_TOOL_OPTIONS")
    (tmp_path / "log4j2.properties").write_text("rootLogger.level = warn\n")
    assert _json_log4j(["", ""]) == ()
    # The profile is Spark's own, in the jars of this pyspark.
    profiles = []
    for path in (Path(pyspark.__file__).parent / "jars").glob("spark-common-utils*.jar"):
        with zipfile.ZipFile(path) as jar:
            if SPARK_JSON_LOG4J in jar.namelist():
                profiles.append(jar.read(SPARK_JSON_LOG4J).decode())
    assert len(profiles) == 1 and "JsonTemplateLayout" in profiles[0]


class _Manager:
    def __init__(self) -> None:
        self.set_to = None

    def dataSourceBuilders(self):  # noqa: N802 - Spark's name
        return type("Option", (), {"isDefined": lambda _self: False})()


def _fake_spark(manager: _Manager):
    """Just enough of py4j's view of Spark's ``DataSourceManager`` for the decision."""
    from types import SimpleNamespace

    manager_class = SimpleNamespace(**{"MODULE$": manager})
    datasources = SimpleNamespace(**{"DataSourceManager$": manager_class})
    setattr(manager, "dataSourceBuilders_$eq", lambda value: setattr(manager, "set_to", value))
    empty_map = SimpleNamespace(**{"MODULE$": SimpleNamespace(empty=lambda: "Map()")})
    immutable = SimpleNamespace(**{"Map$": empty_map})
    sql = SimpleNamespace(execution=SimpleNamespace(datasources=datasources))
    jvm = SimpleNamespace(
        org=SimpleNamespace(apache=SimpleNamespace(spark=SimpleNamespace(sql=sql))),
        scala=SimpleNamespace(
            Some=lambda value: ("Some", value), collection=SimpleNamespace(immutable=immutable)
        ),
    )
    return SimpleNamespace(_jvm=jvm)


def test_the_search_is_spared_only_for_this_interpreter_or_its_wrapper(tmp_path, monkeypatch):
    from deltaflow.pipeline.session import _wrapper, skip_static_source_lookup

    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    wrapper = _wrapper(sys.executable)
    ours = {sys.executable, *([str(wrapper[0])] if wrapper else [])}
    for python in sorted(ours):
        if not os.access(python, os.X_OK):
            continue  # the wrapper is written at the first session start
        monkeypatch.setenv("PYSPARK_PYTHON", python)
        manager = _Manager()
        assert skip_static_source_lookup(_fake_spark(manager), ours)
        assert manager.set_to == ("Some", "Map()")
    # Another interpreter (the virtual environment's base one): Spark searches itself.
    base = os.path.realpath(sys.executable)
    assert base != sys.executable  # the suite runs in a virtual environment
    monkeypatch.setenv("PYSPARK_PYTHON", base)
    assert not skip_static_source_lookup(_fake_spark(_Manager()), ours)
    # A pyspark_* module in the working directory: Spark would find it.
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    (tmp_path / "pyspark_here.py").write_text("")
    manager = _Manager()
    assert not skip_static_source_lookup(_fake_spark(manager), ours) and manager.set_to is None


def test_a_remote_where_no_server_listens_fails_at_once(tmp_path):
    """pyspark's client would retry a server that is not there for over ten minutes, silently
    (and again at exit): the job says so at once, with the transient exit code."""
    from deltaflow.testing import _free_port

    port = _free_port()  # nothing listens there
    job = ["ingest", "t", str(tmp_path / "t"), "--kafka", "127.0.0.1:1", "--app_id", "x", "-e"]
    done = subprocess.run(
        [sys.executable, "-m", "deltaflow.cli", *job, "--remote", f"sc://127.0.0.1:{port}/;token=s3cret"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith(f"error: no Spark Connect server answers at sc://127.0.0.1:{port} ("), said
    assert f"deltaflow engine start --port {port}" in said and "s3cret" not in done.stderr
    assert not (tmp_path / "t").exists()


def test_a_local_remote_is_not_probed():
    # SPARK_REMOTE=local[...] has pyspark start the server itself: nothing listens before it.
    from deltaflow.pipeline.session import check_reachable

    assert check_reachable("local[2]") is None


def test_calls_to_a_server_that_stopped_answering_are_retried_for_a_bounded_time(monkeypatch):
    # pyspark's own policy retries UNAVAILABLE for over ten minutes; deltaflow's says so and
    # stops after DELTAFLOW_ENGINE_WAIT_S, and not at all once the job gave up on the engine.
    import grpc

    from deltaflow.errors import ConfigError
    from deltaflow.pipeline import session

    class Unavailable(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

    def waits(policy) -> float:
        state, total = policy.to_state(), 0.0
        while (wait := state.next_attempt()) is not None:
            total += wait / 1000
        return total

    monkeypatch.setenv("DELTAFLOW_ENGINE_WAIT_S", "20")
    policy = session.engine_retries("sc://h:1")
    assert policy.can_retry(Unavailable()) and not policy.can_retry(ValueError())
    assert 20 <= waits(policy) <= 20 + 5 + 0.5 * policy.max_retries  # (jitter: up to 0.5 s a wait)
    monkeypatch.delenv("DELTAFLOW_ENGINE_WAIT_S")
    assert 60 <= waits(session.engine_retries("sc://h:1")) <= 60 + 5 + 0.5 * 20
    monkeypatch.setenv("DELTAFLOW_ENGINE_WAIT_S", "soon")
    with pytest.raises(ConfigError, match="DELTAFLOW_ENGINE_WAIT_S must be a number"):
        session.engine_retries("sc://h:1")
    # A Connect session refuses it before it calls anything (nothing listens on port 1).
    with pytest.raises(ConfigError, match="DELTAFLOW_ENGINE_WAIT_S must be a number"):
        session._connect_session("sc://127.0.0.1:1", None, {})
    monkeypatch.setattr(session, "_ENGINE_GONE", session.threading.Event())
    policy = session.engine_retries("sc://h:1", 20)
    session.engine_gone()
    assert not policy.can_retry(Unavailable())


@pytest.mark.parametrize("value", ["inf", "1e300", "nan"])
def test_a_wait_without_end_is_refused_not_looped_on(value):
    # DELTAFLOW_ENGINE_WAIT_S=inf ("wait for ever") or a huge number made engine_retries count
    # its waits for ever (100% CPU, the job never started); nan escaped as a ValueError
    # traceback. Each must be a ConfigError (or a bounded policy), at once.
    import subprocess
    import sys

    code = (
        "from deltaflow.errors import ConfigError\n"
        "from deltaflow.pipeline.session import engine_retries\n"
        "try:\n    engine_retries('sc://h:1')\nexcept ConfigError as exc:\n    print('refused', exc)\n"
        "else:\n    print('bounded')\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "DELTAFLOW_ENGINE_WAIT_S": value},
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"DELTAFLOW_ENGINE_WAIT_S={value}: engine_retries did not return in 20 s")
    assert done.returncode == 0 and done.stdout.startswith(("refused", "bounded")), done.stderr[-2000:]


def test_a_local_session_keeps_hadoop_s_chmod_warning_of_a_stop_out(spark):
    """A stop interrupts the chmod Hadoop runs for each checkpoint file: its WARN with a Java
    trace stays out for the session's life."""
    manager = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager
    assert str(manager.getLogger("org.apache.hadoop.util.Shell").getLevel()) == "ERROR"

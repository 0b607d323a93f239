"""The driver JVM's class-data sharing archive: made only by a JVM that exited cleanly, then mapped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deltaflow.pipeline.class_cache import ENV_VAR, ClassCache, class_cache
from deltaflow.pipeline.session import spark_defaults


def test_off_by_environment_or_when_the_options_name_an_archive(tmp_path, monkeypatch):
    assert class_cache({}, cache_dir=tmp_path) is not None
    monkeypatch.setenv(ENV_VAR, "off")
    assert class_cache({}, cache_dir=tmp_path) is None
    monkeypatch.delenv(ENV_VAR)
    for flag in ("-Xshare:off", "-XX:SharedArchiveFile=/x.jsa", "-XX:ArchiveClassesAtExit=/y.jsa"):
        assert class_cache({"spark.driver.extraJavaOptions": f"-Xmx1g {flag}"}, cache_dir=tmp_path) is None


def test_another_installation_of_the_same_jars_has_an_archive_of_its_own(tmp_path, monkeypatch):
    # A JVM refuses an archive made with another class path, and then starts slower than
    # without one: two virtualenvs with the same pyspark must not share an archive.
    names = []
    for home in (tmp_path / "venv-a", tmp_path / "venv-b"):
        (home / "jars").mkdir(parents=True)
        (home / "jars" / "spark-core.jar").write_bytes(b"same")
        monkeypatch.setenv("SPARK_HOME", str(home))
        cache = class_cache({}, cache_dir=tmp_path / "cache")
        assert cache is not None
        names.append(cache.archive.name)
    assert names[0] != names[1]


def test_no_archive_where_spark_would_split_its_path(tmp_path):
    # Spark splits spark.driver.extraJavaOptions at blanks: such a path would break the JVM.
    assert class_cache({}, cache_dir=tmp_path / "my cache") is None
    assert class_cache({}, cache_dir=tmp_path / "it's") is None


def test_spark_defaults_are_read_as_java_properties(tmp_path, monkeypatch):
    (tmp_path / "spark-defaults.conf").write_text(
        "# comment\n! also a comment\n\n"
        "spark.driver.extraJavaOptions   -Da=1 -Db=x:y\n"
        "spark.executor.memory=2g\n"
        "spark.app.name: my app\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert spark_defaults() == {
        "spark.driver.extraJavaOptions": "-Da=1 -Db=x:y",
        "spark.executor.memory": "2g",
        "spark.app.name": "my app",
    }
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "none"))
    assert spark_defaults() == {}


def test_one_archive_per_class_path_written_once_then_mapped(tmp_path):
    first = class_cache({}, cache_dir=tmp_path)
    assert first is not None and first.writes
    assert first.java_options()[0] == f"-XX:ArchiveClassesAtExit={first.partial}"
    assert first.partial.name.startswith(f"{first.archive.stem}.{os.getpid()}-")
    assert ClassCache(first.archive, writes=True).partial != first.partial  # a token of its own
    other = class_cache({"spark.driver.extraClassPath": "/opt/extra.jar"}, cache_dir=tmp_path)
    assert other is not None and other.archive != first.archive
    first.archive.write_bytes(b"archive")
    again = class_cache({}, cache_dir=tmp_path)
    assert again is not None and not again.writes and again.archive == first.archive
    assert f"-XX:SharedArchiveFile={first.archive}" in again.java_options()
    assert "-Xshare:auto" in again.java_options()


def _fake_jvm(partial: Path, status: int) -> subprocess.Popen[bytes]:
    """A process that, like pyspark's gateway JVM, ends at the end of its input and writes its
    archive on the way out."""
    write = f"open({str(partial)!r}, 'wb').write(b'c' * 2_000_000)"
    code = f"import sys; sys.stdin.read(); {write}; sys.exit({status})"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


def test_the_archive_is_published_only_after_a_clean_exit(tmp_path):
    cache = ClassCache(tmp_path / "spark-classes-k.jsa", writes=True)
    cache.finish(_fake_jvm(cache.partial, status=0))
    assert cache.archive.stat().st_size == 2_000_000 and not cache.partial.exists()

    failed = ClassCache(tmp_path / "spark-classes-f.jsa", writes=True)
    failed.finish(_fake_jvm(failed.partial, status=1))  # it may be cut short: never mapped
    assert not failed.archive.exists() and not failed.partial.exists()


def test_tidying_drops_abandoned_partials_and_old_archives(tmp_path):
    old = time.time() - 3600
    gone = tmp_path / "spark-classes-a.999999999.partial"  # no such process
    running = tmp_path / f"spark-classes-a.{os.getpid()}.partial"
    fresh = tmp_path / "spark-classes-b.999999998.partial"
    for path in (gone, running, fresh):
        path.write_bytes(b"x")
    for path in (gone, running):
        os.utime(path, (old, old))
    archives = [tmp_path / f"spark-classes-{i}.jsa" for i in range(4)]
    for i, path in enumerate(archives):
        path.write_bytes(b"x")
        os.utime(path, (old + i, old + i))
    cache = class_cache({}, cache_dir=tmp_path)
    assert cache is not None
    assert not gone.exists() and running.exists() and fresh.exists()
    # The two newest archives of other installations stay; the current one is not made yet.
    assert [p.exists() for p in archives] == [False, False, True, True]


_SESSION = """
import sys
import deltaflow
spark = deltaflow.spark_session(jvm=sys.argv[1])
assert spark.range(1000).selectExpr("sum(id)").first()[0] == 499500
# spark-defaults.conf's Java options reach the JVM beside deltaflow's.
assert str(spark._jvm.java.lang.System.getProperty("deltaflow.test")) == sys.argv[2]
options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
spark.stop()
# pyspark keeps the JVM after a stop: a new session adds no JVM flags (they would not apply);
# its conf shows the flags the JVM really has.
again = deltaflow.spark_session(jvm="lean" if sys.argv[1] == "full" else "full")
assert again.sparkContext.getConf().get("spark.driver.extraJavaOptions") == options, "flags claimed"
print(options)
"""


@pytest.mark.timeout(300)
def test_a_real_driver_jvm_writes_the_archive_and_the_next_one_maps_it(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "SPARK_CONF_DIR": str(conf)}
    env.pop(ENV_VAR, None)
    folder = tmp_path / "deltaflow" / "jvm"

    def run(jvm: str = "full", prop: str = "None") -> str:
        out = subprocess.run(
            [sys.executable, "-c", _SESSION, jvm, prop], env=env, capture_output=True, text=True, timeout=240
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.strip().splitlines()[-1]

    options = run()
    assert "-XX:ArchiveClassesAtExit=" in options and "TieredStopAtLevel" not in options
    (archive,) = folder.glob("*.jsa")
    assert archive.stat().st_size > 10_000_000 and not list(folder.glob("*.partial"))
    options = run(jvm="lean")  # and the lean profile: all are JVM flags deltaflow adds
    assert f"-XX:SharedArchiveFile={archive}" in options
    assert "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" in options
    assert list(folder.glob("*.jsa")) == [archive]

    # A spark-defaults.conf's Java options are kept beside deltaflow's. Its folder is on the
    # class path and not empty: the JVM would refuse to archive, so no archive is used.
    (conf / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Ddeltaflow.test=kept\n")
    options = run(jvm="lean", prop="kept")
    assert "-Ddeltaflow.test=kept" in options and "-XX:TieredStopAtLevel=1" in options
    assert "Archive" not in options and not list(folder.glob("*.partial"))


def test_no_archive_for_a_jvm_without_compressed_object_pointers(tmp_path, monkeypatch):
    """Such a JVM refuses an archive written with them (and starts slower than without one)."""
    for name in ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS", ENV_VAR):
        monkeypatch.delenv(name, raising=False)
    assert class_cache({"spark.driver.memory": "2g"}, cache_dir=tmp_path) is not None
    for settings in (
        {"spark.driver.memory": "32g"},
        {"spark.driver.memory": "40000m"},
        {"spark.driver.extraJavaOptions": "-XX:+UseZGC"},
        {"spark.driver.defaultJavaOptions": "-XX:-UseCompressedOops"},
    ):
        assert class_cache(settings, cache_dir=tmp_path) is None, settings
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:+UseZGC")
    assert class_cache({}, cache_dir=tmp_path) is None

"""``deltaflow.sources.streams``: each stream holds a registration of its own."""

from __future__ import annotations

import threading

from pyspark.sql.datasource import DataSourceRegistration

from deltaflow.sources.file_listing import FileListingDataSource
from deltaflow.sources.streams import load_stream


def _environment_id(spark, df) -> int:
    """Which ``envVars`` map the stream of ``df`` holds: its registration's (Spark's internals:
    the query's start writes to it, ``PythonStreamingSourceRunner.init``)."""
    table = df._jdf.logicalPlan().table()
    field = table.getClass().getDeclaredField("ds")
    field.setAccessible(True)
    environment = field.get(table).source().dataSourceCls().envVars()
    return spark._jvm.java.lang.System.identityHashCode(environment)


def test_a_registration_made_while_a_stream_loads_is_not_the_one_it_holds(spark, tmp_path, monkeypatch):
    # The first load registers, then waits (up to 2 s) for the second load to be done: the
    # second must wait for the first instead, or both streams hold the second registration,
    # and their queries starting at once can corrupt its environment (OptionalDataException).
    original = DataSourceRegistration.register
    registered, second_loaded = threading.Event(), threading.Event()
    first = threading.current_thread()

    def register(self, source):
        original(self, source)
        if threading.current_thread() is first:
            registered.set()
            second_loaded.wait(2)

    monkeypatch.setattr(DataSourceRegistration, "register", register)

    def load(name: str):
        options = {"path": str(tmp_path), "checkpoint": str(tmp_path / name)}
        return load_stream(spark, FileListingDataSource, options)

    loaded = {}

    def second() -> None:
        registered.wait(10)
        loaded["second"] = load("second")
        second_loaded.set()

    thread = threading.Thread(target=second)
    thread.start()
    loaded["first"] = load("first")
    thread.join(30)
    assert _environment_id(spark, loaded["first"]) != _environment_id(spark, loaded["second"])

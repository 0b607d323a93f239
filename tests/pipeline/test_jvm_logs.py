"""``pipeline.jvm_logs``: Spark's JVM loggers set for a while, then as they were."""

from __future__ import annotations

import logging

import pytest

from deltaflow.pipeline import jvm_logs


def _log4j(spark):
    return spark.sparkContext._jvm.org.apache.logging.log4j


def _own(spark, name: str) -> str | None:
    """The logger's own level in the configuration, ``None`` without one."""
    own = _log4j(spark).core.LoggerContext.getContext(False).getConfiguration().getLoggers()
    return str(own.get(name).getLevel()) if own.containsKey(name) else None


def _effective(spark, name: str) -> str:
    return str(_log4j(spark).LogManager.getLogger(name).getLevel())


def test_a_logger_without_a_level_of_its_own_follows_its_parents_again_after(spark):
    name = "org.deltaflow.test.jvm_logs.plain"
    root = _effective(spark, "")
    assert _own(spark, name) is None
    with jvm_logs.levels_for_a_while({name: "OFF"}):
        assert (_own(spark, name), _effective(spark, name)) == ("OFF", "OFF")
    # No level of its own: the root's level (setLogLevel's) reaches it again.
    assert _own(spark, name) is None
    assert _effective(spark, name) == root
    log4j = _log4j(spark)
    log4j.core.config.Configurator.setLevel(name.rsplit(".", 1)[0], log4j.Level.DEBUG)
    try:
        assert _effective(spark, name) == "DEBUG"  # a parent's level reaches it too
    finally:
        log4j.core.LoggerContext.getContext(False).getConfiguration().removeLogger(name.rsplit(".", 1)[0])
        log4j.core.LoggerContext.getContext(False).updateLoggers()


def test_a_logger_with_a_level_of_its_own_gets_it_back(spark):
    name = "org.deltaflow.test.jvm_logs.own"
    log4j = _log4j(spark)
    log4j.core.config.Configurator.setLevel(name, log4j.Level.INFO)
    try:
        with jvm_logs.levels_for_a_while({name: "ERROR"}):
            assert _own(spark, name) == "ERROR"
        assert _own(spark, name) == "INFO"
    finally:
        log4j.core.LoggerContext.getContext(False).getConfiguration().removeLogger(name)
        log4j.core.LoggerContext.getContext(False).updateLoggers()


def test_the_levels_come_back_when_the_block_fails(spark):
    name = "org.deltaflow.test.jvm_logs.failing"
    with pytest.raises(RuntimeError), jvm_logs.levels_for_a_while({name: "OFF"}):
        raise RuntimeError("the block's own failure")
    assert _own(spark, name) is None


def test_without_a_jvm_in_the_process_nothing_is_set(monkeypatch):
    """Over Spark Connect this process has no JVM: nothing to set, nothing to put back."""
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_jvm", None)
    assert jvm_logs.set_levels({"org.deltaflow.test.jvm_logs.none": "OFF"}) is None
    jvm_logs.put_back(None)
    with jvm_logs.levels_for_a_while({"org.deltaflow.test.jvm_logs.none": "OFF"}):
        pass


def test_a_jvm_gone_before_the_put_back_is_passed_over(caplog):
    """At the process's end the gateway may be closed: the put back says so at DEBUG, no more."""
    from py4j.protocol import Py4JNetworkError

    class _Gone:
        def __getattr__(self, _name):
            raise Py4JNetworkError("the gateway is closed")

    with caplog.at_level(logging.DEBUG, logger="deltaflow.pipeline.jvm_logs"):
        jvm_logs.put_back(jvm_logs.Levels(_Gone(), {"org.deltaflow.test.jvm_logs.gone": None}))
    assert "not put back" in caplog.text


def test_a_jvm_that_fails_part_way_keeps_what_it_set_for_the_put_back(spark, monkeypatch):
    """Setting a level is best effort: a failure part-way is passed over (the stop around it goes
    on), and the loggers set before it are still put back."""
    from types import SimpleNamespace

    from pyspark import SparkContext

    log4j = _log4j(spark)
    first, second = "org.deltaflow.test.jvm_logs.first", "org.deltaflow.test.jvm_logs.second"

    def set_level(name, level):
        if name == second:
            raise RuntimeError("the gateway is closed")
        log4j.core.config.Configurator.setLevel(name, level)

    # The JVM's log4j, but for a Configurator that fails on the second logger.
    failing = SimpleNamespace(
        Level=log4j.Level,
        core=SimpleNamespace(
            LoggerContext=log4j.core.LoggerContext,
            config=SimpleNamespace(Configurator=SimpleNamespace(setLevel=set_level)),
        ),
    )
    jvm = SimpleNamespace(org=SimpleNamespace(apache=SimpleNamespace(logging=SimpleNamespace(log4j=failing))))
    monkeypatch.setattr(SparkContext, "_jvm", jvm)
    replaced = jvm_logs.set_levels({first: "OFF", second: "OFF"})
    assert replaced is not None and first in replaced.before
    assert _own(spark, first) == "OFF"
    jvm_logs.put_back(replaced)
    assert _own(spark, first) is None

"""A SparkSession with defaults that suit streaming into Delta tables."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

from deltaflow.exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "default_conf", "spark_session"]

logger = logging.getLogger(__name__)

#: The embedded default: every core of this machine, in one JVM.
DEFAULT_MASTER = "local[*]"


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


def spark_session(master: str | None = None, **conf: Any) -> SparkSession:
    """Get or create a SparkSession for deltaflow, with the ``deltaflow`` format registered.

    Args:
        master: Any Spark master URL; defaults to ``$DELTAFLOW_SPARK_MASTER`` or ``local[*]``.
        **conf: Spark settings (``**{"spark.executor.memory": "4g"}``); they win over the
            defaults of :func:`default_conf`.

    Raises:
        ConfigError: when no Java runtime can be found.
    """
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
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = default_conf(master or "")
    if submitted:  # spark-submit's own settings (executor Python, memory) are the user's
        for key in ("spark.pyspark.python", "spark.pyspark.driver.python", "spark.driver.memory"):
            settings.pop(key)
    settings.update({k: str(v) for k, v in conf.items()})
    builder = SparkSession.builder.appName(settings.pop("spark.app.name", "deltaflow"))
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("DELTAFLOW_SPARK_LOG_LEVEL", "WARN"))
    from deltaflow.api import register

    register(spark)
    logger.info("Spark %s session on %s", spark.version, spark.sparkContext.master)
    return spark

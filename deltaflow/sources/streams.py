"""Streams of deltaflow's Python data sources, each with a registration of its own.

Spark's stream of a Python data source (``PythonStreamingSourceRunner.init``, when its query
starts) puts four entries (``SPARK_LOCAL_DIRS``, ``SPARK_AUTH_SOCKET_TIMEOUT``,
``SPARK_BUFFER_SIZE``, ``SPARK_PYTHON_RUNTIME``) into the environment of the registration it was
loaded from: ``UserDefinedPythonDataSource.dataSourceCls.envVars``, a ``java.util.HashMap``
shared by every stream loaded from that registration, without a lock. Two queries of one
registration that start at once (:func:`deltaflow.service.daemon.run_pipelines` starts its
pipelines in parallel threads) can insert into it at the same time; the map then counts an entry
it lost (``size()`` 6, 5 entries), and every task that carries it from then on fails to
deserialize on the executor (``java.io.OptionalDataException`` in ``HashMap.readObject``): every
query of that registration in the application fails, and for good.

:func:`load_stream` registers the source and loads the stream under one lock: a registration
makes a new map, and ``load()`` resolves the registration (Spark looks the name up when it asks
the source for its schema), so each stream holds a map that only its own query's start writes.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.datasource import DataSource

__all__ = ["load_stream"]

_REGISTER_AND_LOAD = threading.Lock()


def load_stream(spark: SparkSession, source: type[DataSource], options: Mapping[str, str]) -> DataFrame:
    """``spark.readStream.format(source.name()).options(**options).load()``, from a registration
    of ``source`` that no other stream shares (see the module's documentation).

    No schema is given to the reader: with one, Spark would not ask the source for it, and would
    look the registration up later, outside the lock.
    """
    with _REGISTER_AND_LOAD:
        spark.dataSource.register(source)
        return spark.readStream.format(source.name()).options(**options).load()

"""Found by pyspark in every session (it registers the ``DefaultSource`` of each installed module
named ``pyspark_*``), Spark Connect and Spark Declarative Pipelines included: the ``deltaflow``
sink, without a ``deltaflow.register(spark)`` call."""

from deltaflow.sinks.datasource import DeltaflowDataSource as DefaultSource

__all__ = ["DefaultSource"]

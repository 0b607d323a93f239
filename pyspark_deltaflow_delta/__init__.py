"""Found by pyspark in every session (see ``pyspark_deltaflow``): the ``deltaflow-delta`` source (a Delta table, streaming and batch)."""

from deltaflow.sources.delta import DeltaTableDataSource as DefaultSource

__all__ = ["DefaultSource"]

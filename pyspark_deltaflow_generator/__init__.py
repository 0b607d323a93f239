"""Found by pyspark in every session (see ``pyspark_deltaflow``): the ``deltaflow-generator`` source."""

from deltaflow.sources.generator import GeneratorDataSource as DefaultSource

__all__ = ["DefaultSource"]

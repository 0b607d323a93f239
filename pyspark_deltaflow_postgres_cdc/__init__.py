"""Found by pyspark in every session (see ``pyspark_deltaflow``): the ``postgres-cdc`` source."""

from deltaflow.sources.postgres_cdc import PostgresCdcDataSource as DefaultSource

__all__ = ["DefaultSource"]

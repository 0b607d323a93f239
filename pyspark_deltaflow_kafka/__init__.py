"""Found by pyspark in every session (see ``pyspark_deltaflow``): the ``deltaflow-kafka`` source."""

from deltaflow.sources.kafka import KafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]

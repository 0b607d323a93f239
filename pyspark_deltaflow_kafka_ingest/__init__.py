"""Found by pyspark in every session (see ``pyspark_deltaflow``): the ``deltaflow-kafka-ingest`` source (the Arrow ingest path)."""

from deltaflow.sources.kafka_ingest import KafkaIngestDataSource as DefaultSource

__all__ = ["DefaultSource"]

"""Streaming sources for Spark that need no JVM jar."""

from deltaflow.sources.kafka import KafkaDataSource, KafkaSourceOptions

__all__ = ["KafkaDataSource", "KafkaSourceOptions"]

"""``deltaflow.config.ingest``: the options of ``deltaflow ingest`` as one frozen model."""

from __future__ import annotations

import pytest

from deltaflow.config.ingest import IngestConfig
from deltaflow.errors import ConfigError

BASE = {"topic": "t", "table_uri": "/tmp/t", "pipeline_id": "p"}


def test_app_id_is_the_pipeline_id_and_the_model_is_frozen():
    config = IngestConfig.build(topic="t", table_uri="/tmp/t", app_id="orders")
    assert config.pipeline_id == "orders"
    assert config.sink_options(None).pipeline_id == "orders"
    assert config.dlq_options("/c") is None
    with pytest.raises(ValueError, match="frozen"):
        config.topic = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"pipeline_id": "bad id"}, "pipeline_id: must be 1-128 letters"),
        (
            {"auto_offset_reset": "oldest"},
            "auto_offset_reset: must be one of 'earliest' or 'latest' (received 'oldest')",
        ),
        (
            {"max_messages_per_batch": -1},
            "max_messages_per_batch: Input should be greater than or equal to 0 (received -1)",
        ),
        ({"value_format": "avro"}, "Avro values need --avro"),
        ({"dlq_table_location": "/tmp/t/"}, "--dlq-table-location must be another table than the main one"),
        ({"dlq_transforms": ("a: kafka.offset",)}, "--dlq-transform needs --dlq-table-location"),
        ({"transforms": ("x: lower(y)",)}, "transform source 'lower(y)' is not understood"),
        ({"commit_to_group": True}, "needs --consumer-group-id"),
        ({"colour": "red"}, "colour: unknown option"),
        ({"key_columns": ("id",)}, "--key_columns names a mirror's key: it needs --cdc debezium"),
        ({"cdc": "debezium", "transforms": ("a: kafka.offset",)}, "--transform (a mirror's columns"),
        ({"cdc": "debezium", "value_format": "raw"}, "--raw is not available with --cdc debezium"),
        ({"cdc": "debezium", "engine": "spark"}, "--engine spark is not available with --cdc debezium"),
        ({"cdc": "debezium", "value_schema": "id INT"}, "--schema (the columns come from the change events)"),
        ({"cdc": "maxwell"}, "cdc: must be one of 'none' or 'debezium'"),
        ({"cdc_mode": "append"}, "--cdc_mode and --cdc_errors apply to --cdc debezium"),
        (
            {"cdc": "debezium", "cdc_errors": "dead_letter"},
            "--cdc_errors dead_letter needs --dlq_table_location",
        ),
        (
            {"cdc": "debezium", "value_format": "avro", "avro": "x.avsc"},
            "--avro other than a schema registry URL",
        ),
        ({"cdc": "debezium", "cdc_mode": "append", "key_columns": ("id",)}, "--cdc_mode append keeps every"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_bad_options_are_refused_naming_the_option_and_the_value(values, message):
    with pytest.raises(ConfigError) as info:
        IngestConfig.build(**{**BASE, **values})
    assert message in str(info.value)


def test_kafka_settings_are_secrets():
    config = IngestConfig.build(**BASE, kafka_settings={"sasl.password": "hunter2", "acks": "all"})
    assert "hunter2" not in repr(config)
    assert config.kafka_conf == {"sasl.password": "hunter2", "acks": "all"}
    with pytest.raises(ConfigError) as info:
        IngestConfig.build(**BASE, kafka_settings={"sasl.password": 7.5j})
    assert "7.5j" not in str(info.value) and "**********" in str(info.value)

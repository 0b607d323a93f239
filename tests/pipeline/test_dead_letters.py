"""``deltaflow.pipeline.dead_letters``: the dead-letter rows the Spark engine makes."""

from __future__ import annotations

import base64

import pytest

from deltaflow.pipeline.dead_letters import INGEST_META, ingest_letters

#: No JSON (cut short), and longer than 57 bytes: Spark's base64 breaks its text into lines of
#: 76 characters.
LONG = b'{"id": 1, "text": "' + b"x" * 200


@pytest.mark.parametrize("dlq_format", ["deltaflow", "kafka-delta-ingest"])
def test_raw_bytes_are_in_base64_on_one_line_as_on_the_arrow_engine(spark, dlq_format):
    frame = spark.sql(
        "SELECT named_struct('partition', 0, 'offset', 7L, 'topic', 't', "
        "'timestamp', TIMESTAMP'2026-01-01 00:00:00') AS kafka, "
        f"named_struct('error', 'boom', 'key', unhex('{(b'k' * 80).hex()}'), "
        f"'value', unhex('{LONG.hex()}')) AS {INGEST_META}"
    )
    (row,) = ingest_letters(frame, dlq_format=dlq_format).collect()
    columns = {"deltaflow": ["key_base64", "value_base64"], "kafka-delta-ingest": ["base64_bytes"]}
    texts = [row[c] for c in columns[dlq_format]]
    assert not any("\n" in t or "\r" in t for t in texts)
    assert base64.b64decode(texts[-1], validate=True) == LONG

"""Spark's JSON inference run in the JVM alone (``infer_json``): the types ``spark.read.json``
gives the same texts, whatever they hold."""

from __future__ import annotations

import json

from deltaflow.pipeline.evolution import infer_json

TEXTS = [
    json.dumps({"id": 1, "name": "a", "amount": 1.5, "tags": ["x"], "at": "2026-11-27T01:00:00Z"}),
    json.dumps({"id": 2, "nested": {"deep": {"n": 3}}, "amount": 2, "flag": True, "none": None}),
    json.dumps({"id": 12345678901234, "mixed": "text"}),
    json.dumps({"mixed": 5, "list": [{"a": 1}, {"b": "two"}]}),
    '{"id": not json',
    "[1, 2, 3]",
    json.dumps({"unicode": "h\u00e9llo \u2603", "big": 1e300}),
]


def test_json_inference_in_the_jvm_types_as_spark_read_json_does(spark):
    expected = spark.read.json(spark.sparkContext.parallelize(TEXTS)).schema
    assert infer_json(spark, TEXTS) == expected
    assert "_corrupt_record" in infer_json(spark, TEXTS).fieldNames()  # kept, as Spark keeps it
    assert infer_json(spark, []).fields == []
    wrapped = [f'{{"t0":{t}}}' for t in TEXTS[:2]] + [f'{{"t1":{t}}}' for t in TEXTS[2:4]]
    assert infer_json(spark, wrapped) == spark.read.json(spark.sparkContext.parallelize(wrapped)).schema

import pytest
from pyspark.sql import functions as F  # noqa: N812

from deltaflow.config.transforms import KAFKA_FIELDS, parse_transform
from deltaflow.errors import ConfigError
from deltaflow.pipeline.transforms import apply_transforms


@pytest.mark.parametrize("text", ["no colon", ": kafka.offset", "a.b:", "bad target!: kafka.offset"])
def test_malformed_transforms_are_rejected(text):
    with pytest.raises(ConfigError, match=r"must look like 'target\.path: source'"):
        parse_transform(text)


def test_unknown_source_names_the_accepted_forms():
    with pytest.raises(
        ConfigError,
        match=r"unknown function\(s\) lower\); use a JMESPath expression \(kafka.<partition\|offset",
    ):
        parse_transform("x: lower(name)").check()


def test_transforms_compile_to_spark_columns(spark):
    df = spark.createDataFrame(
        [({"producer": {"timestamp": "2021-07-20T05:59:55Z"}}, 1626760795, 1626760795123, "Ada")],
        "meta STRUCT<producer: STRUCT<timestamp: STRING>>, secs LONG, millis LONG, name STRING",
    ).withColumn("kafka", F.struct(F.lit(3).alias("partition"), F.lit(42).cast("long").alias("offset")))
    transforms = [
        parse_transform(t)
        for t in [
            "date: substr(meta.producer.timestamp, `0`, `10`)",
            "meta.kafka.offset: kafka.offset",
            "meta.kafka.partition: kafka.partition",
            "audit.kafka.offset: kafka.offset",
            "seen_at: epoch_seconds_to_iso8601(secs)",
            "seen_at_ms: epoch_millis_to_iso8601(millis)",
            "shout: sql: upper(name)",
        ]
    ]
    row = apply_transforms(df, transforms).drop("kafka").collect()[0].asDict(recursive=True)
    assert row["date"] == "2021-07-20"
    assert row["meta"] == {
        "producer": {"timestamp": "2021-07-20T05:59:55Z"},
        "kafka": {"offset": 42, "partition": 3},
    }
    assert row["audit"] == {"kafka": {"offset": 42}}
    assert row["seen_at"] == "2021-07-20T05:59:55Z"
    assert row["seen_at_ms"] == "2021-07-20T05:59:55.123Z"
    assert row["shout"] == "ADA"


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("a: kafka.offset", {"offset"}),
        ("k: substr(kafka.key, 0, 4)", {"key"}),
        ("t: epoch_millis_to_iso8601(kafka.timestamp)", {"timestamp"}),
        ("s: sql: kafka.headers[0].key", {"headers"}),
        ("s: sql: `kafka`.`timestamp`", {"timestamp"}),
        ("a: kafka", set(KAFKA_FIELDS)),
        ("t: kafka.timestamp_type", {"timestamp_type", "timestamp"}),
        ("j: join(':', [kafka.topic, to_string(kafka.offset)])", {"topic", "offset"}),
        ("j: items[?kafka.offset > `1`]", set()),
        ("w: @", set(KAFKA_FIELDS)),
        ("s: sql: to_json(kafka)", set(KAFKA_FIELDS)),
        ("s: sql: upper(user) || kafkaesque", set()),
        ("x: meta.kafka.key", set()),
    ],
)
def test_kafka_fields_a_transform_reads(text, fields):
    """The source builds only these metadata columns for good messages: none may be missed."""
    assert parse_transform(text).kafka_fields() == fields


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("a: items[?x > `1`].y", {"items"}),
        ("a: {n: name, k: kafka.key}", {"name", "kafka"}),
        ("a: join('-', [user, to_string(id)])", {"user", "id"}),
        ("a: sort_by(items, &x)[0] | y", {"items"}),
        ("a: length(@)", None),
        ("a: keys(@)", None),
    ],
)
def test_root_fields_a_per_message_transform_converts(text, fields):
    """Only these columns go through Python: a missed one would read as null."""
    got = parse_transform(text).root_fields()
    assert got == (None if fields is None else frozenset(fields))

"""``deltaflow.io.arrow_transforms``: the same results as the Spark transforms, on Arrow."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from deltaflow.config.transforms import parse_transform
from deltaflow.errors import ConfigError
from deltaflow.io.arrow_transforms import apply, check, unsupported

KAFKA = pa.struct(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("topic", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("key", pa.string()),
    ]
)
META = pa.struct([("producer", pa.struct([("ts", pa.string())])), ("n", pa.int64())])
TS = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)


def _messages() -> pa.Table:
    rows = [
        ("héllo wörld", 1609459200, "1609459200123", {"producer": {"ts": "1609459200.9"}, "n": 1}),
        ("ab", -1, " 12.5 ", {"producer": {"ts": "-0.5"}, "n": 2}),
        (None, None, "soon", None),
        ("xyz", 0, None, {"producer": None, "n": 3}),
        ("0123456789abc", 4102444800, "1e3", {"producer": {"ts": "abc"}, "n": 4}),
    ]
    return pa.table(
        {
            "name": pa.array([r[0] for r in rows]),
            "epoch_s": pa.array([r[1] for r in rows], pa.int64()),
            "epoch_ms": pa.array([r[2] for r in rows]),
            "meta": pa.array([r[3] for r in rows], META),
            "at": pa.array(
                [
                    TS,
                    TS.replace(microsecond=120_000),
                    None,
                    dt.datetime(1969, 12, 31, 23, 59, 59, 500_000, dt.UTC),
                    TS,
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "flag": pa.array([True, False, None, True, False]),
            "kafka": pa.array(
                [
                    {"partition": i % 2, "offset": 10 + i, "topic": "t", "timestamp": TS, "key": f"k{i}"}
                    for i in range(5)
                ],
                KAFKA,
            ),
        }
    )


TRANSFORMS = [
    "prefix: substr(name, `1`, `4`)",
    "day: epoch_seconds_to_iso8601(epoch_s)",
    "at_ms: epoch_millis_to_iso8601(epoch_ms)",
    "meta.produced_at: epoch_seconds_to_iso8601(meta.producer.ts)",
    "meta.origin.offset: kafka.offset",
    "where.partition: kafka.partition",
    "where.topic: kafka.topic",
    "key: kafka.key",
    "name: substr(name, `0`, `2`)",
    "count: META.N",
    "at_text: substr(at, `0`, `40`)",
    "flag_text: substr(flag, `0`, `5`)",
]


def test_arrow_transforms_give_what_spark_gives(spark):
    from pyspark.sql import functions as F  # noqa: N812

    from deltaflow.pipeline.transforms import apply_transforms, failure

    transforms = [parse_transform(t) for t in TRANSFORMS]
    table = _messages()
    out, errors = apply(table, transforms)

    frame = spark.createDataFrame(table)
    expected = apply_transforms(frame, transforms)
    failures = [c for t in transforms if (c := failure(t)) is not None]
    expected = expected.withColumn("_error", F.coalesce(*failures))
    # Compared as Python values (Spark's toArrow refuses its own non-null struct fields here).
    rows = [r.asDict(recursive=True) for r in expected.collect()]

    assert out.schema.names == [n for n in expected.columns if n != "_error"]
    for name in out.schema.names:
        if name not in ("kafka", "at"):  # inputs, unchanged (Spark hands timestamps back zoneless)
            assert out.column(name).to_pylist() == [r[name] for r in rows], name
    assert errors is not None and errors.to_pylist() == [r["_error"] for r in rows]
    # Spot checks, so that a shared mistake cannot hide.
    assert out.column("day").to_pylist()[:2] == ["2021-01-01T00:00:00Z", "1969-12-31T23:59:59Z"]
    assert out.column("at_ms").to_pylist()[0] == "2021-01-01T00:00:00.123Z"
    assert out.column("prefix").to_pylist()[0] == "éll"
    assert errors.to_pylist()[2] == "transform 'at_ms': epoch_ms is not a number: soon"
    assert out.column("at_text").to_pylist()[:2] == ["2026-11-23 00:00:00", "2026-11-23 00:00:00.12"]


def test_spark_sql_and_missing_fields_are_refused():
    assert unsupported([parse_transform("x: sql: upper(name)"), parse_transform("y: name")]) == [
        "x: sql: upper(name)"
    ]
    with pytest.raises(ConfigError, match="needs the Spark engine"):
        apply(_messages(), [parse_transform("x: sql: upper(name)")])
    with pytest.raises(ConfigError, match="no field 'nope'"):
        check(_messages().schema, [parse_transform("x: meta.nope")])
    with pytest.raises(ConfigError, match="substr on a double field needs the Spark engine"):
        check(pa.schema([("v", pa.float64())]), [parse_transform("x: substr(v, `0`, `2`)")])
    assert check(_messages().schema, [parse_transform("a.b: name")]).field("a").type == pa.struct(
        [("b", pa.string())]
    )

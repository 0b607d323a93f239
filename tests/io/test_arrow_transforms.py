"""``deltaflow.io.arrow_transforms``: the same results as the Spark transforms, on Arrow, and as
the per-message JMESPath evaluator."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from deltaflow.config.transforms import parse_transform
from deltaflow.errors import ConfigError
from deltaflow.io.arrow_transforms import apply, check, unsupported, vectorised
from deltaflow.io.jmespath_eval import evaluate

KAFKA = pa.struct(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("topic", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestamp_type", pa.int32()),
        ("key", pa.string()),
    ]
)
TS = dt.datetime(2026, 11, 23, 0, 0, 0, 250_000, tzinfo=dt.UTC)
ITEM = pa.struct([("x", pa.int64()), ("y", pa.string())])
META = pa.struct([("producer", pa.struct([("ts", pa.string())])), ("n", pa.int64())])


def _messages() -> pa.Table:
    rows = [
        {
            "id": 1,
            "name": "William",
            "my field": {"x": "q1"},
            "meta": {"producer": {"ts": "1626823098"}, "n": 1},
            "secs": 1626823098,
            "millis": "1626823098123",
            "micros": 1626823098123456,
            "items": [{"x": 1, "y": "a"}, {"x": 2, "y": "b"}, {"x": 3, "y": "c"}],
            "tags": ["t1", "t2"],
            "price": 12.5,
            "at": TS,
        },
        {
            "id": 22,
            "name": "héllo wörld",
            "my field": {"x": None},
            "meta": {"producer": {"ts": "-0.5"}, "n": 2},
            "secs": -1,
            "millis": "soon",
            "micros": 1626823098123000,
            "items": [],
            "tags": [],
            "price": 3.0,
            "at": dt.datetime(1969, 12, 31, 23, 59, 59, 500_000, dt.UTC),
        },
        {"id": 3},
        {
            "id": 4,
            "name": "ab",
            "my field": None,
            "meta": {"producer": None, "n": 4},
            "secs": 4102444800,
            "millis": " -1 ",
            "micros": 0,
            "items": [{"x": 5, "y": None}],
            "tags": ["only"],
            "price": 10.0,
            "at": TS,
        },
    ]
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("my field", pa.struct([("x", pa.string())])),
            ("meta", META),
            ("secs", pa.int64()),
            ("millis", pa.string()),
            ("micros", pa.int64()),
            ("items", pa.list_(ITEM)),
            ("tags", pa.list_(pa.string())),
            ("price", pa.float64()),
            ("at", pa.timestamp("us", tz="UTC")),
        ]
    )
    table = pa.Table.from_pylist(rows, schema=schema)
    kafka = pa.array(
        [
            {
                "partition": i % 2,
                "offset": 10 + i,
                "topic": "t",
                "timestamp": TS,
                "timestamp_type": i % 2,
                "key": f"k{i}",
            }
            for i in range(len(rows))
        ],
        KAFKA,
    )
    return table.append_column("kafka", kafka)


#: Compiled to columns on both engines.
VECTORISED = [
    "f_nested: meta.producer.ts",
    'f_quoted: "my field".x',
    "f_case: META.N",
    "f_partition: kafka.partition",
    "f_offset: kafka.offset",
    "f_topic: kafka.topic",
    "f_timestamp: kafka.timestamp",
    "f_timestamp_type: kafka.timestamp_type",
    "s_name: substr(name, `1`, `4`)",
    "s_int: substr(id, `0`, `1`)",
    "s_at: substr(at, `0`, `40`)",
    "s_old_spelling: substr(name, 0, 2)",
    "e_secs: epoch_seconds_to_iso8601(secs)",
    "e_millis: epoch_millis_to_iso8601(millis)",
    "e_micros: epoch_micros_to_iso8601(micros)",
    "e_millis_to_micro: epoch_millis_to_micro(millis)",
    "nested.offset: kafka.offset",
]
#: Evaluated per message (the jmespath library) on both engines.
PER_MESSAGE = [
    "p_filter: items[?x > `1`].y",
    "p_projection: items[*].x",
    "p_hash: {n: name, first: items[0].y, k: kafka.key}",
    "p_list: [id, name]",
    "p_pipe: items[*].x | [0]",
    "p_length: length(items)",
    "p_join: join(',', tags)",
    "p_to_string: to_string(price)",
    "p_contains: contains(tags, 't2')",
    "p_compare: price > `10`",
    "p_max: max(items[*].x)",
    "p_substr_of_join: substr(join('-', tags), `1`, `3`)",
    "p_epoch_of_number: epoch_seconds_to_iso8601(to_number(meta.producer.ts))",
    "p_epoch_of_kafka: epoch_micros_to_iso8601(kafka.timestamp)",
    "p_millis_to_micro: epoch_millis_to_micro(`1626823098123`)",
    "p_kafka: join(':', [kafka.topic, to_string(kafka.partition), to_string(kafka.offset)])",
    "p_substr_double: substr(price, `0`, `2`)",
    "p_fails: substr(items, `0`, `1`)",
]


def _spark_rows(spark, table: pa.Table, transforms):
    from pyspark.sql import functions as F  # noqa: N812

    from deltaflow.delta.schema import spark_to_arrow
    from deltaflow.pipeline.transforms import apply_transforms

    frame = spark.createDataFrame(table).withColumn("_error", F.lit(None).cast("string"))
    out = apply_transforms(frame, transforms, errors="_error")
    # Compared as Python values (Spark's toArrow refuses its own non-null struct fields here).
    return out, spark_to_arrow(out.schema), [r.asDict(recursive=True) for r in out.collect()]


def _plain(v):
    return v.replace(tzinfo=None) if isinstance(v, dt.datetime) else v


def test_engines_and_the_per_message_evaluator_agree(spark):
    table = _messages()
    transforms = [parse_transform(t) for t in [*VECTORISED, *PER_MESSAGE]]
    assert [t.source for t in transforms if vectorised(t, table.schema)] == [
        parse_transform(t).source for t in VECTORISED
    ]
    out, errors = apply(table, transforms)
    spark_out, spark_schema, rows = _spark_rows(spark, table, transforms)

    for t in transforms:
        name = t.target[0]
        got = [_plain(v) for v in out.column(name).to_pylist()]
        assert got == [_plain(r[name]) for r in rows], t.source
        assert out.schema.field(name).type == spark_schema.field(name).type, t.source
        if len(t.target) == 1 and name != "f_case":  # (a compiled path matches names as Spark does)
            # What kafka-delta-ingest's way gives: the expression per message, into that type.
            values, _ = evaluate(t.expression, table, out.schema.field(name).type, name)
            assert [_plain(v) for v in values.to_pylist()] == got, t.source
    assert errors is not None and errors.to_pylist() == [r["_error"] for r in rows]

    # Spot checks against kafka-delta-ingest's own examples and semantics.
    col = {n: out.column(n).to_pylist() for n in out.schema.names}
    assert col["s_name"][:2] == ["illi", "éllo"]  # substr(s, skip, take)
    assert col["s_old_spelling"][0] == "Wi"
    assert col["e_secs"][:2] == ["2021-07-20T23:18:18Z", "1969-12-31T23:59:59Z"]
    assert col["e_millis"] == ["2021-07-20T23:18:18.123Z", None, None, "1969-12-31T23:59:59.999Z"]
    assert col["e_micros"][:2] == ["2021-07-20T23:18:18.123456Z", "2021-07-20T23:18:18.123Z"]
    assert col["e_millis_to_micro"][0] == 1626823098123000
    assert col["f_timestamp_type"] == [0, 1, 0, 1]
    assert col["f_quoted"] == ["q1", None, None, None] and col["f_case"] == [1, 2, None, 4]
    assert col["p_filter"][:2] == ['["b","c"]', "[]"]  # an array into a string column: its JSON
    assert col["p_hash"][0] == '{"first":"a","k":"k0","n":"William"}'
    assert col["p_length"] == [3, 0, None, 1] and col["p_compare"] == [True, False, None, False]
    assert col["p_epoch_of_number"][:2] == ["2021-07-20T23:18:18Z", "1970-01-01T00:00:00Z"]
    assert col["p_epoch_of_kafka"][0] == "2026-11-23T00:00:00.250Z"
    assert col["p_substr_double"][0] is None  # a failed row
    assert col["s_at"][:2] == ["2026-11-23 00:00:00.25", "1969-12-31 23:59:59.5"]
    first = errors.to_pylist()
    assert first[1] == "transform 'e_millis': epoch_millis_to_iso8601: not a number: soon"
    assert first[0] == "transform 'p_substr_double': substr: expected a string, got a number"
    assert first[2].startswith("transform 'p_length': In function length(), invalid type for value: None")

    # The compiled forms stay compiled on Spark: no Python UDF in their plan.
    plan = spark_out._jdf.queryExecution().executedPlan().toString()
    assert "ArrowEvalPython" in plan
    only_vectorised, _, _ = _spark_rows(spark, table, [parse_transform(t) for t in VECTORISED])
    assert "EvalPython" not in only_vectorised._jdf.queryExecution().executedPlan().toString()


def test_epoch_numbers_beyond_the_years_1_to_9999_fail_the_message_on_every_path(spark):
    """An ``epoch_*`` argument naming an instant outside years 1 to 9999 (or microseconds
    beyond 64 bits) fails the message, with the same reason on both engines and per message:
    the Arrow engine failed the whole batch on it (a double cast), the Spark engine wrote a
    five-digit year."""
    table = pa.table(
        {
            "secs": pa.array([253402300799, 253402300800, -62135596800, -62135596801, 1 << 62, None]),
            "millis": pa.array(["1767225600123", "1e20", "1e400", " -1 ", "253402300800000", "x"]),
            "real": pa.array([1.5, 1e300, float("inf"), float("nan"), -2.5e17, 9.3e15]),
        }
    )
    transforms = [
        parse_transform(t)
        for t in (
            "a: epoch_seconds_to_iso8601(secs)",
            "b: epoch_millis_to_iso8601(millis)",
            "c: epoch_micros_to_iso8601(real)",
            "d: epoch_millis_to_micro(real)",
        )
    ]
    # One failing transform per row shows its reason: each alone, so that every one is seen.
    for t in transforms:
        out, errors = apply(table, [t])
        _, _, rows = _spark_rows(spark, table, [t])
        name = t.target[0]
        assert out.column(name).to_pylist() == [r[name] for r in rows], t.source
        assert errors is not None and errors.to_pylist() == [r["_error"] for r in rows], t.source
        values, reasons = evaluate(t.expression, table, out.schema.field(name).type, name)
        assert values.to_pylist() == out.column(name).to_pylist(), t.source
        assert reasons.to_pylist() == errors.to_pylist(), t.source
    years = "out of range (not in the years 1 to 9999)"
    out, errors = apply(table, transforms[:1])
    first, last = "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z"
    assert out.column("a").to_pylist() == [last, None, first, None, None, None]
    assert errors is not None and errors.to_pylist() == [
        None,
        f"transform 'a': epoch_seconds_to_iso8601: {years}",
        None,
        f"transform 'a': epoch_seconds_to_iso8601: {years}",
        f"transform 'a': epoch_seconds_to_iso8601: {years}",
        None,
    ]
    out, errors = apply(table, transforms[3:])
    assert out.column("d").to_pylist() == [1000, None, None, None, None, None]
    assert errors is not None and errors.to_pylist() == [
        None,
        "transform 'd': epoch_millis_to_micro: out of range (the microseconds do not fit 64 bits)",
        None,  # Infinity and NaN give null, as before
        None,
        "transform 'd': epoch_millis_to_micro: out of range (the microseconds do not fit 64 bits)",
        "transform 'd': epoch_millis_to_micro: out of range (the microseconds do not fit 64 bits)",
    ]


def test_a_per_message_result_takes_the_tables_type():
    table = _messages()
    target = pa.schema([("n", pa.int32()), ("when", pa.timestamp("us", tz="UTC")), ("s", pa.string())])
    transforms = [
        parse_transform("n: length(tags)"),
        parse_transform("when: kafka.timestamp"),
        parse_transform("s: items[0]"),
    ]
    out, errors = apply(table, transforms, target_schema=target)
    assert out.schema.field("n").type == pa.int32() and out.column("n").to_pylist() == [2, 0, None, 1]
    assert out.column("s").to_pylist()[0] == '{"x":1,"y":"a"}'
    # A number into a timestamp column is microseconds (kafka-delta-ingest's coercion).
    values, _ = evaluate("kafka.timestamp", table, pa.timestamp("us", tz="UTC"), "when")
    assert values.to_pylist()[0] == TS
    assert errors is not None and [e is not None for e in errors.to_pylist()] == [False, False, True, False]


def test_spark_sql_bad_expressions_and_missing_fields_are_refused():
    assert unsupported([parse_transform("x: sql: upper(name)"), parse_transform("y: name")]) == [
        "x: sql: upper(name)"
    ]
    with pytest.raises(ConfigError, match="needs the Spark engine"):
        apply(_messages(), [parse_transform("x: sql: upper(name)")])
    with pytest.raises(ConfigError, match="no field 'nope'"):
        check(_messages().schema, [parse_transform("x: meta.nope")])
    with pytest.raises(ConfigError, match="unknown function"):
        parse_transform("x: lower(name)").check()
    with pytest.raises(ConfigError, match="is not understood"):
        parse_transform("x: items[?").check()
    assert check(_messages().schema, [parse_transform("a.b: name")]).field("a").type == pa.struct(
        [("b", pa.string())]
    )

"""``deltaflow.delta.schema``: Spark -> Arrow -> Delta schemas, partition checks, table vs data."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest
from deltalake import Field, Schema
from deltalake.schema import PrimitiveType

from deltaflow.delta.schema import (
    check_partition_columns,
    compare,
    ensure_compatible,
    file_schema,
    plain_schema,
    spark_to_arrow,
)
from deltaflow.errors import ConfigError, SchemaMismatchError

DATA = pa.schema([("id", pa.int64()), ("day", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])


def _table(*fields: tuple[str, str, bool]) -> Schema:
    return Schema([Field(n, PrimitiveType(t), nullable=nullable) for n, t, nullable in fields])


def test_spark_types_become_arrow_types():
    from pyspark.sql import types as T  # noqa: N812

    spark_schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("name", T.StringType()),
            T.StructField("at", T.TimestampType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
        ]
    )
    arrow = spark_to_arrow(spark_schema)
    assert arrow.names == ["id", "name", "at", "tags"]
    assert arrow.field("id").type == pa.int64()
    assert pa.types.is_timestamp(arrow.field("at").type)
    assert pa.types.is_list(arrow.field("tags").type)


def test_plain_schema_drops_view_and_large_types():
    plain = plain_schema(
        pa.schema(
            [
                ("s", pa.string_view()),
                ("b", pa.large_binary()),
                ("l", pa.large_list(pa.large_string())),
                ("i", pa.int32()),
            ]
        )
    )
    assert [f.type for f in plain] == [pa.string(), pa.binary(), pa.list_(pa.string()), pa.int32()]


def test_partition_columns_live_in_paths_only():
    assert file_schema(DATA, ["day"]).names == ["id", "ts"]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (["Day"], "did you mean 'day'? names are case-sensitive"),
        (["ts"], "has type timestamp[us, tz=UTC], which makes one directory per distinct value"),
        (["id", "day", "ts"], "has type timestamp"),
    ],
)
def test_bad_partition_columns_are_refused(columns, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_partition_columns(DATA, columns, "/t")
    check_partition_columns(DATA, ["day", "id"], "/t")  # strings and integers are fine


def test_merge_adds_columns_and_never_changes_a_type():
    table = _table(("id", "long", True), ("day", "string", False))
    diff = compare(table, DATA)
    assert diff.new_in_data == (("ts", "timestamp", True),)
    assert not diff.missing_in_data and not diff.type_changes
    assert ensure_compatible(table, DATA, schema_mode="merge", table_uri="/t") == diff
    with pytest.raises(SchemaMismatchError, match=r"column 'ts' .* is in the data but not in the table"):
        ensure_compatible(table, DATA, schema_mode="strict", table_uri="/t")
    widened = _table(("id", "integer", True), ("day", "string", True))
    with pytest.raises(SchemaMismatchError, match="column 'id' is integer in the table but long in the data"):
        ensure_compatible(widened, DATA, schema_mode="merge", table_uri="/t")
    required = _table(
        ("id", "long", True), ("day", "string", True), ("ts", "timestamp", True), ("n", "long", False)
    )
    with pytest.raises(SchemaMismatchError, match="'n' \\(long\\) is NOT NULL in the table but missing"):
        ensure_compatible(required, DATA, schema_mode="merge", table_uri="/t")

"""Schemas: Spark to Arrow to Delta, partition-column checks and table-vs-data comparison."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.types as pat
from deltalake import Field as DeltaField
from deltalake import Schema as DeltaSchema

from deltaflow.errors import ConfigError, SchemaMismatchError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = [
    "SchemaDiff",
    "check_against_table",
    "check_partition_columns",
    "compare",
    "delta_schema",
    "file_schema",
    "spark_to_arrow",
]


def spark_to_arrow(schema: StructType) -> pa.Schema:
    """Arrow schema Spark uses for ``schema`` (a ``StructType``), timestamps in UTC."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with Arrow view types (delta-rs' and DataFusion's output) as plain ones, nested
    types included: Spark, Parquet writers and printers take the plain types only."""
    return pa.schema([f.with_type(_plain_type(f.type)) for f in schema], metadata=schema.metadata)


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if (
        pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
        or pa.types.is_large_list(t)
        or (pa.types.is_list(t))
    ):
        return pa.list_(t.value_field.with_type(_plain_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_plain_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(_plain_type(t.key_type)), t.item_field.with_type(_plain_type(t.item_type))
        )
    return t


def delta_schema(arrow_schema: pa.Schema) -> DeltaSchema:
    """The Delta schema of an Arrow schema."""
    return DeltaSchema.from_arrow(arrow_schema)


def file_schema(arrow_schema: pa.Schema, partition_columns: Sequence[str]) -> pa.Schema:
    """The schema of the Parquet data files: partition columns live in the paths only."""
    keep = [f for f in arrow_schema if f.name not in set(partition_columns)]
    return pa.schema(keep)


def _partition_type_ok(t: pa.DataType) -> bool:
    return bool(
        pat.is_string(t) or pat.is_large_string(t) or pat.is_integer(t) or pat.is_boolean(t) or pat.is_date(t)
    )


def check_partition_columns(
    arrow_schema: pa.Schema, partition_columns: Sequence[str], table_uri: str
) -> None:
    """Reject partition columns that are missing or of a type unfit for directory names.

    Allowed: strings, integers, booleans and dates. Timestamps, floats, binary and nested
    columns would create one directory per distinct value; derive a date or bucket instead.
    """
    names = arrow_schema.names
    for col in partition_columns:
        if col not in names:
            near = [n for n in names if n.lower() == col.lower()]
            hint = f" (did you mean {near[0]!r}? names are case-sensitive)" if near else ""
            raise ConfigError(
                f"partition column {col!r} is not in the data's schema{hint}; "
                f"columns are: {', '.join(names)}",
                table_uri=table_uri,
                column=col,
            )
        field_type = arrow_schema.field(col).type
        if not _partition_type_ok(field_type):
            raise ConfigError(
                f"partition column {col!r} has type {field_type}, which makes one directory per "
                "distinct value; partition by a string, integer, boolean or date column "
                "(e.g. derive a date with to_date(ts))",
                table_uri=table_uri,
                column=col,
            )
    if partition_columns and len(partition_columns) >= len(names):
        raise ConfigError(
            "every column is a partition column; at least one column must be stored in the files",
            table_uri=table_uri,
        )


@dataclass(frozen=True)
class SchemaDiff:
    """How a batch's schema differs from the table's (Delta types, compared by name)."""

    missing_in_data: tuple[tuple[str, str], ...]  # (name, type) in the table, not in the data
    new_in_data: tuple[tuple[str, str, bool], ...]  # (name, type, nullable) not in the table
    type_changes: tuple[tuple[str, str, str], ...]  # (name, table type, data type)

    @property
    def is_empty(self) -> bool:
        return not (self.missing_in_data or self.new_in_data or self.type_changes)

    def lines(self) -> list[str]:
        out = [f"column {n!r} ({t}) is in the table but not in the data" for n, t in self.missing_in_data]
        out += [f"column {n!r} ({t}) is in the data but not in the table" for n, t, _ in self.new_in_data]
        out += [f"column {n!r} is {tt} in the table but {dt} in the data" for n, tt, dt in self.type_changes]
        return out


def _type_name(field: DeltaField) -> str:
    t = field.type
    return str(getattr(t, "type", None) or t.to_json())


def compare(table: DeltaSchema, data: pa.Schema) -> SchemaDiff:
    """Compare the table's schema with the data's (names and Delta types)."""
    data_delta = delta_schema(data)
    table_fields = {f.name: f for f in table.fields}
    data_fields = {f.name: f for f in data_delta.fields}
    missing = tuple((n, _type_name(f)) for n, f in table_fields.items() if n not in data_fields)
    new = tuple((n, _type_name(f), bool(f.nullable)) for n, f in data_fields.items() if n not in table_fields)
    changed = tuple(
        (n, _type_name(table_fields[n]), _type_name(f))
        for n, f in data_fields.items()
        if n in table_fields and table_fields[n].type != f.type
    )
    return SchemaDiff(missing, new, changed)


def check_against_table(
    table: Any, data: pa.Schema, *, partition_columns: Sequence[str], schema_mode: str, table_uri: str
) -> SchemaDiff:
    """Raise unless ``data`` may be written to the existing ``table`` (a ``DeltaTable``):
    the same partitioning, and a schema allowed by ``schema_mode`` (see :func:`ensure_compatible`).
    """
    parts = list(table.metadata().partition_columns)
    if parts != list(partition_columns):
        raise ConfigError(
            f"table {table_uri!r} is partitioned by {parts}, but partition_columns="
            f"{list(partition_columns)} was given; nothing was written",
            table_uri=table_uri,
        )
    return ensure_compatible(table.schema(), data, schema_mode=schema_mode, table_uri=table_uri)


def ensure_compatible(table: DeltaSchema, data: pa.Schema, *, schema_mode: str, table_uri: str) -> SchemaDiff:
    """Raise :class:`SchemaMismatchError` unless ``data`` may be written to ``table``.

    ``strict``: the schemas must be equal. ``merge``: the data may add columns (they become
    nullable columns of the table) and may leave out nullable table columns; it may never change
    a column's type. ``subset`` (delta-spark's default): the data may leave out nullable table
    columns, never add one or change a type. Returns the diff so the caller can add the new columns.
    """
    diff = compare(table, data)
    if diff.is_empty:
        return diff
    if schema_mode == "subset" and diff.new_in_data:
        raise SchemaMismatchError(
            table_uri,
            [f"column {n!r} ({t}) is in the data but not in the table" for n, t, _ in diff.new_in_data],
            hint="nothing was written; add new columns with schema_mode='merge' (Delta's mergeSchema)",
        )
    if schema_mode == "strict":
        raise SchemaMismatchError(
            table_uri,
            diff.lines(),
            hint="nothing was written; align the data's schema or use schema_mode='merge' to add new columns",
        )
    problems = [
        f"column {n!r} is {tt} in the table but {dt} in the data (types are never changed)"
        for n, tt, dt in diff.type_changes
    ]
    nullable = {f.name: f.nullable for f in table.fields}
    problems += [
        f"column {n!r} ({t}) is NOT NULL in the table but missing from the data"
        for n, t in diff.missing_in_data
        if not nullable[n]
    ]
    if problems:
        raise SchemaMismatchError(table_uri, problems, hint="nothing was written")
    return diff

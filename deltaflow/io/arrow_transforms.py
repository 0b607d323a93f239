"""kafka-delta-ingest transforms (:mod:`deltaflow.config.transforms`) on Arrow, in the tasks.

The Arrow ingest path runs them where the rows are decoded, with Arrow compute: no JVM and no
Python per row. They give what :mod:`deltaflow.pipeline.transforms` gives on Spark (the tests
compare both on the same messages):

* a field path ``a.b`` (case-insensitive, as Spark resolves names; a null parent gives null);
* ``kafka.<field>`` from the ``kafka`` struct (``key`` as UTF-8 text);
* ``substr(path, start, end)``: code points ``[start, end)`` of a string (integers, booleans,
  dates and timestamps as Spark's cast to string writes them);
* ``epoch_seconds_to_iso8601`` / ``epoch_millis_to_iso8601``: a number, or a string holding
  one, as ``2021-01-01T00:00:00Z`` / ``2021-01-01T00:00:00.123Z`` (UTC, floored as Spark
  does); anything else makes the row fail with ``transform '<target>': <path> is not a number:
  <value>``.

``sql:`` transforms need Spark: :func:`unsupported` names them, and such runs take the Spark
engine; so do the other cases :func:`apply` refuses on the messages' schema (checked on an
empty table before the query starts: :func:`check`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from deltaflow.config.transforms import Transform
from deltaflow.errors import ConfigError

__all__ = ["KAFKA_COLUMN", "apply", "check", "unsupported"]

#: The struct column holding the message's coordinates (partition, offset, topic, ...).
KAFKA_COLUMN = "kafka"
#: A number as Spark's cast from string to double reads it (surrounding spaces allowed).
_NUMBER = r"^\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*$"
_MICROS = 1_000_000


def unsupported(transforms: Sequence[Transform]) -> list[str]:
    """The transforms only Spark can run (``sql:``), as written."""
    return [f"{'.'.join(t.target)}: {t.source}" for t in transforms if t.sql is not None]


def check(schema: pa.Schema, transforms: Sequence[Transform]) -> pa.Schema:
    """The schema ``transforms`` produce from ``schema``, or :class:`ConfigError` when the Arrow
    engine cannot run them on it (run on the driver, on no rows)."""
    out, _ = apply(schema.empty_table(), transforms)
    return out.schema


def apply(table: pa.Table, transforms: Sequence[Transform]) -> tuple[pa.Table, pa.Array | None]:
    """Set each transform's target (in order) on ``table``; return it and why rows failed.

    Returns:
        The table with every target column set (nested structs created as needed), and per
        row the first transform failure (``None`` where none failed), or ``None`` when no
        transform can fail.

    Raises:
        ConfigError: a ``sql:`` transform, or a field the messages do not have.
    """
    errors: pa.Array | None = None
    for t in transforms:
        value, failed = _compute(table, t)
        table = _set(table, t.target, value)
        if failed is not None:
            errors = failed if errors is None else pc.coalesce(errors, failed)
    return table, errors


def _compute(table: pa.Table, t: Transform) -> tuple[pa.ChunkedArray, pa.ChunkedArray | None]:
    if t.sql is not None:
        raise ConfigError(f"transform {'.'.join(t.target)!r} is Spark SQL: it needs the Spark engine")
    if (sub := t.substr) is not None:
        path, start, end = sub
        text = _as_text(_get(table, path))
        return pc.utf8_slice_codeunits(text, start, max(start, end)), None
    if (epoch := t.epoch) is not None:
        unit, path = epoch
        return _iso8601(table, _get(table, path), unit, ".".join(t.target), path)
    if (field := t.field) is not None:
        return _get(table, field), None
    raise t.not_understood()


def _get(table: pa.Table, path: str) -> pa.ChunkedArray:
    """The column at the dotted ``path`` (names matched case-insensitively, like Spark's)."""
    parts = path.split(".")
    column = table.column(_name(table.schema.names, parts[0], path))
    for part in parts[1:]:
        if not pa.types.is_struct(column.type):
            raise ConfigError(f"transform source {path!r}: {part!r} is not a field of a struct")
        names = [column.type.field(i).name for i in range(column.type.num_fields)]
        column = pc.struct_field(column, _name(names, part, path))
    return column


def _name(names: Sequence[str], wanted: str, path: str) -> str:
    if wanted in names:
        return wanted
    folded = [n for n in names if n.lower() == wanted.lower()]
    if len(folded) == 1:
        return folded[0]
    raise ConfigError(
        f"transform source {path!r}: no field {wanted!r} (there are: {', '.join(names)})", transform=path
    )


def _as_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A column as Spark's cast to string writes it (strings, integers, booleans, dates and
    timestamps; timestamps as ``2026-01-02 03:04:05.12`` in UTC, the session's time zone)."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pc.cast(column, pa.string())
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return pc.cast(column, pa.string())
    if pa.types.is_date(kind):
        return pc.strftime(pc.cast(column, pa.timestamp("s")), format="%Y-%m-%d")
    if pa.types.is_timestamp(kind):
        micros = pc.cast(pc.cast(column, pa.timestamp("us", tz=kind.tz)), pa.int64())
        seconds = pc.multiply(
            pc.floor(pc.divide(pc.cast(micros, pa.float64()), float(_MICROS))), float(_MICROS)
        )
        whole = pc.cast(seconds, pa.int64())
        base = pc.strftime(
            pc.cast(pc.cast(whole, pa.timestamp("us", tz="UTC")), pa.timestamp("s", tz="UTC")),
            format="%Y-%m-%d %H:%M:%S",
        )
        fraction = pc.subtract(micros, whole)
        digits = pc.utf8_rtrim(pc.utf8_lpad(pc.cast(fraction, pa.string()), 6, "0"), "0")
        return pc.if_else(pc.equal(fraction, 0), base, pc.binary_join_element_wise(base, digits, "."))
    raise ConfigError(
        f"substr on a {kind} field needs the Spark engine (the Arrow engine takes strings, integers, "
        "booleans, dates and timestamps)"
    )


def _iso8601(
    table: pa.Table, column: pa.ChunkedArray, unit: str, target: str, path: str
) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        number = pc.cast(column, pa.float64())
    elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        ok = pc.match_substring_regex(column, _NUMBER)
        number = pc.cast(pc.utf8_trim_whitespace(pc.if_else(ok, column, None)), pa.float64())
    else:
        number = pa.chunked_array([pa.nulls(len(column), pa.float64())])
    seconds = number if unit == "seconds" else pc.divide(number, 1000.0)
    # timestamp_seconds(x) keeps (x * 10^6) as a long: truncated toward zero, then formatted
    # with the instant floored to the pattern's precision.
    micros = pc.cast(pc.trunc(pc.multiply(seconds, float(_MICROS))), pa.int64(), safe=False)
    step = _MICROS if unit == "seconds" else 1000
    floored = pc.multiply(pc.floor(pc.divide(pc.cast(micros, pa.float64()), float(step))), float(step))
    instant = pc.cast(pc.cast(floored, pa.int64()), pa.timestamp("us", tz="UTC"))
    precision = pa.timestamp("s", tz="UTC") if unit == "seconds" else pa.timestamp("ms", tz="UTC")
    text = pc.strftime(pc.cast(instant, precision), format="%Y-%m-%dT%H:%M:%S")
    value = pc.binary_join_element_wise(text, "Z", "")
    failed_rows = pc.and_(pc.is_valid(column), pc.is_null(number))
    raw = _display(column)
    message = pc.binary_join_element_wise(f"transform {target!r}: {path} is not a number: ", raw, "")
    failed = pc.if_else(failed_rows, message, pa.scalar(None, pa.string()))
    return value, failed


def _display(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A value as text for an error message (Spark prints its cast to string)."""
    try:
        return pc.cast(column, pa.string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return pa.chunked_array([pa.array([None if v is None else str(v) for v in column.to_pylist()])])


def _set(table: pa.Table, target: tuple[str, ...], value: pa.ChunkedArray) -> pa.Table:
    """``table`` with ``value`` at ``target``; missing structs are created, others kept."""
    root = target[0]
    index = table.schema.get_field_index(root)
    if len(target) == 1:
        if index >= 0:
            return table.set_column(index, root, value)
        return table.append_column(root, value)
    if index < 0 or not pa.types.is_struct(table.schema.field(index).type):
        column = _wrap(value, target[1:], len(table))
        if index >= 0:
            return table.set_column(index, root, column)
        return table.append_column(root, column)
    parent = table.column(index).combine_chunks()
    return table.set_column(index, root, _with_field(parent, target[1:], value.combine_chunks()))


def _wrap(value: pa.ChunkedArray, names: tuple[str, ...], length: int) -> pa.ChunkedArray:
    """``struct(names[0]: struct(...: value))``, never null itself (as Spark's ``struct``)."""
    array = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
    for name in reversed(names):
        array = pa.StructArray.from_arrays([array], names=[name])
    return pa.chunked_array([array])


def _with_field(parent: pa.StructArray, names: tuple[str, ...], value: pa.Array) -> pa.StructArray:
    """``parent.withField(names, value)``: a null parent stays null (Spark's ``withField``)."""
    fields = [parent.type.field(i) for i in range(parent.type.num_fields)]
    children = [parent.field(i) for i in range(len(fields))]
    position = next((i for i, f in enumerate(fields) if f.name == names[0]), -1)
    if len(names) == 1:
        child = value
    elif position >= 0 and pa.types.is_struct(fields[position].type):
        child = _with_field(children[position], names[1:], value)
    else:
        child = _wrap(pa.chunked_array([value]), names[1:], len(value)).combine_chunks()
    if position >= 0:
        children[position] = child
        fields[position] = pa.field(names[0], child.type)
    else:
        children.append(child)
        fields.append(pa.field(names[0], child.type))
    mask = pc.is_null(parent) if parent.null_count else None
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)

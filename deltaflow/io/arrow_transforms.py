"""kafka-delta-ingest transforms (:mod:`deltaflow.config.transforms`) on Arrow, in the tasks.

The Arrow ingest path runs them where the rows are decoded. The forms both engines compile to
columns run with Arrow compute, no Python per row; :mod:`deltaflow.pipeline.transforms` gives
the same on Spark (the tests compare both, and both with the per-message evaluator):

* a field path ``a.b`` (``"quoted names"`` too; case-insensitive, as Spark resolves names; a
  null parent gives null), ``kafka.<field>`` from the ``kafka`` struct;
* ``substr(path, `skip`, `take`)`` over strings, integers, booleans, dates and timestamps
  (the last three as Spark's cast to string writes them);
* ``epoch_seconds_to_iso8601`` / ``epoch_millis_to_iso8601`` / ``epoch_micros_to_iso8601`` /
  ``epoch_millis_to_micro`` over a number, or a string holding one; anything else makes the row
  fail with ``transform '<target>': <function>: not a number: <value>``, and so does a number
  outside :func:`~deltaflow.io.jmespath_eval.epoch_bounds` (``out of range``).

Every other JMESPath expression (and these forms over other column types) is evaluated per
message (:func:`deltaflow.io.jmespath_eval.evaluate`), its result coerced into the target
column's type (the table's, else :func:`result_type`). ``sql:`` transforms need Spark:
:func:`unsupported` names them, and such runs take the Spark engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from deltaflow.config.transforms import Transform
from deltaflow.errors import ConfigError
from deltaflow.io.jmespath_eval import NUMBER, as_text, epoch_bounds, evaluate, out_of_range

__all__ = [
    "KAFKA_COLUMN",
    "apply",
    "check",
    "field_type",
    "result_type",
    "type_at",
    "unsupported",
    "vectorised",
]

#: The struct column holding the message's coordinates (partition, offset, topic, ...).
KAFKA_COLUMN = "kafka"
_MICROS = 1_000_000
_UNIT_MICROS = {"seconds": _MICROS, "millis": 1000, "micros": 1, "millis_to_micro": 1000}
#: Result types of JMESPath functions, for a per-message transform's new column.
_STRING_FUNCTIONS = {
    "substr",
    "epoch_seconds_to_iso8601",
    "epoch_millis_to_iso8601",
    "epoch_micros_to_iso8601",
    "join",
    "to_string",
    "type",
}
_INTEGER_FUNCTIONS = {"length", "epoch_millis_to_micro"}
_NUMBER_FUNCTIONS = {"to_number", "abs", "avg", "ceil", "floor", "sum"}
_BOOLEAN_FUNCTIONS = {"contains", "starts_with", "ends_with"}


def unsupported(transforms: Sequence[Transform]) -> list[str]:
    """The transforms only Spark can run (``sql:``), as written."""
    return [f"{'.'.join(t.target)}: {t.source}" for t in transforms if t.sql is not None]


def check(
    schema: pa.Schema, transforms: Sequence[Transform], target_schema: pa.Schema | None = None
) -> pa.Schema:
    """The schema ``transforms`` produce from ``schema``, or :class:`ConfigError` when the Arrow
    engine cannot run them on it (run on the driver, on no rows)."""
    out, _ = apply(schema.empty_table(), transforms, target_schema=target_schema)
    return out.schema


def type_at(schema: pa.Schema | None, path: Sequence[str]) -> pa.DataType | None:
    """The type of the (nested) field at ``path`` of ``schema``, if it has one."""
    if schema is None:
        return None
    fields: Sequence[pa.Field] = list(schema)
    kind: pa.DataType | None = None
    for name in path:
        found = next((f for f in fields if f.name == name), None)
        if found is None:
            return None
        kind = found.type
        fields = list(kind) if pa.types.is_struct(kind) else []
    return kind


def result_type(t: Transform) -> pa.DataType:
    """The column type of a per-message transform's result when the table has none: by the
    expression's outer function (``length`` a long, ``to_number`` a double, ``contains`` a
    boolean, ...), a comparison or ``!`` a boolean; anything else a string (objects, arrays
    and numbers as their JSON text, kafka-delta-ingest's coercion into a string column)."""
    node = t.ast
    kind = node["type"]
    if kind == "function_expression":
        name = node["value"]
        if name in _STRING_FUNCTIONS:
            return pa.string()
        if name in _INTEGER_FUNCTIONS:
            return pa.int64()
        if name in _NUMBER_FUNCTIONS:
            return pa.float64()
        if name in _BOOLEAN_FUNCTIONS:
            return pa.bool_()
    if kind in ("comparator", "not_expression"):
        return pa.bool_()
    return pa.string()


def vectorised(t: Transform, schema: pa.Schema) -> bool:
    """Whether ``t`` runs as columns over rows of ``schema`` (both engines decide with this)."""
    if t.sql is not None:
        return True
    if t.field is not None:
        return True
    try:
        if (sub := t.substr) is not None:
            kind = field_type(schema, sub[0])
            return bool(
                pa.types.is_string(kind)
                or pa.types.is_integer(kind)
                or pa.types.is_boolean(kind)
                or pa.types.is_date(kind)
                or pa.types.is_timestamp(kind)
            )
        if (epoch := t.epoch) is not None:
            kind = field_type(schema, epoch[1])
            return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_string(kind))
    except ConfigError:
        return False  # a field the messages lack: JMESPath gives null, per message
    return False


def apply(
    table: pa.Table, transforms: Sequence[Transform], *, target_schema: pa.Schema | None = None
) -> tuple[pa.Table, pa.Array | None]:
    """Set each transform's target (in order) on ``table``; return it and why rows failed.

    Args:
        table: The decoded rows with the ``kafka`` struct.
        transforms: Applied in order, each seeing the earlier ones' targets.
        target_schema: The rows' schema in the table: a per-message result is coerced into
            its type at the target (else :func:`result_type`).

    Returns:
        The table with every target column set (nested structs created as needed), and per
        row the first transform failure (``None`` where none failed), or ``None`` when no
        transform can fail.

    Raises:
        ConfigError: a ``sql:`` transform, or a field path the messages do not have.
    """
    errors: pa.Array | None = None
    for t in transforms:
        value, failed = _compute(table, t, target_schema)
        table = _set(table, t.target, value)
        if failed is not None:
            errors = failed if errors is None else pc.coalesce(errors, failed)
    return table, errors


def _compute(
    table: pa.Table, t: Transform, target_schema: pa.Schema | None
) -> tuple[pa.ChunkedArray, pa.ChunkedArray | None]:
    if t.sql is not None:
        raise ConfigError(f"transform {'.'.join(t.target)!r} is Spark SQL: it needs the Spark engine")
    target = ".".join(t.target)
    if not vectorised(t, table.schema):
        kind = type_at(target_schema, t.target) or result_type(t)
        # Only the columns the expression reads are converted to Python objects.
        names = t.root_fields()
        rows = table if names is None else table.select([n for n in table.schema.names if n in names])
        values, failed = evaluate(t.expression, rows, kind, target)
        return pa.chunked_array([values]), pa.chunked_array([failed])
    if (sub := t.substr) is not None:
        path, skip, take = sub
        text = _as_text(_get(table, path))
        return pc.utf8_slice_codeunits(text, skip, skip + take), None
    if (epoch := t.epoch) is not None:
        unit, path = epoch
        return _epoch(_get(table, path), unit, target, t.ast["value"])
    assert t.field is not None
    return _get(table, t.field), None


def field_type(schema: pa.Schema, path: Sequence[str]) -> pa.DataType:
    """The type of the field at ``path`` (matched as :func:`apply` matches it)."""
    return _get(schema.empty_table(), path).type


def _get(table: pa.Table, parts: Sequence[str]) -> pa.ChunkedArray:
    """The column at ``parts`` (names matched case-insensitively, like Spark's)."""
    path = ".".join(parts)
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
    timestamps; timestamps in UTC, the session's time zone)."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column
    if pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        text = as_text(column)
        assert isinstance(text, pa.ChunkedArray)
        return text
    return pc.cast(column, pa.string())


def _epoch(
    column: pa.ChunkedArray, unit: str, target: str, function: str
) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """An ``epoch_*`` function: the number truncated to whole units (as kafka-delta-ingest's
    ``as i64``), as ISO-8601 with fractional digits only when not zero (chrono's format); a
    number out of :func:`~deltaflow.io.jmespath_eval.epoch_bounds` fails the row."""
    no_text = pa.scalar(None, pa.string())
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        ok = pc.match_substring_regex(column, NUMBER)
        number = pc.cast(pc.utf8_trim(pc.if_else(ok, column, None), " "), pa.float64())
        failed_rows = pc.and_(pc.is_valid(column), pc.invert(ok))
        message = pc.binary_join_element_wise(f"transform {target!r}: {function}: not a number: ", column, "")
        failed = pc.if_else(failed_rows, message, no_text)
    else:
        # (Rounded to the nearest double, as Spark's cast: an integer beyond 2**53 is no error.)
        number = pc.cast(column, pa.float64(), safe=False)
        failed = pa.chunked_array([pa.nulls(len(column), pa.string())])
    # Infinity and NaN (or a string overflowing to one) give null, on every engine.
    number = pc.if_else(pc.is_finite(number), number, pa.scalar(None, pa.float64()))
    low, high = epoch_bounds(unit)
    inside = pc.and_(pc.greater(number, low), pc.less(number, high))
    outside = pc.fill_null(pc.invert(inside), False)
    failed = pc.if_else(outside, f"transform {target!r}: {out_of_range(function, unit)}", failed)
    number = pc.if_else(inside, number, pa.scalar(None, pa.float64()))
    units = pc.cast(pc.trunc(number), pa.int64())
    micros = pc.multiply(units, _UNIT_MICROS[unit])
    if unit == "millis_to_micro":
        return micros, failed
    # Whole seconds rounded down and the microseconds beyond them, in integers (the instants of
    # years 1 to 9999 need more digits than a double holds).
    whole = pc.divide(micros, _MICROS)  # toward zero
    fraction = pc.subtract(micros, pc.multiply(whole, _MICROS))
    below = pc.less(fraction, 0)
    fraction = pc.if_else(below, pc.add(fraction, _MICROS), fraction)
    seconds = pc.if_else(below, pc.subtract(whole, 1), whole)
    text = pc.strftime(pc.cast(seconds, pa.timestamp("s", tz="UTC")), format="%Y-%m-%dT%H:%M:%S")
    millis = pc.utf8_lpad(pc.cast(pc.divide(fraction, 1000), pa.string()), 3, "0")
    micro_digits = pc.utf8_lpad(pc.cast(fraction, pa.string()), 6, "0")
    digits = pc.case_when(
        pc.make_struct(
            pc.equal(fraction, 0),
            pc.equal(pc.subtract(fraction, pc.multiply(pc.divide(fraction, 1000), 1000)), 0),
        ),
        "",
        pc.binary_join_element_wise(".", millis, ""),
        pc.binary_join_element_wise(".", micro_digits, ""),
    )
    return pc.binary_join_element_wise(text, digits, "Z", ""), failed


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

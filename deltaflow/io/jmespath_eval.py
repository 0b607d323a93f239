"""Transforms evaluated per message with the ``jmespath`` library (kafka-delta-ingest's way).

Both engines run the JMESPath transforms no engine compiles to columns
(:attr:`~deltaflow.config.transforms.Transform.per_message`) through :func:`evaluate`: the
Arrow engine in its tasks, the Spark engine in an Arrow UDF. Each message is the decoded row
as JSON: strings, numbers, booleans, objects and arrays as they are; timestamps and dates as
the text a cast to string writes (``2026-11-23 00:00:00.12``, UTC); binary as base64; the
``kafka`` object as kafka-delta-ingest gives it (``timestamp`` in microseconds,
``timestamp_type`` -1/0/1). The result is coerced into the target's column type
(:mod:`deltaflow.io.coercions`). An expression that raises for a message (a function given
the wrong type, a result the column cannot take) fails that message: it becomes a dead letter
with the reason.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import re
from functools import lru_cache
from typing import Any

import jmespath
import pyarrow as pa
import pyarrow.compute as pc
from jmespath import functions
from jmespath.exceptions import JMESPathError

from deltaflow.io.coercions import coerce, json_kind

__all__ = [
    "FUNCTIONS",
    "NUMBER",
    "as_text",
    "epoch_bounds",
    "epoch_iso8601",
    "evaluate",
    "json_rows",
    "out_of_range",
    "search",
]

_MICROS = 1_000_000
#: A number in a string, as the ``epoch_*`` functions take it (surrounding spaces allowed, ASCII digits); the
#: same regular expression on every engine (RE2 in Arrow, Java's in Spark, Python's here).
NUMBER = r"^ *[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)? *$"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: Microseconds per unit of the ``epoch_*`` functions' argument.
_UNIT_MICROS = {"seconds": _MICROS, "millis": 1000, "micros": 1, "millis_to_micro": 1000}
#: The instants an ``epoch_*_to_iso8601`` result can name: years 1 to 9999 (four digits).
_MIN_INSTANT_US = -62_135_596_800 * _MICROS
_MAX_INSTANT_US = 253_402_300_800 * _MICROS - 1
_INT64 = (-(1 << 63), (1 << 63) - 1)


def epoch_bounds(unit: str) -> tuple[float, float]:
    """The open interval of numbers an ``epoch_*`` function of ``unit`` takes, as doubles
    (every engine compares the argument with these: the same doubles, the same verdict): the
    whole units truncated from them give an instant in years 1 to 9999, or for
    ``millis_to_micro`` microseconds that fit 64 bits."""
    factor = _UNIT_MICROS[unit]
    low, high = _INT64 if unit == "millis_to_micro" else (_MIN_INSTANT_US, _MAX_INSTANT_US)
    # Whole units u with low <= u * factor <= high; truncation toward zero keeps x in
    # (first - 1, last + 1) within them.
    first, last = -(-low // factor), high // factor
    return float(first - 1), float(last + 1)


def out_of_range(function: str, unit: str) -> str:
    """Why an ``epoch_*`` argument outside :func:`epoch_bounds` fails the message."""
    if unit == "millis_to_micro":
        return f"{function}: out of range (the microseconds do not fit 64 bits)"
    return f"{function}: out of range (not in the years 1 to 9999)"


class FunctionArgumentError(ValueError):
    """A custom function refused its argument (the message becomes a dead letter)."""


def _number(value: Any, function: str, unit: str) -> int | None:
    """An ``epoch_*`` argument truncated toward zero (kafka-delta-ingest's ``as i64``); a string
    holding a number is taken too (deltaflow's leniency), null gives null; outside
    :func:`epoch_bounds` it fails."""
    if value is None:
        return None
    number: Any = value
    if isinstance(value, str):
        if not re.match(NUMBER, value):
            raise FunctionArgumentError(f"{function}: not a number: {value}")
        number = float(value.strip())
    if isinstance(number, float) and not math.isfinite(number):
        return None  # as the compiled forms: Infinity and NaN give null
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise FunctionArgumentError(
            f"{function}: not a number: {value if isinstance(value, str) else json_kind(value)}"
        )
    low, high = epoch_bounds(unit)
    if not low < float(number) < high:
        raise FunctionArgumentError(out_of_range(function, unit))
    return int(number)


def epoch_iso8601(units: int, unit: str) -> str:
    """``units`` of ``unit`` since the epoch as kafka-delta-ingest writes them (chrono's
    ``{:?}`` of a UTC instant): fractional digits only when not zero, in groups of three."""
    micros = units * _UNIT_MICROS[unit]
    instant = _EPOCH + dt.timedelta(microseconds=micros)
    # (strftime's %Y leaves out the leading zeros of years before 1000.)
    text = f"{instant.year:04d}" + instant.strftime("-%m-%dT%H:%M:%S")
    fraction = micros % _MICROS
    if fraction:
        text += f".{fraction // 1000:03d}" if fraction % 1000 == 0 else f".{fraction:06d}"
    return text + "Z"


def _text(value: Any) -> str | None:
    """``substr``'s argument as text: strings, and numbers and booleans as their JSON text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise FunctionArgumentError(f"substr: expected a string, got {json_kind(value)}")


def _count(value: Any) -> int:
    """A number as Rust's ``f64 as usize`` makes it: truncated, negative and NaN give 0."""
    if isinstance(value, float) and math.isnan(value):
        return 0
    return max(0, int(value))


class _Functions(functions.Functions):  # type: ignore[misc]
    """JMESPath's built-in functions plus kafka-delta-ingest's."""

    @functions.signature({"types": []}, {"types": ["number"]}, {"types": ["number"]})  # type: ignore[untyped-decorator]
    def _func_substr(self, value: Any, skip: Any, take: Any) -> str | None:
        text = _text(value)
        if text is None:
            return None
        start = _count(skip)
        return text[start : start + _count(take)]

    @functions.signature({"types": []})  # type: ignore[untyped-decorator]
    def _func_epoch_seconds_to_iso8601(self, value: Any) -> str | None:
        n = _number(value, "epoch_seconds_to_iso8601", "seconds")
        return None if n is None else epoch_iso8601(n, "seconds")

    @functions.signature({"types": []})  # type: ignore[untyped-decorator]
    def _func_epoch_millis_to_iso8601(self, value: Any) -> str | None:
        n = _number(value, "epoch_millis_to_iso8601", "millis")
        return None if n is None else epoch_iso8601(n, "millis")

    @functions.signature({"types": []})  # type: ignore[untyped-decorator]
    def _func_epoch_micros_to_iso8601(self, value: Any) -> str | None:
        n = _number(value, "epoch_micros_to_iso8601", "micros")
        return None if n is None else epoch_iso8601(n, "micros")

    @functions.signature({"types": []})  # type: ignore[untyped-decorator]
    def _func_epoch_millis_to_micro(self, value: Any) -> int | None:
        n = _number(value, "epoch_millis_to_micro", "millis_to_micro")
        return None if n is None else n * 1000


FUNCTIONS = _Functions()
_OPTIONS = jmespath.Options(custom_functions=FUNCTIONS)


@lru_cache(maxsize=256)
def _compiled(expression: str) -> Any:
    return jmespath.compile(expression)


def search(expression: str, message: dict[str, Any]) -> Any:
    """``expression`` over one message (a JSON object), with the custom functions."""
    return _compiled(expression).search(message, options=_OPTIONS)


def evaluate(
    expression: str, rows: pa.Table, target_type: pa.DataType, target: str
) -> tuple[pa.Array, pa.Array]:
    """``expression`` over every row of ``rows``, coerced into ``target_type``.

    Returns:
        The values, and per row why the transform failed (null where it did not).
    """
    messages = json_rows(rows)
    values: list[Any] = []
    errors: list[str | None] = []
    for message in messages:
        try:
            values.append(coerce(search(expression, message), target_type, target))
            errors.append(None)
        except (JMESPathError, ValueError, TypeError, ArithmeticError, OverflowError) as exc:
            values.append(None)
            errors.append(f"transform {target!r}: {exc}".replace("\n", " "))
    try:
        array = pa.array(values, target_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        array = _one_by_one(values, errors, target_type, target)
    return array, pa.array(errors, pa.string())


def _one_by_one(
    values: list[Any], errors: list[str | None], target_type: pa.DataType, target: str
) -> pa.Array:
    fixed: list[Any] = []
    for k, v in enumerate(values):
        try:
            pa.array([v], target_type)
            fixed.append(v)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            fixed.append(None)
            errors[k] = f"transform {target!r}: does not fit {target_type}: {exc}"
    return pa.array(fixed, target_type)


def json_rows(rows: pa.Table) -> list[dict[str, Any]]:
    """The rows as JSON objects (what the expressions see; see the module docstring)."""
    columns = {}
    for name, column in zip(rows.schema.names, rows.columns, strict=True):
        array = column.combine_chunks()
        if name == "kafka" and pa.types.is_struct(array.type):
            array = _kafka_json(array)
        columns[name] = _texts(array).to_pylist()
    names = list(columns)
    return (
        [
            {n: _json(v) for n, v in zip(names, values, strict=True)}
            for values in zip(*columns.values(), strict=True)
        ]
        if names
        else [{} for _ in range(rows.num_rows)]
    )


def _kafka_json(kafka: pa.StructArray) -> pa.StructArray:
    """The ``kafka`` struct with ``timestamp`` in microseconds (kafka-delta-ingest's value)."""
    fields = [kafka.type.field(i) for i in range(kafka.type.num_fields)]
    children = [kafka.field(i) for i in range(len(fields))]
    for i, f in enumerate(fields):
        if f.name == "timestamp" and pa.types.is_timestamp(f.type):
            children[i] = pc.cast(pc.cast(children[i], pa.timestamp("us", tz="UTC")), pa.int64())
            fields[i] = pa.field("timestamp", pa.int64())
    return pa.StructArray.from_arrays(
        children, fields=fields, mask=pc.is_null(kafka) if kafka.null_count else None
    )


def _texts(array: pa.Array) -> pa.Array:
    """Timestamps and dates (also nested in structs and lists) as text (:func:`as_text`)."""
    kind = array.type
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return as_text(array)
    if pa.types.is_struct(kind):
        fields = [kind.field(i) for i in range(kind.num_fields)]
        assert isinstance(array, pa.StructArray)
        children = [_texts(array.field(i)) for i in range(len(fields))]
        mask = pc.is_null(array) if array.null_count else None
        return pa.StructArray.from_arrays(
            children,
            fields=[pa.field(f.name, c.type) for f, c in zip(fields, children, strict=True)],
            mask=mask,
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        assert isinstance(array, (pa.ListArray, pa.LargeListArray))
        values = _texts(array.values)
        if values.type == kind.value_type:
            return array
        cls = pa.ListArray if pa.types.is_list(kind) else pa.LargeListArray
        return cls.from_arrays(array.offsets, values, mask=pc.is_null(array) if array.null_count else None)
    return array


def _json(v: Any) -> Any:
    """A Python value of an Arrow column as JSON (binary as base64, decimals as numbers, maps
    as objects)."""
    if isinstance(v, dict):
        return {k: _json(x) for k, x in v.items()}
    if isinstance(v, list):
        if v and all(isinstance(x, tuple) and len(x) == 2 for x in v):
            return {str(k): _json(x) for k, x in v}
        return [_json(x) for x in v]
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, decimal.Decimal):
        return float(v)
    return v


def as_text(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A date or timestamp column as Spark's cast to string writes it (timestamps as
    ``2026-01-02 03:04:05.12``, in UTC: the session's time zone)."""
    kind = column.type
    if pa.types.is_date(kind):
        return pc.strftime(pc.cast(column, pa.timestamp("s")), format="%Y-%m-%d")
    micros = pc.cast(pc.cast(column, pa.timestamp("us", tz=kind.tz)), pa.int64())
    seconds = pc.multiply(pc.floor(pc.divide(pc.cast(micros, pa.float64()), float(_MICROS))), float(_MICROS))
    whole = pc.cast(seconds, pa.int64())
    base = pc.strftime(
        pc.cast(pc.cast(whole, pa.timestamp("us", tz="UTC")), pa.timestamp("s", tz="UTC")),
        format="%Y-%m-%d %H:%M:%S",
    )
    fraction = pc.subtract(micros, whole)
    digits = pc.utf8_rtrim(pc.utf8_lpad(pc.cast(fraction, pa.string()), 6, "0"), "0")
    return pc.if_else(pc.equal(fraction, 0), base, pc.binary_join_element_wise(base, digits, "."))

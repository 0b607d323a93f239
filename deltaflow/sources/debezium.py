"""Debezium change events to typed rows, inside the source tasks.

Debezium, and the CDC tools that copy its layout, write one topic per database table. A
message's key is the row's key (a struct of the key columns); its value is the change envelope:
``op`` (``c`` create, ``r`` read by the snapshot, ``u`` update, ``d`` delete, ``t`` truncate),
``before`` and ``after`` (the row images; ``before`` of an update only with REPLICA IDENTITY FULL
or its equivalent), ``source`` (where the change was read) and ``ts_ms``. A delete is followed
by a tombstone (the key without a value) for log compaction; a mirror has nothing to do with it.

With Kafka Connect's JSON converter and ``schemas.enable=true`` each key and value is
``{"schema": ..., "payload": ...}``: the schema gives each column's Connect type and, by its
name, Debezium's semantic type, from which :func:`arrow_type` picks the Delta column type
(the mapping is in its docstring). Without schemas the payload comes alone, and the types are
the table's (or inferred from the values by the caller).

:func:`decode` turns one message into a :class:`Change`: the operation, the key, the row image
(values converted to the Arrow types) and the image's schema. A message that cannot be read
(not JSON, not an envelope, a value its type cannot hold) is a :class:`Change` with ``error``
set: the caller makes it a dead letter, and nothing is guessed.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import pyarrow as pa

__all__ = [
    "UNAVAILABLE",
    "Change",
    "AvroEnvelopes",
    "JsonEnvelopes",
    "arrow_type",
    "connect_schema",
    "converter",
    "decode",
    "envelope_columns",
    "event_data",
    "row_schema",
    "source_sequence",
    "struct_schema",
]

#: Delta's DECIMAL holds at most 38 digits; a wider one is kept as its exact digits in text.
MAX_DECIMAL_PRECISION = 38
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DAY = dt.date(1970, 1, 1)

_PLAIN: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "bytes": pa.binary(),
}
_DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
#: Semantic timestamps without a zone (the database's local time), and their unit per second.
_LOCAL_TIMESTAMPS = {
    "io.debezium.time.Timestamp": 1_000,
    "org.apache.kafka.connect.data.Timestamp": 1_000,
    "io.debezium.time.MicroTimestamp": 1_000_000,
    "io.debezium.time.NanoTimestamp": 1_000_000_000,
}
#: Times of day (Delta has no TIME type: kept as ``HH:MM:SS[.ffffff]`` text, as the
#: postgres-cdc mirror keeps them), and their unit per second.
_TIMES = {
    "io.debezium.time.Time": 1_000,
    "org.apache.kafka.connect.data.Time": 1_000,
    "io.debezium.time.MicroTime": 1_000_000,
    "io.debezium.time.NanoTime": 1_000_000_000,
}
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
_OPS: dict[str, Literal["upsert", "delete", "truncate"]] = {
    "c": "upsert",
    "r": "upsert",
    "u": "upsert",
    "d": "delete",
    "t": "truncate",
}


class _BadValueError(ValueError):
    pass


def _decimal_precision(schema: Mapping[str, Any]) -> tuple[int | None, int]:
    params = schema.get("parameters") or {}
    scale = int(params.get("scale", 0))
    precision = params.get("connect.decimal.precision")
    return (int(precision) if precision is not None else None), scale


def arrow_type(schema: Mapping[str, Any]) -> pa.DataType:
    """The Delta (Arrow) type of a Kafka Connect schema (a field's, or a whole struct's).

    ================================================  ============================================
    Connect type or semantic name                     Delta type
    ================================================  ============================================
    int8, int16, int32, int64                         BYTE, SHORT, INT, LONG
    float32, float64; boolean; string; bytes          FLOAT, DOUBLE; BOOLEAN; STRING; BINARY
    ``...data.Decimal`` (scale, precision <= 38)      DECIMAL(precision, scale)
    ``...data.Decimal`` wider or without precision    STRING (the exact digits)
    ``io.debezium.data.VariableScaleDecimal``         STRING (the exact digits)
    ``io.debezium.time.Date``, ``...data.Date``       DATE
    ``io.debezium.time.[Micro|Nano]Timestamp``,       TIMESTAMP_NTZ (the database's local time)
    ``...data.Timestamp``
    ``io.debezium.time.ZonedTimestamp``               TIMESTAMP (UTC)
    ``io.debezium.time.[Micro|Nano]Time``,            STRING ``HH:MM:SS[.ffffff]`` (Delta has no
    ``...data.Time``, ``ZonedTime``                   TIME; as the postgres-cdc mirror keeps them)
    ``Json``, ``Uuid``, ``Enum``, ``Xml``, ...        STRING (their text)
    array; map; struct                                ARRAY; MAP; STRUCT of the above
    ================================================  ============================================
    """
    name = schema.get("name")
    kind = schema.get("type")
    if name in _DATES:
        return pa.date32()
    if name in _LOCAL_TIMESTAMPS:
        return pa.timestamp("us")
    if name == _ZONED_TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    if name in _TIMES:
        return pa.string()
    if name == _DECIMAL:
        precision, scale = _decimal_precision(schema)
        if precision is not None and 0 < precision <= MAX_DECIMAL_PRECISION and 0 <= scale <= precision:
            return pa.decimal128(precision, scale)
        return pa.string()  # no declared precision, or beyond Delta's: the exact digits as text
    if name == _VARIABLE_DECIMAL:
        return pa.string()
    if kind == "struct":
        return pa.struct(struct_schema(schema))
    if kind == "array":
        return pa.list_(arrow_type(schema.get("items") or {"type": "string"}))
    if kind == "map":
        return pa.map_(arrow_type(schema.get("keys") or {}), arrow_type(schema.get("values") or {}))
    if kind in _PLAIN:
        return _PLAIN[kind]
    raise _BadValueError(f"unknown Kafka Connect type {kind!r}")


def struct_schema(schema: Mapping[str, Any]) -> pa.Schema:
    """The columns of a Connect struct schema (a row image or a key), nullable as declared."""
    fields = []
    for f in schema.get("fields") or []:
        fields.append(pa.field(f["field"], arrow_type(f), nullable=bool(f.get("optional", True))))
    return pa.schema(fields)


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise _BadValueError(f"{value!r} is not base64") from None
    raise _BadValueError(f"{value!r} is not bytes")


def _unscaled(value: Any, scale: int) -> Decimal:
    """A Connect Decimal: the unscaled number's big-endian two's complement bytes (base64 in
    JSON), or a ``Decimal`` already (Avro)."""
    if isinstance(value, Decimal):
        return value
    # From text, which is exact: Decimal arithmetic (scaleb included) rounds to the context's
    # 28 digits, and a NUMERIC(38) value would lose its last ten.
    return Decimal(f"{int.from_bytes(_bytes(value), 'big', signed=True)}E{-scale}")


def _decimal_text(number: Decimal) -> str:
    """The digits as a database prints them (``0.0000001``, not ``1E-7``)."""
    return format(number, "f")


def _time_text(value: Any, per_second: int) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, int) or isinstance(value, bool):
        raise _BadValueError(f"{value!r} is not a time of day")
    # Signed: MySQL's TIME is a duration (-838:59:59 to 838:59:59), sent as signed units.
    sign = "-" if value < 0 else ""
    micros = abs(value) * 1_000_000 // per_second
    seconds, micro = divmod(micros, 1_000_000)
    text = f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return f"{text}.{micro:06d}" if micro else text


def converter(schema: Mapping[str, Any]) -> Callable[[Any], Any]:
    """JSON payload value of ``schema`` -> the Python value of :func:`arrow_type`'s type
    (``None`` stays ``None``); raises ``ValueError`` for a value the type cannot hold."""
    name = schema.get("name")
    kind = schema.get("type")
    convert: Callable[[Any], Any]
    if name in _DATES:

        def convert(v: Any) -> Any:
            if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
                return v  # Avro's date logical type, read
            return _EPOCH_DAY + dt.timedelta(days=_int(v))

    elif name in _LOCAL_TIMESTAMPS:
        per_second = _LOCAL_TIMESTAMPS[name]

        def convert(v: Any) -> Any:
            if isinstance(v, dt.datetime):  # Avro's timestamp logical types, read (UTC)
                return v.astimezone(dt.UTC).replace(tzinfo=None) if v.tzinfo else v
            return _EPOCH + dt.timedelta(microseconds=_int(v) * 1_000_000 // per_second)

    elif name == _ZONED_TIMESTAMP:

        def convert(v: Any) -> Any:
            try:
                parsed = dt.datetime.fromisoformat(v)
            except (TypeError, ValueError):
                raise _BadValueError(f"{v!r} is not an ISO-8601 timestamp") from None
            if parsed.tzinfo is None:
                raise _BadValueError(f"{v!r} has no zone")
            return parsed.astimezone(dt.UTC)

    elif name in _TIMES:
        per_second = _TIMES[name]

        def convert(v: Any) -> Any:
            if isinstance(v, dt.time):  # Avro's time logical types, read
                return v.isoformat()
            return _time_text(v, per_second)

    elif name == _DECIMAL:
        declared, scale = _decimal_precision(schema)
        text = pa.types.is_string(arrow_type(schema))
        precision = declared or 0  # known whenever the type is a DECIMAL

        def convert(v: Any) -> Any:
            number = _unscaled(v, scale)
            if text:
                return _decimal_text(number)
            if len(number.as_tuple().digits) > precision or -int(number.as_tuple().exponent) > scale:
                raise _BadValueError(f"{number} does not fit DECIMAL({precision},{scale})")
            return number

    elif name == _VARIABLE_DECIMAL:

        def convert(v: Any) -> Any:
            if not isinstance(v, Mapping) or "value" not in v:
                raise _BadValueError(f"{v!r} is not a VariableScaleDecimal (scale, value)")
            return _decimal_text(_unscaled(v["value"], int(v.get("scale") or 0)))

    elif kind == "struct":
        fields = [(f["field"], converter(f)) for f in schema.get("fields") or []]

        def convert(v: Any) -> Any:
            if not isinstance(v, Mapping):
                raise _BadValueError(f"{v!r} is not a struct")
            return {n: (None if v.get(n) is None else c(v[n])) for n, c in fields}

    elif kind == "array":
        item = converter(schema.get("items") or {"type": "string"})

        def convert(v: Any) -> Any:
            if not isinstance(v, list):
                raise _BadValueError(f"{v!r} is not an array")
            return [None if x is None else item(x) for x in v]

    elif kind == "map":
        key, value = converter(schema.get("keys") or {}), converter(schema.get("values") or {})

        def convert(v: Any) -> Any:
            pairs = v.items() if isinstance(v, Mapping) else v
            try:
                return [(key(k), None if x is None else value(x)) for k, x in pairs]
            except (TypeError, ValueError) as exc:
                raise _BadValueError(f"{v!r} is not a map: {exc}") from None

    elif kind == "bytes":
        convert = _bytes
    elif kind in ("int8", "int16", "int32", "int64"):
        convert = _int
    elif kind in ("float32", "float64"):

        def convert(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, int | float | str):
                raise _BadValueError(f"{v!r} is not a number")
            return float(v)  # also "NaN", "Infinity"

    elif kind == "boolean":

        def convert(v: Any) -> Any:
            if not isinstance(v, bool):
                raise _BadValueError(f"{v!r} is not a boolean")
            return v

    elif kind == "string":

        def convert(v: Any) -> Any:
            return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

    else:
        raise _BadValueError(f"unknown Kafka Connect type {kind!r}")
    return convert


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _BadValueError(f"{v!r} is not an integer")
    return v


#: What Debezium sends for a value it did not get (``unavailable.value.placeholder``'s default),
#: as text, and base64 for a bytes column.
UNAVAILABLE = "__debezium_unavailable_value"
_UNAVAILABLE_BASE64 = base64.b64encode(UNAVAILABLE.encode()).decode()
_SHIFT = 64


def _unavailable(value: Any) -> bool:
    return value in (UNAVAILABLE, _UNAVAILABLE_BASE64) or (isinstance(value, list) and value == [UNAVAILABLE])


def source_sequence(source: Any) -> int | None:
    """The change's place in the database's change stream, comparable across all changes of one
    database (all topics, all partitions): PostgreSQL's ``sequence`` (``["<last commit LSN>",
    "<LSN>"]``) as ``commit * 2**64 + lsn``; MySQL's binlog ``file``, ``pos`` and ``row`` as
    ``(file number * 2**40 + pos) * 2**16 + row``. ``None`` for another source (the caller
    orders by the Kafka offset instead: comparable within a partition, where a key's changes
    are)."""
    if not isinstance(source, Mapping):
        return None
    sequence = source.get("sequence")
    if isinstance(sequence, str):
        try:
            parts = json.loads(sequence)
            if isinstance(parts, list) and len(parts) == 2:
                commit, lsn = (int(p) if p is not None else 0 for p in parts)
                return (commit << _SHIFT) + lsn
        except (ValueError, TypeError):
            return None
    binlog, pos = source.get("file"), source.get("pos")
    if isinstance(binlog, str) and isinstance(pos, int):
        digits = binlog.rsplit(".", 1)[-1]
        if digits.isdigit():
            row = source.get("row")
            return (((int(digits) << 40) + pos) << 16) + (row if isinstance(row, int) else 0)
    return None


@dataclass(frozen=True)
class Change:
    """One message of a Debezium topic, read.

    Attributes:
        op: ``upsert`` (create, snapshot read, update), ``delete``, ``truncate``, or ``None``
            for a tombstone (a key without a value: nothing to apply).
        key: The key's columns (from the message key; ``None`` when it has none).
        image: The row: ``after`` of an upsert, ``before`` of a delete (``None`` when the
            event carries no image, as a delete without REPLICA IDENTITY FULL may not).
        before: An update's row before the change, when the database sent it.
        schema: The image's columns from the envelope's schema (``None`` without schemas).
        key_schema: The key's columns from the key's schema (``None`` without schemas).
        error: Why the message cannot be applied (a dead letter); the rest is then ``None``.
        sequence: The change's place in the database's change stream, from the envelope's
            ``source`` (:func:`source_sequence`); ``None`` when it names none.
    """

    op: Literal["upsert", "delete", "truncate"] | None
    key: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    schema: pa.Schema | None = None
    key_schema: pa.Schema | None = None
    error: str | None = None
    sequence: int | None = None
    #: ``insert``, ``snapshot``, ``update``, ``delete`` or ``truncate`` (the event table's names).
    event: str | None = None
    #: The change's time in the database (``ts_ms`` of ``source``, else of the envelope).
    timestamp_ms: int | None = None
    #: ``<schema or database>.<table>`` from ``source`` (``None`` when it names no table).
    stream: str | None = None


def _envelope(raw: bytes, what: str) -> tuple[Any, Mapping[str, Any] | None]:
    """(payload, schema) of a JSON-converter message, with or without ``schemas.enable``."""
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _BadValueError(f"the {what} is not JSON: {exc}") from None
    if isinstance(value, dict) and set(value) == {"schema", "payload"}:
        schema = value["schema"]
        if schema is not None and not isinstance(schema, dict):
            raise _BadValueError(f"the {what}'s schema is not an object")
        return value["payload"], schema
    return value, None


def _field(schema: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    if schema is None:
        return None
    for f in schema.get("fields") or []:
        if f.get("field") == name:
            return dict(f)
    return None


def _row(value: Any, struct: _Struct | None, what: str) -> dict[str, Any] | None:
    """A row image's columns, typed; a column whose value Debezium did not have (its
    placeholder: an unchanged TOAST value PostgreSQL did not send) is left out."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _BadValueError(f"{what} is not an object")
    present: dict[str, Any] = {k: v for k, v in value.items() if not _unavailable(v)}
    if struct is None:
        return present
    row: dict[str, Any] = {}
    for name, convert in struct.fields:
        if name not in present:
            continue  # left out above, or not sent: the mirror keeps the column's value
        try:
            row[name] = None if present[name] is None else convert(present[name])
        except (ValueError, OverflowError) as exc:  # OverflowError: a date or time past year 9999
            raise _BadValueError(f"{what}: column {name!r}: {exc}") from None
    return row


@dataclass(frozen=True)
class _Struct:
    """A Connect struct schema compiled: each field's converter, and the Arrow columns."""

    fields: tuple[tuple[str, Callable[[Any], Any]], ...]
    arrow: pa.Schema

    @classmethod
    def of(cls, schema: Mapping[str, Any] | None) -> _Struct | None:
        if schema is None:
            return None
        return cls(
            tuple((f["field"], converter(f)) for f in schema.get("fields") or []), struct_schema(schema)
        )


class _Compiled:
    """A key's or an envelope's schema, compiled once per distinct schema (readers keep them):
    typing a message then costs no schema work."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        self._struct: _Struct | None = None
        self._images: tuple[_Struct | None, _Struct | None] | None = None

    @property
    def struct(self) -> _Struct | None:
        """The schema as a row (a key)."""
        if self._struct is None:
            self._struct = _Struct.of(self.schema)
        return self._struct

    @property
    def images(self) -> tuple[_Struct | None, _Struct | None]:
        """The envelope's ``after`` and ``before`` rows."""
        if self._images is None:
            self._images = (
                _Struct.of(_field(self.schema, "after")),
                _Struct.of(_field(self.schema, "before")),
            )
        return self._images


#: Distinct schemas a reader keeps compiled (a topic has a few; beyond, the oldest go).
_COMPILED_KEPT = 256
#: How the JSON converter (compact) and Python's json.dumps (spaced) begin an envelope, and
#: what separates its schema from its payload.
_SPLITS = ((b'{"schema": ', b', "payload": '), (b'{"schema":', b',"payload":'))


class JsonEnvelopes:
    """Reads JSON converter messages. With ``schemas.enable`` every message repeats its schema
    (most of its bytes): a message ``{"schema":S,"payload":P}`` has S parsed and compiled once
    per distinct S; any other text is parsed whole."""

    def __init__(self) -> None:
        self._compiled: dict[bytes, _Compiled] = {}

    def read(self, raw: bytes, what: str) -> tuple[Any, _Compiled | None]:
        for start, key in _SPLITS:
            if raw.startswith(start) and raw.endswith(b"}"):
                found = self._split(raw, start, key)
                if found is not None:
                    return found
        payload, schema = _envelope(raw, what)
        return payload, _Compiled(schema) if schema is not None else None

    def _split(self, raw: bytes, start: bytes, key: bytes) -> tuple[Any, _Compiled] | None:
        """(payload, compiled schema) of ``raw`` cut at its first ``key``; ``None`` when that is
        no place to cut (the key's text inside the schema, a parameter's name: the schema
        before it is then no JSON) or the payload is no JSON."""
        cut = raw.find(key)
        if cut <= 0:
            return None
        compiled = self._compiled.get(raw[:cut])
        if compiled is None:
            try:
                schema = json.loads(raw[len(start) : cut])
            except ValueError:
                return None
            if not isinstance(schema, dict):
                return None
            if len(self._compiled) >= _COMPILED_KEPT:
                self._compiled.clear()
            compiled = self._compiled[raw[:cut]] = _Compiled(schema)
        try:
            return json.loads(raw[cut + len(key) : -1]), compiled
        except ValueError:
            return None


_EVENTS = {"c": "insert", "r": "snapshot", "u": "update", "d": "delete", "t": "truncate"}


def _where(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The change's time and table, from the envelope."""
    found = payload.get("source")
    source: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    stamp = source.get("ts_ms", payload.get("ts_ms"))
    table = source.get("table")
    schema = source.get("schema") or source.get("db")
    return {
        "timestamp_ms": stamp if isinstance(stamp, int) and not isinstance(stamp, bool) else None,
        "stream": f"{schema}.{table}" if isinstance(table, str) and isinstance(schema, str) else None,
    }


def event_data(change: Change) -> str:
    """The change's row as JSON text, as an event table holds it: the row of an insert,
    snapshot read or delete, ``{"before": ..., "after": ...}`` of an update, ``{}`` of a truncate.
    Decimals keep their digits, times are ISO 8601, bytes base64."""
    if change.event == "update":
        return _json({"before": change.before, "after": change.image})
    if change.event == "truncate":
        return "{}"
    return _json(change.image if change.image is not None else change.key or {})


def _json(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{json.dumps(str(k))}:{_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_json(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime | dt.date):
        return json.dumps(value.isoformat())
    if isinstance(value, bytes):
        return json.dumps(base64.b64encode(value).decode())
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return json.dumps(str(value))  # NaN, Infinity: no JSON numbers
    return json.dumps(value, ensure_ascii=False)


def envelope_columns(schema: Mapping[str, Any]) -> pa.Schema | None:
    """The row's columns of a change envelope's Connect schema (its ``after``, else its
    ``before`` struct); ``None`` when it has neither."""
    row = _field(schema, "after") or _field(schema, "before")
    return struct_schema(row) if row is not None else None


def row_schema(text: str) -> tuple[pa.Schema | None, dict[str, Any] | None]:
    """From one change event's text: the row's columns (the envelope's ``after`` schema, with
    ``schemas.enable``), else its row as sent (``after``, or ``before``); ``(None, None)`` when
    it is no change event."""
    try:
        payload, schema = _envelope(text.encode(), "value")
    except _BadValueError:
        return None, None
    if schema is not None:
        try:
            columns = envelope_columns(schema)
        except _BadValueError:
            return None, None
        if columns is not None:
            return columns, None
    if isinstance(payload, dict):
        row = payload.get("after") or payload.get("before")
        if isinstance(row, dict):
            return None, row
    return None, None


def decode(
    key: bytes | None, value: bytes | None, reader: AvroEnvelopes | JsonEnvelopes | None = None
) -> Change:
    """One Debezium message as a :class:`Change`: Kafka Connect's JSON converter (with or without
    schemas; ``reader`` a :class:`JsonEnvelopes` to keep the schemas compiled across messages),
    or with an :class:`AvroEnvelopes` reader its Avro converter (the Confluent wire format and a
    registry)."""
    try:
        read = (reader or JsonEnvelopes()).read
        key_payload, key_schema = read(key, "key") if key is not None else (None, None)
        if key_payload is not None and not isinstance(key_payload, dict):
            raise _BadValueError("the key is not an object of the key's columns")
        key_struct = key_schema.struct if key_schema is not None else None
        key_row = _row(key_payload, key_struct, "the key")
        if value is None:
            return Change(None, key=key_row)
        payload, schema = read(value, "value")
        return _change(key_row, key_struct, payload, schema)
    except _BadValueError as exc:
        return Change(None, error=str(exc))


def _change(
    key_row: dict[str, Any] | None,
    key_struct: _Struct | None,
    payload: Any,
    schema: _Compiled | None,
) -> Change:
    if not isinstance(payload, dict) or "op" not in payload:
        raise _BadValueError("the value is not a Debezium change event (no 'op')")
    op = _OPS.get(str(payload["op"]))
    if op is None:
        raise _BadValueError(f"unknown Debezium op {payload['op']!r} (expected c, r, u, d or t)")
    sequence = source_sequence(payload.get("source"))
    where = _where(payload)
    if op == "truncate":
        return Change("truncate", key=key_row, sequence=sequence, event="truncate", **where)
    after_struct, before_struct = schema.images if schema is not None else (None, None)
    image_struct = after_struct if op == "upsert" else before_struct
    if schema is not None and image_struct is None:
        raise _BadValueError("the envelope's schema has no 'after'/'before' struct")
    before = _row(payload.get("before"), before_struct, "'before'")
    image = _row(payload.get("after"), after_struct, "'after'") if op == "upsert" else before
    if op == "upsert" and image is None:
        raise _BadValueError(f"a {payload['op']!r} event without 'after'")
    if op == "delete" and image is None and key_row is None:
        raise _BadValueError("a delete without 'before' and without a key: no row to delete")
    return Change(
        op,
        key=key_row,
        image=image,
        before=before if op == "upsert" else None,
        schema=image_struct.arrow if image_struct is not None else None,
        key_schema=key_struct.arrow if key_struct is not None else None,
        sequence=sequence,
        event=_EVENTS[str(payload["op"])],
        **where,
    )


# -- Avro (Kafka Connect's Avro converter) ------------------------------------------------------

_AVRO_PRIMITIVES = {
    "int": "int32",
    "long": "int64",
    "float": "float32",
    "double": "float64",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
    "enum": "string",
    "fixed": "bytes",
}


def connect_schema(avro: Any, names: dict[str, Any] | None = None, namespace: str = "") -> dict[str, Any]:
    """An Avro schema (as the Avro converter writes it: ``connect.name``, ``connect.type``,
    ``connect.parameters``) as the Kafka Connect schema the JSON converter would have sent, so
    that both are typed alike (:func:`arrow_type`, :func:`converter`)."""
    names = {} if names is None else names
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) != 1:
            raise _BadValueError(f"an Avro union of {avro!r} (a column is one type, or null)")
        return {**connect_schema(branches[0], names, namespace), "optional": True}
    if isinstance(avro, str):
        if avro in names or f"{namespace}.{avro}" in names:
            return dict(names.get(avro) or names[f"{namespace}.{avro}"])
        if avro not in _AVRO_PRIMITIVES:
            raise _BadValueError(f"unknown Avro type {avro!r}")
        return {"type": _AVRO_PRIMITIVES[avro], "optional": False}
    if not isinstance(avro, Mapping):
        raise _BadValueError(f"unknown Avro schema {avro!r}")
    kind = avro.get("type")
    out: dict[str, Any]
    if kind == "record":
        space = avro.get("namespace", namespace)
        name = avro.get("name", "")
        full = name if "." in name or not space else f"{space}.{name}"
        out = {"type": "struct", "name": avro.get("connect.name", full), "optional": False, "fields": []}
        names[full] = out
        names.setdefault(name, out)
        out["fields"] = [
            {"field": f["name"], **connect_schema(f["type"], names, space)} for f in avro["fields"]
        ]
        return out
    if kind == "array":
        out = {"type": "array", "items": connect_schema(avro["items"], names, namespace)}
    elif kind == "map":
        out = {
            "type": "map",
            "keys": {"type": "string"},
            "values": connect_schema(avro["values"], names, namespace),
        }
    elif isinstance(kind, list | Mapping):
        return connect_schema(kind, names, namespace)
    elif kind in _AVRO_PRIMITIVES:
        out = {"type": avro.get("connect.type", _AVRO_PRIMITIVES[kind])}
        if kind in ("enum", "fixed") and "name" in avro:
            names[avro["name"]] = {"type": _AVRO_PRIMITIVES[kind], "optional": False}
    else:
        raise _BadValueError(f"unknown Avro type {kind!r}")
    if "connect.name" in avro:
        out["name"] = avro["connect.name"]
    parameters = dict(avro.get("connect.parameters") or {})
    if avro.get("logicalType") == "decimal":
        out["name"] = _DECIMAL
        parameters.setdefault("scale", str(avro.get("scale", 0)))
        if "precision" in avro:
            parameters.setdefault("connect.decimal.precision", str(avro["precision"]))
    if parameters:
        out["parameters"] = parameters
    out["optional"] = False
    return out


class AvroEnvelopes:
    """Reads Avro converter messages: the Confluent wire format (magic byte 0, the schema id, the
    Avro datum), each schema read once from the registry
    (a :class:`~deltaflow.sources.decode.SchemaRegistry`)."""

    def __init__(self, registry: Any) -> None:
        import fastavro

        self._fastavro = fastavro
        self._registry = registry
        self._schemas: dict[int, tuple[Any, _Compiled]] = {}

    def _schema(self, schema_id: int) -> tuple[Any, _Compiled]:
        if schema_id not in self._schemas:
            from deltaflow.errors import ConfigError

            try:
                text = self._registry.schema_by_id(schema_id)
            except ConfigError as exc:
                raise _BadValueError(f"schema id {schema_id}: {exc}") from None
            parsed = json.loads(text)
            self._schemas[schema_id] = (
                self._fastavro.parse_schema(parsed),
                _Compiled(connect_schema(parsed)),
            )
        return self._schemas[schema_id]

    def read(self, raw: bytes, what: str) -> tuple[Any, _Compiled]:
        """(payload, its Connect schema compiled) of one framed Avro key or value."""
        import io

        if len(raw) < 5 or raw[0] != 0:
            raise _BadValueError(f"the {what} is not in the Confluent wire format (magic byte 0, schema id)")
        writer, schema = self._schema(int.from_bytes(raw[1:5], "big"))
        buf = io.BytesIO(raw[5:])
        try:
            record = self._fastavro.schemaless_reader(buf, writer, None)
        except Exception as exc:  # noqa: BLE001 - any decoding failure is this message's error
            raise _BadValueError(
                f"the {what} is no Avro datum of its schema: {type(exc).__name__}: {exc}"
            ) from None
        return record, schema

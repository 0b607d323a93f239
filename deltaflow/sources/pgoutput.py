"""PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1), decoded.

The built-in ``pgoutput`` plugin (no server extension) writes one binary message per row of
``pg_logical_slot_peek_binary_changes``: Begin, Relation, Insert/Update/Delete/Truncate, Commit
(PostgreSQL's documentation, "Logical Replication Message Formats"). Column values arrive in
PostgreSQL's text representation; :class:`ValueEncoder` turns a row into the JSON object of the
change events (:mod:`deltaflow.sources.postgres_cdc`), choosing per column type what JSON value
keeps the value exact:

=============================================  ==============================================
PostgreSQL type                                 JSON value in ``data``
=============================================  ==============================================
smallint, integer, bigint, oid, real, double,   number, as PostgreSQL printed it (``NaN`` and
numeric                                         ``Infinity`` as strings)
boolean                                         ``true`` / ``false``
json, jsonb                                     the document itself (nested JSON)
timestamptz                                     ISO 8601 string in UTC (``...+00:00``)
timestamp, date, time                           ISO 8601 string (values Python cannot hold, such
                                                as ``infinity``, BC dates or ``24:00``: as
                                                PostgreSQL printed them)
bytea                                           base64 string
arrays                                          JSON arrays (nested for several dimensions),
                                                each element encoded as its type's scalar;
                                                lower bounds (``[2:3]=``) are not kept
anything else (text, varchar, uuid, enums,      string, as PostgreSQL printed it
interval, ranges, inet, ...)
=============================================  ==============================================

The reading session fixes the settings that change PostgreSQL's text (``DateStyle=ISO``,
``IntervalStyle=postgres``, ``extra_float_digits=3``, ``bytea_output=hex``, UTF8, UTC), so the
output does not depend on a role's or database's defaults. A value PostgreSQL did not send (an
unchanged TOASTed column of an update) is left out of the object, so a consumer can tell
"unchanged" from ``null``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Begin",
    "Change",
    "Column",
    "Commit",
    "Relation",
    "Truncate",
    "ValueEncoder",
    "decode",
    "lsn_from_text",
    "lsn_to_text",
]

#: Microseconds between the Unix epoch and PostgreSQL's (2000-01-01 UTC).
_PG_EPOCH_US = 946_684_800_000_000

_INT64 = struct.Struct(">q")
_HEADER_BEGIN = struct.Struct(">qqI")
_HEADER_COMMIT = struct.Struct(">bqqq")
_INT32 = struct.Struct(">I")
_INT16 = struct.Struct(">H")


def lsn_from_text(text: str) -> int:
    """``'16/B374D848'`` -> the 64-bit position."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_to_text(lsn: int) -> str:
    """The 64-bit position as PostgreSQL writes it (``'16/B374D848'``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    key: bool


@dataclass(frozen=True)
class Relation:
    """A table's columns as the publication sends them (before its first change in a session)."""

    oid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]

    @property
    def stream(self) -> str:
        return f"{self.namespace or 'pg_catalog'}.{self.name}"


@dataclass(frozen=True)
class Begin:
    commit_lsn: int  # the LSN of the transaction's commit record
    commit_time_us: int  # Unix epoch microseconds
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


#: A column's value: text as PostgreSQL printed it, ``None`` for NULL, ``UNCHANGED`` for a
#: TOASTed value the update did not send.
UNCHANGED = object()
Values = tuple[Any, ...]


@dataclass(frozen=True)
class Change:
    """An insert, update or delete: ``old`` is the key (or the whole old row with replica
    identity full) of updates and deletes when the table's replica identity provides it."""

    kind: str  # insert | update | delete
    relation_oid: int
    new: Values | None
    old: Values | None
    old_is_key: bool


@dataclass(frozen=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


Message = Begin | Commit | Relation | Change | Truncate | None


def _string(data: bytes, pos: int, encoding: str) -> tuple[str, int]:
    end = data.index(0, pos)
    return data[pos:end].decode(encoding), end + 1


def _tuple(data: bytes, pos: int, encoding: str) -> tuple[Values, int]:
    (count,) = _INT16.unpack_from(data, pos)
    pos += 2
    values: list[Any] = []
    for _ in range(count):
        kind = data[pos]
        pos += 1
        if kind == 0x74:  # 't': text
            (size,) = _INT32.unpack_from(data, pos)
            pos += 4
            values.append(data[pos : pos + size].decode(encoding))
            pos += size
        elif kind == 0x6E:  # 'n': null
            values.append(None)
        elif kind == 0x75:  # 'u': unchanged TOASTed value
            values.append(UNCHANGED)
        else:
            raise ValueError(f"pgoutput: unexpected tuple column kind {chr(kind)!r}")
    return tuple(values), pos


def decode(data: bytes, encoding: str = "utf-8") -> Message:
    """One pgoutput message; ``None`` for the kinds a change stream does not need (origin,
    type, logical messages). Names and values are in the session's client ``encoding`` (pgoutput
    converts them from the database's)."""
    kind = data[0]
    if kind == 0x42:  # 'B'
        lsn, ts, xid = _HEADER_BEGIN.unpack_from(data, 1)
        return Begin(lsn, ts + _PG_EPOCH_US, xid)
    if kind == 0x43:  # 'C'
        _, lsn, end, ts = _HEADER_COMMIT.unpack_from(data, 1)
        return Commit(lsn, end, ts + _PG_EPOCH_US)
    if kind == 0x49:  # 'I': oid, 'N', new tuple
        (oid,) = _INT32.unpack_from(data, 1)
        new, _ = _tuple(data, 6, encoding)
        return Change("insert", oid, new, None, False)
    if kind == 0x55:  # 'U': oid, ['K'|'O' old tuple], 'N' new tuple
        (oid,) = _INT32.unpack_from(data, 1)
        pos, old, old_is_key = 5, None, False
        if data[pos] in (0x4B, 0x4F):
            old_is_key = data[pos] == 0x4B
            old, pos = _tuple(data, pos + 1, encoding)
        new, _ = _tuple(data, pos + 1, encoding)
        return Change("update", oid, new, old, old_is_key)
    if kind == 0x44:  # 'D': oid, 'K'|'O', old tuple
        (oid,) = _INT32.unpack_from(data, 1)
        old, _ = _tuple(data, 6, encoding)
        return Change("delete", oid, None, old, data[5] == 0x4B)
    if kind == 0x52:  # 'R'
        (oid,) = _INT32.unpack_from(data, 1)
        namespace, pos = _string(data, 5, encoding)
        name, pos = _string(data, pos, encoding)
        identity = chr(data[pos])
        (count,) = _INT16.unpack_from(data, pos + 1)
        pos += 3
        columns = []
        for _ in range(count):
            flags = data[pos]
            column, pos = _string(data, pos + 1, encoding)
            (type_oid,) = _INT32.unpack_from(data, pos)
            pos += 8  # type oid, type modifier
            columns.append(Column(column, type_oid, bool(flags & 1)))
        return Relation(oid, namespace, name, identity, tuple(columns))
    if kind == 0x54:  # 'T'
        (count,) = _INT32.unpack_from(data, 1)
        options = data[5]
        oids = tuple(_INT32.unpack_from(data, 6 + 4 * i)[0] for i in range(count))
        return Truncate(oids, bool(options & 1), bool(options & 2))
    if kind in (0x4F, 0x59, 0x4D):  # origin, type, logical message
        return None
    raise ValueError(f"pgoutput: unknown message kind {chr(kind)!r}")


# -- values --------------------------------------------------------------------------------

_NUMBERS = {20, 21, 23, 26, 700, 701, 1700}  # int8, int2, int4, oid, float4, float8, numeric
_BOOL = 16
_JSON = {114, 3802}
_TIMESTAMPTZ = 1184
_TEXT_ARRAY = 1009
#: Types whose text psycopg parses into Python values we print as ISO 8601 / base64.
_PARSED = {1114, 1082, 1083, 1266, 17}  # timestamp, date, time, timetz, bytea


class ValueEncoder:
    """Turns rows of a relation (PostgreSQL text values) into JSON object text.

    Arrays and the date/time/bytea types are parsed with psycopg's own loaders (the text
    format's rules live there); numbers, booleans and JSON are copied as text.
    """

    def __init__(self) -> None:
        self._encoders: dict[int, Callable[[str], str]] = {}

    def encode_row(self, relation: Relation, values: Values) -> str:
        parts = []
        for column, value in zip(relation.columns, values, strict=True):
            if value is UNCHANGED:
                continue
            text = "null" if value is None else self._encoder(column.type_oid)(value)
            parts.append(f"{json.dumps(column.name)}:{text}")
        return "{" + ",".join(parts) + "}"

    def _encoder(self, oid: int) -> Callable[[str], str]:
        found = self._encoders.get(oid)
        if found is None:
            found = self._encoders[oid] = self._make(oid)
        return found

    def _make(self, oid: int) -> Callable[[str], str]:
        if oid in _NUMBERS:
            return _number
        if oid == _BOOL:
            return lambda text: "true" if text == "t" else "false"
        if oid in _JSON:
            return lambda text: text
        from psycopg import adapters
        from psycopg.pq import Format

        element = _array_element(oid)
        if element is not None:
            # Split as text[] (psycopg parses the array syntax), then each element as a scalar
            # of its own type. Lower bounds (``[2:3]={...}``) are not kept.
            split = adapters.get_loader(_TEXT_ARRAY, Format.TEXT)
            assert split is not None
            splitter = split(_TEXT_ARRAY)
            inner = self._encoder(element)

            def array(text: str) -> str:
                return _nested(splitter.load(text.encode("utf-8")), inner)

            return _or_text(array)
        if oid == _TIMESTAMPTZ or oid in _PARSED:
            loader_cls = adapters.get_loader(oid, Format.TEXT)
            if loader_cls is None:
                return json.dumps
            loader = loader_cls(oid)

            def parsed(text: str) -> str:
                return _dump(loader.load(text.encode("utf-8")))

            return _or_text(parsed)
        return json.dumps


def _or_text(encode: Callable[[str], str]) -> Callable[[str], str]:
    """``encode``, or PostgreSQL's text as a JSON string for values Python cannot hold
    (``infinity`` timestamps, BC dates, years past 9999, ``24:00``)."""

    def guarded(text: str) -> str:
        try:
            return encode(text)
        except (ValueError, OverflowError, ArithmeticError, _data_error()):
            return json.dumps(text)

    return guarded


def _data_error() -> type[Exception]:
    from psycopg import DataError

    return DataError


def _nested(value: Any, inner: Callable[[str], str]) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_nested(v, inner) for v in value) + "]"
    return inner(str(value))


def _array_element(oid: int) -> int | None:
    """The element type of a built-in array type (``None`` if ``oid`` is no array)."""
    from psycopg import adapters

    for info in adapters.types:
        if info.array_oid == oid:
            return int(info.oid)
    return None


def _number(text: str) -> str:
    return json.dumps(text) if text in ("NaN", "Infinity", "-Infinity") else text


def _dump(value: Any) -> str:
    """JSON text of a parsed value; numerics stay exact (their digits, not a float's)."""
    from decimal import Decimal

    if isinstance(value, list):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value) if value.is_finite() else json.dumps(str(value))
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return json.dumps(value.isoformat())
    if isinstance(value, dt.date | dt.time):
        return json.dumps(value.isoformat())
    if isinstance(value, bytes | bytearray | memoryview):
        return json.dumps(base64.b64encode(bytes(value)).decode("ascii"))
    if value is None or isinstance(value, bool | int | float | str):
        return json.dumps(value)
    return json.dumps(str(value))

"""JSON values into Arrow column types, with kafka-delta-ingest's coercions (its ``coercions.rs``).

One home for what a JSON value becomes in a column of the table: the JSON decoder's Python
path (:mod:`deltaflow.sources.decode`) and the per-message transforms
(:mod:`deltaflow.io.jmespath_eval`) both coerce with :func:`coerce`. As kafka-delta-ingest:

* a string column takes any value: a non-string is its compact JSON text (objects with their
  keys sorted, as ``serde_json``'s default map writes them; non-ASCII characters as they are);
* a timestamp column takes an ISO-8601 string (``Z``, ``+00:00``, ``-00:00`` or any other
  offset, converted to UTC; none means UTC) or a number, which is microseconds since the epoch
  (what its Arrow JSON decoder reads into Delta's microsecond timestamps; fractions truncated);

and, as Spark's JSON reader (deltaflow's own leniency, beyond kafka-delta-ingest): dates take
ISO dates, decimals numbers or numeric strings, binary columns base64 strings.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from typing import Any

import pyarrow as pa

__all__ = ["coerce", "coerce_fields", "json_kind", "json_text"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def json_text(value: Any) -> str:
    """``value`` as kafka-delta-ingest writes a non-string into a string column."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def json_kind(v: Any) -> str:
    """The JSON type of ``v``, for error messages (``a number``, ``an object``, ...)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    return "an array" if isinstance(v, list) else "an object"


def coerce_fields(
    obj: dict[str, Any], struct_type: pa.StructType, path: str, extra: list[str]
) -> dict[str, Any]:
    """A JSON object as a row of ``struct_type``; its fields the struct lacks go to ``extra``."""
    names = {f.name for f in struct_type}
    extra += [f"{path}{k}" for k in obj if k not in names]
    return {f.name: coerce(obj.get(f.name), f.type, f"{path}{f.name}", extra) for f in struct_type}


def coerce(v: Any, t: pa.DataType, path: str, extra: list[str] | None = None) -> Any:
    """A JSON value as a Python value of Arrow type ``t`` (ValueError when it has none)."""
    extra = [] if extra is None else extra
    if v is None:
        return None
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return v if isinstance(v, str) else json_text(v)
    if pa.types.is_boolean(t) and isinstance(v, bool):
        return v
    if pa.types.is_integer(t) and number and float(v).is_integer():
        value = int(v)
        low, high = (
            (-(1 << (t.bit_width - 1)), 1 << (t.bit_width - 1))
            if pa.types.is_signed_integer(t)
            else (0, 1 << t.bit_width)
        )
        if low <= value < high:
            return value
        raise ValueError(f"{path}: {value} does not fit {t}")
    if pa.types.is_floating(t) and number:
        return float(v)
    if pa.types.is_decimal(t) and (number or isinstance(v, str)):
        return decimal.Decimal(str(v))
    if pa.types.is_timestamp(t):
        if isinstance(v, str):
            stamp = dt.datetime.fromisoformat(v)
            return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)
        if number:
            micros = int(v)  # truncated toward zero, as kafka-delta-ingest's `as i64`
            return _EPOCH + dt.timedelta(microseconds=micros)
    if pa.types.is_date(t) and isinstance(v, str):
        return dt.date.fromisoformat(v)
    if (pa.types.is_binary(t) or pa.types.is_large_binary(t)) and isinstance(v, str):
        return base64.b64decode(v, validate=True)
    if pa.types.is_struct(t) and isinstance(v, dict):
        return coerce_fields(v, t, f"{path}.", extra)
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and isinstance(v, list):
        return [coerce(x, t.value_type, path, extra) for x in v]
    if pa.types.is_map(t) and isinstance(v, dict):
        return [(str(k), coerce(x, t.item_type, path, extra)) for k, x in v.items()]
    raise ValueError(f"{path}: expected {t}, got {json_kind(v)}")

"""Message payload decoding to Arrow, inside the source tasks (JSON, Avro, gzip).

Decoding where the bytes are read keeps it off Spark's row path: JSON is parsed by pyarrow's
block parser in one call per chunk (a few µs per message), Avro by fastavro. A message that
cannot be decoded never fails the batch: its row carries the error text (for the dead-letter
table) and null data. Fields a message has but the schema lacks are reported per row.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import logging
import struct
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.json as pj

from deltaflow.errors import ConfigError, TransientError
from deltaflow.io.coercions import coerce_fields, json_kind

__all__ = [
    "AvroDecoder",
    "ContainerAvroDecoder",
    "Decoded",
    "JsonDecoder",
    "SchemaRegistry",
    "SingleObjectAvroDecoder",
    "avro_to_spark_ddl",
    "decompress",
]

logger = logging.getLogger(__name__)

#: Confluent wire format: magic byte 0, then a 4-byte big-endian schema id.
_CONFLUENT_HEADER = struct.Struct(">bI")
#: Longer than any Arrow binary value (an explicit end for ``binary_slice``).
_MAX_BINARY = (1 << 31) - 1
#: Avro single-object encoding: marker ``C3 01``, then an 8-byte schema fingerprint.
_SOE_MAGIC = b"\xc3\x01"
_SOE_HEADER_SIZE = 10
#: A failing block is halved down to this many messages; those are decoded one by one.
SLOW_PATH_BLOCK = 64
#: Timeout of one schema registry request.
REGISTRY_TIMEOUT_S = 10.0


@dataclass
class Decoded:
    """The decoded chunk: one entry per input message, in order."""

    data: pa.StructArray
    errors: list[str | None]
    unknown_fields: list[list[str] | None] = field(default_factory=list)


def decompress(values: Sequence[bytes | None], codec: str) -> tuple[list[bytes | None], list[str | None]]:
    """Decompress every value (``gzip``); a value that fails gets ``None`` and an error."""
    if codec == "none":
        return list(values), [None] * len(values)
    out: list[bytes | None] = []
    errors: list[str | None] = []
    for v in values:
        if v is None:
            out.append(None)
            errors.append(None)
            continue
        try:
            out.append(gzip.decompress(v))
            errors.append(None)
        except (OSError, EOFError, zlib.error) as exc:
            out.append(None)
            errors.append(f"gzip: {exc}")
    return out, errors


class JsonDecoder:
    """JSON objects -> a struct array of ``schema`` (pyarrow's parser, explicit schema).

    With ``registry``, values are in the Confluent wire format (kafka-delta-ingest's
    ``--json <registry URL>``): magic byte 0, a 4-byte schema id the registry must know, then
    the JSON; the frame is checked and removed with Arrow compute.
    """

    def __init__(self, schema: pa.Schema, registry: SchemaRegistry | None = None) -> None:
        self.schema = schema
        self._registry = registry
        self._known_ids: dict[int, str | None] = {}
        self._type = pa.struct(list(schema))
        # pyarrow's parser handles these types; any other (date, map, decimal, binary) sends
        # every message through the Python path.
        self._fast = all(_fast_type(f.type) for f in schema)

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        if self._registry is None:
            return self._decode(values)
        payloads, frame_errors = self._unframe(values)
        out = self._decode(payloads)
        for i, e in enumerate(frame_errors):
            if e is not None:
                out.errors[i] = e
        if any(e is not None for e in frame_errors):
            mask = pa.array([e is not None for e in out.errors], pa.bool_())
            data = out.data
            children = [data.field(i) for i in range(data.type.num_fields)]
            out.data = pa.StructArray.from_arrays(children, fields=list(data.type), mask=mask)
        return out

    def _unframe(self, values: Sequence[bytes | None]) -> tuple[list[bytes | None], list[str | None]]:
        """The JSON payloads of Confluent-framed values, and why a frame is refused."""
        import pyarrow.compute as pc

        assert self._registry is not None
        raw = pc.fill_null(pa.array(values, pa.binary()), b"")
        long_enough = pc.fill_null(pc.greater_equal(pc.binary_length(raw), _CONFLUENT_HEADER.size), False)
        framed = pc.and_(long_enough, pc.equal(pc.binary_slice(raw, 0, 1), b"\x00"))
        ids = pc.if_else(framed, pc.binary_slice(raw, 1, _CONFLUENT_HEADER.size), None)
        for schema_id in pc.unique(ids).to_pylist():  # a few per chunk: ask the registry once each
            if schema_id is not None:
                number = int.from_bytes(schema_id, "big")
                if number not in self._known_ids:
                    try:
                        self._registry.schema_by_id(number)
                        self._known_ids[number] = None
                    except ConfigError as exc:  # unknown id: every message naming it is a dead letter
                        self._known_ids[number] = f"JSON: {exc}"
        # With an explicit stop: without one, binary_slice fails ("Negative buffer resize",
        # pyarrow 26) when the values' lengths differ.
        rest = pc.binary_slice(raw, _CONFLUENT_HEADER.size, _MAX_BINARY)
        payloads = pc.if_else(framed, rest, None).to_pylist()
        if framed.false_count == 0 and not any(self._known_ids.values()):
            return payloads, [None] * len(values)
        errors: list[str | None] = []
        for ok, value, schema_id in zip(framed.to_pylist(), values, ids.to_pylist(), strict=True):
            if ok:
                errors.append(self._known_ids[int.from_bytes(schema_id, "big")])
            elif not value:
                errors.append(None)  # empty: the decoder's own error
            elif len(value) < _CONFLUENT_HEADER.size:
                errors.append("JSON: shorter than the Confluent header (magic byte + schema id)")
            else:
                errors.append(f"JSON: magic byte {value[0]}, expected 0 (Confluent wire format)")
        return payloads, errors

    def _decode(self, values: Sequence[bytes | None]) -> Decoded:
        n = len(values)
        errors: list[str | None] = [None] * n
        unknown: list[list[str] | None] = [None] * n
        good: list[int] = []
        lines: list[bytes] = []
        if _one_object_per_line(values):
            good, lines = list(range(n)), list(values)  # type: ignore[arg-type]
        else:
            for i, v in enumerate(values):
                if v is None or not v.strip():
                    errors[i] = "empty message: no JSON object"
                    continue
                # Valid JSON holds no raw newline inside a string, so newlines are only
                # whitespace; replacing them keeps one message per line for the parser.
                good.append(i)
                lines.append(v.replace(b"\n", b" ").replace(b"\r", b" "))
        tables: list[tuple[list[int], pa.Table]] = []
        self._parse(good, lines, errors, unknown, tables)
        if len(tables) == 1 and len(tables[0][0]) == n:
            return Decoded(_struct(tables[0][1], self._type, errors), errors, unknown)
        # Parsed pieces + nulls for the failed messages, back in message order.
        merged = pa.concat_tables([_select(t, self.schema) for _, t in tables] or [self.schema.empty_table()])
        position: list[int | None] = [None] * n
        row = 0
        for idx, _table in tables:
            for i in idx:
                position[i] = row
                row += 1
        data = _struct(merged.take(pa.array(position, pa.int64())), self._type, errors)
        return Decoded(data, errors, unknown)

    def _parse(
        self,
        idx: list[int],
        lines: list[bytes],
        errors: list[str | None],
        unknown: list[list[str] | None],
        out: list[tuple[list[int], pa.Table]],
        screened: bool = False,
    ) -> None:
        """Parse ``lines`` as one block. On failure, first set aside the messages that are not
        JSON objects at all (the usual dead letters; ``json`` finds them in a few µs each) and
        parse the rest as one block again; if that fails too, halve it, and decode small
        failing blocks message by message in Python (which also takes what pyarrow's parser
        refuses)."""
        if not idx:
            return
        if self._fast:
            table, _error = self._parse_block(lines, "infer")
            if table is not None:
                extra = _extra_fields(table.schema, self.schema)
                if extra:
                    for k, names in _rows_with(table, extra).items():
                        unknown[idx[k]] = names
                    table, _error = self._parse_block(lines, "ignore")
            else:
                # An unknown field whose type changes breaks inference: parse without it.
                table, _error = self._parse_block(lines, "ignore")
                if table is not None:
                    self._top_level_unknown(idx, lines, unknown)
            if table is not None:
                out.append((idx, table))
                return
            if not screened and len(idx) > SLOW_PATH_BLOCK:
                verdicts = [_not_an_object(line) for line in lines]
                if any(verdicts):
                    keep = [k for k, v in enumerate(verdicts) if v is None]
                    for k, v in enumerate(verdicts):
                        if v is not None:
                            errors[idx[k]] = v
                    rest_idx, rest_lines = [idx[k] for k in keep], [lines[k] for k in keep]
                    self._parse(rest_idx, rest_lines, errors, unknown, out, screened=True)
                    return
            if len(idx) > SLOW_PATH_BLOCK:
                half = len(idx) // 2
                self._parse(idx[:half], lines[:half], errors, unknown, out, screened=True)
                self._parse(idx[half:], lines[half:], errors, unknown, out, screened=True)
                return
        self._slow(idx, lines, errors, unknown, out)

    def _top_level_unknown(self, idx: list[int], lines: list[bytes], unknown: list[list[str] | None]) -> None:
        names = set(self.schema.names)
        for i, line in zip(idx, lines, strict=True):
            extra = [k for k in json.loads(line) if k not in names]
            if extra:
                unknown[i] = extra

    def _slow(
        self,
        idx: list[int],
        lines: list[bytes],
        errors: list[str | None],
        unknown: list[list[str] | None],
        out: list[tuple[list[int], pa.Table]],
    ) -> None:
        """Decode each message with ``json`` and coerce it (:mod:`deltaflow.io.coercions`)."""
        rows: list[dict[str, Any]] = []
        good: list[int] = []
        for i, line in zip(idx, lines, strict=True):
            extra: list[str] = []
            try:
                obj = _json_object(line)
                rows.append(coerce_fields(obj, self._type, "", extra))
            except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:
                errors[i] = f"JSON: {exc}"
                continue
            good.append(i)
            if extra:
                unknown[i] = extra
        if not good:
            return
        try:
            out.append((good, pa.Table.from_pylist(rows, schema=self.schema)))
            return
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
        # A value its column cannot hold (a decimal with more digits than its precision or
        # scale): that message fails, not the batch.
        kept: list[int] = []
        fitting: list[dict[str, Any]] = []
        for i, row in zip(good, rows, strict=True):
            try:
                pa.Table.from_pylist([row], schema=self.schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                errors[i] = f"JSON: does not fit the table: {exc}"
                unknown[i] = None
                continue
            kept.append(i)
            fitting.append(row)
        if kept:
            out.append((kept, pa.Table.from_pylist(fitting, schema=self.schema)))

    def _parse_block(self, lines: list[bytes], behavior: str) -> tuple[pa.Table | None, str | None]:
        buf = b"\n".join(lines)
        try:
            table = pj.read_json(
                io.BytesIO(buf),
                read_options=pj.ReadOptions(block_size=max(len(buf) + 1, 1 << 20), use_threads=False),
                parse_options=pj.ParseOptions(
                    explicit_schema=self.schema, unexpected_field_behavior=behavior
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            reason = str(exc).removeprefix("JSON parse error: ").removesuffix(" in row 0")
            return None, f"JSON: {reason}"
        if table.num_rows != len(lines):
            return None, "not one JSON object per message"
        return table, None


def _json_object(line: bytes) -> dict[str, Any]:
    """``line`` as a JSON object; ValueError (the dead letter's reason) when it is not one."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError(f"not a JSON object but {json_kind(obj)}")
    return obj


def _not_an_object(line: bytes) -> str | None:
    """The decoding error of a message that is not a JSON object (as :meth:`JsonDecoder._slow`
    reports it), None for a JSON object."""
    try:
        _json_object(line)
    except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:
        return f"JSON: {exc}"
    return None


def _one_object_per_line(values: Sequence[bytes | None]) -> bool:
    """Whether ``values`` joined by newlines is one line per message, each starting an object.

    Scans in C instead of looking at each message in Python: no value is missing, none holds
    a newline or carriage return, and every line starts with ``{`` (so none is blank).
    """
    if not values or None in values:
        return False
    buf = b"\n".join(values)  # type: ignore[arg-type]
    n = len(values)
    return (
        buf.startswith(b"{") and buf.count(b"\n") == n - 1 and buf.count(b"\n{") == n - 1 and b"\r" not in buf
    )


def _fast_type(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return all(_fast_type(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _fast_type(t.value_type)
    return bool(
        pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_timestamp(t)
    )


def _select(table: pa.Table, schema: pa.Schema) -> pa.Table:
    return table.select(schema.names).cast(schema)


def _struct(table: pa.Table, struct_type: pa.DataType, errors: Sequence[str | None]) -> pa.StructArray:
    """The table as one struct array, null where the message failed."""
    table = table.select([f.name for f in struct_type])
    arrays = [table.column(f.name).combine_chunks().cast(f.type) for f in struct_type]
    mask = pa.array([e is not None for e in errors], pa.bool_())
    return pa.StructArray.from_arrays(arrays, fields=list(struct_type), mask=mask)


def _extra_fields(got: pa.Schema | pa.StructType, want: pa.Schema | pa.StructType) -> list[str]:
    """Dotted paths of fields in ``got`` that ``want`` lacks (recursing into structs)."""
    wanted = {f.name: f for f in want}
    out: list[str] = []
    for f in got:
        w = wanted.get(f.name)
        if w is None:
            out.append(f.name)
        elif pa.types.is_struct(f.type) and pa.types.is_struct(w.type):
            out += [f"{f.name}.{sub}" for sub in _extra_fields(f.type, w.type)]
    return out


def _rows_with(table: pa.Table, paths: list[str]) -> dict[int, list[str]]:
    """Row index -> the unknown fields (of ``paths``) that row carries."""
    import pyarrow.compute as pc

    found: dict[int, list[str]] = {}
    for path in paths:
        column: Any = table
        for part in path.split("."):
            column = column.column(part) if isinstance(column, pa.Table) else pc.struct_field(column, part)
        mask = pc.is_valid(column).to_pylist()
        for k, present in enumerate(mask):
            if present:
                found.setdefault(k, []).append(path)
    return found


# -- Avro ------------------------------------------------------------------------------------


class SchemaRegistry:
    """A Confluent-compatible schema registry, read over HTTP(S) (GET requests only).

    Written against the registry's REST API (``/schemas/ids/<id>``,
    ``/subjects/<subject>/versions/latest``) with the standard library: confluent-kafka's
    registry client pulls in dependencies that cannot be installed next to our pins.
    """

    def __init__(self, url: str, *, basic_auth: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._auth = basic_auth

    def _get(self, path: str) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", headers={"Accept": "application/json"})
        if self._auth:
            token = base64.b64encode(self._auth.encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=REGISTRY_TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise ConfigError(
                    f"schema registry {self.url} has nothing at {path} (HTTP 404)", registry=self.url
                ) from None
            raise TransientError(f"schema registry {self.url}{path}: HTTP {exc.code}") from None
        except OSError as exc:
            raise TransientError(f"schema registry {self.url} unreachable: {exc}") from None

    def schema_by_id(self, schema_id: int) -> str:
        return str(self._get(f"/schemas/ids/{schema_id}")["schema"])

    def latest(self, subject: str) -> tuple[int, str]:
        found = self._get(f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest")
        return int(found["id"]), str(found["schema"])


class AvroDecoder:
    """Avro values -> a struct array: Confluent-framed with a registry, or bare datums.

    ``reader_schema`` (Avro JSON) fixes the output columns; each message's writer schema
    (by id, from the registry) is resolved against it, so compatible evolution just works.
    """

    def __init__(
        self, reader_schema: str, arrow_type: pa.StructType, registry: SchemaRegistry | None
    ) -> None:
        import fastavro

        self._fastavro = fastavro
        self._reader = fastavro.parse_schema(json.loads(reader_schema))
        self._type = arrow_type
        self._registry = registry
        self._writers: dict[int, Any] = {}
        self._missing: dict[int, str] = {}
        #: Per writer schema: its top-level fields the reader schema lacks (dropped on read).
        self._extra: dict[int, list[str] | None] = {}
        self._reader_fields = set(_field_names(self._reader))

    def _writer(self, schema_id: int) -> Any:
        if schema_id in self._missing:
            raise ValueError(self._missing[schema_id])
        if schema_id not in self._writers:
            assert self._registry is not None
            try:
                text = self._registry.schema_by_id(schema_id)
            except ConfigError as exc:  # unknown id: every message naming it is a dead letter
                self._missing[schema_id] = str(exc)
                raise
            parsed = self._fastavro.parse_schema(json.loads(text))
            self._writers[schema_id] = parsed
            extra = [name for name in _field_names(parsed) if name not in self._reader_fields]
            self._extra[schema_id] = extra or None
        return self._writers[schema_id]

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        records: list[dict[str, Any] | None] = []
        errors: list[str | None] = []
        unknown: list[list[str] | None] = []
        for v in values:
            try:
                record, extra = self._decode_one(v)
                records.append(record)
                errors.append(None)
                unknown.append(extra)
            except TransientError:
                raise
            except Exception as exc:  # noqa: BLE001 - any decoding failure is this message's error
                records.append(None)
                errors.append(f"Avro: {type(exc).__name__}: {exc}")
                unknown.append(None)
        try:
            data = pa.array(records, self._type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            data, errors = self._one_by_one(records, errors)
        assert isinstance(data, pa.StructArray)
        return Decoded(data, errors, unknown)

    def _decode_one(self, value: bytes | None) -> tuple[dict[str, Any], list[str] | None]:
        if not value:
            raise ValueError("empty message")
        buf = io.BytesIO(value)
        writer = self._reader
        extra: list[str] | None = None
        if self._registry is not None:
            if len(value) < _CONFLUENT_HEADER.size:
                raise ValueError("shorter than the Confluent header (magic byte + schema id)")
            magic, schema_id = _CONFLUENT_HEADER.unpack_from(value)
            if magic != 0:
                raise ValueError(f"magic byte {magic}, expected 0 (Confluent wire format)")
            writer = self._writer(schema_id)
            extra = self._extra[schema_id]
            buf.seek(_CONFLUENT_HEADER.size)
        record = self._fastavro.schemaless_reader(buf, writer, self._reader)
        if buf.tell() != len(value):
            raise ValueError(f"{len(value) - buf.tell()} trailing byte(s) after the record")
        if not isinstance(record, dict):
            raise ValueError("the Avro schema is not a record")
        return record, extra

    def _one_by_one(
        self, records: list[dict[str, Any] | None], errors: list[str | None]
    ) -> tuple[pa.Array, list[str | None]]:
        fixed: list[dict[str, Any] | None] = []
        for k, r in enumerate(records):
            try:
                pa.array([r], self._type)
                fixed.append(r)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                fixed.append(None)
                errors[k] = f"Avro: does not fit the table: {exc}"
        return pa.array(fixed, self._type), errors


class SingleObjectAvroDecoder(AvroDecoder):
    """Avro single-object encoding (kafka-delta-ingest's ``--soe-avro``): ``0xC3 0x01``, the
    writer schema's 8-byte little-endian CRC-64-AVRO fingerprint, then the datum.

    The writer schemas are the ``.avsc`` files given; a message is read with the one whose
    fingerprint it carries (as kafka-delta-ingest: no reader schema), its fields landing in the
    table's columns of the same name; an unknown fingerprint makes it a dead letter.
    """

    def __init__(self, schemas: Sequence[str], arrow_type: pa.StructType) -> None:
        import fastavro
        from fastavro.schema import fingerprint, to_parsing_canonical_form

        self._fastavro = fastavro
        self._type = arrow_type
        self._registry = None
        self._reader_fields = {f.name for f in arrow_type}
        self._by_fingerprint: dict[bytes, Any] = {}
        self._extra_by_fingerprint: dict[bytes, list[str] | None] = {}
        for text in schemas:
            parsed = fastavro.parse_schema(json.loads(text))
            key = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
            self._by_fingerprint[key] = parsed
            extra = [n for n in _field_names(parsed) if n not in self._reader_fields]
            self._extra_by_fingerprint[key] = extra or None

    def _decode_one(self, value: bytes | None) -> tuple[dict[str, Any], list[str] | None]:
        if not value:
            raise ValueError("empty message")
        if len(value) < _SOE_HEADER_SIZE or not value.startswith(_SOE_MAGIC):
            raise ValueError("not Avro single-object encoded (no C3 01 header)")
        key = value[2:_SOE_HEADER_SIZE]
        writer = self._by_fingerprint.get(key)
        if writer is None:
            raise ValueError(f"unknown schema with fingerprint {key.hex()}")
        buf = io.BytesIO(value)
        buf.seek(_SOE_HEADER_SIZE)
        record = self._fastavro.schemaless_reader(buf, writer, None)
        if buf.tell() != len(value):
            raise ValueError(f"{len(value) - buf.tell()} trailing byte(s) after the record")
        if not isinstance(record, dict):
            raise ValueError("the Avro schema is not a record")
        return record, self._extra_by_fingerprint[key]


class ContainerAvroDecoder(AvroDecoder):
    """Each message an Avro object container file (kafka-delta-ingest's ``--avro ""``, or with a
    schema file its reader schema): its first record, read with the schema it embeds (resolved
    against ``reader_schema`` when given)."""

    def __init__(self, reader_schema: str | None, arrow_type: pa.StructType) -> None:
        import fastavro

        self._fastavro = fastavro
        self._type = arrow_type
        self._registry = None
        self._container_reader = fastavro.parse_schema(json.loads(reader_schema)) if reader_schema else None
        self._reader_fields = {f.name for f in arrow_type}

    def _decode_one(self, value: bytes | None) -> tuple[dict[str, Any], list[str] | None]:
        if not value:
            raise ValueError("empty message")
        reader = self._fastavro.reader(io.BytesIO(value), self._container_reader)
        record = next(iter(reader), None)
        if record is None:
            raise ValueError("the Avro container holds no record")
        if not isinstance(record, dict):
            raise ValueError("the Avro schema is not a record")
        extra = [n for n in _field_names(reader.writer_schema) if n not in self._reader_fields]
        return record, extra or None


def _field_names(schema: Any) -> list[str]:
    """Top-level field names of a parsed Avro record schema (none for other schemas)."""
    fields = schema.get("fields", []) if isinstance(schema, dict) else []
    return [str(f["name"]) for f in fields]


@lru_cache(maxsize=64)
def avro_to_spark_ddl(schema_json: str) -> str:
    """The Spark DDL (``a LONG, b STRUCT<...>``) of an Avro record schema."""
    schema = json.loads(schema_json)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError("the Avro value schema must be a record")
    return ", ".join(f"`{f['name']}` {_avro_type(f['type'])}" for f in schema["fields"])


_AVRO_PRIMITIVES = {
    "boolean": "BOOLEAN",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "string": "STRING",
    "bytes": "BINARY",
    "fixed": "BINARY",
    "enum": "STRING",
}
#: Avro logical types without a Spark column type here: refused at start, not per message.
_AVRO_UNSUPPORTED = ("time-millis", "time-micros", "duration")
_AVRO_LOGICAL = {
    "timestamp-millis": "TIMESTAMP",
    "timestamp-micros": "TIMESTAMP",
    "local-timestamp-millis": "TIMESTAMP_NTZ",
    "local-timestamp-micros": "TIMESTAMP_NTZ",
    "date": "DATE",
    "uuid": "STRING",
}


def _avro_type(t: Any) -> str:
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        if len(branches) != 1:
            raise ConfigError(f"Avro unions other than [null, T] are not supported: {t}")
        return _avro_type(branches[0])
    if isinstance(t, str):
        if t in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[t]
        raise ConfigError(f"Avro type {t!r} is not supported (named type references are not)")
    logical = t.get("logicalType")
    if logical in _AVRO_UNSUPPORTED:
        raise ConfigError(f"Avro logical type {logical!r} has no Spark column type; it is not supported")
    if logical in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[logical]
    if logical == "decimal":
        return f"DECIMAL({t['precision']},{t.get('scale', 0)})"
    kind = t["type"]
    if kind == "record":
        return "STRUCT<" + ", ".join(f"`{f['name']}`: {_avro_type(f['type'])}" for f in t["fields"]) + ">"
    if kind == "array":
        return f"ARRAY<{_avro_type(t['items'])}>"
    if kind == "map":
        return f"MAP<STRING, {_avro_type(t['values'])}>"
    return _avro_type(kind)

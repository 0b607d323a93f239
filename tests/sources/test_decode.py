"""Payload decoding in the source tasks: JSON and Avro to Arrow, errors per message."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import struct

import fastavro
import fastavro.schema
import pyarrow as pa
import pytest

from deltaflow.errors import ConfigError
from deltaflow.sources.decode import (
    AvroDecoder,
    ContainerAvroDecoder,
    JsonDecoder,
    SchemaRegistry,
    SingleObjectAvroDecoder,
    avro_to_spark_ddl,
    decompress,
)
from tests.fixtures.registry import AVRO_V1, AVRO_V2

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("user", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("meta", pa.struct([("a", pa.int32())])),
    ]
)


def test_json_good_bad_and_unknown_fields_keep_message_order():
    values = [
        b'{"id": 1, "user": "a", "extra": 3}',
        None,
        b"   ",
        b'{"id": "x"}',
        b"5",
        b'{"id": 2,\n  "meta": {"a": 5, "b": 6}}',
        b'{"id": 3}{"id": 4}',
        b"\xff\xfe",
        b'{"id": 7, "ts": "2026-01-01T00:00:00Z"}',
    ]
    out = JsonDecoder(SCHEMA).decode(values)
    rows = out.data.to_pylist()
    assert len(rows) == len(values)
    assert rows[0] == {"id": 1, "user": "a", "ts": None, "meta": None}
    assert rows[5] == {"id": 2, "user": None, "ts": None, "meta": {"a": 5}}
    assert rows[8]["id"] == 7
    assert rows[8]["ts"] == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    bad = {1, 2, 3, 4, 6, 7}
    for i in range(len(values)):
        assert (out.errors[i] is not None) == (i in bad), (i, out.errors[i])
        assert (rows[i] is None) == (i in bad)
    assert out.errors[3] == "JSON: id: expected int64, got a string"
    assert out.errors[4] == "JSON: not a JSON object but a number"
    assert out.errors[1].startswith("empty message")
    assert out.unknown_fields[0] == ["extra"]
    assert out.unknown_fields[5] == ["meta.b"]
    assert out.unknown_fields[8] is None


def test_json_one_bad_message_in_a_large_chunk_is_isolated():
    values = [json.dumps({"id": i, "user": f"u{i}"}).encode() for i in range(5000)]
    values[1234] = b'{"id": 1234, "user": '
    out = JsonDecoder(SCHEMA).decode(values)
    ids = [r["id"] if r else None for r in out.data.to_pylist()]
    assert ids == [None if i == 1234 else i for i in range(5000)]
    assert [i for i, e in enumerate(out.errors) if e] == [1234]


def test_json_many_bad_messages_in_a_large_chunk_decode_as_one_by_one():
    """1% broken JSON, a few wrong types and unknown fields among 5,000 messages: the same rows,
    errors and unknown fields as decoding each message alone (the block is screened with
    ``json`` first, then parsed whole; what pyarrow still refuses is halved as before)."""
    values = [json.dumps({"id": i, "user": f"u{i}"}).encode() for i in range(5000)]
    for i in range(37, 5000, 100):
        values[i] = b'{"id": %d, "user": ' % i
    for i in (50, 2500):
        values[i] = json.dumps({"id": f"id-{i}"}).encode()  # JSON, but not the column's type
    for i in (60, 4000):
        values[i] = json.dumps({"id": i, "new": True}).encode()
    values[70] = b"[1, 2]"
    decoder = JsonDecoder(SCHEMA)
    out = decoder.decode(values)
    alone = [decoder.decode([v]) for v in values]
    assert out.data.to_pylist() == [a.data.to_pylist()[0] for a in alone]
    assert out.errors == [a.errors[0] for a in alone]
    assert out.unknown_fields == [a.unknown_fields[0] for a in alone]
    assert sum(e is not None for e in out.errors) == 50 + 2 + 1
    assert out.errors[70] == "JSON: not a JSON object but an array"


def test_json_clean_chunk_checks_each_message_still():
    # Every message starts with "{" and holds no newline: decoded as one block without looking
    # at messages one by one, and still one row per message, each error its own.
    values = [json.dumps({"id": i}).encode() for i in range(100)]
    values[10] = b'{"id": 10}{"id": 11}'
    values[20] = b'{"id": 20} {"id": 21}'
    values[30] = b'{"id": 30}   '
    values[40] = b"{}"
    out = JsonDecoder(SCHEMA).decode(values)
    ids = [r["id"] if r else None for r in out.data.to_pylist()]
    assert ids == [None if i in (10, 20) else (None if i == 40 else i) for i in range(100)]
    assert [i for i, e in enumerate(out.errors) if e] == [10, 20]
    assert out.data.to_pylist()[40] == {"id": None, "user": None, "ts": None, "meta": None}


def test_json_unknown_field_with_changing_types_is_reported_not_an_error():
    values = [b'{"id": 1, "x": 1}', b'{"id": 2, "x": "one"}']
    out = JsonDecoder(SCHEMA).decode(values)
    assert [r["id"] for r in out.data.to_pylist()] == [1, 2]
    assert out.errors == [None, None]
    assert out.unknown_fields == [["x"], ["x"]]


def test_json_coerces_as_kafka_delta_ingest_where_pyarrow_is_strict():
    # Strings take numbers, booleans and objects (as their compact JSON text, keys sorted,
    # non-ASCII as is); timestamps take microseconds since the epoch and ISO strings with any
    # offset; every message of a chunk falls back to the Python path without failing.
    values = [
        json.dumps({"id": i, "user": i, "ts": 1_795_000_000_000_000 + i, "meta": {"a": i}}).encode()
        for i in range(300)
    ]
    values[7] = b'{"id": 7, "user": {"name": "x\xc3\xa9", "a": [1, 2.5]}, "ts": "2026-11-22T10:00:00+01:00"}'
    values[8] = b'{"id": 8, "user": true, "ts": "2026-11-22 10:00:00"}'
    values[9] = b'{"id": 9.5}'
    values[10] = b'{"id": 10, "ts": "2026-11-22T10:00:00-00:00"}'
    out = JsonDecoder(SCHEMA).decode(values)
    rows = out.data.to_pylist()
    assert rows[0]["user"] == "0" and rows[0]["ts"] == dt.datetime.fromtimestamp(1_795_000_000, dt.UTC)
    assert rows[1]["ts"] == dt.datetime.fromtimestamp(1_795_000_000, dt.UTC) + dt.timedelta(microseconds=1)
    assert rows[7]["user"] == '{"a":[1,2.5],"name":"xé"}'
    assert rows[7]["ts"] == dt.datetime(2026, 11, 22, 9, 0, tzinfo=dt.UTC)
    assert rows[8]["user"] == "true" and rows[8]["ts"] == dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
    assert rows[10]["ts"] == dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
    assert [i for i, e in enumerate(out.errors) if e] == [9]
    assert out.errors[9] == "JSON: id: expected int64, got a number"
    assert [r["id"] for r in rows if r] == [i for i in range(300) if i != 9]


def test_json_types_pyarrow_cannot_parse_go_through_python():
    schema = pa.schema(
        [
            ("d", pa.date32()),
            ("m", pa.map_(pa.string(), pa.int64())),
            ("n", pa.decimal128(10, 2)),
            ("b", pa.binary()),
        ]
    )
    out = JsonDecoder(schema).decode(
        [b'{"d": "2026-11-22", "m": {"a": 1}, "n": 1.25, "b": "aGk="}', b'{"d": "22.11."}']
    )
    assert out.data.to_pylist()[0] == {
        "d": dt.date(2026, 11, 22),
        "m": [("a", 1)],
        "n": __import__("decimal").Decimal("1.25"),
        "b": b"hi",
    }
    assert out.errors[0] is None and out.errors[1].startswith("JSON: Invalid isoformat string")


def test_json_a_decimal_its_column_cannot_hold_fails_that_message_not_the_chunk():
    """More fractional digits than the scale, or more digits than the precision: the message is
    a dead letter (the whole chunk raised, failing the batch on both engines, again at every
    restart)."""
    schema = pa.schema([("id", pa.int64()), ("n", pa.decimal128(6, 2))])
    values = [b'{"id": 1, "n": 1.25}', b'{"id": 2, "n": 1.255}', b'{"id": 3, "n": 123456}', b'{"id": 4}']
    out = JsonDecoder(schema).decode(values)
    decimal = __import__("decimal").Decimal
    assert out.data.to_pylist() == [{"id": 1, "n": decimal("1.25")}, None, None, {"id": 4, "n": None}]
    assert out.errors[0] is None and out.errors[3] is None
    assert out.errors[1] == "JSON: does not fit the table: Rescaling Decimal value would cause data loss"
    assert out.errors[2].startswith("JSON: does not fit the table: ")


def test_gzip_decompress_flags_bad_payloads():
    values, errors = decompress([gzip.compress(b'{"id": 1}'), b"not gzip", None], "gzip")
    assert values[0] == b'{"id": 1}'
    assert values[1] is None and errors[1].startswith("gzip:")
    assert values[2] is None and errors[2] is None


def _bare(schema, record):
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def _arrow_type(schema) -> pa.StructType:
    mapping = {"BIGINT": pa.int64(), "STRING": pa.string(), "TIMESTAMP": pa.timestamp("us", tz="UTC")}
    fields = [part.split(" ") for part in avro_to_spark_ddl(json.dumps(schema)).split(", ")]
    return pa.struct([(name.strip("`"), mapping[kind]) for name, kind in fields])


def test_avro_bare_datums_and_a_bad_one():
    at = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
    decoder = AvroDecoder(json.dumps(AVRO_V1), _arrow_type(AVRO_V1), None)
    good = _bare(AVRO_V1, {"id": 1, "url": "/a", "at": at})
    out = decoder.decode([good, b"\x02", good + b"\x00"])
    assert out.data.to_pylist()[0] == {"id": 1, "url": "/a", "at": at}
    assert out.errors[0] is None
    assert out.errors[1] is not None and out.errors[2] is not None
    assert "trailing" in out.errors[2]
    assert out.data.to_pylist()[1:] == [None, None]


def test_avro_with_registry_resolves_each_writer_schema(schema_registry):
    v1 = schema_registry.register("clicks-value", AVRO_V1)
    v2 = schema_registry.register("clicks-value", AVRO_V2)
    registry = SchemaRegistry(schema_registry.url)
    latest_id, latest = registry.latest("clicks-value")
    assert latest_id == v2
    at = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)
    decoder = AvroDecoder(latest, _arrow_type(AVRO_V2), registry)
    out = decoder.decode(
        [
            schema_registry.encode(v1, {"id": 1, "url": "/a", "at": at}),
            schema_registry.encode(v2, {"id": 2, "url": "/b", "at": at, "ref": "x"}),
            b"\x01\x00\x00\x00\x01abc",  # wrong magic byte
            b"\x00\x00\x00\x00\x63abc",  # unknown schema id 99
        ]
    )
    rows = out.data.to_pylist()
    assert rows[0] == {"id": 1, "url": "/a", "at": at, "ref": None}  # v1 read with v2's default
    assert rows[1] == {"id": 2, "url": "/b", "at": at, "ref": "x"}
    assert "magic byte 1" in out.errors[2]
    assert "HTTP 404" in out.errors[3]
    assert schema_registry.requests.count(f"/schemas/ids/{v1}") == 1  # cached

    # A writer newer than the reader: its extra field is reported, not silently dropped.
    old_reader = AvroDecoder(json.dumps(AVRO_V1), _arrow_type(AVRO_V1), registry)
    newer = old_reader.decode([schema_registry.encode(v2, {"id": 3, "url": "/c", "at": at, "ref": "y"})])
    assert newer.data.to_pylist() == [{"id": 3, "url": "/c", "at": at}]
    assert newer.unknown_fields == [["ref"]]


def test_avro_schema_to_spark_ddl():
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "a", "type": ["null", "int"]},
            {"name": "b", "type": {"type": "array", "items": "string"}},
            {"name": "c", "type": {"type": "map", "values": "double"}},
            {
                "name": "d",
                "type": {"type": "record", "name": "In", "fields": [{"name": "x", "type": "boolean"}]},
            },
            {"name": "e", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
            {"name": "f", "type": {"type": "int", "logicalType": "date"}},
            {"name": "g", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
        ],
    }
    assert avro_to_spark_ddl(json.dumps(schema)) == (
        "`a` INT, `b` ARRAY<STRING>, `c` MAP<STRING, DOUBLE>, `d` STRUCT<`x`: BOOLEAN>, "
        "`e` DECIMAL(10,2), `f` DATE, `g` STRING"
    )
    with pytest.raises(ConfigError, match="unions other than"):
        avro_to_spark_ddl(json.dumps({**schema, "fields": [{"name": "u", "type": ["int", "string"]}]}))


def test_json_in_the_confluent_wire_format_with_a_registry(schema_registry):
    """kafka-delta-ingest's ``--json <registry>``: magic 0 + schema id + JSON text."""
    schema_id = schema_registry.register("events-value", {"type": "object"})
    frame = struct.pack(">bI", 0, schema_id)
    decoder = JsonDecoder(SCHEMA, SchemaRegistry(schema_registry.url))
    out = decoder.decode(
        [
            frame + b'{"id": 1, "user": "a"}',
            b'{"id": 2}',  # not framed: magic byte 123
            struct.pack(">bI", 0, 99) + b'{"id": 3}',  # an id the registry does not know
            frame + b'{"id": "x"}',
            b"\x00\x00",
        ]
    )
    assert out.data.to_pylist()[0] == {"id": 1, "user": "a", "ts": None, "meta": None}
    assert out.data.to_pylist()[1:] == [None, None, None, None]
    assert out.errors[1] == "JSON: magic byte 123, expected 0 (Confluent wire format)"
    assert "HTTP 404" in out.errors[2]
    assert out.errors[3] is not None and out.errors[3].startswith("JSON: id")
    assert out.errors[4] == "JSON: shorter than the Confluent header (magic byte + schema id)"
    # Lengths that made pyarrow's binary_slice without an end fail (30 and 12 bytes).
    good = decoder.decode([frame + b'{"id": 5, "user": "abcd"}', frame + b'{"i":6}'])
    assert good.errors == [None] * 2 and [r["id"] for r in good.data.to_pylist()] == [5, None]
    assert schema_registry.requests.count(f"/schemas/ids/{schema_id}") == 1  # cached


def _soe(schema: dict, record: dict) -> bytes:
    """Avro single-object encoding, written out by hand from the Avro specification."""
    parsed = fastavro.parse_schema(schema)
    canonical = fastavro.schema.to_parsing_canonical_form(parsed)
    # The CRC-64-AVRO fingerprint, computed here bit by bit (not with the code under test).
    empty = 0xC15D213AA4D7A795
    fp = empty
    for byte in canonical.encode():
        fp ^= byte
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    return b"\xc3\x01" + fp.to_bytes(8, "little") + buf.getvalue()


def test_avro_single_object_encoding_by_fingerprint():
    at = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)
    decoder = SingleObjectAvroDecoder([json.dumps(AVRO_V1), json.dumps(AVRO_V2)], _arrow_type(AVRO_V2))
    other = {"type": "record", "name": "Other", "fields": [{"name": "id", "type": "long"}]}
    out = decoder.decode(
        [
            _soe(AVRO_V1, {"id": 1, "url": "/a", "at": at}),
            _soe(AVRO_V2, {"id": 2, "url": "/b", "at": at, "ref": "x"}),
            _soe(other, {"id": 3}),
            b"\x00\x00\x00\x00\x01abc",
        ]
    )
    rows = out.data.to_pylist()
    assert rows[0] == {"id": 1, "url": "/a", "at": at, "ref": None}
    assert rows[1] == {"id": 2, "url": "/b", "at": at, "ref": "x"}
    assert out.errors[2] is not None and "unknown schema with fingerprint" in out.errors[2]
    assert out.errors[3] == "Avro: ValueError: not Avro single-object encoded (no C3 01 header)"
    # The spec's test vector: "int" has the fingerprint 0x7275d51a3f395c8f (little-endian on the wire).
    assert _soe("int", 5)[2:10] == bytes.fromhex("8f5c393f1ad57572")


def test_avro_object_container_per_message():
    """kafka-delta-ingest's ``--avro ""``: each message an Avro container file, its first record."""
    at = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)

    def container(schema: dict, records: list[dict]) -> bytes:
        buf = io.BytesIO()
        fastavro.writer(buf, fastavro.parse_schema(schema), records)
        return buf.getvalue()

    out = ContainerAvroDecoder(None, _arrow_type(AVRO_V1)).decode(
        [
            container(AVRO_V1, [{"id": 1, "url": "/a", "at": at}, {"id": 9, "url": "/z", "at": at}]),
            container(AVRO_V2, [{"id": 2, "url": "/b", "at": at, "ref": "r"}]),
            container(AVRO_V1, []),
            b"not avro",
        ]
    )
    assert out.data.to_pylist()[:2] == [{"id": 1, "url": "/a", "at": at}, {"id": 2, "url": "/b", "at": at}]
    assert out.unknown_fields[:2] == [None, ["ref"]]
    assert out.errors[2] == "Avro: ValueError: the Avro container holds no record"
    assert out.errors[3] is not None and out.errors[3].startswith("Avro:")
    with_reader = ContainerAvroDecoder(json.dumps(AVRO_V2), _arrow_type(AVRO_V2))
    assert with_reader.decode([container(AVRO_V1, [{"id": 1, "url": "/a", "at": at}])]).data.to_pylist() == [
        {"id": 1, "url": "/a", "at": at, "ref": None}
    ]

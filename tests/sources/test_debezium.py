"""Debezium messages (Kafka Connect's JSON converter, with and without schemas) read into
changes with Delta types: every semantic type of the README's table, each op, tombstones,
truncates, and the messages that must become dead letters."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal

import pyarrow as pa
import pytest

from deltaflow.sources.debezium import arrow_type, decode

# The columns of a PostgreSQL table as Debezium's PostgreSQL connector describes them
# (decimal.handling.mode=precise, time.precision.mode=adaptive_time_microseconds).
COLUMNS = [
    {"field": "id", "type": "int32", "optional": False},
    {"field": "name", "type": "string", "optional": True},
    {"field": "price", "type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}},
    {"field": "ratio", "type": "struct", "optional": True, "name": "io.debezium.data.VariableScaleDecimal",
     "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}]},
    {"field": "born", "type": "int32", "optional": True, "name": "io.debezium.time.Date"},
    {"field": "seen", "type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp"},
    {"field": "at", "type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp"},
    {"field": "opens", "type": "int64", "optional": True, "name": "io.debezium.time.MicroTime"},
    {"field": "doc", "type": "string", "optional": True, "name": "io.debezium.data.Json"},
    {"field": "uid", "type": "string", "optional": True, "name": "io.debezium.data.Uuid"},
    {"field": "tags", "type": "array", "optional": True, "items": {"type": "string", "optional": True}},
    {"field": "blob", "type": "bytes", "optional": True},
    {"field": "ok", "type": "boolean", "optional": True},
    {"field": "score", "type": "float64", "optional": True},
]  # fmt: skip
KEY_SCHEMA = {"type": "struct", "name": "db.public.t.Key", "optional": False, "fields": COLUMNS[:1]}
ROW_SCHEMA = {"type": "struct", "name": "db.public.t.Value", "optional": True, "fields": COLUMNS}


def _b64(unscaled: int, size: int = 2) -> str:
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def _envelope(op: str, before: dict | None, after: dict | None, *, schemas: bool = True) -> bytes:
    payload = {
        "before": before,
        "after": after,
        "source": {"connector": "postgresql", "db": "db", "schema": "public", "table": "t", "lsn": 123},
        "op": op,
        "ts_ms": 1_700_000_000_000,
    }
    if not schemas:
        return json.dumps(payload).encode()
    schema = {
        "type": "struct",
        "name": "db.public.t.Envelope",
        "fields": [
            {**ROW_SCHEMA, "field": "before"},
            {**ROW_SCHEMA, "field": "after"},
            {"field": "source", "type": "struct", "fields": []},
            {"field": "op", "type": "string"},
            {"field": "ts_ms", "type": "int64", "optional": True},
        ],
    }
    return json.dumps({"schema": schema, "payload": payload}).encode()


def _key(id_: int, *, schemas: bool = True) -> bytes:
    return json.dumps({"schema": KEY_SCHEMA, "payload": {"id": id_}} if schemas else {"id": id_}).encode()


ROW = {
    "id": 7,
    "name": "seven",
    "price": _b64(12345),  # 123.45
    "ratio": {"scale": 3, "value": _b64(-1500)},  # -1.500
    "born": 19_000,
    "seen": 1_700_000_000_123_456,
    "at": "2024-03-01T10:00:00.5+02:00",
    "opens": 9 * 3600 * 1_000_000 + 30 * 60 * 1_000_000 + 250_000,
    "doc": '{"a": [1, 2]}',
    "uid": "5b1f5d7e-8b43-4d59-9c7a-1f0e8f3c2a10",
    "tags": ["a", None, "b"],
    "blob": base64.b64encode(b"\x00\xff").decode(),
    "ok": True,
    "score": "-Infinity",
}


def test_the_semantic_types_map_to_delta_types():
    change = decode(_key(7), _envelope("c", None, ROW))
    assert change.error is None
    assert change.schema == pa.schema(
        [
            pa.field("id", pa.int32(), nullable=False),
            ("name", pa.string()),
            ("price", pa.decimal128(10, 2)),
            ("ratio", pa.string()),  # a numeric without a declared scale: its exact digits
            ("born", pa.date32()),
            ("seen", pa.timestamp("us")),  # the database's local time: TIMESTAMP_NTZ
            ("at", pa.timestamp("us", tz="UTC")),
            ("opens", pa.string()),  # Delta has no TIME type
            ("doc", pa.string()),
            ("uid", pa.string()),
            ("tags", pa.list_(pa.string())),
            ("blob", pa.binary()),
            ("ok", pa.bool_()),
            ("score", pa.float64()),
        ]
    )
    image = change.image
    assert image is not None
    assert image["price"] == Decimal("123.45") and image["ratio"] == "-1.500"
    assert image["born"] == dt.date(2022, 1, 8)
    assert image["seen"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert image["at"] == dt.datetime(2024, 3, 1, 8, 0, 0, 500000, tzinfo=dt.UTC)
    assert image["opens"] == "09:30:00.250000"
    assert (
        image["tags"] == ["a", None, "b"] and image["blob"] == b"\x00\xff" and image["score"] == float("-inf")
    )
    # The converted values fit the schema's types: Arrow takes them as they are.
    assert pa.Table.from_pylist([image], change.schema).to_pylist()[0]["price"] == Decimal("123.45")
    assert change.op == "upsert" and change.key == {"id": 7}
    assert change.key_schema == pa.schema([pa.field("id", pa.int32(), nullable=False)])


@pytest.mark.parametrize(
    ("op", "before", "after", "expected_op", "image_of"),
    [
        ("r", None, ROW, "upsert", "after"),  # a snapshot read
        ("u", None, {**ROW, "name": "new"}, "upsert", "after"),  # REPLICA IDENTITY DEFAULT
        ("u", ROW, {**ROW, "name": "new"}, "upsert", "after"),  # REPLICA IDENTITY FULL
        ("d", ROW, None, "delete", "before"),
        ("d", {"id": 7}, None, "delete", "before"),  # only the key columns known
    ],
    ids=["read", "update", "update-full", "delete-full", "delete-key"],
)
def test_each_op_becomes_an_upsert_or_a_delete_of_its_image(op, before, after, expected_op, image_of):
    change = decode(_key(7), _envelope(op, before, after))
    assert change.error is None and change.op == expected_op
    image = change.image
    assert image is not None and image["id"] == 7
    assert image.get("name") == (after if image_of == "after" else before).get("name")
    assert change.before == (
        decode(_key(7), _envelope("c", None, before)).image if op == "u" and before else None
    )


def test_tombstones_and_truncates():
    tombstone = decode(_key(7), None)
    assert (tombstone.op, tombstone.key, tombstone.error) == (None, {"id": 7}, None)
    truncate = decode(None, _envelope("t", None, None))
    assert (truncate.op, truncate.image, truncate.error) == ("truncate", None, None)


def test_without_schemas_the_payload_is_taken_as_it_is():
    change = decode(_key(7, schemas=False), _envelope("u", None, {"id": 7, "name": "x"}, schemas=False))
    assert (change.op, change.key, change.image, change.schema) == (
        "upsert",
        {"id": 7},
        {"id": 7, "name": "x"},
        None,
    )


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        (None, b"{not json", "the value is not JSON"),
        (None, b'{"after": {"id": 1}}', "not a Debezium change event (no 'op')"),
        (None, json.dumps({"op": "x", "after": {}}).encode(), "unknown Debezium op 'x'"),
        (None, json.dumps({"op": "c", "after": None}).encode(), "a 'c' event without 'after'"),
        (None, json.dumps({"op": "d", "before": None}).encode(), "a delete without 'before' and without a"),
        (b"[1]", json.dumps({"op": "c", "after": {"id": 1}}).encode(), "the key is not an object"),
        (None, _envelope("c", None, {**ROW, "price": "!!"}), "'after': column 'price': '!!' is not base64"),
        (None, _envelope("c", None, {**ROW, "price": _b64(10**11, 8)}), "does not fit DECIMAL(10,2)"),
        (None, _envelope("c", None, {**ROW, "born": "2024-01-01"}), "'2024-01-01' is not an integer"),
        (None, _envelope("c", None, {**ROW, "at": "2024-01-01T00:00:00"}), "has no zone"),
    ],
    ids=["not-json", "no-op", "bad-op", "create-without-after", "delete-without-row", "key-array",
         "bad-base64", "decimal-overflow", "date-as-text", "zoneless"],
)  # fmt: skip
def test_a_message_that_cannot_be_applied_says_why(key, value, error):
    change = decode(key, value)
    assert change.op is None and change.image is None
    assert change.error is not None and error in change.error


def test_wide_decimals_and_nested_types():
    wide = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "0"}}
    assert arrow_type(wide) == pa.string()  # no declared precision: text
    assert (
        arrow_type({**wide, "parameters": {"scale": "2", "connect.decimal.precision": "40"}}) == pa.string()
    )
    nested = {"type": "struct", "fields": [{"field": "m", "type": "map", "keys": {"type": "string"},
                                            "values": {"type": "int64"}}]}  # fmt: skip
    assert arrow_type(nested) == pa.struct([("m", pa.map_(pa.string(), pa.int64()))])


def test_a_timestamp_beyond_python_s_range_is_a_dead_letter_not_a_crash():
    # PostgreSQL's 'infinity' as Debezium sends it (its PostgreSQL connector's docs: "TIMESTAMP
    # type"), and a date past year 9999: a dead letter, like every value its type cannot hold.
    for field, value in [("seen", 9223372036825200000), ("seen", -9223372036832400000), ("born", 2**31 - 1)]:
        change = decode(_key(7), _envelope("c", None, {**ROW, field: value}))
        assert change.op is None and change.error is not None and "'after'" in change.error, change


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        (-1_000_000, "-00:00:01"),
        (-1_500_000, "-00:00:01.500000"),
        (-(838 * 3600 + 59 * 60 + 59) * 1_000_000, "-838:59:59"),
        (25 * 3600 * 1_000_000, "25:00:00"),
    ],
    ids=["minus-one-second", "minus-a-second-and-a-half", "mysql-minimum", "past-a-day"],
)
def test_a_mysql_time_is_a_signed_duration(micros, text):
    # MySQL's TIME holds -838:59:59 to 838:59:59; Debezium sends it as signed microseconds
    # (BinlogValueConverters.convertDurationToMicroseconds).
    change = decode(_key(7), _envelope("c", None, {**ROW, "opens": micros}))
    assert change.error is None and change.image is not None
    assert change.image["opens"] == text


@pytest.mark.parametrize(
    ("scale", "unscaled", "text"),
    [(7, 1, "0.0000001"), (10, -25, "-0.0000000025"), (0, 10**30, "1" + "0" * 30), (2, 0, "0.00")],
    ids=["small", "small-negative", "large", "zero"],
)
def test_a_decimal_kept_as_text_is_plain_digits(scale, unscaled, text):
    # A PostgreSQL NUMERIC without a declared scale (VariableScaleDecimal): its digits as
    # PostgreSQL prints them, not Python's exponent notation ('1E-7').
    ratio = {"scale": scale, "value": _b64(unscaled, 16)}
    change = decode(_key(7), _envelope("c", None, {**ROW, "ratio": ratio}))
    assert change.error is None and change.image is not None
    assert change.image["ratio"] == text


def test_a_decimal_of_38_digits_keeps_every_digit():
    # Python's Decimal arithmetic rounds to 28 digits: the unscaled number must not go through it.
    big = 12345678901234567890123456789012345678
    column = {"field": "big", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
              "parameters": {"scale": "4", "connect.decimal.precision": "38"}}  # fmt: skip
    schema = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [column]},
                                           {"field": "op", "type": "string"}]}  # fmt: skip
    payload = {"op": "c", "after": {"big": _b64(big, 16)}}
    change = decode(None, json.dumps({"schema": schema, "payload": payload}).encode())
    assert change.error is None and change.image is not None
    assert change.image["big"] == Decimal("1234567890123456789012345678901234.5678")
    stored = pa.Table.from_pylist([change.image], change.schema).to_pylist()[0]["big"]
    assert stored == Decimal("1234567890123456789012345678901234.5678")


def test_avro_converter_messages_are_typed_as_the_json_converters(schema_registry):
    """Kafka Connect's Avro converter: Connect's types in the Avro schema's connect.* attributes,
    Decimal as Avro's decimal logical type, the 'after' row a reference to 'before's record."""
    from deltaflow.sources.debezium import AvroEnvelopes, connect_schema
    from deltaflow.sources.decode import SchemaRegistry

    row = {
        "type": "record",
        "name": "Value",
        "namespace": "db.public.t",
        "fields": [
            {"name": "id", "type": "int"},
            {"name": "small", "type": ["null", {"type": "int", "connect.type": "int16"}], "default": None},
            {
                "name": "price",
                "type": [
                    "null",
                    {
                        "type": "bytes",
                        "scale": 2,
                        "precision": 10,
                        "connect.version": 1,
                        "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                        "connect.name": "org.apache.kafka.connect.data.Decimal",
                        "logicalType": "decimal",
                    },
                ],
                "default": None,
            },
            {"name": "born", "type": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}]},
            {
                "name": "seen",
                "type": ["null", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}],
            },
            {
                "name": "at",
                "type": ["null", {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"}],
            },
            {"name": "tags", "type": ["null", {"type": "array", "items": "string"}]},
        ],
    }
    envelope = {
        "type": "record",
        "name": "Envelope",
        "namespace": "db.public.t",
        "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", "db.public.t.Value"], "default": None},
            {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
                {"name": "sequence", "type": ["null", "string"]}]}},
            {"name": "op", "type": "string"},
        ],
    }  # fmt: skip
    key = {
        "type": "record",
        "name": "Key",
        "namespace": "db.public.t",
        "fields": [{"name": "id", "type": "int"}],
    }
    after = {
        "id": 7,
        "small": 3,
        "price": Decimal("123.45"),
        "born": 19_000,
        "seen": 1_700_000_000_123_456,
        "at": "2024-03-01T10:00:00.5+02:00",
        "tags": ["a"],
    }
    value = schema_registry.encode(
        schema_registry.register("t-value", envelope),
        {"before": None, "after": after, "source": {"sequence": '["10","12"]'}, "op": "c"},
    )
    change = decode(
        schema_registry.encode(schema_registry.register("t-key", key), {"id": 7}),
        value,
        AvroEnvelopes(SchemaRegistry(schema_registry.url)),
    )
    assert change.error is None, change.error
    assert change.op == "upsert" and change.key == {"id": 7} and change.sequence == (10 << 64) + 12
    assert change.image == {
        "id": 7,
        "small": 3,
        "price": Decimal("123.45"),
        "born": dt.date(2022, 1, 8),
        "seen": dt.datetime(2023, 11, 14, 22, 13, 20, 123456),
        "at": dt.datetime(2024, 3, 1, 8, 0, 0, 500000, tzinfo=dt.UTC),
        "tags": ["a"],
    }
    assert change.schema is not None
    assert [str(f.type) for f in change.schema] == [
        "int32",
        "int16",
        "decimal128(10, 2)",
        "date32[day]",
        "timestamp[us]",
        "timestamp[us, tz=UTC]",
        "list<item: string>",
    ]
    assert connect_schema(envelope)["fields"][1]["optional"] is True
    garbage = decode(None, b"\x00\x00\x00\x00\x63abc", AvroEnvelopes(SchemaRegistry(schema_registry.url)))
    assert garbage.error is not None and "schema id 99" in garbage.error


def test_a_json_reader_compiles_each_schema_once_and_reads_what_a_fresh_parse_reads():
    from deltaflow.sources.debezium import JsonEnvelopes

    reader = JsonEnvelopes()
    messages = [(_key(i), _envelope("u", None, {**ROW, "id": i, "name": f"n{i}"})) for i in range(5)]
    for key, value in messages:
        assert decode(key, value, reader) == decode(key, value)
    assert len(reader._compiled) == 2  # the key's schema and the envelope's, each once
    # A ',"payload":' inside the schema (a parameter's name) is no place to cut: parsed whole.
    odd = json.loads(_envelope("c", None, ROW))
    odd["schema"]["fields"][0]["parameters"] = {"payload": "x"}
    text = json.dumps(odd, separators=(",", ":")).encode()
    assert decode(_key(7), text, reader) == decode(_key(7), text) and decode(_key(7), text).error is None
    # Text after the payload is an error, as for a fresh parse.
    broken = _envelope("c", None, ROW)[:-1] + b',"extra":1}'
    assert decode(_key(7), broken, reader).error == decode(_key(7), broken).error

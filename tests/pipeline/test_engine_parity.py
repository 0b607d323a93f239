"""One answer per pipeline, whatever the engine: the same Kafka messages through a YAML pipeline
on the Spark engine and on the Arrow engine give the same tables, row for row and column type
for column type, and the same dead-letter tables.

The messages hold what kafka-delta-ingest users meet: tombstones (skipped, as there), keys (none,
not UTF-8), headers, create times, null vs missing fields, decimals, dates, maps, binary, nested
structs and arrays, gzip, Avro, values that do not decode, transforms that fail. The pipelines
use every kind of transform both engines compile, JMESPath evaluated per message, every
``kafka.*`` field, a nested target, partitioning and the sink options the Arrow engine takes.
``deltaflow ingest`` infers a schema when none is given (YAML pipelines need one): its two
engines are compared on the same messages too.

All pipelines of both engines run side by side in one ``run_pipelines`` call (one Spark
session, ``availableNow``): the module costs about two query starts.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from deltaflow.pipeline.dead_letters import KAFKA_COLUMNS
from deltaflow.service.daemon import run_pipelines
from tests.fixtures.pipelines import pipelines as _pipelines

ENGINES = ("spark", "arrow")
#: Message i's create time is ``BASE_MS + i`` (ms).
BASE_MS = 1_767_225_600_000

#: A message: key, value (``None``: a tombstone), headers.
Message = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def _produce(bootstrap: str, topic: str, messages: Sequence[Message], partitions: int = 2) -> None:
    """Message i to partition i % partitions, each in a record batch of its own (the test
    broker's high watermark counts whole batches only), created at ``BASE_MS + i``."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for i, (key, value, headers) in enumerate(messages):
        producer.produce(
            topic, value=value, key=key, partition=i % partitions, headers=headers, timestamp=BASE_MS + i
        )
    assert producer.flush(60) == 0


def _json(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


# -- the messages --------------------------------------------------------------------------------

#: Decoded by pyarrow's block parser: scalars, a timestamp, arrays, nested structs.
EVENTS_SCHEMA = (
    "id BIGINT, name STRING, score DOUBLE, ok BOOLEAN, ts TIMESTAMP, tags ARRAY<STRING>, "
    "items ARRAY<STRUCT<sku: STRING, qty: INT>>, nested STRUCT<a: INT, b: STRUCT<c: STRING>>, "
    "at STRING, code STRING, meta STRUCT<offset: BIGINT>"
)
EVENTS: list[Message] = [
    (
        b"k0",
        _json(
            id=0,
            name="alpha",
            score=1.5,
            ok=True,
            ts="2026-01-02T03:04:05.123456Z",
            tags=["x", "y"],
            items=[{"sku": "a", "qty": 2}, {"sku": "b", "qty": 1}],
            nested={"a": 1, "b": {"c": "deep"}},
            at="1767225600.5",
        ),
        [("h1", b"v1"), ("h2", b"\x00\xff")],
    ),
    # JSON null in every field, no key.
    (
        None,
        _json(id=1, name=None, score=None, ok=None, ts=None, tags=None, items=None, nested=None, at=None),
        [],
    ),
    # Every field missing but the id; a key that is no UTF-8.
    (b"\xff\xfe", _json(id=2), [("h", b"")]),
    # Nulls inside structs and arrays; a time with an offset; an integer into a double.
    (
        b"k3",
        _json(
            id=3,
            ts="2026-01-02T03:04:05+02:00",
            tags=[],
            items=[{"sku": "c", "qty": None}, {"sku": None}],
            nested={"a": None, "b": None},
            at="1767225600",
            score=2,
        ),
        [],
    ),
    (b"k4", None, []),  # a tombstone (Debezium follows each delete with one)
    (b"k5", b"", []),  # an empty value: no JSON
    (b"k6", b'{"id": 6, "name": ', []),  # cut short
    (b"k7", b"[1, 2]", []),  # not an object
    (b"k8", _json(id="eight"), []),  # a wrong type
    (b"k9", _json(id=9, at="soon"), []),  # a compiled transform fails: no number
    (b"k10", _json(id=10, code="x"), []),  # a per-message (JMESPath) transform fails
    (b"k11", _json(id=11, ts=1767225600123456, name="omega", nested={"a": 5}), [("h1", b"v11")]),
    (None, None, []),  # a tombstone without a key
    (b"k13", _json(id=13, name="last", tags=["x"], extra="not in the schema"), []),
    (b"k14", _json(id=14, at="1e20"), []),  # a compiled transform fails: beyond the year 9999
]
EVENTS_GOOD = [0, 1, 2, 3, 11, 13]
EVENTS_BAD = [5, 6, 7, 8, 9, 10, 14]
EVENTS_TRANSFORMS = {
    "name_copy": "name",
    "c": "nested.b.c",
    "prefix": "substr(name, `1`, `3`)",
    "at_s": "epoch_seconds_to_iso8601(at)",
    "at_ms": "epoch_millis_to_iso8601(at)",
    "at_us": "epoch_micros_to_iso8601(at)",
    "at_micro": "epoch_millis_to_micro(at)",
    "score_iso": "epoch_seconds_to_iso8601(score)",
    "k_offset": "kafka.offset",
    "k_partition": "kafka.partition",
    "k_topic": "kafka.topic",
    "k_ts": "kafka.timestamp",
    "k_ts_type": "kafka.timestamp_type",
    "k_key": "kafka.key",
    "k_headers": "kafka.headers",
    "meta.offset": "kafka.offset",  # a nested target the messages never carry
    "key_head": "substr(kafka.key, `0`, `1`)",
    # Per message (the jmespath library) on both engines.
    "skus": "items[?qty > `1`].sku",
    "n_tags": "length(not_null(tags, `[]`))",
    "has_x": "contains(not_null(tags, `[]`), 'x')",
    "summary": "{n: name, k: kafka.key, t: kafka.timestamp, kind: kafka.timestamp_type}",
    "first_header": "kafka.headers[0].key",
    "code_iso": "epoch_seconds_to_iso8601(not_null(code, '0'))",
}

#: Decoded message by message in Python (decimals, dates, maps and binary are), gzip-compressed,
#: into a table that exists: it has a column more than the schema (decoded too) and takes a
#: per-message result in its own type.
AMOUNTS_SCHEMA = "id BIGINT, amount DECIMAL(10,2), day DATE, attrs MAP<STRING, STRING>, blob BINARY"
AMOUNTS_TABLE = pa.schema(
    [
        ("id", pa.int64()),
        ("amount", pa.decimal128(10, 2)),
        ("day", pa.date32()),
        ("attrs", pa.map_(pa.string(), pa.string())),
        ("blob", pa.binary()),
        ("note", pa.string()),
        ("amount_text", pa.string()),
        ("k_key", pa.string()),
        ("k_offset", pa.int64()),
        ("n_attrs", pa.int32()),
    ]
)
AMOUNTS: list[Message] = [
    (b"a0", _json(id=0, amount=12.34, day="2026-01-02", attrs={"a": "1"}, blob="AAE=", note="n0"), []),
    (b"a1", _json(id=1, amount="5", day=None, attrs=None, blob=None), []),
    (b"a2", _json(id=2), []),
    (b"a3", _json(id=3, amount=1e2, attrs={"x": "1", "y": "2"}, note="n3"), []),
    (b"a4", None, []),  # a tombstone
    (b"a5", _json(id=5, day="not a day"), []),  # a value its column cannot take
    (b"a6", _json(id=6), []),  # sent without gzip: cannot be decompressed
    (b"a7", _json(id=7, amount=-0.5, blob="not base64!"), []),
    (b"a8", _json(id=8, amount=1.234), []),  # more digits than the scale
]
AMOUNTS_GOOD = [0, 1, 2, 3]
AMOUNTS_TRANSFORMS = {
    "amount_text": "to_string(amount)",
    "k_key": "kafka.key",
    "k_offset": "kafka.offset",
    "n_attrs": "length(not_null(attrs, `{}`))",
}

#: Avro datums (no registry).
AVRO_SCHEMA = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "label", "type": ["null", "string"], "default": None},
        {"name": "value", "type": {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 3}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


def _avro(record: dict[str, Any]) -> bytes:
    import datetime as dt
    import decimal

    record = {
        "label": None,
        "value": decimal.Decimal("1.250"),
        "at": dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
        "tags": [],
    } | record
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO_SCHEMA), record)
    return out.getvalue()


READINGS: list[Message] = [
    (b"r0", _avro({"id": 0, "label": "first", "tags": ["a", "b"]}), [("h", b"1")]),
    (b"r1", _avro({"id": 1}), []),
    (b"r2", None, []),  # a tombstone
    (b"r3", b"\x02", []),  # cut short
    (b"r4", _avro({"id": 4, "label": "last"}) + b"\x00", []),  # a trailing byte
]
READINGS_GOOD = [0, 1]
READINGS_TRANSFORMS = {"k_key": "kafka.key", "k_offset": "kafka.offset", "n": "length(tags)"}


def _gzip(messages: list[Message]) -> list[Message]:
    """The values gzip-compressed, but for tombstones and message 6."""
    return [
        (key, value if value is None or i == 6 else gzip.compress(value, mtime=0), headers)
        for i, (key, value, headers) in enumerate(messages)
    ]


# -- the pipelines -------------------------------------------------------------------------------


def _engine_pipelines(engine: str, topics: dict[str, str], bootstrap: str) -> str:
    """The three pipelines of one engine (YAML list items)."""
    kafka = f'type: kafka, bootstrap_servers: "{bootstrap}"'
    avro = json.dumps(json.dumps(AVRO_SCHEMA))
    return f"""
      - id: events-{engine}
        engine: {engine}
        source: {{{kafka}, topic: "{topics["events"]}", schema: "{EVENTS_SCHEMA}"}}
        transforms: {json.dumps(EVENTS_TRANSFORMS)}
        dead_letter: {{table_uri: "${{DIR}}/{engine}/events_dlq"}}
        sinks:
          - table_uri: "${{DIR}}/{engine}/events"
            partition_columns: [k_partition]
            compression: zstd
            max_records_per_file: 2
            target_file_size_mb: 1
            table_properties: {{delta.dataSkippingNumIndexedCols: "5"}}
            user_metadata: parity
            auto_compact: false
      - id: amounts-{engine}
        engine: {engine}
        source:
          {{{kafka}, topic: "{topics["amounts"]}", schema: "{AMOUNTS_SCHEMA}", decompress_gzip: true}}
        transforms: {json.dumps(AMOUNTS_TRANSFORMS)}
        dead_letter: {{table_uri: "${{DIR}}/{engine}/amounts_dlq"}}
        sinks: [{{table_uri: "${{DIR}}/{engine}/amounts", schema_mode: merge}}]
      - id: readings-{engine}
        engine: {engine}
        source: {{{kafka}, topic: "{topics["readings"]}", format: avro, avro_schema: {avro}}}
        transforms: {json.dumps(READINGS_TRANSFORMS)}
        dead_letter: {{table_uri: "${{DIR}}/{engine}/readings_dlq"}}
        sinks: [{{table_uri: "${{DIR}}/{engine}/readings"}}]
    """


#: Spark engine only: a dead-letter table made before Kafka pipelines took ingest's layout, and
#: a drop expectation (its rows land in the Kafka layout).
SPARK_ONLY = """
      - id: legacy
        source: {{type: kafka, bootstrap_servers: "{bootstrap}", topic: "{amounts}", schema: "{schema}",
                  decompress_gzip: true}}
        transforms: {{n: "abs(id)"}}
        dead_letter: {{table_uri: "${{DIR}}/legacy_dlq"}}
        sinks: [{{table_uri: "${{DIR}}/legacy"}}]
      - id: expect
        source: {{type: kafka, bootstrap_servers: "{bootstrap}", topic: "{events}",
                  schema: "id BIGINT, name STRING"}}
        expectations: [{{name: named, expr: "name IS NOT NULL", action: drop}}]
        dead_letter: {{table_uri: "${{DIR}}/expect_dlq"}}
        sinks: [{{table_uri: "${{DIR}}/expect"}}]
"""


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def runs(spark, kafka, tmp_path_factory) -> Iterator[tuple[Path, dict[str, str], list[str]]]:
    """Every pipeline of both engines, side by side in one run: the folder of their tables, the
    topics, and what deltaflow's pipelines logged."""
    root = tmp_path_factory.mktemp("parity")
    topics = {name: kafka.create_topic(partitions=2) for name in ("events", "amounts", "readings")}
    _produce(kafka.bootstrap, topics["events"], EVENTS)
    _produce(kafka.bootstrap, topics["amounts"], _gzip(AMOUNTS))
    _produce(kafka.bootstrap, topics["readings"], READINGS)
    # The dead-letter table of a Kafka pipeline as earlier versions made it.
    from deltaflow.delta import commit

    legacy = pa.schema(
        [
            ("pipeline_id", pa.string()),
            ("batch_id", pa.int64()),
            ("reason", pa.string()),
            ("record", pa.string()),
            ("dead_lettered_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    commit.create_table(str(root / "legacy_dlq"), legacy, partition_by=[], properties={}, storage_options={})
    for engine in ENGINES:
        commit.create_table(
            str(root / engine / "amounts"), AMOUNTS_TABLE, partition_by=[], properties={}, storage_options={}
        )
    spark_only = SPARK_ONLY.format(
        bootstrap=kafka.bootstrap, amounts=topics["amounts"], events=topics["events"], schema=AMOUNTS_SCHEMA
    )
    both = "".join(_engine_pipelines(engine, topics, kafka.bootstrap) for engine in ENGINES)
    specs = _pipelines(root, "\n    pipelines:" + both + spark_only)
    records = _Records()
    logger = logging.getLogger("deltaflow.pipeline")
    logger.addHandler(records)
    try:
        run_pipelines(spark, specs, available_now=True)
    finally:
        logger.removeHandler(records)
    yield root, topics, records.messages


def _table(path: Path) -> tuple[pa.Schema, list[dict[str, Any]]]:
    table = DeltaTable(str(path))
    return pa.schema(table.schema().to_arrow()), table.to_pyarrow_table().to_pylist()


def _by(rows: list[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))


def _letters(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dead letters in message order, without the time each was made."""
    kept = [{k: v for k, v in r.items() if k != "dead_lettered_at"} for r in rows]
    return _by(kept, "partition", "offset")


# -- the tables ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "good"), [("events", EVENTS_GOOD), ("amounts", AMOUNTS_GOOD), ("readings", READINGS_GOOD)]
)
def test_both_engines_write_the_same_table(runs, name, good):
    root, _, _ = runs
    spark_schema, spark_rows = _table(root / "spark" / name)
    arrow_schema, arrow_rows = _table(root / "arrow" / name)
    assert arrow_schema == spark_schema  # names, order, types, nullability
    assert _by(arrow_rows, "id") == _by(spark_rows, "id")
    # Each good message once; tombstones nowhere (kafka-delta-ingest skips them).
    assert sorted(r["id"] for r in arrow_rows) == good


def test_what_the_events_table_holds(runs):
    """Spot checks of the (equal) tables against what the messages say."""
    root, topics, _ = runs
    rows = {r["id"]: r for r in _table(root / "arrow" / "events")[1]}
    for i, r in rows.items():
        assert (r["k_partition"], r["k_offset"]) == (i % 2, i // 2)
        assert r["k_topic"] == topics["events"] and r["k_ts_type"] == 0  # create time
        assert int(r["k_ts"].timestamp() * 1000) == BASE_MS + i
        assert r["meta"] == {"offset": i // 2}  # the nested target, filled on both engines
    assert [rows[i]["k_key"] for i in (0, 1, 2)] == ["k0", None, "\ufffd\ufffd"]  # text, as Python decodes it
    assert rows[0]["k_headers"] == [{"key": "h1", "value": b"v1"}, {"key": "h2", "value": b"\x00\xff"}]
    assert rows[1]["k_headers"] == [] and rows[0]["first_header"] == "h1"
    assert json.loads(rows[0]["summary"]) == {"n": "alpha", "k": "k0", "t": (BASE_MS) * 1000, "kind": 0}
    assert (rows[0]["at_s"], rows[0]["at_ms"], rows[0]["at_micro"]) == (
        "2026-01-01T00:00:00Z",
        "1970-01-21T10:53:45.600Z",
        1767225600000,
    )
    assert rows[0]["skus"] == '["a"]' and rows[0]["n_tags"] == 2 and rows[0]["has_x"] is True
    # JSON null and a missing field are alike: null.
    assert {k: rows[1][k] for k in ("name", "tags", "nested", "ts")} == {
        k: rows[2][k] for k in ("name", "tags", "nested", "ts")
    }
    assert rows[3]["nested"] == {"a": None, "b": None} and rows[3]["items"][1] == {"sku": None, "qty": None}
    assert rows[3]["ts"].isoformat() == "2026-01-02T01:04:05+00:00" and rows[3]["score"] == 2.0


@pytest.mark.parametrize(
    ("name", "bad"),
    [("events_dlq", EVENTS_BAD), ("amounts_dlq", [5, 6, 7, 8]), ("readings_dlq", [3, 4])],
)
def test_both_engines_write_the_same_dead_letters(runs, name, bad):
    root, _, _ = runs
    spark_schema, spark_rows = _table(root / "spark" / name)
    arrow_schema, arrow_rows = _table(root / "arrow" / name)
    assert arrow_schema == spark_schema
    assert arrow_schema.names == list(KAFKA_COLUMNS)

    assert _letters(arrow_rows) == _letters(spark_rows)
    # The failed messages, each once, with their bytes and key; no tombstone among them.
    assert sorted((r["partition"], r["offset"]) for r in arrow_rows) == sorted((i % 2, i // 2) for i in bad)
    assert all(r["error"] and r["value_base64"] is not None and r["key_base64"] for r in arrow_rows)
    # In base64 on one line (Spark's base64 breaks lines after 76 characters: gzip's, Avro's).
    assert not any("\n" in r["value_base64"] for r in spark_rows)


def test_an_existing_table_decodes_its_other_columns_and_types_per_message_results(runs):
    root, _, _ = runs
    for engine in ENGINES:
        schema, rows = _table(root / engine / "amounts")
        assert schema == AMOUNTS_TABLE, engine
        by_id = {r["id"]: r for r in rows}
        assert [by_id[i]["note"] for i in AMOUNTS_GOOD] == ["n0", None, None, "n3"], engine
        assert [by_id[i]["n_attrs"] for i in AMOUNTS_GOOD] == [1, 0, 0, 2], engine


def test_the_reasons_of_the_events_dead_letters(runs):
    root, _, _ = runs
    rows = {(r["partition"], r["offset"]): r for r in _table(root / "spark" / "events_dlq")[1]}
    reasons = {i: rows[i % 2, i // 2]["error"] for i in EVENTS_BAD}
    assert reasons[5] == "empty message: no JSON object"
    assert reasons[6].startswith("JSON:") and reasons[7].startswith("JSON: not a JSON object")
    assert reasons[8].startswith("JSON: id: expected int64")
    assert reasons[9] == "transform 'at_s': epoch_seconds_to_iso8601: not a number: soon"
    assert reasons[10] == "transform 'code_iso': epoch_seconds_to_iso8601: not a number: x"
    years = "out of range (not in the years 1 to 9999)"
    assert reasons[14] == f"transform 'at_s': epoch_seconds_to_iso8601: {years}"
    assert base64.b64decode(rows[1, 4]["value_base64"]) == b'{"id": 9, "at": "soon"}'
    assert rows[1, 2]["value_base64"] == "" and base64.b64decode(rows[1, 2]["key_base64"]) == b"k5"


def test_the_sink_options_apply_alike(runs):
    """Partitioning, compression, file size and rows per file, table properties, commit metadata."""
    root, _, _ = runs
    for engine in ENGINES:
        table = DeltaTable(str(root / engine / "events"))
        assert table.metadata().partition_columns == ["k_partition"], engine
        assert table.metadata().configuration.get("delta.dataSkippingNumIndexedCols") == "5", engine
        for uri in table.file_uris():
            meta = pq.ParquetFile(uri.removeprefix("file://")).metadata
            assert meta.num_rows <= 2, engine
            assert meta.row_group(0).column(0).compression == "ZSTD", engine
        (batch,) = table.history(1)  # the one batch's commit (the writer's claim came before)
        assert batch.get("userMetadata") == "parity", engine


# -- the Spark engine's own cases ----------------------------------------------------------------


def test_a_dead_letter_table_of_the_old_pipeline_layout_keeps_it(runs):
    """Made by an earlier deltaflow (pipeline_id, batch_id, reason, record): its pipeline goes on
    writing that layout (a warning says how to take the new one) instead of failing."""
    root, topics, logged = runs
    schema, rows = _table(root / "legacy_dlq")
    assert schema.names == ["pipeline_id", "batch_id", "reason", "record", "dead_lettered_at"]
    assert sorted(json.loads(r["record"])["offset"] for r in rows) == [2, 3, 3, 4]  # messages 5-8
    assert {r["pipeline_id"] for r in rows} == {"legacy"} and all(r["reason"] for r in rows)
    record = next(
        json.loads(r["record"])
        for r in rows
        if json.loads(r["record"])["offset"] == 3 and json.loads(r["record"])["partition"] == 0
    )
    assert record["topic"] == topics["amounts"] and base64.b64decode(record["key_base64"]) == b"a6"
    assert any("has the columns pipeline_id, batch_id, reason, record" in m for m in logged)
    assert sorted(r["id"] for r in _table(root / "legacy")[1]) == AMOUNTS_GOOD


def test_a_drop_expectation_of_a_kafka_pipeline_lands_in_the_kafka_layout(runs):
    root, topics, _ = runs
    schema, rows = _table(root / "expect_dlq")
    assert schema.names == list(KAFKA_COLUMNS)
    dropped = [r for r in rows if r["error"] == "expectation failed: named"]
    # Decoded with no name: messages 1, 2, 3, 9, 10, 14; not decoded: 5-8.
    named = [0, 11, 13]
    assert sorted((r["partition"], r["offset"]) for r in dropped) == sorted(
        (i % 2, i // 2) for i in (1, 2, 3, 9, 10, 14)
    )
    assert len(rows) == len(dropped) + 4
    first = next(r for r in dropped if (r["partition"], r["offset"]) == (1, 0))
    assert first["topic"] == topics["events"] and first["kafka_timestamp"] is not None
    assert first["key_base64"] is None  # message 1 has no key
    assert json.loads(base64.b64decode(first["value_base64"])) == {"id": 1}  # the row, as JSON
    assert sorted(r["id"] for r in _table(root / "expect")[1]) == named


# -- deltaflow ingest: an inferred schema --------------------------------------------------------


def test_ingest_infers_the_same_schema_on_both_engines(spark, kafka, runs, tmp_path):
    """Without a schema ``deltaflow ingest`` infers one from the messages (YAML pipelines need
    ``schema``): both engines infer the same and write the same tables."""
    from deltaflow.config.ingest import IngestConfig
    from deltaflow.pipeline.ingest import ingest

    _, topics, _ = runs
    queries = []
    for engine in ENGINES:
        config = IngestConfig.build(
            topic=topics["events"],
            table_uri=str(tmp_path / engine),
            brokers=kafka.bootstrap,
            pipeline_id=f"infer-{engine}",
            transforms=(
                "k_key: kafka.key",
                "k_offset: kafka.offset",
                "k_ts: kafka.timestamp",
                "at_s: epoch_seconds_to_iso8601(at)",
            ),
            dlq_table_location=str(tmp_path / f"{engine}-dlq"),
            ends_at_latest_offsets=True,
            engine=engine,
        )
        queries.append(ingest(spark, config))
    assert all(q.awaitTermination(300) for q in queries)
    spark_schema, spark_rows = _table(tmp_path / "spark")
    arrow_schema, arrow_rows = _table(tmp_path / "arrow")
    assert arrow_schema == spark_schema
    assert _by(arrow_rows, "k_offset", "k_ts") == _by(spark_rows, "k_offset", "k_ts")
    assert spark_schema.field("id").type == pa.string()  # one message's id is "eight"
    assert spark_schema.field("extra").type == pa.string()  # inferred from message 13
    # "eight" fits a string id and no transform fails on message 10 here; no tombstone.
    assert sorted(r["id"] for r in arrow_rows) == sorted([*(str(i) for i in [*EVENTS_GOOD, 10]), "eight"])
    _, spark_dead = _table(tmp_path / "spark-dlq")
    _, arrow_dead = _table(tmp_path / "arrow-dlq")
    assert _letters(arrow_dead) == _letters(spark_dead)
    assert len(arrow_dead) == 5  # empty, cut short, not an object, "soon", 1e20

"""``deltaflow ingest`` with kafka-delta-ingest's other value formats, through the broker:
Confluent-framed JSON (``--json-registry``), Avro single-object encoding (``--soe-avro``), an
Avro container file per message (``--avro ''``)."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import struct

import fastavro
import fastavro.schema
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltaflow.cli import cli
from deltaflow.config.ingest import IngestConfig
from deltaflow.pipeline.ingest import ingest
from tests.fixtures.registry import AVRO_V1, AVRO_V2

AT = dt.datetime(2026, 11, 22, 8, 30, tzinfo=dt.UTC)


def _soe(schema: dict, record: dict) -> bytes:
    parsed = fastavro.parse_schema(schema)
    fp = fastavro.schema.fingerprint(fastavro.schema.to_parsing_canonical_form(parsed), "CRC-64-AVRO")
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    return b"\xc3\x01" + bytes.fromhex(fp) + buf.getvalue()


def _container(record: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(AVRO_V1), [record])
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["json_registry", "soe_avro", "avro_container"])
def test_other_value_formats_end_to_end(spark, kafka, schema_registry, tmp_path, kind):
    topic = kafka.create_topic(partitions=2)
    options: dict[str, object] = {}
    if kind == "json_registry":
        frame = struct.pack(">bI", 0, schema_registry.register(f"{topic}-value", {"type": "object"}))
        values = [frame + json.dumps({"id": i, "url": f"/p/{i}"}).encode() for i in range(20)]
        bad = b'{"id": 99}'  # not framed
        options = {
            "json_registry": schema_registry.url,
            "value_schema": "id LONG, url STRING",
            "schema_registry_username": "ingest",
            "schema_registry_password": "s3cret",
        }
    elif kind == "soe_avro":
        (tmp_path / "schemas").mkdir()
        (tmp_path / "schemas" / "a_v1.avsc").write_text(json.dumps(AVRO_V1))
        (tmp_path / "schemas" / "b_v2.avsc").write_text(json.dumps(AVRO_V2))  # the columns: last
        values = [
            _soe(AVRO_V1, {"id": i, "url": f"/p/{i}", "at": AT})
            if i < 10
            else _soe(AVRO_V2, {"id": i, "url": f"/p/{i}", "at": AT, "ref": "r"})
            for i in range(20)
        ]
        bad = _soe({"type": "record", "name": "X", "fields": [{"name": "id", "type": "long"}]}, {"id": 99})
        options = {"value_format": "avro", "soe_avro": str(tmp_path / "schemas")}
    else:
        values = [_container({"id": i, "url": f"/p/{i}", "at": AT}) for i in range(20)]
        bad = b"Obj\x01garbage"
        options = {"value_format": "avro", "avro": "", "value_schema": "id LONG, url STRING, at TIMESTAMP"}
    kafka.produce(topic, [*values, bad], partitions=2)
    config = IngestConfig.build(
        topic=topic,
        table_uri=str(tmp_path / "t"),
        brokers=kafka.bootstrap,
        pipeline_id=f"formats-{kind}".replace("_", "-"),
        dlq_table_location=str(tmp_path / "dlq"),
        ends_at_latest_offsets=True,
        transforms=("path_head: substr(url, `0`, `2`)",),
        **options,
    )
    assert ingest(spark, config).awaitTermination(300)
    rows = sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(20))
    assert all(r["url"] == f"/p/{r['id']}" and r["path_head"] == "/p" for r in rows)
    if kind == "soe_avro":
        assert [r["ref"] for r in rows] == [None] * 10 + ["r"] * 10
    if kind != "json_registry":
        assert all(r["at"] == AT for r in rows)
    (dead,) = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    expected = {
        "json_registry": "JSON: magic byte 123",
        "soe_avro": "Avro: ValueError: unknown schema with fingerprint",
        "avro_container": "Avro:",
    }
    assert dead["error"].startswith(expected[kind]), dead["error"]
    if kind == "json_registry":  # the tasks asked the registry with basic auth
        assert set(schema_registry.authorizations) == {"Basic " + base64.b64encode(b"ingest:s3cret").decode()}
        assert "s3cret" not in repr(config)


def test_cli_flags_of_the_formats(monkeypatch):
    seen: list[dict] = []

    def fake_config(**kwargs):  # stop before Spark: only the parsing is under test
        seen.append(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr("deltaflow.config.ingest.IngestConfig.build", fake_config)
    CliRunner().invoke(cli, ["ingest", "t", "/tmp/x", "--avro", ""])
    CliRunner().invoke(cli, ["ingest", "t", "/tmp/x"], env={"AVRO_REGISTRY": "http://r:8081"})
    CliRunner().invoke(cli, ["ingest", "t", "/tmp/x", "--soe-avro", "/s"])
    CliRunner().invoke(cli, ["ingest", "t", "/tmp/x"], env={"JSON_REGISTRY": "http://r:8081"})
    CliRunner().invoke(cli, ["ingest", "t", "/tmp/x", "--json", "http://r:8082"])  # kafka-delta-ingest's form
    CliRunner().invoke(cli, ["ingest", "t", "/tmp/x", "--json"])  # a bare --json: plain JSON
    assert [(s["value_format"], s["avro"], s["soe_avro"], s["json_registry"]) for s in seen] == [
        ("avro", "", None, None),
        ("avro", "http://r:8081", None, None),
        ("avro", None, "/s", None),
        ("json", None, None, "http://r:8081"),
        ("json", None, None, "http://r:8082"),
        ("json", None, None, None),
    ]
    # --json before the arguments would take TOPIC as its URL: refused, naming the fix.
    wrong = CliRunner().invoke(cli, ["ingest", "--json", "t", "/tmp/x"], env={"TABLE_LOCATION": "/tmp/y"})
    assert wrong.exit_code == 2 and "put TOPIC and TABLE before a bare --json" in wrong.output

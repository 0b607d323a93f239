"""Declarative pipelines end to end through Spark into Delta: every source, routing to several
sinks, expectations and the dead-letter table, a crash between two sinks' commits, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.config.pipeline import load_pipelines
from deltaflow.delta import commit
from deltaflow.errors import ConfigError, DeltaSourceError, ExpectationFailedError
from deltaflow.metrics import metrics
from deltaflow.pipeline.runner import SOURCE_SCHEMA_FILE
from deltaflow.service.daemon import run_pipelines
from deltaflow.sources.generator import generate

ROOT = Path(__file__).resolve().parents[2]


def _pipelines(tmp_path: Path, text: str, **env: str):
    path = tmp_path / "pipelines.yaml"
    path.write_text(textwrap.dedent(text))
    return load_pipelines(path, env={"DIR": str(tmp_path), **env}).pipelines


def _rows(uri: Path, *columns: str) -> list[tuple]:
    table = DeltaTable(str(uri)).to_pyarrow_table(columns=list(columns) or None)
    return sorted(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


def _expected_events(total: int) -> pa.Table:
    """What the generator produces for ids 0..total-1 (started_ms does not affect these columns)."""
    return pa.Table.from_batches([generate(0, total, 0, 1000.0, 0)])


def test_generator_routed_to_two_sinks_with_expectations_and_dead_letters(spark, tmp_path):
    total = 3000
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: shop
            source:
              type: generator
              total_rows: 3000
              rows_per_batch: 1000
              fields: {day: "to_date(event_time)"}
            transforms: {kind: "sql: upper(event_type)", "meta.source": "sql: 'gen'"}
            filter: "event_type <> 'view'"
            select: [id, kind, event_type, country, amount, day, meta]
            expectations:
              - {name: small_purchase, expr: "event_type <> 'purchase' OR amount < 500", action: drop}
              - {name: not_pl, expr: "country <> 'PL'", action: warn}
            dead_letter: {table_uri: "${DIR}/rejected"}
            sinks:
              - {name: purchases, table_uri: "${DIR}/purchases", when: "event_type = 'purchase'"}
              - name: other
                table_uri: "${DIR}/other"
                when: "event_type <> 'purchase'"
                partition_columns: [day]
          - id: countries
            source: {type: generator, total_rows: 500, seed: 7}
            select: [id, country]
            sinks: [{table_uri: "${DIR}/countries"}]
        """,
    )
    summaries = run_pipelines(spark, specs, available_now=True)
    assert summaries["shop"].messages == total
    assert summaries["countries"].messages == 500

    events = _expected_events(total)
    not_view = events.filter(pc.not_equal(events["event_type"], "view"))
    purchase = pc.equal(not_view["event_type"], "purchase")
    big = pc.and_(purchase, pc.greater_equal(not_view["amount"], 500))
    want_purchases = sorted(not_view.filter(pc.and_(purchase, pc.invert(big)))["id"].to_pylist())
    want_other = sorted(not_view.filter(pc.invert(purchase))["id"].to_pylist())
    want_rejected = sorted(not_view.filter(big)["id"].to_pylist())
    assert want_purchases and want_other and want_rejected  # the data exercises every route

    assert [r[0] for r in _rows(tmp_path / "purchases", "id")] == want_purchases
    assert [r[0] for r in _rows(tmp_path / "other", "id")] == want_other
    other = DeltaTable(str(tmp_path / "other"))
    assert other.metadata().partition_columns == ["day"]
    sample = other.to_pyarrow_table().to_pylist()[0]
    assert sample["kind"] == sample["event_type"].upper() and sample["meta"] == {"source": "gen"}

    rejected = DeltaTable(str(tmp_path / "rejected")).to_pyarrow_table().to_pylist()
    assert sorted(json.loads(r["record"])["id"] for r in rejected) == want_rejected
    assert {r["reason"] for r in rejected} == {"expectation failed: small_purchase"}
    assert {r["pipeline_id"] for r in rejected} == {"shop"}
    # Every table: one commit per batch with rows, each txn = the last batch.
    for name in ("purchases", "other", "rejected"):
        assert DeltaTable(str(tmp_path / name)).transaction_version("shop") == 2
    assert len(_rows(tmp_path / "countries", "id")) == 500

    def violations(name: str, action: str) -> float:
        value = metrics.registry.get_sample_value(
            "deltaflow_expectation_violations_total",
            {"pipeline": "shop", "expectation": name, "action": action},
        )
        return value or 0.0

    assert violations("small_purchase", "drop") == len(want_rejected)
    want_pl = len(not_view.filter(pc.equal(not_view["country"], "PL")))
    assert violations("not_pl", "warn") == want_pl  # counted, and the rows were kept

    # Run again: nothing new, nothing written twice.
    run_pipelines(spark, specs, available_now=True)
    assert [r[0] for r in _rows(tmp_path / "purchases", "id")] == want_purchases


def test_a_bad_route_or_expectation_is_refused_before_any_batch(spark, tmp_path):
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: typo
            source: {type: generator, total_rows: 10}
            expectations: [{name: ok, expr: "amount >= 0"}]
            sinks: [{table_uri: "${DIR}/a"}, {table_uri: "${DIR}/b", when: "contry = 'DE'"}]
        """,
    )
    with pytest.raises(ConfigError, match=r"sinks.sink1.when: \"contry = 'DE'\" is not a valid predicate"):
        run_pipelines(spark, specs, available_now=True)
    assert not (tmp_path / "a").exists()  # nothing created, nothing written


def test_a_failing_expectation_stops_the_pipeline_with_nothing_committed(spark, tmp_path):
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: strict
            source: {type: generator, total_rows: 400}
            expectations:
              - {name: no_purchases, expr: "event_type <> 'purchase'", action: fail}
            sinks: [{table_uri: "${DIR}/a"}, {table_uri: "${DIR}/b"}]
        """,
    )
    with pytest.raises(ExpectationFailedError, match=r"expectation 'no_purchases' \(\d+ row\(s\) violate"):
        run_pipelines(spark, specs, available_now=True)
    for name in ("a", "b"):
        table = DeltaTable(str(tmp_path / name))
        assert table.to_pyarrow_table().num_rows == 0  # created, never written: ...
        entries = commit.read_entries(str(tmp_path / name), {}, 1, table.version())
        assert [bool(e.info.get(commit.CLAIM_KEY)) for e in entries] == [True]  # ... only claimed


def test_json_files_schema_inferred_once_and_rescued_data(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_text(
        '{"id": 1, "name": "a", "score": 1.5}\n{"id": 2, "name": "b", "score": 2.5}\n\n'
    )
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: files
            source: {type: files, path: "${DIR}/landing", format: json, max_files_per_trigger: 1,
                     source_file_column: source_file}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    stored = tmp_path / "t" / "_deltaflow" / "checkpoints" / "files" / SOURCE_SCHEMA_FILE
    assert [f["name"] for f in json.loads(stored.read_text())["fields"]] == ["id", "name", "score"]

    # Later files: a new field, a wrong type, broken JSON. The schema stays; nothing is lost.
    (landing / "b.json").write_text(
        '{"id": 3, "name": "c", "score": 3.5, "extra": {"x": 1}}\n'
        '{"id": 4, "name": "d", "score": "high"}\n'
        '{"id": 5, "name": \n'
        '{"id": 6, "name": "f", "score": 6.5}\n'
    )
    run_pipelines(spark, specs, available_now=True)
    table = DeltaTable(str(tmp_path / "t"))
    assert [f.name for f in table.schema().fields] == ["id", "name", "score", "_rescued_data", "source_file"]
    rows = sorted(
        table.to_pyarrow_table().to_pylist(),
        key=lambda r: (r["id"] is None, r["id"] or 0, r["_rescued_data"]),
    )
    got = [(r["id"], r["name"], r["score"], r["_rescued_data"]) for r in rows]
    assert got == [
        (1, "a", 1.5, None),
        (2, "b", 2.5, None),
        (3, "c", 3.5, '{"extra":"{\\"x\\":1}"}'),
        (4, "d", None, '{"id": 4, "name": "d", "score": "high"}'),
        (6, "f", 6.5, None),
        (None, None, None, '{"id": 5, "name": '),
    ]
    assert {Path(r["source_file"]).name for r in rows} == {"a.json", "b.json"}
    # max_files_per_trigger 1: one commit per file.
    assert table.transaction_version("files") == 1


def test_csv_files_with_a_given_schema(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "1.csv").write_text("id,city,temp\n1,Oslo,3.5\n2,Rome,x\n3,Lima,19\n")
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: csv
            source:
              type: files
              path: "${DIR}/landing"
              format: csv
              schema: "id INT, city STRING, temp DOUBLE"
            transforms: {city_uc: "sql: upper(city)"}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    assert _rows(tmp_path / "t", "id", "city_uc", "temp", "_rescued_data") == [
        (1, "OSLO", 3.5, None),
        (2, "ROME", None, "2,Rome,x"),
        (3, "LIMA", 19.0, None),
    ]


def test_parquet_files_schema_inferred(spark, tmp_path):
    import pyarrow.parquet as pq

    landing = tmp_path / "landing"
    landing.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "tags": [["a"], []]}), landing / "1.parquet")
    pq.write_table(pa.table({"id": [3], "tags": [["b", "c"]]}), landing / "2.parquet")
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: pq
            source: {type: files, path: "${DIR}/landing", format: parquet, max_files_per_trigger: 1}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    assert _rows(tmp_path / "t", "id") == [(1,), (2,), (3,)]
    table = DeltaTable(str(tmp_path / "t"))
    assert table.to_pyarrow_table().sort_by("id").column("tags").to_pylist() == [["a"], [], ["b", "c"]]
    assert table.transaction_version("pq") == 1  # one batch per file


def test_avro_files_decoded_without_a_jar_schema_from_the_first_file(spark, tmp_path):
    import datetime as dt

    import fastavro

    landing = tmp_path / "landing"
    landing.mkdir()
    v1 = {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "city", "type": ["null", "string"]},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
        ],
    }
    at = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.UTC)
    with open(landing / "1.avro", "wb") as out:
        fastavro.writer(out, v1, [{"id": i, "city": f"c{i}", "at": at, "tags": ["x"] * i} for i in range(3)])
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: avro
            source: {type: files, path: "${DIR}/landing", format: avro, source_file_column: file}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    # A newer writer schema with one more field: the column set stays, the field is rescued.
    v2 = {**v1, "fields": [*v1["fields"], {"name": "unit", "type": "string"}]}
    with open(landing / "2.avro", "wb") as out:
        fastavro.writer(out, v2, [{"id": 9, "city": None, "at": at, "tags": [], "unit": "C"}])
    run_pipelines(spark, specs, available_now=True)
    rows = sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["city"], r["at"], r["tags"], r["_rescued_data"]) for r in rows] == [
        (0, "c0", at, [], None),
        (1, "c1", at, ["x"], None),
        (2, "c2", at, ["x", "x"], None),
        (9, None, at, [], '{"unit": "C"}'),
    ]
    assert [Path(r["file"]).name for r in rows] == ["1.avro", "1.avro", "1.avro", "2.avro"]


def _delta_pipeline(tmp_path: Path, source: str, pid: str) -> list:
    return _pipelines(
        tmp_path,
        f"""
        pipelines:
          - id: {pid}
            source: {source}
            sinks: [{{table_uri: "${{DIR}}/{pid}"}}]
        """,
    )


def test_delta_source_snapshot_then_new_commits_deletes_and_changes(spark, tmp_path):
    src = tmp_path / "bronze"
    part = ["a b", "d:e", "c"]
    write_deltalake(str(src), pa.table({"id": [0, 1, 2], "p": part}), partition_by=["p"])
    write_deltalake(str(src), pa.table({"id": [3, 4], "p": ["a b", "c"]}), partition_by=["p"], mode="append")
    specs = _delta_pipeline(tmp_path, f"{{type: delta, table_uri: '{src}'}}", "silver")

    run_pipelines(spark, specs, available_now=True)  # the snapshot (version 1) as one batch
    assert _rows(tmp_path / "silver", "id", "p") == [(0, "a b"), (1, "d:e"), (2, "c"), (3, "a b"), (4, "c")]

    write_deltalake(str(src), pa.table({"id": [5], "p": ["d:e"]}), partition_by=["p"], mode="append")
    DeltaTable(str(src)).optimize.compact()  # dataChange=false: no new rows
    run_pipelines(spark, specs, available_now=True)
    assert [r[0] for r in _rows(tmp_path / "silver", "id")] == [0, 1, 2, 3, 4, 5]

    # Deleting a whole partition removes files only: refused, then skipped with ignore_deletes.
    DeltaTable(str(src)).delete("p = 'c'")
    with pytest.raises(DeltaSourceError, match=r"deletes data.*Set ignore_deletes"):
        run_pipelines(spark, specs, available_now=True)
    ignoring = _delta_pipeline(
        tmp_path, f"{{type: delta, table_uri: '{src}', ignore_deletes: true}}", "silver"
    )
    run_pipelines(spark, ignoring, available_now=True)
    assert [r[0] for r in _rows(tmp_path / "silver", "id")] == [0, 1, 2, 3, 4, 5]

    # Rewriting rows: refused even with ignore_deletes; ignore_changes reads the new files again.
    DeltaTable(str(src)).update(updates={"id": "id + 100"}, predicate="id = 0")
    with pytest.raises(DeltaSourceError, match="rewrites files"):
        run_pipelines(spark, ignoring, available_now=True)
    changes = _delta_pipeline(
        tmp_path, f"{{type: delta, table_uri: '{src}', ignore_changes: true}}", "silver"
    )
    run_pipelines(spark, changes, available_now=True)
    ids = [r[0] for r in _rows(tmp_path / "silver", "id")]
    assert 100 in ids and ids.count(3) == 2  # the rewritten file's other row (3) came again


def test_delta_source_timestamp_partitions_and_a_column_added_upstream(spark, tmp_path):
    import datetime as dt

    src = tmp_path / "src"
    hour = dt.datetime(2026, 11, 22, 8, tzinfo=dt.UTC)
    write_deltalake(str(src), pa.table({"id": [1], "hour": [hour]}), partition_by=["hour"])
    specs = _pipelines(
        tmp_path,
        f"""
        pipelines:
          - id: ts
            source: {{type: delta, table_uri: "{src}"}}
            sinks: [{{table_uri: "${{DIR}}/t", schema_mode: merge}}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)  # the snapshot
    later = hour + dt.timedelta(hours=1)
    write_deltalake(str(src), pa.table({"id": [2], "hour": [later]}), partition_by=["hour"], mode="append")
    run_pipelines(spark, specs, available_now=True)  # a new commit: partition values from the log
    assert _rows(tmp_path / "t", "id", "hour") == [(1, hour), (2, later)]

    # A column added upstream while a query reads: that query stops (transient, the daemon restarts
    # it) rather than dropping the new column's values; a query started afterwards reads it.
    from deltaflow.errors import SchemaEvolvedError
    from deltaflow.sources.delta import DeltaStreamOptions, DeltaStreamReader, table_arrow_schema

    running = DeltaStreamReader(DeltaStreamOptions(str(src)), table_arrow_schema(DeltaTable(str(src))))
    write_deltalake(
        str(src),
        pa.table({"id": [3], "hour": [later], "note": ["new"]}),
        partition_by=["hour"],
        mode="append",
        schema_mode="merge",
    )
    with pytest.raises(SchemaEvolvedError, match="adds column\\(s\\) note; restarting the query"):
        running.partitions({"version": 1, "snapshot": 0}, {"version": 2, "snapshot": 0})
    run_pipelines(spark, specs, available_now=True)
    assert _rows(tmp_path / "t", "id", "note") == [(1, None), (2, None), (3, "new")]


def test_delta_source_from_a_version_and_its_change_feed(spark, tmp_path):
    src = tmp_path / "cdf"
    props = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(str(src), pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}), configuration=props)
    write_deltalake(str(src), pa.table({"id": [4], "v": ["d"]}), mode="append")
    DeltaTable(str(src)).update(updates={"v": "'B'"}, predicate="id = 2")
    DeltaTable(str(src)).delete("id = 3")

    # From version 1 on, following rewrites: each rewritten file's rows come again.
    source = f"{{type: delta, table_uri: '{src}', starting_version: 1, ignore_changes: true}}"
    run_pipelines(spark, _delta_pipeline(tmp_path, source, "plain"), available_now=True)
    assert _rows(tmp_path / "plain", "id", "v") == [
        (1, "a"),
        (1, "a"),
        (2, "B"),
        (2, "B"),
        (3, "c"),
        (4, "d"),
    ]

    feed = _delta_pipeline(
        tmp_path, f"{{type: delta, table_uri: '{src}', starting_version: 1, read_change_feed: true}}", "feed"
    )
    run_pipelines(spark, feed, available_now=True)
    got = _rows(tmp_path / "feed", "_commit_version", "_change_type", "id", "v")
    assert got == [
        (1, "insert", 4, "d"),
        (2, "update_postimage", 2, "B"),
        (2, "update_preimage", 2, "b"),
        (3, "delete", 3, "c"),
    ]


def test_kafka_source_pipeline_with_undecodable_messages_dead_lettered(spark, kafka, tmp_path):
    topic = kafka.create_topic(partitions=2)
    values = [json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(40)]
    values[7] = b"{not json"
    values[20] = b'{"id": "twenty"}'
    kafka.produce(topic, values, partitions=2)
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: k
            source:
              type: kafka
              bootstrap_servers: "${BROKER}"
              topic: "${TOPIC}"
              schema: "id BIGINT, name STRING"
            transforms: {offset: kafka.offset, part: kafka.partition}
            dead_letter: {table_uri: "${DIR}/dlq"}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
        BROKER=kafka.bootstrap,
        TOPIC=topic,
    )
    run_pipelines(spark, specs, available_now=True)
    rows = _rows(tmp_path / "t", "id", "part", "offset")
    assert [r[0] for r in rows] == [i for i in range(40) if i not in (7, 20)]
    assert all(part == i % 2 and offset == i // 2 for i, part, offset in rows)
    assert "kafka" not in DeltaTable(str(tmp_path / "t")).schema().to_arrow().names
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert len(letters) == 2
    import base64

    raw = sorted(base64.b64decode(json.loads(r["record"])["value_base64"]) for r in letters)
    assert raw == sorted([b"{not json", b'{"id": "twenty"}'])
    assert all(r["reason"] for r in letters)


def _run_cli(args: list[str], **env: str) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DELTAFLOW_TEST_")}
    environ.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "deltaflow.cli", *args],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_killed_between_two_sinks_commits_then_run_until_sigterm_is_exactly_once(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            spark: {{master: "local[2]", conf: {{spark.sql.shuffle.partitions: "2"}}}}
            pipelines:
              - id: fan
                source: {{type: generator, total_rows: 3000, rows_per_batch: 1000, rows_per_second: 100000}}
                sinks:
                  - {{name: first, table_uri: "{tmp_path}/first"}}
                  - {{name: second, table_uri: "{tmp_path}/second", when: "event_type = 'view'"}}
            """
        )
    )
    # SIGKILL right after the FIRST sink committed batch 1; the second has batch 0 only.
    crashed = _run_cli(["run", str(path), "--once"], DELTAFLOW_TEST_CRASH_AT="after_commit:1")
    _, err = crashed.communicate(timeout=300)
    assert crashed.returncode == -signal.SIGKILL, err[-3000:]
    assert DeltaTable(str(tmp_path / "first")).transaction_version("fan") == 1
    assert DeltaTable(str(tmp_path / "second")).transaction_version("fan") == 0

    # Restart as a daemon (no --once): the replayed batch 1 skips `first` and lands in `second`.
    daemon = _run_cli(["run", str(path)])
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and daemon.poll() is None:
        done = [DeltaTable(str(tmp_path / t)).transaction_version("fan") for t in ("first", "second")]
        if done == [2, 2]:  # SIGTERM between the two commits would leave batch 2 to the next start
            break
        time.sleep(0.5)
    assert daemon.poll() is None, daemon.communicate()[1][-3000:]
    daemon.send_signal(signal.SIGTERM)
    out, err = daemon.communicate(timeout=120)
    assert daemon.returncode == 0, err[-3000:]
    assert "stopped by SIGTERM" in err
    assert "fan: " in out

    events = _expected_events(3000)
    assert [r[0] for r in _rows(tmp_path / "first", "id")] == list(range(3000))
    views = sorted(events.filter(pc.equal(events["event_type"], "view"))["id"].to_pylist())
    assert [r[0] for r in _rows(tmp_path / "second", "id")] == views
    for name in ("first", "second"):
        epochs = [
            h["deltaflow.epoch"] for h in DeltaTable(str(tmp_path / name)).history() if "deltaflow.epoch" in h
        ]
        assert sorted(epochs) == [0, 1, 2]  # one commit per batch in each table, none twice


def test_starting_timestamp_picks_the_first_version_at_or_after_it(tmp_path):
    from deltaflow.sources.delta import _version_at

    for i in range(3):
        write_deltalake(str(tmp_path / "t"), pa.table({"id": [i]}), mode="append")
        time.sleep(0.01)  # distinct commit timestamps (milliseconds)
    table = DeltaTable(str(tmp_path / "t"))
    stamps = {h["version"]: h["timestamp"] for h in table.history()}
    import datetime as dt

    def iso(ms: int) -> str:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat()

    assert _version_at(table, iso(stamps[1])) == 1
    assert _version_at(table, iso(stamps[1] - 1)) == 1
    assert _version_at(table, iso(stamps[0] - 60_000)) == 0
    assert _version_at(table, iso(stamps[2] + 1)) == 3  # after the last commit: the next one
    with pytest.raises(Exception, match="is not an ISO-8601 time"):
        _version_at(table, "yesterday")

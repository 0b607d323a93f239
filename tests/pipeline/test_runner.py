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
from deltalake import DeltaTable

from deltaflow.delta import commit
from deltaflow.errors import ConfigError, ExpectationFailedError
from deltaflow.metrics import metrics
from deltaflow.service.daemon import run_pipelines
from deltaflow.sources.generator import generate
from tests.fixtures.pipelines import pipelines as _pipelines
from tests.fixtures.pipelines import rows as _rows

ROOT = Path(__file__).resolve().parents[2]


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


KAFKA_PIPELINE = """
    pipelines:
      - id: k
        engine: "${ENGINE}"
        source:
          type: kafka
          bootstrap_servers: "${BROKER}"
          topic: "${TOPIC}"
          schema: "id BIGINT, name STRING"
        transforms: {offset: kafka.offset, part: kafka.partition}
        dead_letter: {table_uri: "${DIR}/dlq"}
        sinks: [{table_uri: "${DIR}/t", partition_columns: [part]}]
"""


def _kafka_values(first: int, count: int, bad: dict[int, bytes]) -> list[bytes]:
    return [bad.get(i, json.dumps({"id": i, "name": f"n{i}"}).encode()) for i in range(first, first + count)]


def _kafka_pipeline(kafka, tmp_path: Path, count: int, bad: dict[int, bytes]):
    """A 2-partition topic holding ``count`` messages (``bad`` ones replaced), and the
    :data:`KAFKA_PIPELINE` specs reading it for an engine."""
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _kafka_values(0, count, bad), partitions=2)

    def specs(engine: str):
        return _pipelines(tmp_path, KAFKA_PIPELINE, BROKER=kafka.bootstrap, TOPIC=topic, ENGINE=engine)

    return topic, specs


def _check_kafka_rows(tmp_path: Path, ids: list[int]) -> None:
    rows = _rows(tmp_path / "t", "id", "part", "offset")
    assert [r[0] for r in rows] == ids  # each message once, in order of id
    assert all(part == i % 2 and offset == i // 2 for i, part, offset in rows)
    assert "kafka" not in DeltaTable(str(tmp_path / "t")).schema().to_arrow().names


def test_kafka_source_pipeline_with_undecodable_messages_dead_lettered(spark, kafka, tmp_path):
    from deltaflow.service.status import board

    bad = {7: b"{not json", 20: b'{"id": "twenty"}'}
    topic, specs = _kafka_pipeline(kafka, tmp_path, 40, bad)
    run_pipelines(spark, specs("spark"), available_now=True)
    _check_kafka_rows(tmp_path, [i for i in range(40) if i not in bad])
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert len(letters) == 2
    import base64

    # The Arrow engine's (and ingest's) layout: coordinates, raw key and value, the error.
    raw = sorted(base64.b64decode(r["value_base64"]) for r in letters)
    assert raw == sorted(bad.values())
    assert sorted((r["partition"], r["offset"]) for r in letters) == [(0, 10), (1, 3)]
    assert all(r["error"] and r["topic"] == topic for r in letters)

    # Its tables hold batch progress: the Arrow engine would start over, so it is refused
    # before anything is written; auto stays on Spark.
    version = DeltaTable(str(tmp_path / "t")).version()
    with pytest.raises(ConfigError, match=r"holds its progress per batch, written by the Spark engine"):
        run_pipelines(spark, specs("arrow"), available_now=True)
    assert DeltaTable(str(tmp_path / "t")).version() == version
    # Two batched partitions: message 40 goes to partition 0, as message i % 2 always does.
    kafka.produce(topic, _kafka_values(40, 10, {}), partitions=2)
    run_pipelines(spark, specs("auto"), available_now=True)
    assert board.snapshot()["pipelines"][-1]["engine"] == "spark"
    _check_kafka_rows(tmp_path, [i for i in range(50) if i not in bad])


def test_kafka_pipeline_on_the_arrow_engine(spark, kafka, tmp_path):
    """``engine: arrow``: the pipeline runs as ``deltaflow ingest`` (progress per partition,
    ingest's dead-letter layout, the sink's options kept); the Spark engine is refused on its
    tables, ``auto`` carries on with Arrow."""
    from deltaflow.service.status import board

    bad = {3: b"[1, 2]", 12: b"{not json"}
    topic, specs = _kafka_pipeline(kafka, tmp_path, 30, bad)
    run_pipelines(spark, specs("arrow"), available_now=True)
    assert board.snapshot()["pipelines"][-1]["engine"] == "arrow"
    _check_kafka_rows(tmp_path, [i for i in range(30) if i not in bad])
    table = DeltaTable(str(tmp_path / "t"))
    assert table.metadata().partition_columns == ["part"]
    assert {p: table.transaction_version(f"k-{topic}-{p}") for p in (0, 1)} == {0: 14, 1: 14}
    assert table.transaction_version("k") is None
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert sorted((r["partition"], r["offset"]) for r in letters) == [(0, 6), (1, 1)]
    assert all(r["error"] and r["value_base64"] for r in letters)

    version = table.version()
    refused = r"holds its progress per Kafka partition, written by the Arrow engine"
    with pytest.raises(ConfigError, match=refused):
        run_pipelines(spark, specs("spark"), available_now=True)
    # Also when its table is no longer the first sink (auto must take Spark for two sinks).
    routed = KAFKA_PIPELINE.replace(
        'sinks: [{table_uri: "${DIR}/t", partition_columns: [part]}]',
        'sinks: [{table_uri: "${DIR}/new", when: "id > 100"},'
        ' {table_uri: "${DIR}/t", partition_columns: [part]}]',
    )
    assert routed != KAFKA_PIPELINE
    with pytest.raises(ConfigError, match=refused):
        run_pipelines(
            spark,
            _pipelines(tmp_path, routed, BROKER=kafka.bootstrap, TOPIC=topic, ENGINE="auto"),
            available_now=True,
        )
    assert DeltaTable(str(tmp_path / "t")).version() == version and not (tmp_path / "new").exists()
    kafka.produce(topic, _kafka_values(30, 10, {}), partitions=2)
    run_pipelines(spark, specs("auto"), available_now=True)
    assert board.snapshot()["pipelines"][-1]["engine"] == "arrow"
    _check_kafka_rows(tmp_path, [i for i in range(40) if i not in bad])


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


@pytest.mark.parametrize(
    ("source", "units"),
    [
        pytest.param("{type: files, path: /in, format: json}", ("file(s)", "row(s)", ""), id="files"),
        pytest.param("{type: parquet-files, path: /in}", ("file(s)", "row(s)", ""), id="parquet-files"),
        pytest.param("{type: generator}", ("row(s)", "row(s)", ""), id="generator"),
        pytest.param("{type: delta, table_uri: /src}", ("row(s)", "row(s)", ""), id="delta"),
        pytest.param(
            "{type: kafka, bootstrap_servers: 'b:9092', topic: t, schema: 'id INT'}",
            ("message(s)", "row(s)", "message(s)"),
            id="kafka",
        ),
        pytest.param(
            "{type: postgres-cdc, host: db, dbname: shop, publication: pub, snapshot: never}",
            ("change(s)", "change(s)", "byte(s) of WAL"),
            id="postgres-cdc",
        ),
    ],
)
def test_each_source_names_the_unit_it_reads_and_commits(tmp_path, source, units):
    from deltaflow.pipeline.runner import source_units

    (spec,) = _pipelines(tmp_path, f"pipelines: [{{id: p, source: {source}, sinks: [{{table_uri: /t}}]}}]")
    assert source_units(spec) == units


def test_a_sink_without_partition_columns_takes_the_existing_tables_partitioning(spark, tmp_path):
    from deltalake import write_deltalake

    table = tmp_path / "events"
    first = _expected_events(4)
    write_deltalake(str(table), first, partition_by=["country"])
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: more
            source: {type: generator, total_rows: 40}
            sinks: [{table_uri: "${DIR}/events"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    written = DeltaTable(str(table))
    assert written.metadata().partition_columns == ["country"]
    assert written.to_pyarrow_table().num_rows == 44
    added = pa.table(written.get_add_actions(flatten=True)).column("path").to_pylist()
    assert added and all(path.startswith("country=") for path in added)

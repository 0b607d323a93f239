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

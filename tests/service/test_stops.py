"""Stopping a service as systemd, a container init and Ctrl-C do: a signal to every process of
it (the driver, its JVM, Spark's Python workers), mid-batch. CLI processes against the broker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.fixtures.service import NOT_CLEAN, ROOT, Service

MESSAGES = 100_000


def _messages(first: int, count: int) -> list[bytes]:
    return [json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(first, first + count)]


def _ids(table: Path) -> list[int]:
    return sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["id"])["id"].to_pylist())


def _ingest(kafka, topic: str, table: Path, *extra: str) -> list[str]:
    return ["ingest", topic, str(table), "--kafka", kafka.bootstrap, "--app_id", "svc", *extra]


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_process_group_stops_ingest_cleanly_and_loses_nothing(kafka, tmp_path, number):
    topic = kafka.create_topic(partitions=4)
    kafka.produce(topic, _messages(0, MESSAGES), partitions=4, batched=True)
    table = tmp_path / "t"
    service = Service(
        _ingest(kafka, topic, table, "--allowed_latency", "1", "--max_messages_per_batch", "10000")
    )
    service.wait_for("committed batch 1 of")  # mid-run: more batches wait
    service.signal_all(number)
    code, output = service.finish()
    assert code == 0, output[-5000:]
    assert f"stopped by {signal.Signals(number).name}" in output
    assert not [line for line in output.splitlines() if any(word in line for word in NOT_CLEAN)], output[
        -5000:
    ]
    landed = _ids(table)
    assert landed == sorted(set(landed)) and 0 < len(landed) < MESSAGES
    if number == signal.SIGTERM:  # the next start takes the rest, nothing twice
        rest = subprocess.run(
            [
                sys.executable,
                "-m",
                "deltaflow.cli",
                *_ingest(kafka, topic, table, "--ends_at_latest_offsets"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert rest.returncode == 0, rest.stderr[-3000:]
        assert _ids(table) == list(range(MESSAGES))


def test_run_stops_every_pipeline_cleanly_on_a_signal_to_its_group(kafka, tmp_path):
    topics = [kafka.create_topic(partitions=2) for _ in range(2)]
    for topic in topics:
        kafka.produce(topic, _messages(0, MESSAGES // 2), partitions=2, batched=True)
    pipelines = {
        "pipelines": [
            {
                "id": f"p{i}",
                "engine": "arrow",
                "source": {
                    "type": "kafka",
                    "bootstrap_servers": kafka.bootstrap,
                    "topic": topic,
                    "schema": "id LONG, name STRING",
                    "max_messages_per_batch": 5000,
                },
                "sinks": [{"table_uri": str(tmp_path / f"t{i}")}],
            }
            for i, topic in enumerate(topics)
        ]
    }
    spec = tmp_path / "pipelines.yml"
    spec.write_text(json.dumps(pipelines))  # JSON is YAML
    service = Service(["run", str(spec)])
    service.wait_for("committed batch 1 of", count=2)
    # Every pipeline on the Arrow engine: the JVM only plans, with its quick compiler.
    (java,) = service.children_named("java")
    assert "-XX:TieredStopAtLevel=1" in java.cmdline()
    service.signal_all(signal.SIGTERM)
    code, output = service.finish()
    assert code == 0, output[-5000:]
    assert not [line for line in output.splitlines() if any(word in line for word in NOT_CLEAN)], output[
        -5000:
    ]
    for i in range(2):
        landed = _ids(tmp_path / f"t{i}")
        assert landed == sorted(set(landed)) and landed

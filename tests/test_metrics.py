"""Prometheus metrics: scraped over HTTP and parsed with prometheus_client's parser."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from deltaflow.config.ingest import IngestConfig
from deltaflow.metrics import Metrics, metrics
from deltaflow.pipeline.ingest import ingest


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_facade_names_labels_and_lag_from_a_progress_report():
    m = Metrics(CollectorRegistry())
    port = m.serve(0, addr="127.0.0.1")
    m.batch_committed(pipeline="p", table="/t", rows=10, files=2, bytes_=300, seconds=0.02, retries=1)
    m.batch_committed(pipeline="p", table="/t", rows=5, files=1, bytes_=100, seconds=0.01, retries=0)
    m.records_failed(pipeline="p", table="/t", count=3)
    m.progress_reported(
        "p",
        {
            "sources": [
                {
                    "description": "kafka",
                    "endOffset": json.dumps({"t": {"0": 5, "1": 7}}),
                    "latestOffset": json.dumps({"t": {"0": 9, "1": 7}}),
                    "inputRowsPerSecond": 12.5,
                    "processedRowsPerSecond": 40.0,
                }
            ]
        },
    )
    m.progress_reported("p", {"sources": [{"endOffset": "not json"}]})  # never raises
    # A files source's stream is files: its rates are files per second, never "rows".
    m.progress_reported(
        "f", {"sources": [{"description": "files", "inputRowsPerSecond": 2.0}]}, unit="file(s)", behind=""
    )
    # A CDC source's lag is WAL bytes, apart from the messages of Kafka partitions.
    wal = {
        "endOffset": json.dumps({"slot": {"lsn": 100}}),
        "latestOffset": json.dumps({"slot": {"lsn": 160}}),
    }
    m.progress_reported(
        "c", {"sources": [{"description": "pg", **wal}]}, unit="change(s)", behind="byte(s) of WAL"
    )
    got = _scrape(port)
    assert got[("deltaflow_source_input_files_per_second", (("pipeline", "f"), ("source", "files")))] == 2.0
    assert ("deltaflow_source_input_rows_per_second", (("pipeline", "f"), ("source", "files"))) not in got
    assert got[("deltaflow_source_lag_bytes", (("pipeline", "c"), ("source", "slot:lsn")))] == 60
    assert ("deltaflow_source_lag_records", (("pipeline", "c"), ("source", "slot:lsn"))) not in got
    sink = (("pipeline", "p"), ("table", "/t"))
    assert got[("deltaflow_sink_records_written_total", sink)] == 15
    assert got[("deltaflow_sink_bytes_written_total", sink)] == 400
    assert got[("deltaflow_sink_files_created_total", sink)] == 3
    assert got[("deltaflow_sink_commits_success_total", sink)] == 2
    assert got[("deltaflow_sink_commit_retries_total", sink)] == 1
    assert got[("deltaflow_sink_commit_latency_seconds_count", sink)] == 2
    assert got[("deltaflow_sink_batch_records_sum", sink)] == 15
    assert got[("deltaflow_sink_batch_records_min", sink)] == 5
    assert got[("deltaflow_sink_batch_records_max", sink)] == 10
    assert got[("deltaflow_ingest_records_failed_total", sink)] == 3
    assert got[("deltaflow_source_lag_records", (("pipeline", "p"), ("source", "t:0")))] == 4
    assert got[("deltaflow_source_lag_records", (("pipeline", "p"), ("source", "t:1")))] == 0
    assert got[("deltaflow_source_input_rows_per_second", (("pipeline", "p"), ("source", "kafka")))] == 12.5
    # Rivven's Delta sink names, beside ours and from the same counts.
    assert got[("rivven_delta_records_written_total", sink)] == 15
    assert got[("rivven_delta_records_failed_total", sink)] == 3
    assert got[("rivven_delta_bytes_written_total", sink)] == 400
    assert got[("rivven_delta_commits_total", sink)] == 2
    assert got[("rivven_delta_commit_retries_total", sink)] == 1
    assert got[("rivven_delta_files_created_total", sink)] == 3
    assert got[("rivven_delta_commit_latency_us_total", sink)] == 30_000
    assert got[("rivven_delta_batch_size_sum_total", sink)] == 15
    assert got[("rivven_delta_batch_size_min", sink)] == 5
    assert got[("rivven_delta_batch_size_max", sink)] == 10
    assert got[("rivven_delta_commit_latency_avg_ms", sink)] == 15
    assert got[("rivven_delta_batch_size_avg", sink)] == 7.5
    assert got[("rivven_delta_success_rate", sink)] == 1


def test_ingest_counts_what_it_commits_and_dead_letters(spark, kafka, tmp_path):
    port = metrics.serve(0, addr="127.0.0.1")
    topic = kafka.create_topic(partitions=2)
    values = [json.dumps({"id": i}).encode() if i % 5 else b"{broken" for i in range(60)]
    values[7] = json.dumps({"id": 7, "new_field": 1}).encode()
    kafka.produce(topic, values, partitions=2)
    config = IngestConfig(
        topic=topic,
        table_uri=str(tmp_path / "t"),
        brokers=kafka.bootstrap,
        pipeline_id="metrics-test",
        value_schema="id LONG",
        dlq_table_location=str(tmp_path / "dlq"),
        ends_at_latest_offsets=True,
        max_messages_per_batch=30,
    )
    query = ingest(spark, config)
    assert query.awaitTermination(300)
    metrics.progress_reported("metrics-test", query.lastProgress)
    got = _scrape(port)
    main = (("pipeline", "metrics-test"), ("table", str(tmp_path / "t")))
    dlq = (("pipeline", "metrics-test-dlq"), ("table", str(tmp_path / "dlq")))
    assert got[("deltaflow_sink_records_written_total", main)] == 48
    assert got[("deltaflow_sink_records_written_total", dlq)] == 12
    assert got[("deltaflow_ingest_records_failed_total", main)] == 12
    assert got[("deltaflow_ingest_records_with_unknown_fields_total", main)] == 1
    assert got[("deltaflow_sink_commits_success_total", main)] == 2
    assert got[("deltaflow_sink_batches_flushed_total", main)] == 2
    assert got[("deltaflow_sink_write_latency_seconds_count", main)] == 2
    assert got[("deltaflow_sink_batch_records_max", main)] == 24
    for p in range(2):
        assert (
            got[("deltaflow_source_lag_records", (("pipeline", "metrics-test"), ("source", f"{topic}:{p}")))]
            == 0
        )


def test_a_spark_connect_progress_report_reads_as_a_classic_one():
    """A Connect client's report: the derived figures as attributes only, each observed metric
    as a row of values and schema."""
    from pyspark.sql import Row

    from deltaflow.metrics import progress_messages, progress_report

    class ConnectReport(dict):
        numInputRows = 2  # noqa: N815 - pyspark's attribute names
        inputRowsPerSecond = 0.5  # noqa: N815
        processedRowsPerSecond = 4.0  # noqa: N815

    schema = {"type": "struct", "fields": [{"name": "messages", "type": "long", "nullable": False}]}
    connect = ConnectReport(batchId=3, observedMetrics={"deltaflow": Row(values=[1000], schema=schema)})
    classic = {"batchId": 3, "numInputRows": 2, "inputRowsPerSecond": 0.5, "processedRowsPerSecond": 4.0}
    classic["observedMetrics"] = {"deltaflow": Row(messages=1000)}
    for report in (connect, classic):
        read = progress_report(report)
        assert read["numInputRows"] == 2 and read["observedMetrics"] == {"deltaflow": {"messages": 1000}}
        assert progress_messages(read) == 1000

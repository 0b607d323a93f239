"""Prometheus metrics: one facade, intent-named methods, ``deltaflow_<subsystem>_<what>_<unit>``.

Everything that counts calls :data:`metrics` (``metrics.batch_committed(...)``); only this module
knows Prometheus. Labels are limited to ``pipeline``, ``table`` and ``source``.

What is counted where: commits and dead letters are recorded by the process that commits,
which is the driver for ``deltaflow ingest`` and ``write_stream(write_path="spark")`` (the
``foreachBatch`` writer). The ``deltaflow`` data source commits in a Spark Python worker, whose
counters no endpoint serves. Source lag and rates are copied from Spark's progress reports by
the daemon loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["Metrics", "metrics"]

logger = logging.getLogger(__name__)

_SINK = ("pipeline", "table")
_SOURCE = ("pipeline", "source")
#: Commit latency buckets (seconds): delta-rs commits take ms; object stores and conflicts longer.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BATCH_BUCKETS = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)


class Metrics:
    """The metrics of one process, in their own registry (served by :meth:`serve`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._records = Counter(
            "deltaflow_sink_records_written", "Rows committed to Delta tables.", _SINK, registry=r
        )
        self._bytes = Counter(
            "deltaflow_sink_bytes_written", "Bytes of the data files committed.", _SINK, registry=r
        )
        self._files = Counter("deltaflow_sink_files_created", "Data files committed.", _SINK, registry=r)
        self._commits = Counter(
            "deltaflow_sink_commits_success", "Delta commits that landed.", _SINK, registry=r
        )
        self._commit_failures = Counter(
            "deltaflow_sink_commits_failed",
            "Delta commits that failed after their retries.",
            _SINK,
            registry=r,
        )
        self._retries = Counter(
            "deltaflow_sink_commit_retries", "Commit attempts repeated after a failure.", _SINK, registry=r
        )
        self._replays = Counter(
            "deltaflow_sink_batches_skipped", "Replayed batches found committed already.", _SINK, registry=r
        )
        self._commit_latency = Histogram(
            "deltaflow_sink_commit_latency_seconds",
            "Time of the Delta commit of one batch (with retries).",
            _SINK,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._batch_records = Histogram(
            "deltaflow_sink_batch_records",
            "Rows per committed batch.",
            _SINK,
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self._batch_min = Gauge(
            "deltaflow_sink_batch_records_min", "Fewest rows in a committed batch so far.", _SINK, registry=r
        )
        self._batch_max = Gauge(
            "deltaflow_sink_batch_records_max", "Most rows in a committed batch so far.", _SINK, registry=r
        )
        self._flushed = Counter(
            "deltaflow_sink_batches_flushed",
            "Micro-batches whose files were written (foreachBatch writers).",
            _SINK,
            registry=r,
        )
        self._write_latency = Histogram(
            "deltaflow_sink_write_latency_seconds",
            "Time to write one batch's data files, before its commit (foreachBatch writers).",
            _SINK,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._extremes: dict[tuple[str, str], tuple[int, int]] = {}
        #: Rows committed per (pipeline, table) in this process, for run summaries
        #: (:meth:`rows_committed`); pipelines commit from their own query threads.
        self._committed: dict[tuple[str, str], int] = {}
        #: When this process last committed to each (pipeline, table) (epoch seconds).
        self._last_commit: dict[tuple[str, str], float] = {}
        self._committed_lock = threading.Lock()
        #: False once this process drives a Spark Connect server: the sinks commit in its Python
        #: workers, and the commit counters here stay at zero (progress lines leave them out).
        self.counts_commits = True
        self._failed = Counter(
            "deltaflow_ingest_records_failed",
            "Messages seen failing decoding or a transform (dead-lettered or skipped).",
            _SINK,
            registry=r,
        )
        self._unknown = Counter(
            "deltaflow_ingest_records_with_unknown_fields",
            "Messages carrying fields the table lacks (not stored).",
            _SINK,
            registry=r,
        )
        self._expectations = Counter(
            "deltaflow_expectation_violations",
            "Rows that violated a pipeline expectation, by its name and action (warn, drop, fail).",
            ("pipeline", "expectation", "action"),
            registry=r,
        )
        self._compactions = Counter(
            "deltaflow_compaction_runs",
            "Auto-compactions by outcome (success, failed).",
            (*_SINK, "outcome"),
            registry=r,
        )
        self._compacted_removed = Counter(
            "deltaflow_compaction_files_removed",
            "Small files replaced by auto-compaction.",
            _SINK,
            registry=r,
        )
        self._compacted_added = Counter(
            "deltaflow_compaction_files_added", "Files written by auto-compaction.", _SINK, registry=r
        )
        self._vacuums = Counter(
            "deltaflow_vacuum_runs",
            "Scheduled vacuums by outcome (success, failed).",
            (*_SINK, "outcome"),
            registry=r,
        )
        self._vacuumed = Counter(
            "deltaflow_vacuum_files_deleted", "Files deleted by scheduled vacuums.", _SINK, registry=r
        )
        self._table_files = Gauge(
            "deltaflow_table_files", "Data files in the table's current version.", _SINK, registry=r
        )
        self._lag = Gauge(
            "deltaflow_source_lag_records",
            "Messages between the last planned batch and the newest offset, per topic-partition.",
            _SOURCE,
            registry=r,
        )
        self._input_rate = Gauge(
            "deltaflow_source_input_rows_per_second",
            "Spark's input rate of the last batch.",
            _SOURCE,
            registry=r,
        )
        self._processed_rate = Gauge(
            "deltaflow_source_processed_rows_per_second",
            "Spark's processing rate of the last batch.",
            _SOURCE,
            registry=r,
        )
        # A files source's stream is its files (their rows are read inside the batch), and a CDC
        # source's lag is WAL: gauges named for what they count, not the rows ones above.
        self._input_files_rate = Gauge(
            "deltaflow_source_input_files_per_second",
            "Spark's input rate of the last batch of a files source (files taken per second).",
            _SOURCE,
            registry=r,
        )
        self._processed_files_rate = Gauge(
            "deltaflow_source_processed_files_per_second",
            "Spark's processing rate of the last batch of a files source (files per second).",
            _SOURCE,
            registry=r,
        )
        self._lag_bytes = Gauge(
            "deltaflow_source_lag_bytes",
            "Bytes of WAL between a CDC source's last planned batch and the server's newest position.",
            _SOURCE,
            registry=r,
        )
        self._data_loss = Counter(
            "deltaflow_source_data_loss",
            "Kafka partitions a batch restarted at the broker's earliest offset because the broker "
            "no longer held the next one (fail_on_data_loss false), per topic-partition.",
            _SOURCE,
            registry=r,
        )
        r.register(_RivvenNames(self))

    # -- sink ---------------------------------------------------------------------------------

    def batch_committed(
        self, *, pipeline: str, table: str, rows: int, files: int, bytes_: int, seconds: float, retries: int
    ) -> None:
        labels = (pipeline, table)
        self._records.labels(*labels).inc(rows)
        self._bytes.labels(*labels).inc(bytes_)
        self._files.labels(*labels).inc(files)
        self._commits.labels(*labels).inc()
        self._retries.labels(*labels).inc(retries)
        self._commit_latency.labels(*labels).observe(seconds)
        self._batch_records.labels(*labels).observe(rows)
        low, high = self._extremes.get(labels, (rows, rows))
        self._extremes[labels] = low, high = min(low, rows), max(high, rows)
        self._batch_min.labels(*labels).set(low)
        self._batch_max.labels(*labels).set(high)
        with self._committed_lock:
            self._committed[labels] = self._committed.get(labels, 0) + rows
            self._last_commit[labels] = time.time()

    def last_commits(self, pipeline: str) -> dict[str, float]:
        """When this process last committed to each table of ``pipeline`` (epoch seconds)."""
        with self._committed_lock:
            return {table: at for (p, table), at in self._last_commit.items() if p == pipeline}

    def rows_committed(self, pipeline: str) -> dict[str, int]:
        """Rows this process committed for ``pipeline`` so far, per table (its sinks' reports
        through :meth:`batch_committed`; a replayed batch found committed adds nothing)."""
        with self._committed_lock:
            return {table: rows for (p, table), rows in self._committed.items() if p == pipeline}

    def batch_written(self, *, pipeline: str, table: str, seconds: float) -> None:
        self._flushed.labels(pipeline, table).inc()
        self._write_latency.labels(pipeline, table).observe(seconds)

    def commit_failed(self, *, pipeline: str, table: str) -> None:
        self._commit_failures.labels(pipeline, table).inc()

    def batch_skipped(self, *, pipeline: str, table: str) -> None:
        self._replays.labels(pipeline, table).inc()

    # -- ingest -------------------------------------------------------------------------------

    def records_failed(self, *, pipeline: str, table: str, count: int) -> None:
        """Failed messages seen in a batch (a replayed batch counts them again). Those committed
        to the dead-letter table are its ``records_written`` (pipeline ``<app_id>-dlq``)."""
        self._failed.labels(pipeline, table).inc(count)

    def unknown_fields_seen(self, *, pipeline: str, table: str, count: int) -> None:
        self._unknown.labels(pipeline, table).inc(count)

    def expectation_violated(self, *, pipeline: str, expectation: str, action: str, count: int) -> None:
        self._expectations.labels(pipeline, expectation, action).inc(count)

    # -- maintenance --------------------------------------------------------------------------

    def compaction(
        self, *, pipeline: str, table: str, outcome: str, files_removed: int = 0, files_added: int = 0
    ) -> None:
        self._compactions.labels(pipeline, table, outcome).inc()
        self._compacted_removed.labels(pipeline, table).inc(files_removed)
        self._compacted_added.labels(pipeline, table).inc(files_added)

    def vacuum(self, *, pipeline: str, table: str, outcome: str, files_deleted: int = 0) -> None:
        self._vacuums.labels(pipeline, table, outcome).inc()
        self._vacuumed.labels(pipeline, table).inc(files_deleted)

    def table_files(self, *, pipeline: str, table: str, count: int) -> None:
        self._table_files.labels(pipeline, table).set(count)

    # -- source (copied from Spark's progress reports) ----------------------------------------

    def progress_reported(
        self, pipeline: str, progress: Mapping[str, Any], *, unit: str = "row(s)", behind: str = "message(s)"
    ) -> None:
        """Copy rates and per-partition lag out of one ``StreamingQueryProgress`` (never raises).

        ``unit``: what the source's input rows are (``file(s)``: the files gauges, else the rows
        ones); ``behind``: what its lag counts (``byte(s) of WAL``: the bytes gauge; "": none).
        """
        files = unit == "file(s)"
        try:
            for source in progress.get("sources") or []:
                name = str(source.get("description", "source"))
                input_rate, processed_rate = progress_rates(progress, source)
                (self._input_files_rate if files else self._input_rate).labels(pipeline, name).set(input_rate)
                rate = self._processed_files_rate if files else self._processed_rate
                rate.labels(pipeline, name).set(processed_rate)
                if not behind:
                    continue
                lag_gauge = self._lag_bytes if behind.startswith("byte") else self._lag
                for key, lag in source_lags(source).items():
                    lag_gauge.labels(pipeline, key).set(lag)
        except (TypeError, ValueError, AttributeError) as exc:  # a report we do not understand
            logger.debug("progress of %r not copied to metrics: %s", pipeline, exc)

    def restarts_reported(self, pipeline: str, progress: Mapping[str, Any]) -> None:
        """Count the partitions one progress report's batch restarted at the broker's earliest
        offset (call it once per report: a counter; never raises)."""
        try:
            for source in progress.get("sources") or []:
                for key in source_restarts(source):
                    self._data_loss.labels(pipeline, key).inc()
        except (TypeError, ValueError, AttributeError) as exc:
            logger.debug("progress of %r not counted for restarts: %s", pipeline, exc)

    # -- endpoint -----------------------------------------------------------------------------

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on ``addr:port`` (0 = a free port) in a daemon thread; the port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        bound = int(server.server_address[1])
        logger.info("Prometheus metrics on http://%s:%d/metrics", addr, bound)
        return bound


#: The observed metric under which a query reports its messages when its rows are not messages
#: (the Arrow ingest path's rows are one file description per task).
MESSAGES_OBSERVATION = "deltaflow"


class _RivvenNames:
    """Rivven's Delta sink metrics (``rivven_delta_<name>``), derived from ours when scraped:
    dashboards built on Rivven keep working, and nothing is counted twice.

    Names as Rivven's document shows them (``records_written_total``, ``commits_total``,
    ``commit_latency_avg_ms``), its metric table's names for the rest, and its computed gauges
    (average commit and write latency, success rate, average batch size).
    """

    def __init__(self, owner: Metrics) -> None:
        self._m = owner

    def describe(self) -> list[Any]:
        return []  # names are known only at collection time: no duplicate check against ours

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m = self._m
        counters = {
            "records_written": m._records,
            "records_failed": m._failed,
            "bytes_written": m._bytes,
            "commits": m._commits,
            "commits_failed": m._commit_failures,
            "commit_retries": m._retries,
            "files_created": m._files,
            "batches_flushed": m._flushed,
        }
        totals: dict[str, dict[tuple[str, str], float]] = {}
        for name, metric in counters.items():
            family = CounterMetricFamily(f"rivven_delta_{name}", f"Rivven's name of {name}.", labels=_SINK)
            for sample in _samples(metric, "_total"):
                labels = (sample.labels["pipeline"], sample.labels["table"])
                family.add_metric(list(labels), sample.value)
                totals.setdefault(name, {})[labels] = sample.value
            yield family
        sums = {
            "commit_latency_us": (m._commit_latency, 1e6),
            "write_latency_us": (m._write_latency, 1e6),
            "batch_size_sum": (m._batch_records, 1.0),
        }
        for name, (histogram, scale) in sums.items():
            family = CounterMetricFamily(f"rivven_delta_{name}", f"Rivven's name of {name}.", labels=_SINK)
            for sample in _samples(histogram, "_sum"):
                labels = (sample.labels["pipeline"], sample.labels["table"])
                family.add_metric(list(labels), sample.value * scale)
                totals.setdefault(name, {})[labels] = sample.value * scale
            yield family
        for name, gauge in (("batch_size_min", m._batch_min), ("batch_size_max", m._batch_max)):
            g = GaugeMetricFamily(f"rivven_delta_{name}", f"Rivven's name of {name}.", labels=_SINK)
            for sample in _samples(gauge, ""):
                g.add_metric([sample.labels["pipeline"], sample.labels["table"]], sample.value)
            yield g
        commits, failed = totals.get("commits", {}), totals.get("commits_failed", {})
        computed = {
            "commit_latency_avg_ms": _ratio(totals.get("commit_latency_us", {}), commits, 1e-3),
            "write_latency_avg_ms": _ratio(
                totals.get("write_latency_us", {}), totals.get("batches_flushed", {}), 1e-3
            ),
            "batch_size_avg": _ratio(totals.get("batch_size_sum", {}), commits, 1.0),
            "success_rate": _ratio(
                commits, {k: commits.get(k, 0) + failed.get(k, 0) for k in {*commits, *failed}}, 1.0
            ),
        }
        for name, values in computed.items():
            g = GaugeMetricFamily(f"rivven_delta_{name}", f"Rivven's computed {name}.", labels=_SINK)
            for labels, value in values.items():
                g.add_metric(list(labels), value)
            yield g


def _ratio(
    numerator: Mapping[tuple[str, str], float], denominator: Mapping[tuple[str, str], float], scale: float
) -> dict[tuple[str, str], float]:
    return {k: numerator.get(k, 0.0) / d * scale for k, d in denominator.items() if d}


def _samples(metric: Any, suffix: str) -> list[Any]:
    return [s for family in metric.collect() for s in family.samples if s.name == family.name + suffix]


#: A report's figures Spark computes from its sources: a Spark Connect client's report has them
#: as attributes only, not as keys.
_DERIVED = ("numInputRows", "inputRowsPerSecond", "processedRowsPerSecond")


def progress_report(progress: Mapping[str, Any]) -> dict[str, Any]:
    """A ``StreamingQueryProgress`` as a plain dict, the same from a classic session and from a
    Spark Connect client (whose report lacks the derived figures as keys, and gives each observed
    metric as a row of ``values`` and ``schema``)."""
    report = dict(progress)
    for key in _DERIVED:
        if report.get(key) is None and hasattr(progress, key):
            report[key] = getattr(progress, key)
    observed = report.get("observedMetrics") or {}
    report["observedMetrics"] = {name: _observed(row) for name, row in observed.items()}
    return report


def _observed(row: Any) -> dict[str, Any]:
    if isinstance(row, Mapping):
        return dict(row)
    fields = row.asDict() if hasattr(row, "asDict") else {}
    if set(fields) == {"values", "schema"} and isinstance(fields["schema"], Mapping):  # Connect's
        names = [f["name"] for f in fields["schema"].get("fields", [])]
        return dict(zip(names, fields["values"], strict=False))
    return fields


def _messages_scale(progress: Mapping[str, Any]) -> float:
    """Messages per input row of a progress report (1 unless the query observes its messages)."""
    observed = (progress.get("observedMetrics") or {}).get(MESSAGES_OBSERVATION) or {}
    rows = int(progress.get("numInputRows") or 0)
    if "messages" not in observed or not rows:
        return 1.0
    return int(observed["messages"] or 0) / rows


def progress_messages(progress: Mapping[str, Any]) -> int:
    """The messages a ``StreamingQueryProgress`` report's batch read."""
    return round(int(progress.get("numInputRows") or 0) * _messages_scale(progress))


def progress_rates(
    progress: Mapping[str, Any], source: Mapping[str, Any] | None = None
) -> tuple[float, float]:
    """Input and processed messages per second of a report (or of one of its sources)."""
    scale = _messages_scale(progress)
    where = progress if source is None else source
    return (
        float(where.get("inputRowsPerSecond") or 0.0) * scale,
        float(where.get("processedRowsPerSecond") or 0.0) * scale,
    )


def source_lags(source: Mapping[str, Any]) -> dict[str, int]:
    """``topic:partition`` -> latest offset - end offset of the batch, for Kafka-shaped offsets."""
    import json

    def parse(value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    end, latest = parse(source.get("endOffset")), parse(source.get("latestOffset"))
    if not isinstance(end, dict) or not isinstance(latest, dict):
        return {}
    out: dict[str, int] = {}
    for topic, parts in latest.items():
        if not isinstance(parts, dict):
            continue
        for p, newest in parts.items():
            done = end.get(topic, {}).get(p)
            if done is not None:
                out[f"{topic}:{p}"] = max(0, int(newest) - int(done))
    return out


def source_restarts(source: Mapping[str, Any]) -> list[str]:
    """``topic:partition`` of each partition the batch of a report restarted at the broker's
    earliest offset (the Kafka source's record beside its end offsets: ``$data_loss``,
    ``delta.progress.DATA_LOSS_KEY``, spelled out here below the layers that may import it)."""
    import json

    end = source.get("endOffset")
    end = json.loads(end) if isinstance(end, str) else end
    lost = end.get("$data_loss") if isinstance(end, dict) else None
    if not isinstance(lost, dict):
        return []
    return [f"{topic}:{p}" for topic, parts in lost.items() if isinstance(parts, dict) for p in parts]


#: The process's metrics.
metrics = Metrics()

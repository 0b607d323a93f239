"""Kafka -> Delta latency of ``deltaflow ingest``: produce -> visible at a steady rate.

A producer thread produces ``--rate`` JSON messages/s (default 10,000; a burst of rate/100 every
10 ms, ``linger.ms`` 5) for ``--seconds`` (default 60) into a 4-partition topic of a local tansu
broker, while ``deltaflow.pipeline.ingest`` runs with ``allowed_latency=--trigger`` (default 1 s: a
micro-batch at most every second, paced by the source) and ``max_messages_per_batch`` 500,000
(the CLI's default). Messages are
those of ``kafka_ingest.py`` (12 fields) with ``id`` the sequence number and one more field,
``produced_us``: the wall clock (µs since the epoch) right before ``Producer.produce()``.

A poller thread watches the table's Delta log every 100 ms: when version N's JSON file
appears it notes the time (visible), reads the files that version adds and their
``produced_us``. Latency of a row = visible - produced. Rows produced in the first
``--warmup`` seconds (default 10) are left out as warm-up (the first batches with data run
slower). Also printed: the latency up to the commit file's mtime (without the poll interval),
split at the start of the micro-batch that carried the row (trigger time from the query's
progress, matched through the commit's ``deltaflow.epoch``), files per commit, and the
query's per-batch durations.

tansu reports a partition's high watermark as the base offset of its last record batch + 1:
the newest record batch of each partition (here ~25 messages, produced within ~10 ms) is
invisible to the source until the next one arrives. At a steady rate that is part of the
measured latency (one produce interval); after the run each partition gets one
single-record marker message (valid JSON, ``id`` < 0, left out of the figures) so that the tail
becomes visible too.

    .venv/bin/python benchmarks/kafka_latency.py [--rate 10000] [--seconds 60] [--trigger 1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow.parquet as pq
from kafka_ingest import PARTITIONS, SCHEMA_DDL, last_offsets, messages, stop_quietly
from machine import describe

LATENCY_SCHEMA = f"{SCHEMA_DDL}, produced_us LONG"
BURST_EVERY_S = 0.01
POLL_EVERY_S = 0.1
APP_ID = "latency"


class SteadyProducer(threading.Thread):
    """``rate`` msgs/s for ``seconds`` in a burst every ``BURST_EVERY_S``, message n to
    ``targets[n % len(targets)]`` (topic, partition); then one single-record marker (``id`` < 0)
    per target (tansu's high watermark is the base offset of a partition's last record batch + 1).
    An error is kept in ``error`` for the main thread."""

    def __init__(self, bootstrap: str, targets: Sequence[tuple[str, int]], rate: int, seconds: float) -> None:
        super().__init__(name="steady-producer", daemon=True)
        self.bootstrap, self.targets, self.rate, self.seconds = bootstrap, list(targets), rate, seconds
        # Everything but the leading "id" of kafka_ingest's messages: {"id":N,<tail>,"produced_us":T}
        self.tails = [m[m.index(b",") + 1 : -1] for m in messages(10_000)]
        self.count = 0
        self.started = self.ended = 0.0  # wall clock
        self.max_behind_s = 0.0  # how late the worst burst was
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc

    def _run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "batch.num.messages": 10_000}
        )
        per_burst = max(1, round(self.rate * BURST_EVERY_S))
        tails, targets, n = self.tails, self.targets, 0
        count = len(targets)
        self.started = time.time()
        begin = tick = time.monotonic()
        while tick - begin < self.seconds:
            now = time.monotonic()
            if tick > now:
                time.sleep(tick - now)
            else:
                self.max_behind_s = max(self.max_behind_s, now - tick)
            for _ in range(per_burst):
                topic, partition = targets[n % count]
                body = b'{"id":%d,%s,"produced_us":%d}' % (n, tails[n % len(tails)], time.time_ns() // 1000)
                while True:
                    try:
                        producer.produce(topic, body, partition=partition)
                        break
                    except BufferError:
                        producer.poll(0.01)
                n += 1
            producer.poll(0)
            tick += BURST_EVERY_S
        self.ended = time.time()
        self.count = n
        assert producer.flush(60) == 0
        single = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
        for i, (topic, partition) in enumerate(targets):
            single.produce(topic, b'{"id":%d}' % (-1 - i), partition=partition)
            if i % 100 == 0:
                single.poll(0)
        assert single.flush(60) == 0


class LogPoller(threading.Thread):
    """Notes when each Delta version appears and the ``produced_us``/``id`` of the rows it adds."""

    def __init__(self, table: Path) -> None:
        super().__init__(name="delta-poller", daemon=True)
        self.table = table
        self.stop_event = threading.Event()
        # (version, visible wall clock, commit file mtime, batch id, ids, produced_us)
        self.versions: list[tuple[int, float, float, int | None, np.ndarray, np.ndarray]] = []
        self.files: list[int] = []  # files added per version with data
        self.compacted_files = 0  # files written by compactions

    def run(self) -> None:
        version = 0
        while not self.stop_event.is_set():
            path = self.table / "_delta_log" / f"{version:020d}.json"
            try:
                text = path.read_text()
            except FileNotFoundError:
                time.sleep(POLL_EVERY_S)
                continue
            visible = time.time()
            committed = path.stat().st_mtime
            adds, batch = [], None
            for line in text.splitlines():
                action = json.loads(line)
                if "add" in action and action["add"].get("dataChange", True):
                    adds.append(unquote(action["add"]["path"]))
                elif "add" in action:
                    self.compacted_files += 1  # rewritten by auto-compaction: not new rows
                elif "commitInfo" in action:
                    batch = action["commitInfo"].get("deltaflow.epoch", batch)
            ids, produced = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
            for rel in adds:
                data = pq.read_table(self.table / rel, columns=["id", "produced_us"])
                ids.append(data["id"].to_numpy(zero_copy_only=False))
                produced.append(data["produced_us"].fill_null(-1).to_numpy())
            if adds:
                self.files.append(len(adds))
            self.versions.append(
                (version, visible, committed, batch, np.concatenate(ids), np.concatenate(produced))
            )
            version += 1


def caught_up(table: Path, topic: str, last: dict[int, int]) -> bool:
    from deltalake import DeltaTable

    try:
        t = DeltaTable(str(table))
    except Exception:  # noqa: BLE001 - not created yet
        return False
    versions = [t.transaction_version(f"{APP_ID}-{topic}-{p}") for p in range(PARTITIONS)]
    return all(v is not None and v >= last[p] for p, v in enumerate(versions))


def pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=10_000, help="messages per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to produce")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of produce left out")
    parser.add_argument("--trigger", type=float, default=1.0, help="allowed_latency (trigger), seconds")
    parser.add_argument("--max-messages-per-batch", type=int, default=500_000)
    parser.add_argument(
        "--jvm", choices=["quick", "lean", "full"], default="quick", help="spark_session(jvm=...)"
    )
    args = parser.parse_args()

    import deltaflow
    from deltaflow.config.ingest import IngestConfig
    from deltaflow.pipeline.ingest import ingest
    from deltaflow.testing import start_broker

    work = Path(tempfile.mkdtemp(prefix="deltaflow-klat-"))
    table = work / "table"
    broker = start_broker()
    spark = None
    try:
        topic = broker.create_topic(partitions=PARTITIONS)
        spark = deltaflow.spark_session(jvm=args.jvm)  # as a long-running `deltaflow ingest` on Arrow
        config = IngestConfig(
            topic=topic, table_uri=str(table), brokers=broker.bootstrap, pipeline_id=APP_ID,
            allowed_latency=args.trigger, max_messages_per_batch=args.max_messages_per_batch,
            value_schema=LATENCY_SCHEMA,
        )  # fmt: skip
        query = ingest(spark, config)
        while query.lastProgress is None:  # the query's first (empty) trigger has run
            if query.exception() is not None:
                raise RuntimeError(query.exception())
            time.sleep(0.2)
        poller = LogPoller(table)
        poller.start()
        targets = [(topic, p) for p in range(PARTITIONS)]
        producer = SteadyProducer(broker.bootstrap, targets, args.rate, args.seconds)
        print(
            f"producing {args.rate:,} msgs/s for {args.seconds:.0f} s; ingest trigger {args.trigger} s; "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        producer.start()
        progress: dict[int, dict] = {}
        while producer.is_alive():
            producer.join(1.0)
            progress.update((p["batchId"], p) for p in query.recentProgress)
            if query.exception() is not None:
                raise RuntimeError(query.exception())
        if producer.error is not None:
            raise producer.error
        last = last_offsets(broker.bootstrap, topic)
        deadline = time.monotonic() + 120
        while not caught_up(table, topic, last):
            assert time.monotonic() < deadline, "the table did not catch up within 120 s"
            progress.update((p["batchId"], p) for p in query.recentProgress)
            time.sleep(0.2)
        time.sleep(2 * POLL_EVERY_S)  # let the poller read the last version
        poller.stop_event.set()
        poller.join(30)
        progress.update((p["batchId"], p) for p in query.recentProgress)
        stop_quietly(query)
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()

    def started_at(p: dict) -> float:
        return dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()

    # The trigger (micro-batch) start of each version's batch splits the latency in two.
    trigger_start = {b: started_at(p) for b, p in progress.items()}
    assert all(v[3] in trigger_start for v in poller.versions if len(v[4])), "a version without its batch"
    per_row = {
        "visible": [np.full(len(v[4]), v[1]) for v in poller.versions],
        "committed": [np.full(len(v[4]), v[2]) for v in poller.versions],
        "triggered": [np.full(len(v[4]), trigger_start.get(v[3], np.nan)) for v in poller.versions],
    }
    ids = np.concatenate([v[4] for v in poller.versions])
    produced = np.concatenate([v[5] for v in poller.versions]) / 1e6
    visible, committed, triggered = (
        np.concatenate(per_row[k]) for k in ("visible", "committed", "triggered")
    )
    real = ids >= 0
    n = int(real.sum())
    assert n == producer.count and len(np.unique(ids[real])) == n, (n, producer.count)
    assert (~real).sum() == PARTITIONS
    keep = real & (produced >= producer.started + args.warmup)
    to_visible = visible[keep] - produced[keep]
    parts = {
        "produce -> visible": to_visible,
        "produce -> commit file": committed[keep] - produced[keep],
        "produce -> its batch starts": triggered[keep] - produced[keep],
        "batch start -> commit file": committed[keep] - triggered[keep],
    }
    duration = producer.ended - producer.started

    from deltaflow.metrics import progress_messages

    # Messages, not Spark's input rows (on the Arrow engine a row is one task's description).
    batches = [p for _, p in sorted(progress.items()) if progress_messages(p)]
    steady = [p for p in batches if started_at(p) >= producer.started + args.warmup]
    intervals = np.diff([started_at(p) for p in steady])

    def durations(key: str) -> str:
        values = np.array([p["durationMs"].get(key, 0) for p in steady])
        return f"{key} p50 {pct(values, 50):,.0f} / p95 {pct(values, 95):,.0f} / max {values.max():,.0f} ms"

    print()
    print(f"{describe()}; load average at the end {os.getloadavg()[0]:.2f}")
    print(
        f"produced {producer.count:,} messages in {duration:.1f} s: {producer.count / duration:,.0f} msgs/s "
        f"(target {args.rate:,}; worst burst {producer.max_behind_s * 1000:.0f} ms late); "
        f"landed exactly once: checked"
    )
    print(
        f"latency over {len(to_visible):,} rows produced after the first {args.warmup:.0f} s "
        f"(trigger {args.trigger} s, poll {POLL_EVERY_S * 1000:.0f} ms):"
    )
    for label, values in parts.items():
        print(
            f"  {label:27s}: p50 {pct(values, 50):.2f} s, p95 {pct(values, 95):.2f} s, "
            f"p99 {pct(values, 99):.2f} s, max {values.max():.2f} s"
        )
    print(f"  target p99 <= 1.5 s: {'met' if pct(to_visible, 99) <= 1.5 else 'NOT met'}")
    rows = np.array([progress_messages(p) for p in steady])
    print(
        f"{len(steady)} micro-batches with data after the warm-up ({len(batches)} in all); "
        f"messages per batch p50 {pct(rows, 50):,.0f}, max {rows.max():,}; "
        f"one starts every p50 {pct(intervals, 50):.2f} s / "
        f"p95 {pct(intervals, 95):.2f} s; over the trigger interval: "
        f"{sum(p['durationMs']['triggerExecution'] > args.trigger * 1000 for p in steady)}"
    )
    files = np.array(poller.files)
    print(f"files per commit: p50 {pct(files, 50):.0f}, max {files.max()}, {files.sum():,} in all")
    from deltalake import DeltaTable

    final = DeltaTable(str(table))
    compactions = [h for h in final.history() if h.get("operation") == "OPTIMIZE"]
    print(
        f"auto-compaction: {len(compactions)} compaction(s) wrote {poller.compacted_files} file(s); "
        f"{len(final.file_uris())} file(s) in the table at the end (of {files.sum():,} committed)"
    )
    keys = ("triggerExecution", "addBatch", "latestOffset", "queryPlanning", "walCommit", "commitOffsets")
    for key in keys:
        print(f"  {durations(key)}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

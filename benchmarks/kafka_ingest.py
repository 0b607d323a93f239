"""Kafka -> Delta throughput: ``deltaflow ingest`` vs a plain Python reference pipeline.

Both read the same topic (MESSAGES JSON messages of ~300 bytes and 12 fields, 4 partitions) on a
local tansu broker and land it in a fresh Delta table:

* deltaflow: ``deltaflow.ingest`` (Spark ``local[*]``, the deltaflow-kafka source, JSON decoded
  with the given schema, progress in the Delta log), micro-batches every ``--trigger`` seconds;
  timed from the query's start until the table's txns cover every offset.
* reference, no Spark: confluent-kafka consume -> pyarrow JSON decoding -> ``write_deltalake``
  (Parquet + one delta-rs commit) per ~1M rows.

    .venv/bin/python benchmarks/kafka_ingest.py [--messages 1000000] [--trigger 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import platform
import random
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson

SCHEMA_DDL = (
    "id LONG, user_id LONG, session_id STRING, event_type STRING, page STRING, referrer STRING, "
    "country STRING, device STRING, browser STRING, amount DOUBLE, ts TIMESTAMP, is_bot BOOLEAN"
)
_TYPES = {
    "id": pa.int64(), "user_id": pa.int64(), "session_id": pa.string(), "event_type": pa.string(),
    "page": pa.string(), "referrer": pa.string(), "country": pa.string(), "device": pa.string(),
    "browser": pa.string(), "amount": pa.float64(), "ts": pa.timestamp("us", "UTC"), "is_bot": pa.bool_(),
}  # fmt: skip
ARROW_SCHEMA = pa.schema(list(_TYPES.items()))
PARTITIONS = 4
REFERENCE_ROWS_PER_COMMIT = 1_000_000


def messages(count: int) -> list[bytes]:
    rng = random.Random(1)
    start = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    out = []
    for i in range(count):
        out.append(
            json.dumps(
                {
                    "id": i,
                    "user_id": rng.randrange(1_000_000),
                    "session_id": f"{rng.getrandbits(64):016x}",
                    "event_type": rng.choice(["page_view", "click", "add_to_cart", "purchase"]),
                    "page": f"/product/{rng.randrange(100_000)}?ref=campaign-{rng.randrange(50)}",
                    "referrer": rng.choice(
                        ["https://www.example.com/search?q=shoes", "", "https://news.example.org/"]
                    ),
                    "country": rng.choice(["DE", "FR", "US", "BR", "IN", "JP"]),
                    "device": rng.choice(["desktop", "mobile", "tablet"]),
                    "browser": rng.choice(["firefox", "chrome", "safari", "edge"]),
                    "amount": round(rng.uniform(1, 500), 2),
                    "ts": (start + dt.timedelta(milliseconds=i)).isoformat().replace("+00:00", "Z"),
                    "is_bot": rng.random() < 0.01,
                },
                separators=(",", ":"),
            ).encode()
        )
    return out


def run_reference(bootstrap: str, topic: str, total: int, table: str) -> float:
    from confluent_kafka import Consumer, TopicPartition
    from deltalake import write_deltalake

    started = time.perf_counter()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "reference",
            "enable.auto.commit": False,
            "queued.min.messages": 200_000,
            "fetch.wait.max.ms": 50,
            "fetch.queue.backoff.ms": 0,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen, buffer = 0, []
    total += PARTITIONS  # the end markers
    while seen < total:
        batch = consumer.consume(num_messages=min(10_000, total - seen), timeout=1.0)
        buffer.extend(v for m in batch if m.error() is None and (v := m.value()) != b"__end__")
        seen += len(batch)
        if len(buffer) >= REFERENCE_ROWS_PER_COMMIT or (seen >= total and buffer):
            data = pajson.read_json(
                io.BytesIO(b"\n".join(buffer)),
                parse_options=pajson.ParseOptions(explicit_schema=ARROW_SCHEMA),
            )
            write_deltalake(table, data, mode="append")
            buffer = []
    consumer.close()
    return time.perf_counter() - started


def run_deltaflow(spark, bootstrap: str, topic: str, total: int, table: str, trigger: float) -> float:
    from deltalake import DeltaTable

    from deltaflow.ingest import IngestConfig, ingest

    config = IngestConfig(
        topic=topic, table_uri=table, brokers=bootstrap, app_id="bench", allowed_latency=trigger,
        max_messages_per_batch=0, schema=SCHEMA_DDL,
    )  # fmt: skip
    started = time.perf_counter()
    query = ingest(spark, config)
    per_partition = total // PARTITIONS + 1  # + the end marker
    while True:
        time.sleep(0.2)
        if query.exception() is not None:
            raise RuntimeError(query.exception())
        try:
            t = DeltaTable(table)
        except Exception:  # noqa: BLE001 - not created yet
            continue
        versions = [t.transaction_version(f"bench-{topic}-{p}") for p in range(PARTITIONS)]
        if all(v is not None and v >= per_partition - 1 for v in versions):
            break
    elapsed = time.perf_counter() - started
    for p in query.recentProgress:
        if p["numInputRows"]:
            print(
                f"  batch {p['batchId']}: {p['numInputRows']:,} rows, durations ms {p['durationMs']}",
                flush=True,
            )
    query.stop()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--trigger", type=float, default=5.0, help="deltaflow micro-batch interval, seconds")
    args = parser.parse_args()
    total = args.messages - args.messages % PARTITIONS

    import deltaflow
    from deltaflow.testing import start_broker

    work = Path(tempfile.mkdtemp(prefix="deltaflow-kbench-"))
    broker = start_broker()
    try:
        topic = broker.create_topic(partitions=PARTITIONS)
        payload = messages(total)
        print(f"producing {total:,} messages of ~{sum(map(len, payload)) // total} bytes ...", flush=True)
        t0 = time.perf_counter()
        broker.produce(topic, payload, partitions=PARTITIONS, keys=False, batched=True)  # + 1 end marker each
        print(f"  produced in {time.perf_counter() - t0:.1f} s", flush=True)
        del payload

        ref_s = run_reference(broker.bootstrap, topic, total, str(work / "reference"))
        print(f"reference (no Spark): {ref_s:7.2f} s  {total / ref_s:10,.0f} msgs/s", flush=True)
        spark = deltaflow.spark_session()
        df_s = run_deltaflow(spark, broker.bootstrap, topic, total, str(work / "deltaflow"), args.trigger)
        print(f"deltaflow ingest    : {df_s:7.2f} s  {total / df_s:10,.0f} msgs/s", flush=True)
        from deltalake import DeltaTable

        landed = DeltaTable(str(work / "deltaflow")).to_pyarrow_table(columns=["id"])["id"]
        assert len(landed) - landed.null_count == total  # the end markers decode to NULL rows
        print()
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"Spark {spark.version}; {dt.date.today()}; trigger {args.trigger} s")  # fmt: skip
        print(f"ratio deltaflow/reference: {ref_s / df_s:.2f}  (target >= 0.7)")
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Kafka -> Delta throughput: ``deltaflow ingest`` vs a plain Python reference pipeline.

Produces MESSAGES JSON messages (~280 bytes, 12 fields) into one 4-partition topic of a local
tansu broker, then lands that topic, in one process and on the same machine, with:

* reference, no Spark: confluent-kafka consume -> pyarrow JSON decoding (explicit schema) ->
  ``write_deltalake`` (Parquet + one delta-rs commit) per ~1M rows. Timed from creating the
  consumer until the last commit returns.
* deltaflow: ``deltaflow.pipeline.ingest`` (Spark ``local[*]``, the deltaflow-kafka source decoding JSON
  to Arrow in its tasks with the given schema, foreachBatch writer, progress in the Delta log),
  ``allowed_latency=--trigger`` s (the source starts a batch every --trigger s, or at once
  while a backlog drains), ``--max-messages-per-batch`` (the CLI's default 500,000). Timed
  from calling ``ingest()`` (query start) until the table's per-partition txns cover every
  offset of the topic (polled every 0.2 s). The Spark session is created before
  the clock starts (its start-up time is printed separately), with ``jvm="quick"`` as
  a long-running ``deltaflow ingest`` creates it for the Arrow engine (``--jvm full`` for the
  JVM's defaults).

Each round also prints the CPU-seconds per 1M messages of both (``cpu.py``: user + system of
this process and its children; the reference's without the idle JVM, deltaflow's with the JVM
and Spark's Python workers, split by kind; the broker's and the S3 server's never).

Rounds alternate reference, deltaflow on fresh tables over the same topic, in one Spark
session: round 1's query is the first in a fresh JVM (cold Python workers), later rounds are
warm. Every round checks that both tables hold each message exactly once. tansu shows the
tail of a multi-record batch only once more data follows, so each partition's last message is
produced in a record batch of its own (``Broker.produce(batched=True)``). Each deltaflow round
prints its
micro-batches' ``durationMs``; ``--spark-jobs`` also enables the Spark UI and prints the Spark
jobs of each round (duration, tasks, executor run time) from its REST API.

Variants: ``--s3`` puts every table in S3 (a moto server on 127.0.0.1, storage options from the
environment as a deployment would set them); ``--bad-every 100`` makes 1% of the messages
broken JSON: deltaflow writes them to a dead-letter table (checked: exactly the bad ones), the
reference drops them (re-parsing a block without the messages ``json`` cannot read).

    .venv/bin/python benchmarks/kafka_ingest.py [--messages 1000000] [--trigger 5] \
        [--max-messages-per-batch 500000] [--rounds 2] [--spark-jobs] [--jvm quick|lean|full] \
        [--s3] [--bad-every N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import random
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson
from cpu import TreeCpu
from machine import describe

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


#: Storage options of the tables (``--s3``: the moto server's; empty: local files).
STORAGE: dict[str, str] = {}


def is_bad(i: int, bad_every: int) -> bool:
    return bool(bad_every) and i % bad_every == bad_every - 1


def messages(count: int, bad_every: int = 0) -> list[bytes]:
    """``count`` JSON messages; with ``bad_every`` N, every Nth is cut short (not JSON)."""
    rng = random.Random(1)
    start = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    out = []
    for i in range(count):
        if is_bad(i, bad_every):
            out.append(b'{"id": %d, "user_id": ' % i)
            continue
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


def last_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Last offset per partition (high watermark - 1)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] - 1
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


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
    while seen < total:
        batch = consumer.consume(num_messages=min(10_000, total - seen), timeout=1.0)
        buffer.extend(v for m in batch if m.error() is None and (v := m.value()) is not None)
        seen += len(batch)
        if len(buffer) >= REFERENCE_ROWS_PER_COMMIT or (seen >= total and buffer):
            try:
                data = _parse(buffer)
            except pa.ArrowInvalid:  # a bad message: drop the ones json cannot read, parse again
                data = _parse([v for v in buffer if _is_json(v)])
            write_deltalake(table, data, mode="append", storage_options=STORAGE or None)
            buffer = []
    consumer.close()
    return time.perf_counter() - started


def _parse(values: list[bytes]) -> pa.Table:
    return pajson.read_json(
        io.BytesIO(b"\n".join(values)), parse_options=pajson.ParseOptions(explicit_schema=ARROW_SCHEMA)
    )


def _is_json(value: bytes) -> bool:
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def run_deltaflow(
    spark,
    bootstrap: str,
    topic: str,
    last: dict[int, int],
    table: str,
    trigger: float,
    max_per_batch: int,
    dlq: str | None = None,
    checkpoint: str | None = None,
) -> tuple[float, list[dict]]:
    """Seconds from ``ingest()`` until the txns cover ``last``; the query's batch progress."""
    from deltalake import DeltaTable

    from deltaflow.config.ingest import IngestConfig
    from deltaflow.pipeline.ingest import ingest

    config = IngestConfig(
        topic=topic, table_uri=table, brokers=bootstrap, pipeline_id="bench", allowed_latency=trigger,
        max_messages_per_batch=max_per_batch, value_schema=SCHEMA_DDL, dlq_table_location=dlq,
        checkpoint_location=checkpoint,
    )  # fmt: skip
    wall_start = time.time()
    started = time.perf_counter()
    query = ingest(spark, config)
    while True:
        time.sleep(0.2)
        if query.exception() is not None:
            raise RuntimeError(query.exception())
        try:
            t = DeltaTable(table, storage_options=STORAGE or None)
        except Exception:  # noqa: BLE001 - not created yet
            continue
        versions = [t.transaction_version(f"bench-{topic}-{p}") for p in range(PARTITIONS)]
        if all(v is not None and v >= last[p] for p, v in enumerate(versions)):
            break
    elapsed = time.perf_counter() - started
    stop_quietly(query)
    from deltaflow.metrics import progress_messages

    progress = [p for p in query.recentProgress if progress_messages(p)]
    for p in progress:
        began = dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() - wall_start
        d = p["durationMs"]
        print(
            f"    batch {p['batchId']}: {progress_messages(p):,} messages in {p['numInputRows']} task rows, "
            f"trigger at +{began:.1f} s, "
            f"triggerExecution {d['triggerExecution']} ms (addBatch {d.get('addBatch', 0)}, "
            f"latestOffset {d.get('latestOffset', 0)}, queryPlanning {d.get('queryPlanning', 0)}, "
            f"walCommit {d.get('walCommit', 0)}, commitOffsets {d.get('commitOffsets', 0)})",
            flush=True,
        )
    return elapsed, progress


def stop_quietly(query) -> None:
    """Stop ``query`` once its running trigger is over (stopping interrupts Spark's log writes)."""
    deadline = time.monotonic() + 30
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


def check_exactly_once(table: str, total: int, bad_every: int = 0) -> None:
    """``table`` holds each good message's id once (the bad ones: none)."""
    from deltalake import DeltaTable

    total -= sum(1 for i in range(total) if is_bad(i, bad_every))
    ids = DeltaTable(table, storage_options=STORAGE or None).to_pyarrow_table(columns=["id"])["id"]
    distinct = len(ids.unique())
    assert len(ids) == total and distinct == total and ids.null_count == 0, (
        f"{table}: {len(ids)} rows, {distinct} distinct ids, expected {total}"
    )


def spark_jobs(ui_port: int, after: int) -> int:
    """Print the Spark jobs with id > ``after`` (from the UI's REST API); return the last id."""
    import urllib.request

    def get(path: str) -> list[dict]:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/api/v1/applications{path}") as r:
            return json.load(r)

    app = get("")[0]["id"]
    jobs = sorted((j for j in get(f"/{app}/jobs") if j["jobId"] > after), key=lambda j: j["jobId"])
    for job in jobs:
        start, end = (
            dt.datetime.strptime(job[k].replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
            for k in ("submissionTime", "completionTime")
        )
        run_ms = sum(s["executorRunTime"] for sid in job["stageIds"] for s in get(f"/{app}/stages/{sid}"))
        print(
            f"    job {job['jobId']} {job['name'][:60]!r}: {(end - start).total_seconds():.2f} s, "
            f"{job['numTasks']} task(s), executor run time {run_ms / 1000:.2f} s",
            flush=True,
        )
    return max((j["jobId"] for j in jobs), default=after)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--trigger", type=float, default=5.0, help="deltaflow micro-batch interval, seconds")
    parser.add_argument(
        "--max-messages-per-batch",
        type=int,
        default=500_000,
        help="deltaflow admission control (default: the CLI's default; 0 = no limit)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="reference + deltaflow rounds")
    parser.add_argument(
        "--bad-every", type=int, default=0,
        help="every Nth message is not JSON (100: 1%%); deltaflow writes them to a dead-letter table, "
        "the reference drops them",
    )  # fmt: skip
    parser.add_argument("--s3", action="store_true", help="all tables in S3 (a local moto server)")
    parser.add_argument(
        "--jvm", choices=["quick", "lean", "full"], default="quick",
        help="spark_session(jvm=...): quick is what a long-running Arrow-engine `deltaflow ingest` takes",
    )  # fmt: skip
    parser.add_argument(
        "--spark-jobs", action="store_true", help="enable the Spark UI and print each round's Spark jobs"
    )
    args = parser.parse_args()
    total = args.messages - args.messages % PARTITIONS

    import deltaflow
    from deltaflow.testing import start_broker

    work = Path(tempfile.mkdtemp(prefix="deltaflow-kbench-"))
    broker = start_broker()
    s3 = None
    if args.s3:
        from deltaflow.testing import start_s3

        s3 = start_s3("bench")
        STORAGE.update(s3.storage_options)
        os.environ.update(s3.storage_options)  # before Spark starts: its Python workers inherit it
    try:
        topic = broker.create_topic(partitions=PARTITIONS)
        payload = messages(total, args.bad_every)
        print(f"producing {total:,} messages of ~{sum(map(len, payload)) // total} bytes ...", flush=True)
        t0 = time.perf_counter()
        broker.produce(topic, payload, partitions=PARTITIONS, keys=False, batched=True)
        print(f"  produced in {time.perf_counter() - t0:.1f} s", flush=True)
        del payload
        last = last_offsets(broker.bootstrap, topic)
        assert sum(last.values()) == total - PARTITIONS, last  # offsets 0..n-1 of each partition

        conf = {}
        if args.spark_jobs:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                ui_port = sock.getsockname()[1]
            conf = {"spark.ui.enabled": "true", "spark.ui.port": str(ui_port)}
        t0 = time.perf_counter()
        spark = deltaflow.spark_session(jvm=args.jvm, **conf)
        print(f"Spark session (jvm={args.jvm}) started in {time.perf_counter() - t0:.1f} s", flush=True)
        jvm = spark.sparkContext._gateway.proc.pid
        job = -1
        results = []
        for r in range(1, args.rounds + 1):
            base = f"s3://{s3.bucket}/{work.name}" if s3 else str(work)
            ref_table, df_table = f"{base}/reference-{r}", f"{base}/deltaflow-{r}"
            dlq_table = f"{base}/dead-letters-{r}" if args.bad_every else None
            print(f"round {r}: load average {os.getloadavg()[0]:.2f}", flush=True)
            services = (broker.process.pid, *((s3.process.pid,) if s3 else ()))  # neither side's
            cpu = TreeCpu(exclude=(*services, jvm)).start()  # the idle JVM is not the reference's
            ref_s = run_reference(broker.bootstrap, topic, total, ref_table)
            ref_cpu = cpu.stop() * 1e6 / total
            print(f"round {r} reference (no Spark): {ref_s:7.2f} s  {total / ref_s:10,.0f} msgs/s  "
                  f"{ref_cpu:5.1f} CPU-s per 1M")  # fmt: skip
            cpu = TreeCpu(exclude=services).start()
            df_s, _ = run_deltaflow(
                spark, broker.bootstrap, topic, last, df_table, args.trigger, args.max_messages_per_batch,
                dlq_table, str(work / f"checkpoint-{r}"),
            )  # fmt: skip
            df_cpu = cpu.stop() * 1e6 / total
            split = ", ".join(f"{k} {v * 1e6 / total:.1f}" for k, v in sorted(cpu.by_kind().items()))
            print(f"round {r} deltaflow ingest    : {df_s:7.2f} s  {total / df_s:10,.0f} msgs/s  "
                  f"{df_cpu:5.1f} CPU-s per 1M ({split})", flush=True)  # fmt: skip
            if args.spark_jobs:
                job = spark_jobs(ui_port, job)
            check_exactly_once(ref_table, total, args.bad_every)
            check_exactly_once(df_table, total, args.bad_every)
            if dlq_table:
                from deltalake import DeltaTable

                dead = DeltaTable(dlq_table, storage_options=STORAGE or None)
                letters = dead.to_pyarrow_table(columns=["offset"])
                assert letters.num_rows == total // args.bad_every, letters.num_rows
            results.append((ref_s, df_s, ref_cpu, df_cpu))
            shutil.rmtree(ref_table, ignore_errors=True)
            shutil.rmtree(df_table, ignore_errors=True)
        print()
        print(describe(f"Spark {spark.version}"))
        print(
            f"tables {'in S3 (moto)' if s3 else 'on local disk'}; "
            f"{f'every {args.bad_every}th message bad (dead letters); ' if args.bad_every else ''}"
            f"{total:,} messages, {PARTITIONS} partitions; deltaflow trigger {args.trigger} s, "
            f"max_messages_per_batch {args.max_messages_per_batch:,}; exactly once: checked"
        )
        for r, (ref_s, df_s, ref_cpu, df_cpu) in enumerate(results, 1):
            print(
                f"round {r}{' (cold)' if r == 1 else ' (warm)'}: reference {total / ref_s:,.0f} msgs/s, "
                f"deltaflow {total / df_s:,.0f} msgs/s, ratio {ref_s / df_s:.2f} "
                f"(target >= {0.6 if r == 1 else 1.0}); CPU-s per 1M: reference {ref_cpu:.1f}, "
                f"deltaflow {df_cpu:.1f}, ratio {df_cpu / ref_cpu:.2f} (target <= 1.2)"
            )
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
        if s3 is not None:
            s3.stop()


if __name__ == "__main__":
    main()

"""The README's main job, on embedded defaults: clickstream events into a Delta table.

``run_kafka_demo`` (the default of ``deltaflow demo``) starts an embedded Kafka-protocol broker
(tansu), produces JSON clickstream events (a few of them malformed), and runs
``deltaflow ingest`` into a partitioned local table with a dead-letter table.
``run_demo`` does the same from JSON-lines files in a landing folder (Spark's file source).
Both read the tables back with delta-rs and check that every event landed exactly once.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DemoResult", "generate_events", "run_demo", "run_kafka_demo"]

logger = logging.getLogger(__name__)

_EVENT_TYPES = ("page_view", "click", "add_to_cart", "purchase", "search")
_COUNTRIES = ("DE", "FR", "US", "BR", "IN", "JP", "NG", "GB")
_PAGES = ("/", "/search", "/product/{}", "/cart", "/checkout", "/help")


def _where(master: str | None) -> str:
    """Where the demo's Spark work runs, as its progress lines say it."""
    import os

    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        return f"on the Spark Connect server {remote.split(';', 1)[0]}"
    return f"embedded, {master or 'local[*]'}"


def event_json(i: int, events: int, rng: random.Random) -> str:
    """Clickstream event ``i`` of ``events`` (spread over two days) as compact JSON."""
    start = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    ts = start + dt.timedelta(seconds=i * 172_800 / events, microseconds=rng.randrange(1000))
    kind = rng.choice(_EVENT_TYPES)
    return json.dumps(
        {
            "event_id": i,
            "user_id": rng.randrange(50_000),
            "session_id": f"s{rng.randrange(1 << 30):08x}",
            "event_type": kind,
            "page": rng.choice(_PAGES).format(rng.randrange(1000)),
            "country": rng.choice(_COUNTRIES),
            "amount": round(rng.uniform(1, 500), 2) if kind == "purchase" else None,
            "ts": ts.isoformat().replace("+00:00", "Z"),
        },
        separators=(",", ":"),
    )


def generate_events(landing: Path, *, events: int, files: int, seed: int = 7) -> None:
    """Write ``events`` JSON events into ``files`` JSON-lines files under ``landing``.

    Every event has a unique ``event_id`` (0 .. events-1), so the table can be checked for
    exactly-once delivery.
    """
    landing.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    per_file = -(-events // files)
    for f in range(files):
        lo, hi = f * per_file, min(events, (f + 1) * per_file)
        if lo >= hi:
            break
        lines = [event_json(i, events, rng) for i in range(lo, hi)]
        tmp = landing / f".events-{f:04d}.json.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(landing / f"events-{f:04d}.json")  # the file source must never see half a file


def _print_content(
    data: Any, files: int, distinct_ids: int, samples: int, echo: Callable[[str], None]
) -> None:
    """Files, rows, rows per day and a few sample rows of a demo table."""
    echo(f"  data files     {files}")
    echo(f"  rows           {data.num_rows:,} ({distinct_ids:,} distinct event ids)")
    per_day = data.group_by("event_date").aggregate([("event_id", "count")]).sort_by("event_date")
    for row in per_day.to_pylist():
        echo(f"    {row['event_date']}  {row['event_id_count']:,} rows")
    echo("  sample:")
    for row in data.sort_by("event_id").slice(0, samples).to_pylist():
        echo("    " + json.dumps(row, default=str))


@dataclass(frozen=True)
class DemoResult:
    """What the demo produced and read back."""

    table_uri: str
    version: int
    files: int
    rows: int
    distinct_ids: int
    batches: int
    seconds: float


def run_demo(
    workdir: Path,
    *,
    events: int = 300_000,
    files: int = 12,
    files_per_batch: int = 3,
    master: str | None = None,
    echo: Callable[[str], None] = print,
) -> DemoResult:
    """Run the main job on embedded defaults and print what landed in the table."""
    import pyarrow.compute as pc

    import deltaflow
    from deltaflow.delta import log as delta_log
    from deltaflow.pipeline.session import stop_session

    landing, table_uri = workdir / "landing", workdir / "tables" / "events"
    for path in (landing, workdir / "tables"):
        shutil.rmtree(path, ignore_errors=True)
    echo(f"generating {events:,} JSON events in {files} files under {landing}")
    generate_events(landing, events=events, files=files)

    echo(f"starting Spark ({_where(master)}) ...")
    spark = deltaflow.spark_session(master, job="demo:files")
    from pyspark.sql import functions as F  # noqa: N812

    schema = (
        "event_id LONG, user_id LONG, session_id STRING, event_type STRING, page STRING, "
        "country STRING, amount DOUBLE, ts TIMESTAMP"
    )
    source = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", files_per_batch)
        .json(str(landing))
        .withColumn("event_date", F.to_date("ts"))
    )
    started = time.monotonic()
    query = deltaflow.write_stream(
        source,
        str(table_uri),
        pipeline_id="demo-clickstream",
        partition_columns=["event_date"],
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    seconds = time.monotonic() - started
    batches = len(query.recentProgress)

    table = delta_log.load(str(table_uri), {})
    assert table is not None
    data = table.to_pyarrow_table()
    ids = data.column("event_id")
    result = DemoResult(
        table_uri=str(table_uri),
        version=table.version(),
        files=len(table.file_uris()),
        rows=data.num_rows,
        distinct_ids=len(pc.unique(ids)),
        batches=batches,
        seconds=seconds,
    )
    echo(f"\nDelta table {result.table_uri}")
    echo(f"  version        {result.version}")
    echo(f"  micro-batches  {result.batches} in {result.seconds:.1f} s")
    _print_content(data, result.files, result.distinct_ids, 5, echo)
    ok = result.rows == events == result.distinct_ids
    echo(f"\nexactly once: {'OK' if ok else 'MISMATCH'} ({events:,} events generated)")
    stop_session(spark)
    return result


#: Every this many events, the demo produces a malformed one (to show the dead-letter table).
DEMO_BAD_EVERY = 1000
DEMO_SCHEMA = (
    "event_id BIGINT, user_id BIGINT, session_id STRING, event_type STRING, page STRING, "
    "country STRING, amount DOUBLE, ts TIMESTAMP"
)


@dataclass(frozen=True)
class KafkaDemoResult:
    """What the Kafka demo produced and read back."""

    table_uri: str
    dlq_uri: str
    produced: int
    rows: int
    distinct_ids: int
    dead_letters: int
    seconds: float

    @property
    def exactly_once(self) -> bool:
        return self.rows == self.distinct_ids and self.rows + self.dead_letters == self.produced


def run_kafka_demo(
    workdir: Path,
    *,
    events: int = 100_000,
    partitions: int = 4,
    master: str | None = None,
    echo: Callable[[str], None] = print,
) -> KafkaDemoResult:
    """Embedded broker -> JSON events (some malformed) -> ``deltaflow ingest`` -> Delta."""
    import pyarrow.compute as pc

    import deltaflow
    from deltaflow.config.ingest import IngestConfig
    from deltaflow.metrics import progress_messages
    from deltaflow.pipeline.arrow_ingest import choose_engine
    from deltaflow.pipeline.ingest import ingest
    from deltaflow.pipeline.session import stop_session
    from deltaflow.testing import start_broker

    tables = workdir / "tables"
    shutil.rmtree(tables, ignore_errors=True)
    table_uri, dlq_uri = tables / "clickstream", tables / "clickstream_dead_letters"
    echo("starting an embedded Kafka-protocol broker (tansu, 127.0.0.1) ...")
    broker = start_broker()
    try:
        topic = broker.create_topic(partitions=partitions, name="clickstream")
        rng = random.Random(7)
        values = [
            b'{"event_id": %d, "truncated' % i
            if i % DEMO_BAD_EVERY == DEMO_BAD_EVERY - 1
            # the rest are well-formed events
            else event_json(i, events, rng).encode()
            for i in range(events)
        ]
        echo(f"producing {events:,} JSON events to topic {topic!r} ({partitions} partitions) ...")
        broker.produce(topic, values, partitions=partitions, batched=True)
        produced = events
        echo(f"starting Spark ({_where(master)}) and `deltaflow ingest` ...")
        started = time.monotonic()
        config = IngestConfig(
            topic=topic,
            table_uri=str(table_uri),
            brokers=broker.bootstrap,
            pipeline_id="demo-clickstream",
            value_schema=DEMO_SCHEMA,
            transforms=("event_date: substr(ts, `0`, `10`)", "kafka_offset: kafka.offset"),
            partition_by=("event_date",),
            dlq_table_location=str(dlq_uri),
            max_messages_per_batch=max(10_000, events // 4),
            ends_at_latest_offsets=True,
        )
        engine = choose_engine(config)
        echo(f"  engine: {engine} (the rows stay in Arrow inside Spark's tasks)")
        spark = deltaflow.spark_session(
            master, jvm="lean" if engine == "arrow" else "full", job=f"demo:{config.pipeline_id}"
        )
        query = ingest(spark, config)
        query.awaitTermination()
        seconds = time.monotonic() - started
        batches = len([p for p in query.recentProgress if progress_messages(p)])
        stop_session(spark)
    finally:
        broker.stop()

    from deltaflow.delta import log as delta_log

    table = delta_log.load(str(table_uri), {})
    dead_table = delta_log.load(str(dlq_uri), {})
    assert table is not None and dead_table is not None, "ingest committed, so both tables exist"
    data = table.to_pyarrow_table()
    dead = dead_table.to_pyarrow_table()
    result = KafkaDemoResult(
        table_uri=str(table_uri),
        dlq_uri=str(dlq_uri),
        produced=produced,
        rows=data.num_rows,
        distinct_ids=len(pc.unique(data.column("event_id"))),
        dead_letters=dead.num_rows,
        seconds=seconds,
    )
    echo(f"\nDelta table {result.table_uri}")
    echo(f"  version        {table.version()} ({batches} micro-batch(es) in {seconds:.1f} s)")
    _print_content(data, len(table.file_uris()), result.distinct_ids, 3, echo)
    echo(f"\ndead-letter table {result.dlq_uri}: {result.dead_letters:,} message(s)")
    for row in dead.sort_by("offset").slice(0, 2).to_pylist():
        echo(f"    partition {row['partition']} offset {row['offset']}: {row['error']}")
    echo(
        f"\nexactly once: {'OK' if result.exactly_once else 'MISMATCH'} ({produced:,} messages = "
        f"{result.rows:,} rows + {result.dead_letters:,} dead letters: {events // DEMO_BAD_EVERY:,} "
        f"malformed events)"
    )
    return result

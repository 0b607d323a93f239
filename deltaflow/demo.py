"""The README's main job: JSON events in a landing folder, streamed by Spark into Delta.

It generates clickstream events as JSON-lines files, runs a streaming query (Spark's file
source, one micro-batch per few files) into a partitioned Delta table through the deltaflow
sink, and reports what landed, reading the table back with delta-rs.
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

__all__ = ["DemoResult", "generate_events", "run_demo"]

logger = logging.getLogger(__name__)

_EVENT_TYPES = ("page_view", "click", "add_to_cart", "purchase", "search")
_COUNTRIES = ("DE", "FR", "US", "BR", "IN", "JP", "NG", "GB")
_PAGES = ("/", "/search", "/product/{}", "/cart", "/checkout", "/help")


def generate_events(landing: Path, *, events: int, files: int, seed: int = 7) -> None:
    """Write ``events`` JSON events into ``files`` JSON-lines files under ``landing``.

    Every event has a unique ``event_id`` (0 .. events-1), so the table can be checked for
    exactly-once delivery.
    """
    landing.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    start = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    per_file = -(-events // files)
    for f in range(files):
        lo, hi = f * per_file, min(events, (f + 1) * per_file)
        if lo >= hi:
            break
        lines = []
        for i in range(lo, hi):
            ts = start + dt.timedelta(seconds=i * 172_800 / events, microseconds=rng.randrange(1000))
            kind = rng.choice(_EVENT_TYPES)
            lines.append(
                json.dumps(
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
            )
        tmp = landing / f".events-{f:04d}.json.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(landing / f"events-{f:04d}.json")  # the file source must never see half a file


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
    from deltaflow import delta_log

    landing, table_uri = workdir / "landing", workdir / "tables" / "events"
    for path in (landing, workdir / "tables"):
        shutil.rmtree(path, ignore_errors=True)
    echo(f"generating {events:,} JSON events in {files} files under {landing}")
    generate_events(landing, events=events, files=files)

    echo("starting Spark (embedded, local[*]) ...")
    spark = deltaflow.spark_session(master)
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
    echo(f"  data files     {result.files}")
    echo(f"  rows           {result.rows:,} ({result.distinct_ids:,} distinct event ids)")
    per_day = data.group_by("event_date").aggregate([("event_id", "count")]).sort_by("event_date")
    for row in per_day.to_pylist():
        echo(f"    {row['event_date']}  {row['event_id_count']:,} rows")
    echo("  sample:")
    sample = data.sort_by("event_id").slice(0, 5).to_pylist()
    for row in sample:
        echo("    " + json.dumps(row, default=str))
    ok = result.rows == events == result.distinct_ids
    echo(f"\nexactly once: {'OK' if ok else 'MISMATCH'} ({events:,} events generated)")
    spark.stop()
    return result

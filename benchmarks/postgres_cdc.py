"""PostgreSQL CDC -> Delta (``postgres-cdc`` into an event table): snapshot rows/s, changes/s
from a pgbench backlog, and the lag (commit in PostgreSQL -> visible in Delta) at a steady rate.

A fresh PostgreSQL server (``deltaflow.testing.start_postgres``) is loaded by ``pgbench -i -s
SCALE`` (100,000 ``pgbench_accounts`` rows per unit of scale); a publication covers its four
tables. One Spark session (``local[2]``) runs three phases, each a query of the ``postgres-cdc``
source into the ``deltaflow`` sink with the slot's progress in the table (``kafka_offsets``):

1. **snapshot**: ``snapshot: initial`` over the loaded tables, availableNow: rows/s.
2. **backlog**: ``pgbench -t TX`` (TPC-B-like: per transaction three UPDATEs and one INSERT =
   four changes) with the pipeline stopped, then one availableNow run: changes/s (the time of
   the query, session already up).
3. **lag**: the query runs on Spark's default trigger while ``pgbench -R RATE -T SECONDS``
   commits a steady load; a poller watches the Delta log every 50 ms. Lag of a change =
   the mtime of the commit file that added it - its PostgreSQL commit time (the event's
   ``timestamp``; files rewritten by auto-compaction, ``dataChange: false``, are not new rows).
   The first ``--warmup`` seconds are left out.

    .venv/bin/python benchmarks/postgres_cdc.py [--scale 10] [--transactions 20000] [--rate 200]
        [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from machine import describe
from pg_load import CommitPoller, pgbench

from deltaflow.testing import PostgresServer, start_postgres

PUBLICATION = "bench_pub"
TABLES = ("pgbench_accounts", "pgbench_tellers", "pgbench_branches", "pgbench_history")


def run_query(
    spark, server: PostgresServer, table: str, checkpoint: str, *, snapshot: str, available_now: bool
):
    options = {
        "host": server.host,
        "port": str(server.port),
        "user": "postgres",
        "database": "postgres",
        "publication": PUBLICATION,
        "slot": "bench_slot",
        "snapshot": snapshot,
        "delta_table_uri": table,
        "pipeline_id": "bench",
    }
    writer = (
        spark.readStream.format("postgres-cdc")
        .options(**options)
        .load()
        .writeStream.format("deltaflow")
        .option("table_uri", table)
        .option("pipeline_id", "bench")
        .option("kafka_offsets", "true")
        .option("checkpointLocation", checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def rows_in(table: str) -> int:
    from deltalake import DeltaTable

    actions = DeltaTable(table).get_add_actions(flatten=True)
    return int(sum(actions.column("num_records").to_pylist()))


class LogPoller(CommitPoller):
    """For every new commit of the table: its file's mtime and its rows' commit times."""

    def __init__(self, table: str) -> None:
        super().__init__(Path(table), ["timestamp"])
        self.lags_us: list[tuple[int, int]] = []  # (commit time in PostgreSQL, lag)

    def added(self, rows: pa.Table, visible_us: int) -> None:
        for ts in rows.column("timestamp").cast("int64").to_pylist():
            self.lags_us.append((ts, visible_us - ts))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument(
        "--transactions", type=int, default=20_000, help="pgbench transactions of the backlog"
    )
    parser.add_argument("--rate", type=int, default=200, help="pgbench transactions/s of the lag phase")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--warmup", type=float, default=10.0)
    args = parser.parse_args()

    import deltaflow

    work = Path(tempfile.mkdtemp(prefix="deltaflow-bench-cdc-"))
    server = start_postgres(max_wal_size="4GB", checkpoint_timeout="30min")
    try:
        started = time.monotonic()
        pgbench(server, "-i", "-q", "-s", str(args.scale))
        print(f"pgbench -i -s {args.scale}: {time.monotonic() - started:.1f} s")
        with server.connect() as conn:
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(TABLES)}")
            snapshot_rows = sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES)

        spark = deltaflow.spark_session("local[2]", **{"spark.sql.shuffle.partitions": "2"})
        deltaflow.register(spark)

        # 1. snapshot
        table, checkpoint = str(work / "events"), str(work / "cp")
        started = time.monotonic()
        run_query(spark, server, table, checkpoint, snapshot="initial", available_now=True).awaitTermination()
        seconds = time.monotonic() - started
        landed = rows_in(table)
        assert landed == snapshot_rows, (landed, snapshot_rows)
        print(f"snapshot: {landed:,} rows in {seconds:.2f} s = {landed / seconds:,.0f} rows/s")

        # 2. backlog
        started = time.monotonic()
        pgbench(server, "-n", "-c", "4", "-j", "2", "-t", str(args.transactions // 4))
        print(f"pgbench backlog: {args.transactions:,} transactions in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        run_query(spark, server, table, checkpoint, snapshot="initial", available_now=True).awaitTermination()
        seconds = time.monotonic() - started
        changes = rows_in(table) - landed
        assert changes == 4 * 4 * (args.transactions // 4), changes
        print(f"backlog: {changes:,} changes in {seconds:.2f} s = {changes / seconds:,.0f} changes/s")
        landed += changes

        # 3. lag at a steady rate
        poller = LogPoller(table)
        poller.scan()  # what is there already does not count
        poller.lags_us.clear()
        poller.start()
        query = run_query(spark, server, table, checkpoint, snapshot="initial", available_now=False)
        time.sleep(3)  # the query is planning its first batch
        load_started_us = int(time.time() * 1e6)
        pgbench(server, "-n", "-c", "2", "-j", "2", "-R", str(args.rate), "-T", str(args.seconds))
        deadline = time.monotonic() + 120
        with server.connect() as conn:
            history = conn.execute("SELECT count(*) FROM pgbench_history").fetchone()[0]
        expected = snapshot_rows + 4 * history  # each transaction adds one history row
        while time.monotonic() < deadline and rows_in(table) < expected:
            time.sleep(0.2)
        query.stop()
        poller.stop_event.set()
        poller.join()
        warm = load_started_us + int(args.warmup * 1e6)
        lags = np.array([lag for ts, lag in poller.lags_us if ts >= warm]) / 1e6
        total = rows_in(table)
        print(
            f"lag at {args.rate} tx/s ({4 * args.rate} changes/s) for {args.seconds} s: "
            f"{len(poller.lags_us):,} changes, {len(lags):,} after warm-up; "
            f"p50 {np.percentile(lags, 50):.3f} s, p90 {np.percentile(lags, 90):.3f} s, "
            f"p99 {np.percentile(lags, 99):.3f} s, max {lags.max():.3f} s; table {total:,} rows "
            f"(expected {expected:,})"
        )
        spark.stop()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{describe()}; load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

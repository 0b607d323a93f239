"""PostgreSQL CDC -> typed mirror tables (``postgres-cdc`` with ``write_mode: merge`` sinks):
snapshot rows/s, changes/s from a pgbench backlog, and the lag (commit in PostgreSQL -> visible
in the mirror) at a steady rate.

A fresh PostgreSQL server is loaded by ``pgbench -i -s SCALE``; a publication covers the three
pgbench tables with a primary key (accounts, tellers, branches), each mirrored into its own Delta
table by one YAML-equivalent pipeline (:func:`deltaflow.pipeline.runner.start_pipeline`), plus a
``lag_probe`` table. One Spark session (``local[2]``):

1. **snapshot** (availableNow): the mirrors created and filled; rows/s.
2. **backlog**: ``pgbench -t TX`` (TPC-B-like) with the pipeline stopped: per transaction one
   UPDATE of each published table (accounts, tellers, branches: three changes) and one INSERT
   into the unpublished history table; then one availableNow run: changes/s. The mirrors are
   then compared with PostgreSQL (row count and the sum of the balance of every table).
3. **lag**: the pipeline on Spark's default trigger while ``pgbench -R RATE -T SECONDS``
   commits a steady load and a thread inserts a ``lag_probe`` row (``clock_timestamp()``) every
   50 ms; lag = mtime of the mirror's commit file that added a probe row - the row's time.

    .venv/bin/python benchmarks/postgres_mirror.py [--scale 10] [--transactions 20000]
        [--rate 200] [--seconds 60] [--max-changes 0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from machine import describe
from pg_load import CommitPoller, pgbench

from deltaflow.testing import PostgresServer, start_postgres

PUBLICATION = "mirror_pub"
TABLES = ("pgbench_accounts", "pgbench_tellers", "pgbench_branches", "lag_probe")
BALANCE = {"pgbench_accounts": "abalance", "pgbench_tellers": "tbalance", "pgbench_branches": "bbalance"}


def spec_for(server: PostgresServer, work: Path, max_changes: int):
    from deltaflow.config.pipeline import PipelineSpec

    return PipelineSpec.model_validate(
        {
            "pipeline_id": "mirror_bench",
            "checkpoint_location": str(work / "cp"),
            "source": {
                "type": "postgres-cdc",
                "host": server.host,
                "port": server.port,
                "user": "postgres",
                "database": "postgres",
                "publication": PUBLICATION,
                "slot": "mirror_slot",
                "max_changes_per_batch": max_changes,
            },
            "sinks": [
                {"table_uri": str(work / t), "write_mode": "merge", "stream": f"public.{t}"} for t in TABLES
            ],
        }
    )


def check_equal(server: PostgresServer, work: Path) -> str:
    """Row count and balance sum of every mirror against PostgreSQL."""
    from deltalake import DeltaTable

    out = []
    with server.connect() as conn:
        for table, column in BALANCE.items():
            want = conn.execute(f"SELECT count(*), coalesce(sum({column}), 0) FROM {table}").fetchone()
            data = DeltaTable(str(work / table)).to_pyarrow_table(columns=[column])
            got = (data.num_rows, sum(v for v in data.column(column).to_pylist() if v is not None))
            assert tuple(int(x) for x in want) == got, (table, want, got)
            out.append(f"{table} {got[0]:,} rows, sum {got[1]:,}")
    return "; ".join(out)


class ProbeWriter(threading.Thread):
    def __init__(self, server: PostgresServer) -> None:
        super().__init__(name="lag-probe", daemon=True)
        self.server = server
        self.stop_event = threading.Event()
        self.count = 0

    def run(self) -> None:
        with self.server.connect() as conn:
            while not self.stop_event.is_set():
                self.count += 1
                conn.execute("INSERT INTO lag_probe VALUES (%s, clock_timestamp())", (self.count,))
                time.sleep(0.05)


class ProbePoller(CommitPoller):
    """For every new commit of the probe's mirror: its file's mtime and its new rows' times."""

    def __init__(self, table: Path) -> None:
        super().__init__(table, ["id", "at"])
        self.seen_ids: set[int] = set()
        self.lags_us: list[tuple[int, int]] = []

    def added(self, rows: pa.Table, visible_us: int) -> None:
        ids, ats = rows.column("id").to_pylist(), rows.column("at").cast("int64").to_pylist()
        for i, at in zip(ids, ats, strict=True):
            if i not in self.seen_ids:
                self.seen_ids.add(i)
                self.lags_us.append((at, visible_us - at))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--transactions", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=200, help="pgbench transactions/s of the lag phase")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--max-changes", type=int, default=0, help="max_changes_per_batch (0: none)")
    args = parser.parse_args()

    import deltaflow
    from deltaflow.pipeline.runner import start_pipeline

    work = Path(tempfile.mkdtemp(prefix="deltaflow-bench-mirror-"))
    server = start_postgres(max_wal_size="4GB", checkpoint_timeout="30min")
    try:
        pgbench(server, "-i", "-q", "-s", str(args.scale))
        with server.connect() as conn:
            conn.execute("CREATE TABLE lag_probe (id int PRIMARY KEY, at timestamptz)")
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(TABLES)}")
            snapshot_rows = sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES)
        spark = deltaflow.spark_session("local[2]", **{"spark.sql.shuffle.partitions": "2"})
        spec = spec_for(server, work, args.max_changes)

        # 1. snapshot
        started = time.monotonic()
        start_pipeline(spark, spec, available_now=True).awaitTermination()
        seconds = time.monotonic() - started
        print(f"snapshot: {snapshot_rows:,} rows in {seconds:.2f} s = {snapshot_rows / seconds:,.0f} rows/s")
        print(f"  equal: {check_equal(server, work)}")

        # 2. backlog (TPC-B-like: 3 UPDATEs of published tables per transaction)
        pgbench(server, "-n", "-c", "4", "-j", "2", "-t", str(args.transactions // 4))
        changes = 3 * 4 * (args.transactions // 4)
        started = time.monotonic()
        start_pipeline(spark, spec, available_now=True).awaitTermination()
        seconds = time.monotonic() - started
        print(f"backlog: {changes:,} changes in {seconds:.2f} s = {changes / seconds:,.0f} changes/s")
        print(f"  equal: {check_equal(server, work)}")

        # 3. lag at a steady rate
        poller = ProbePoller(work / "lag_probe")
        poller.scan()
        poller.lags_us.clear()
        probe = ProbeWriter(server)
        query = start_pipeline(spark, spec)
        time.sleep(5)  # the query is planning its first batch
        poller.start()
        probe.start()
        load_started_us = int(time.time() * 1e6)
        pgbench(server, "-n", "-c", "2", "-j", "2", "-R", str(args.rate), "-T", str(args.seconds))
        probe.stop_event.set()
        probe.join()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(poller.seen_ids) < probe.count:
            time.sleep(0.2)
        query.stop()
        poller.stop_event.set()
        poller.join()
        warm = load_started_us + int(args.warmup * 1e6)
        lags = np.array([lag for at, lag in poller.lags_us if at >= warm]) / 1e6
        print(
            f"lag at {args.rate} tx/s ({3 * args.rate} changes/s + 20 probe rows/s) for {args.seconds} s: "
            f"{len(poller.seen_ids):,} of {probe.count:,} probe rows seen, {len(lags):,} after warm-up; "
            f"p50 {np.percentile(lags, 50):.3f} s, p90 {np.percentile(lags, 90):.3f} s, "
            f"p99 {np.percentile(lags, 99):.3f} s, max {lags.max():.3f} s"
        )
        print(f"  equal: {check_equal(server, work)}")
        spark.stop()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{describe()}; load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""``deltaflow add-files``: many small Parquet files registered in ONE commit, without reading
their data.

pyarrow writes ``--files`` small files (``--rows`` rows each, 4 columns) into ``--partitions``
Hive folders below a fresh table root (not timed), then :func:`deltaflow.ops.add_files`
registers them all: seconds (listing, footers on ``--threads`` threads, schema checks, the
commit), commits in the log, and the same call again (every file skipped). The script checks
that the table holds every file and every row once. With ``--s3`` the files live in a local
moto S3 server (``deltaflow.testing.start_s3``) instead of on local disk.

With ``--watch N`` the files are registered by the watching mode instead (the
``deltaflow-landed-files`` Spark source and one add-files commit per micro-batch, ``availableNow``,
at most N files per trigger; Spark ``local[2]``): seconds from the query's start to its end
(the Spark session's start is printed apart), commits, and a second run on a new checkpoint that
must register nothing.

Then DuckDB (its delta extension, from the wheel) counts the rows of one file's id range: the
files it scans out of all, as its ``EXPLAIN ANALYZE`` reports them (the add actions' footer
statistics let it skip the others), and the seconds of that query and of a full count.

    .venv/bin/python benchmarks/add_files.py [--files 10000] [--rows 100] [--partitions 10]
        [--threads 16] [--s3] [--watch 1000]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from machine import describe

from deltaflow import ops
from deltaflow.io.storage import filesystem
from deltaflow.testing import start_s3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures.readers


def write_files(uri: str, options: dict[str, str], files: int, rows: int, partitions: int) -> None:
    fs, root = filesystem(uri, options)
    for p in range(partitions):
        fs.create_dir(f"{root}/day=2026-11-{p + 1:02d}", recursive=True)

    def one(n: int) -> None:
        ids = pa.array(range(n * rows, (n + 1) * rows), pa.int64())
        table = pa.table({"id": ids, "v": pc.multiply(ids, 2), "name": [f"n{n}"] * rows})
        pq.write_table(
            table, f"{root}/day=2026-11-{n % partitions + 1:02d}/part-{n:06d}.parquet", filesystem=fs
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(files)))


def duckdb_skipping(uri: str, endpoint: str | None, args: argparse.Namespace) -> None:
    """DuckDB over the registered table: a filter one file's statistics match, then all rows."""
    from tests.fixtures.readers import duckdb_delta

    con = duckdb_delta(endpoint)
    try:
        first = (args.files // 2) * args.rows  # the ids of file files/2
        where = f"id >= {first} AND id < {first + args.rows}"
        started = time.perf_counter()
        plan = "\n".join(
            row[1]
            for row in con.execute(
                f"EXPLAIN ANALYZE SELECT count(*) FROM delta_scan('{uri}') WHERE {where}"
            ).fetchall()
        )
        filtered = time.perf_counter() - started
        match = re.search(r"Scanning Files:[\s\u2502]*(\d+)/(\d+)", plan)  # across the plan's box lines
        assert match, plan
        count = con.execute(f"SELECT count(*) FROM delta_scan('{uri}') WHERE {where}").fetchone()
        assert count == (args.rows,), count
        started = time.perf_counter()
        total = con.execute(f"SELECT count(*) FROM delta_scan('{uri}')").fetchone()
        full = time.perf_counter() - started
        assert total == (args.files * args.rows,), total
        print(
            f"duckdb {where}: scanned {match.group(1)}/{match.group(2)} files in {filtered:.2f} s "
            f"(EXPLAIN ANALYZE); count(*) of all rows {full:.2f} s"
        )
    finally:
        con.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--s3", action="store_true", help="files and table in a local moto S3 server")
    parser.add_argument("--watch", type=int, default=0, help="files per trigger of the watching mode")
    args = parser.parse_args()

    server = start_s3("bench") if args.s3 else None
    workdir = tempfile.mkdtemp(prefix="deltaflow-add-files-")
    try:
        uri = "s3://bench/events" if server else f"{workdir}/events"
        options = dict(server.storage_options) if server else {}
        started = time.perf_counter()
        write_files(uri, options, args.files, args.rows, args.partitions)
        print(f"wrote {args.files:,} files in {time.perf_counter() - started:.1f} s (not timed below)")

        if args.watch:
            watch(uri, options, args, workdir)
            return
        started = time.perf_counter()
        result = ops.add_files(uri, [uri], storage_options=options, threads=args.threads)
        seconds = time.perf_counter() - started
        table = DeltaTable(uri, storage_options=options or None)
        commits = table.version() + 1
        started = time.perf_counter()
        again = ops.add_files(uri, [uri], storage_options=options, threads=args.threads)
        again_seconds = time.perf_counter() - started

        assert result.files_added == args.files and result.rows_added == args.files * args.rows
        assert len(table.file_uris()) == args.files
        assert again.files_added == 0 and again.files_skipped == args.files
        assert DeltaTable(uri, storage_options=options or None).version() == table.version()
        rows = table.to_pyarrow_table(columns=["id"])["id"]
        assert len(rows) == args.files * args.rows and pc.count_distinct(rows).as_py() == len(rows)

        print(describe(f"{'moto S3' if server else 'local disk'}, {args.threads} footer threads"))
        print(
            f"add_files: {args.files:,} files ({args.files * args.rows:,} rows, {args.partitions} "
            f"partitions) in {seconds:.2f} s = {args.files / seconds:,.0f} files/s; commits: {commits}; "
            f"table version {table.version()}"
        )
        print(f"again (every file skipped): {again_seconds:.2f} s, commits: 0")
        duckdb_skipping(uri, server.endpoint if server else None, args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if server:
            server.stop()


def watch(uri: str, options: dict[str, str], args: argparse.Namespace, workdir: str) -> None:
    import deltaflow
    from deltaflow.pipeline.watch_files import start_watch

    started = time.perf_counter()
    spark = deltaflow.spark_session("local[2]", **{"spark.sql.shuffle.partitions": "2"})
    print(f"Spark session started in {time.perf_counter() - started:.1f} s (not timed below)")

    def run(checkpoint: str) -> float:
        began = time.perf_counter()
        query = start_watch(
            spark,
            table_uri=uri,
            path=uri,
            pipeline_id="bench-watch",
            checkpoint_location=checkpoint,
            storage_options=options,
            available_now=True,
            max_files_per_trigger=args.watch,
        )
        query.awaitTermination()
        return time.perf_counter() - began

    try:
        seconds = run(f"{workdir}/checkpoint")
        table = DeltaTable(uri, storage_options=options or None)
        version = table.version()
        again = run(f"{workdir}/checkpoint-lost")
        assert DeltaTable(uri, storage_options=options or None).version() == version
        assert len(table.file_uris()) == args.files
        rows = table.to_pyarrow_table(columns=["id"])["id"]
        assert len(rows) == args.files * args.rows and pc.count_distinct(rows).as_py() == len(rows)
        commits = sum(1 for h in table.history() if h.get("deltaflow.operation") == "add files")
        print(describe(f"{'moto S3' if args.s3 else 'local disk'}, watch, {args.watch} files per trigger"))
        print(
            f"watch: {args.files:,} files ({args.files * args.rows:,} rows) in {seconds:.2f} s = "
            f"{args.files / seconds:,.0f} files/s; add-files commits: {commits}; table version {version}"
        )
        print(f"again on a new checkpoint (nothing to register): {again:.2f} s, commits: 0")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()

"""Throughput of the deltaflow sink against Spark's built-in Parquet sink.

Streams the same input (Parquet files, ROWS rows x 10 columns) with Spark's file source into
(a) the built-in ``parquet`` streaming sink and (b) the deltaflow Delta sink, with the same
Spark session and trigger, and prints rows/s of each and the ratio (b)/(a). Runs alternate
(a, b, a, b, ...) and the best of ``--repeat`` is reported, so JVM warm-up and page cache
favour neither side.

    .venv/bin/python benchmarks/sink_throughput.py [--rows 5000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from machine import describe


def make_input(folder: Path, rows: int, files: int) -> None:
    """ROWS rows x 10 columns of mixed types in FILES Parquet files."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(42)
    per_file = rows // files
    base = np.datetime64("2026-11-01T00:00:00", "us")
    for f in range(files):
        n = per_file if f < files - 1 else rows - per_file * (files - 1)
        ids = np.arange(f * per_file, f * per_file + n, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "user_id": rng.integers(0, 1_000_000, n),
                "session": rng.integers(0, 1 << 31, n).astype(np.int32),
                "quantity": rng.integers(1, 20, n).astype(np.int32),
                "price": rng.random(n) * 100,
                "score": rng.normal(size=n),
                "country": pa.array(np.array(["DE", "FR", "US", "BR", "IN", "JP"])[rng.integers(0, 6, n)]),
                "url": pa.array([f"/p/{i % 5000}" for i in ids]),
                "ts": pa.array(base + (ids * 1000).astype("timedelta64[us]"), pa.timestamp("us", "UTC")),
                "flag": rng.random(n) < 0.5,
            }
        )
        pq.write_table(table, folder / f"input-{f:03d}.parquet")


def run_once(
    spark, sink: str, source_dir: Path, fmt: str, out: Path, files_per_batch: int, write_path: str
) -> float:
    import deltaflow

    shutil.rmtree(out, ignore_errors=True)
    schema = spark.read.parquet(str(source_dir.parent / "input")).schema
    stream = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", files_per_batch)
        .format(fmt)
        .load(str(source_dir))
    )
    started = time.perf_counter()
    if sink == "parquet":
        query = (
            stream.writeStream.format("parquet")
            .option("path", str(out / "data"))
            .option("checkpointLocation", str(out / "cp"))
            .trigger(availableNow=True)
            .start()
        )
    else:
        query = deltaflow.write_stream(
            stream,
            str(out / "table"),
            pipeline_id="bench",
            checkpoint_location=str(out / "cp"),
            trigger={"availableNow": True},
            write_path=write_path,
        )
    query.awaitTermination()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--files-per-batch", type=int, default=5, help="maxFilesPerTrigger")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--write-path",
        choices=("auto", "spark", "arrow"),
        default="auto",
        help="the sink's write_path option",
    )
    parser.add_argument(
        "--format",
        choices=("parquet", "json"),
        default="parquet",
        help="input file format: parquet (cheapest source, the sink dominates) or json (a landing zone)",
    )
    args = parser.parse_args()

    import deltaflow

    work = args.workdir or Path(tempfile.mkdtemp(prefix="deltaflow-bench-"))
    source = work / "input"
    print(f"generating {args.rows:,} rows x 10 columns in {args.files} Parquet files ...", flush=True)
    shutil.rmtree(source, ignore_errors=True)
    make_input(source, args.rows, args.files)

    spark = deltaflow.spark_session(args.master)
    if args.format == "json":
        json_dir = work / "input-json"
        shutil.rmtree(json_dir, ignore_errors=True)
        spark.read.parquet(str(source)).repartition(args.files).write.json(str(json_dir))
        source = json_dir
    best: dict[str, float] = {}
    for i in range(args.repeat):
        for sink in ("parquet", "deltaflow"):
            seconds = run_once(
                spark, sink, source, args.format, work / f"out-{sink}", args.files_per_batch, args.write_path
            )
            rate = args.rows / seconds
            print(f"run {i + 1} {sink:9s} {seconds:7.2f} s  {rate:12,.0f} rows/s", flush=True)
            best[sink] = min(best.get(sink, float("inf")), seconds)

    from deltalake import DeltaTable

    landed = DeltaTable(str(work / "out-deltaflow" / "table")).count()
    assert landed == args.rows, f"deltaflow table holds {landed} rows, expected {args.rows}"
    batches = -(-args.files // args.files_per_batch)
    parquet_rate, delta_rate = args.rows / best["parquet"], args.rows / best["deltaflow"]
    print()
    print(describe(f"Spark {spark.version}", f"master {args.master}"))
    print(
        f"input: {args.rows:,} rows x 10 columns, {args.files} {args.format} files, "
        f"{batches} micro-batches; best of {args.repeat}"
    )
    print(f"built-in parquet sink : {parquet_rate:12,.0f} rows/s")
    print(f"deltaflow Delta sink  : {delta_rate:12,.0f} rows/s (write_path={args.write_path})")
    print(f"ratio deltaflow/parquet: {delta_rate / parquet_rate:.2f}  (target >= 0.85)")
    spark.stop()
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

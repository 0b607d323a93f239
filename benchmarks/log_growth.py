"""A stream's commit as its table's log grows: one local table, many small batches, no Spark.

A streaming table gets a log entry per batch, and Delta keeps them for
``delta.logRetentionDuration`` (30 days unless set; checkpoints make them redundant for
reads, not gone). On a local or mounted filesystem delta-rs lists the whole ``_delta_log``
folder (and reads each entry's metadata) whenever it brings a table up to date or commits, so
a commit costs more with every entry the folder holds (object stores that list from an offset,
as S3 can, are not measured here).

Makes one table (``--log-retention``: its ``delta.logRetentionDuration``) and claims it for
one pipeline, as ``deltaflow ingest`` does, then commits ``--batches`` batches of ``--rows``
rows through the sink's own path (``_DeltaSink.write_task`` for the file,
``_DeltaSink.commit_batch`` with a Kafka partition's end offset, its table kept between
batches as a stream keeps it) and prints, every ``--every`` batches, the files in
``_delta_log`` and the mean wall and CPU milliseconds of those batches' commits (the commit
alone: the file is written before the clock starts).

    .venv/bin/python benchmarks/log_growth.py [--batches 5000] [--every 500] [--rows 10] \
        [--log-retention 'interval 30 seconds']
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time

import pyarrow as pa
from machine import describe

from deltaflow.config.sink import SinkOptions
from deltaflow.delta.commit import create_table
from deltaflow.ops.compaction import close_all
from deltaflow.pipeline.api import claim_all
from deltaflow.sinks.datasource import _DeltaSink


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=5_000)
    parser.add_argument("--every", type=int, default=500, help="batches per printed line")
    parser.add_argument("--rows", type=int, default=10, help="rows of each batch's file")
    parser.add_argument(
        "--log-retention",
        help="the table's delta.logRetentionDuration, e.g. 'interval 30 seconds' (unset: 30 days)",
    )
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="deltaflow-log-growth-")
    try:
        uri = f"{root}/t"
        data = pa.table({"id": pa.array(range(args.rows), pa.int64())})
        properties = {"delta.logRetentionDuration": args.log_retention} if args.log_retention else {}
        create_table(uri, data.schema, partition_by=[], properties=properties, storage_options={})
        (options,) = claim_all([SinkOptions(table_uri=uri, pipeline_id="bench", kafka_offsets=True)])
        sink = _DeltaSink(options, data.schema, overwrite=False)
        retention = args.log_retention or "unset (30 days)"
        print(f"== 1 table, {args.batches:,} batches of {args.rows} rows, log retention {retention}")
        wall = cpu = 0.0
        for batch in range(args.batches):
            message = sink.write_task(iter(data.to_batches()), batch_id=batch)
            end = {"t": {"0": (batch + 1) * args.rows}}
            started, used = time.perf_counter(), _cpu()
            sink.commit_batch([message], batch, source=(end, {}))
            wall += time.perf_counter() - started
            cpu += _cpu() - used
            if (batch + 1) % args.every == 0:
                files = len(os.listdir(f"{uri}/_delta_log"))
                print(
                    f"  batches {batch + 2 - args.every}-{batch + 1}: {files:,} files in _delta_log; "
                    f"commit {wall / args.every * 1000:.1f} ms wall, {cpu / args.every * 1000:.1f} ms CPU "
                    "(mean)",
                    flush=True,
                )
                wall = cpu = 0.0
        close_all(10.0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(describe(), flush=True)


if __name__ == "__main__":
    main()

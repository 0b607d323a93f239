"""The commit phase of a many-topics batch alone: N local tables, no Spark, no broker.

Makes N Delta tables (the 12 columns of ``kafka_ingest.py``'s messages) and claims them for
one pipeline, as ``deltaflow ingest --topic_pattern`` does at start. Then, per batch, writes
one Parquet file of ``--rows`` rows per table (``_DeltaSink.write_task``, as a task would) and
times the driver's part: every table's ``_DeltaSink.commit_batch`` with its two Kafka
partitions' end offsets, side by side in the ingest's commit threads
(``arrow_ingest._run_all``). Prints each batch's seconds and the table loads per table
(``delta.log.load`` calls; 1 is the floor: step 2's load serves the commit) and the txn
lookups that reach delta-rs (each replays the commits since the last checkpoint).

With ``--checkpoint-interval N`` the tables are made with ``delta.checkpointInterval`` N (0:
none set, delta-rs' default of 100; deltaflow makes its own tables with 10): a long run
(``--batches 60``) shows the commit phase growing with the commits since the last checkpoint.

    .venv/bin/python benchmarks/commit_phase.py [--tables 200] [--batches 6] [--rows 2500] \
        [--checkpoint-interval 0]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import functools
import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from machine import describe

from deltaflow.config.sink import SinkOptions
from deltaflow.delta import commit as delta_commit
from deltaflow.delta import log as delta_log
from deltaflow.pipeline import arrow_ingest
from deltaflow.pipeline.api import claim_all
from deltaflow.sinks.datasource import _DeltaSink


def _rows(count: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(count), pa.int64()),
            "user_id": pa.array(range(count), pa.int64()),
            "session_id": pa.array([f"s{i}" for i in range(count)]),
            "event_type": pa.array(["view"] * count),
            "page": pa.array(["/p"] * count),
            "referrer": pa.array(["r"] * count),
            "country": pa.array(["fr"] * count),
            "device": pa.array(["d"] * count),
            "browser": pa.array(["b"] * count),
            "amount": pa.array([1.5] * count),
            "ts": pa.array([dt.datetime(2026, 1, 1)] * count, pa.timestamp("us", tz="UTC")),
            "is_bot": pa.array([False] * count),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--rows", type=int, default=2_500, help="rows of each table's file per batch")
    parser.add_argument(
        "--checkpoint-interval", type=int, default=0, help="delta.checkpointInterval of the tables (0: unset)"
    )
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="deltaflow-commit-phase-")
    try:
        data = _rows(args.rows)
        uris = [f"{root}/t{i:03d}" for i in range(args.tables)]
        every = args.checkpoint_interval
        interval = {"delta.checkpointInterval": str(every)} if every else None
        for uri in uris:
            write_deltalake(uri, data.slice(0, 0), configuration=interval)
        options = claim_all([SinkOptions(table_uri=u, pipeline_id="bench", kafka_offsets=True) for u in uris])
        sinks = [_DeltaSink(o, data.schema, overwrite=False) for o in options]

        loads: collections.Counter[str] = collections.Counter()
        real_load = delta_log.load

        def counted(uri: str, storage_options: Mapping[str, str]) -> Any:
            loads[uri] += 1
            return real_load(uri, storage_options)

        delta_log.load = counted  # type: ignore[assignment]
        lookups = collections.Counter[str]()
        real_lookup = DeltaTable.transaction_version

        def looked_up(table: DeltaTable, app_id: str) -> int | None:
            lookups[app_id] += 1
            return real_lookup(table, app_id)

        DeltaTable.transaction_version = looked_up  # type: ignore[method-assign]
        delta_commit.delta_log.load = counted  # type: ignore[attr-defined]
        print(
            f"== {args.tables} tables, {args.rows:,} rows a file, {args.batches} batches, "
            f"checkpoint interval {args.checkpoint_interval or 'unset (100)'}",
            flush=True,
        )
        for batch in range(args.batches):
            jobs = {}
            for i, sink in enumerate(sinks):
                message = sink.write_task(iter(data.to_batches()), batch_id=batch)
                end = {f"t{i}": {"0": (batch + 1) * 50, "1": (batch + 1) * 50}}
                commit = functools.partial(sink.commit_batch, [message], batch)
                jobs[sink.table_uri] = functools.partial(commit, source=(end, {}))
            loads.clear()
            lookups.clear()
            started = time.monotonic()
            arrow_ingest._run_all(jobs)
            taken = time.monotonic() - started
            print(
                f"  batch {batch}: {args.tables} tables committed in {taken:.2f} s; "
                f"loads per table {sum(loads.values()) / args.tables:.1f}, "
                f"txn lookups in delta-rs per table {sum(lookups.values()) / args.tables:.1f}",
                flush=True,
            )
            time.sleep(0.5)  # the auto-compactor's threads
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(describe(), flush=True)


if __name__ == "__main__":
    main()

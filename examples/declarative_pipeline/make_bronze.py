"""The bronze Delta table the example pipeline reads: ``python make_bronze.py [PATH] [--start N]
[--rows N]`` appends ``--rows`` events (ids from ``--start``) to it, creating it when missing.

Every fifth event has a non-positive amount, which the pipeline's flow filters out."""

import argparse
import datetime as dt

import pyarrow as pa
from deltalake import write_deltalake


def events(ids: range) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int64()),
            "amount": [float(i % 5 - 1) for i in ids],
            "at": pa.array(
                [dt.datetime(2026, 11, 20 + i % 3, 8, tzinfo=dt.UTC) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", nargs="?", default="/tmp/deltaflow-example/bronze")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args()
    write_deltalake(args.path, events(range(args.start, args.start + args.rows)), mode="append")
    print(f"bronze table {args.path}: {args.rows} event(s) appended")

"""A streaming job for the crash tests, run as its own process (its own driver and JVM).

    python -m tests.jobs.stream_job LANDING TABLE WRITE_PATH

Streams JSON files (one file per micro-batch) into TABLE with the deltaflow sink until all
available input is committed. The crash tests set DELTAFLOW_TEST_CRASH_AT to have the sink
SIGKILL this process group at a chosen step of the commit sequence.
"""

from __future__ import annotations

import os
import sys

import deltaflow


def main(landing: str, table: str, write_path: str) -> None:
    # The sink's crash hook kills this process group: this driver and its JVM.
    os.environ["DELTAFLOW_TEST_KILL_PGID"] = str(os.getpgrp())
    # A short job: the lean JVM (quick compiler, serial collector) starts with ~5 s less CPU a
    # life (measured: 15 against 20 s), and the crash tests start many on 2 cores.
    spark = deltaflow.spark_session(
        "local[2]", jvm="lean", **{"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}
    )
    source = (
        spark.readStream.schema("id LONG, name STRING, part STRING")
        .option("maxFilesPerTrigger", 1)
        .json(landing)
    )
    query = deltaflow.write_stream(
        source,
        table,
        pipeline_id="crash-test",
        partition_columns=["part"],
        write_path=write_path,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])

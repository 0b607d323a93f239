"""A Kafka -> Delta streaming job for the crash tests, run as its own process.

    python -m tests.jobs.kafka_job BOOTSTRAP TOPIC TABLE CHECKPOINT WRITE_PATH

Progress is recorded in the Delta log (kafka_offsets) and the source resumes from it.
"""

from __future__ import annotations

import os
import sys

import deltaflow


def main(bootstrap: str, topic: str, table: str, checkpoint: str, write_path: str) -> None:
    os.environ["DELTAFLOW_TEST_KILL_PGID"] = str(os.getpgrp())
    # A short job: the lean JVM (quick compiler, serial collector) starts with ~5 s less CPU a
    # life (measured: 15 against 20 s), and the crash tests start many on 2 cores.
    spark = deltaflow.spark_session(
        "local[2]", jvm="lean", **{"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}
    )
    source = (
        spark.readStream.format("deltaflow-kafka")
        .option("bootstrap_servers", bootstrap)
        .option("topic", topic)
        .option("max_messages_per_batch", 300)
        .option("delta_table_uri", table)
        .option("delta_app_id", "kafka-crash")
        .load()
    )
    query = deltaflow.write_stream(
        source.selectExpr("CAST(value AS STRING) AS value", "partition", "offset"),
        table,
        pipeline_id="kafka-crash",
        checkpoint_location=checkpoint,
        kafka_offsets=True,
        write_path=write_path,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])

"""``format("delta")`` and ``DeltaTable`` over Spark Connect (``--remote "local[2]"``, in its own
process): the writer shim takes ``partitionBy`` and the save modes from Connect's writers too,
and a MERGE finds the source's alias in Connect's plan."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from deltalake import DeltaTable

_JOB = """
import os, sys
import deltaflow
from pyspark.sql import SparkSession
from deltaflow.pipeline.delta_format import TableExistsError
from deltaflow.tables import DeltaTable

root = sys.argv[1]
spark = SparkSession.builder.remote("local[2]").getOrCreate()
deltaflow.register(spark)
path = os.path.join(root, "t")
df = spark.createDataFrame([(1, "a"), (2, "b")], "id int, p string")
df.write.format("delta").partitionBy("p").save(path)  # the default mode, a new table
try:
    df.write.format("delta").save(path)
    raise SystemExit("errorifexists wrote to an existing table")
except TableExistsError:
    pass
for _ in range(2):
    df.write.format("delta").mode("append").option("txnAppId", "x").option("txnVersion", 1).save(path)
assert spark.read.format("delta").load(path).count() == 4
query = (
    spark.readStream.format("delta").load(path)
    .writeStream.format("delta").partitionBy("p")
    .option("checkpointLocation", os.path.join(root, "ck"))
    .trigger(availableNow=True)
    .start(os.path.join(root, "copy"))
)
query.awaitTermination(120)
changes = spark.createDataFrame([(1, "z"), (3, "c")], "id int, p string")
(DeltaTable.forPath(spark, os.path.join(root, "copy")).alias("t")
    .merge(changes.alias("s"), "s.id = t.id")
    .whenMatchedDelete()
    .whenNotMatchedInsertAll()
    .execute())
spark.stop()
"""


def test_format_delta_and_merge_over_spark_connect(tmp_path, connect_server_turn):
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(_JOB))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(job), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert DeltaTable(str(tmp_path / "t")).metadata().partition_columns == ["p"]
    copy = DeltaTable(str(tmp_path / "copy"))
    assert copy.metadata().partition_columns == ["p"]
    ids = sorted(r["id"] for r in copy.to_pyarrow_table().to_pylist())
    assert ids == [2, 2, 3]  # both id-1 rows deleted by the merge, id 3 inserted
